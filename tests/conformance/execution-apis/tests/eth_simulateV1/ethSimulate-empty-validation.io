// simulates empty with validation
>> {"jsonrpc":"2.0","id":1,"method":"eth_simulateV1","params":[{"blockStateCalls":[{}],"validation":true,"returnFullTransactions":true},"latest"]}

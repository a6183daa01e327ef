// set block number otherwise empty with latest - 1
>> {"jsonrpc":"2.0","id":1,"method":"eth_simulateV1","params":[{"blockStateCalls":[{}]},"0x35"]}

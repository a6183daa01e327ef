// checks that you can set timestamp and increment it in next block
>> {"jsonrpc":"2.0","id":1,"method":"eth_simulateV1","params":[{"blockStateCalls":[{"blockOverrides":{"time":"0x227"}},{"blockOverrides":{"time":"0x228"}}]},"latest"]}

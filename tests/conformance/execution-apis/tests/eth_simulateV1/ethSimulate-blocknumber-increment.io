// blocknumbers should increment
>> {"jsonrpc":"2.0","id":1,"method":"eth_simulateV1","params":[{"blockStateCalls":[{"blockOverrides":{"number":"0x40","time":"0x410"}},{},{},{},{},{},{"blockOverrides":{"number":"0x54"}},{},{},{}],"traceTransfers":true,"returnFullTransactions":true},"latest"]}

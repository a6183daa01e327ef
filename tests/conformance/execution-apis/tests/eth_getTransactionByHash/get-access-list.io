// gets an access list transaction
>> {"jsonrpc":"2.0","id":1,"method":"eth_getTransactionByHash","params":["0x695ad02907c9e13ab7c69963f723fa46ac13cd5e2314f61eab2cb2f07b946faa"]}

// gets a legacy transaction with input data
>> {"jsonrpc":"2.0","id":1,"method":"eth_getTransactionReceipt","params":["0xc1d605c6612a5fe84dc95810030bfe5b1d327652b381bc695e28f50d13b2b09e"]}

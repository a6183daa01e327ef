// gets a dynamic fee transaction
>> {"jsonrpc":"2.0","id":1,"method":"eth_getTransactionByHash","params":["0x205405746564cbcf1dd53fb5ac92c7622d3792d82f03c59d9baddf2443d91864"]}

// gets a legacy transaction
>> {"jsonrpc":"2.0","id":1,"method":"eth_getTransactionByHash","params":["0x3fbac8b19b59077cd29bbacc3815d73577b45a4d976cae80b04c98c793684c07"]}

// gets the receipt for a legacy value transfer tx
>> {"jsonrpc":"2.0","id":1,"method":"eth_getTransactionReceipt","params":["0x3fbac8b19b59077cd29bbacc3815d73577b45a4d976cae80b04c98c793684c07"]}

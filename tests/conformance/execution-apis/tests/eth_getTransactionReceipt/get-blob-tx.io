// gets a blob transaction
>> {"jsonrpc":"2.0","id":1,"method":"eth_getTransactionReceipt","params":["0x4bb6fa064c302d27ea9ac821e061bcc336b8fa40de77f01e116c6461d47e7ac1"]}

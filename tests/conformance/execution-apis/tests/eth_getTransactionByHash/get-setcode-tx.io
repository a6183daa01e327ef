// retrieves an EIP-7702 transaction
>> {"jsonrpc":"2.0","id":1,"method":"eth_getTransactionByHash","params":["0x99f7e58af4dd2735931a3262705fbe57ea2fcc79497668f74309cdeaf37cc223"]}

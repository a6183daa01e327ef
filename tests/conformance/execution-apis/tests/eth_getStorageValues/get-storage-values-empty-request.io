// requests with an empty map
>> {"jsonrpc":"2.0","id":1,"method":"eth_getStorageValues","params":[{},"latest"]}

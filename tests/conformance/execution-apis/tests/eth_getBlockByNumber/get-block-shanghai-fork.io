// requests a block at the Shanghai fork
>> {"jsonrpc":"2.0","id":1,"method":"eth_getBlockByNumber","params":["0x27",false]}

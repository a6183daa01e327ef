// requests a block at the Prague fork
>> {"jsonrpc":"2.0","id":1,"method":"eth_getBlockByNumber","params":["0x2d",false]}

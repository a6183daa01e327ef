// requests a block at the London fork
>> {"jsonrpc":"2.0","id":1,"method":"eth_getBlockByNumber","params":["0x1b",false]}

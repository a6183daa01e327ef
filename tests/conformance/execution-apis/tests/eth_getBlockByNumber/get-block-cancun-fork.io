// requests a block at the Cancun fork
>> {"jsonrpc":"2.0","id":1,"method":"eth_getBlockByNumber","params":["0x2a",false]}

// requests a block at the merge (Paris) fork
>> {"jsonrpc":"2.0","id":1,"method":"eth_getBlockByNumber","params":["0x24",false]}

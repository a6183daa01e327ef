// get the block with tag "safe"
>> {"jsonrpc":"2.0","id":1,"method":"eth_getBlockByNumber","params":["safe",true]}

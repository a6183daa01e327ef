// get the block with tag "finalized"
>> {"jsonrpc":"2.0","id":1,"method":"eth_getBlockByNumber","params":["finalized",true]}

// gets the block with tag "latest"
>> {"jsonrpc":"2.0","id":1,"method":"eth_getBlockByNumber","params":["latest",true]}

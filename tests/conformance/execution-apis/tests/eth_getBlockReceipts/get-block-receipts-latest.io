// gets receipts for block latest
>> {"jsonrpc":"2.0","id":1,"method":"eth_getBlockReceipts","params":["latest"]}

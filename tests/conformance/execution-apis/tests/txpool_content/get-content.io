// retrieves the transaction pool content
// speconly: client response is only checked for schema validity.
>> {"jsonrpc":"2.0","id":1,"method":"txpool_content"}

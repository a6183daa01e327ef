// retrieves the client's current fork configuration as defined by EIP-7910
>> {"jsonrpc":"2.0","id":1,"method":"eth_config"}

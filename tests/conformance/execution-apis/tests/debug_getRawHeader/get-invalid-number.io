// gets block with invalid number formatting
>> {"jsonrpc":"2.0","id":1,"method":"debug_getRawHeader","params":["2"]}

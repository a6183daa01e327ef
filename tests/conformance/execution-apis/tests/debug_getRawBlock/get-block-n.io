// gets non-zero block
>> {"jsonrpc":"2.0","id":1,"method":"debug_getRawBlock","params":["0x3"]}

// gets receipts non-zero block
>> {"jsonrpc":"2.0","id":1,"method":"debug_getRawReceipts","params":["0x3"]}

// traces block 0x2 and validates cumulative storage snapshots across repeated SSTORE operations
// speconly: client response is only checked for schema validity.
>> {"jsonrpc":"2.0","id":1,"method":"debug_traceBlockByNumber","params":["0x2",{"disableStack":false,"disableStorage":false,"enableMemory":false,"enableReturnData":true}]}

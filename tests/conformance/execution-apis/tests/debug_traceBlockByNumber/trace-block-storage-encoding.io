// traces block 0x2 with storage enabled; storage keys and values must be 0x-prefixed bytes32 values
// speconly: client response is only checked for schema validity.
>> {"jsonrpc":"2.0","id":1,"method":"debug_traceBlockByNumber","params":["0x2",{"disableStack":false,"disableStorage":false,"enableMemory":false,"enableReturnData":true}]}

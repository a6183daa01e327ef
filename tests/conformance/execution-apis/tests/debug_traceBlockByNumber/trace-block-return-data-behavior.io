// traces a block with returnData disabled and enabled to validate returnData field gating and encoding
// speconly: client response is only checked for schema validity.
>> {"jsonrpc":"2.0","id":1,"method":"debug_traceBlockByNumber","params":["0x1",{"disableStack":false,"disableStorage":true,"enableMemory":false,"enableReturnData":false}]}
>> {"jsonrpc":"2.0","id":2,"method":"debug_traceBlockByNumber","params":["0x1",{"disableStack":false,"disableStorage":true,"enableMemory":false,"enableReturnData":true}]}

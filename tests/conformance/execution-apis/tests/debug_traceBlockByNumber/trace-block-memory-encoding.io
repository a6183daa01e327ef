// traces block 0x1 with memory enabled; memory chunks must be 0x-prefixed bytes32 values
// speconly: client response is only checked for schema validity.
>> {"jsonrpc":"2.0","id":1,"method":"debug_traceBlockByNumber","params":["0x1",{"disableStack":false,"disableStorage":false,"enableMemory":true,"enableReturnData":true}]}

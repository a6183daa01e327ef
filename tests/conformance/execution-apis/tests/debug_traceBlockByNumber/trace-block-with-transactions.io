// traces a block containing transactions; validates that each entry has txHash and a spec-compliant result
// speconly: client response is only checked for schema validity.
>> {"jsonrpc":"2.0","id":1,"method":"debug_traceBlockByNumber","params":["0x1"]}

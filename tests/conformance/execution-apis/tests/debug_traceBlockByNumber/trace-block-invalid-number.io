// requests a trace with a non-hex block number; the client must return an error
>> {"jsonrpc":"2.0","id":1,"method":"debug_traceBlockByNumber","params":["3"]}

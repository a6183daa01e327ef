// traces a contract call transaction; validates spec compliance of structLogs including stack encoding, error field behavior, and optional storage encoding
// speconly: client response is only checked for schema validity.
>> {"jsonrpc":"2.0","id":1,"method":"debug_traceTransaction","params":["0xc1d605c6612a5fe84dc95810030bfe5b1d327652b381bc695e28f50d13b2b09e"]}

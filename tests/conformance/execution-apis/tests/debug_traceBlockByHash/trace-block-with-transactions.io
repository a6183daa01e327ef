// traces a block containing transactions by hash; validates that each entry has txHash and a spec-compliant result
// speconly: client response is only checked for schema validity.
>> {"jsonrpc":"2.0","id":1,"method":"debug_traceBlockByHash","params":["0x80e911b62f552f563a2544dfef5eb39ec8863d9082c998ca6b657f76e19de38e"]}

// queries for logs with a null topic in position zero, acting as a wildcard for that position
>> {"jsonrpc":"2.0","id":1,"method":"eth_getLogs","params":[{"fromBlock":"0x3","toBlock":"0x6","topics":[null,["0x95b7276947f6331672b0c63eca28c1d39f25286d5e2793d6a487837ff1475ba0"]]}]}

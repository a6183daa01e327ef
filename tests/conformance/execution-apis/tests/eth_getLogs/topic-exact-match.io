// queries for logs with two topics, with both topics set explictly
>> {"jsonrpc":"2.0","id":1,"method":"eth_getLogs","params":[{"fromBlock":"0x3","toBlock":"0x6","topics":[["0x00000000000000000000000000000000000000000000000000000000656d6974"],["0x95b7276947f6331672b0c63eca28c1d39f25286d5e2793d6a487837ff1475ba0"]]}]}

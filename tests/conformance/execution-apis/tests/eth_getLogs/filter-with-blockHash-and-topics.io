// queries for logs in a block, identified by blockHash
>> {"jsonrpc":"2.0","id":1,"method":"eth_getLogs","params":[{"blockHash":"0x98f797a6af91ea770ab3a99d89c17a3a46d14c76db6bb711b18156a3493d2c94","topics":[["0x00000000000000000000000000000000000000000000000000000000656d6974"],["0x95b7276947f6331672b0c63eca28c1d39f25286d5e2793d6a487837ff1475ba0"]]}]}

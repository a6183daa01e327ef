// queries for all logs of a block, identified by blockHash
>> {"jsonrpc":"2.0","id":1,"method":"eth_getLogs","params":[{"blockHash":"0x98f797a6af91ea770ab3a99d89c17a3a46d14c76db6bb711b18156a3493d2c94"}]}

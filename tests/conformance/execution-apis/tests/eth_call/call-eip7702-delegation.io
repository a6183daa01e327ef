// Performs a call to an account that has an EIP-7702 code delegation.
>> {"jsonrpc":"2.0","id":1,"method":"eth_call","params":[{"from":"0x0000000000000000000000000000000000000000","gas":"0x186a0","to":"0xeda8645ba6948855e3b3cd596bbb07596d59c603"},"latest"]}

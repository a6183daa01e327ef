"""The transaction lifecycle: the Ethereum methods only an execution client can answer.

One list for every component: the write node passes them to its execution client, the
proxy routes them to the chain's Leader write node, and a state node refuses them with a
pointer to the proxy. The names map object params to positional lists.
"""

from __future__ import annotations

# Mempool, fees, receipts: passed to the execution client as they are.
TX_LIFECYCLE: dict[str, tuple[str, ...]] = {
    "eth_sendRawTransaction": ("data",),
    "eth_sendTransaction": ("transaction",),
    "eth_estimateGas": ("transaction", "blockNumber", "stateOverride"),
    "eth_gasPrice": (),
    "eth_maxPriorityFeePerGas": (),
    "eth_feeHistory": ("blockCount", "newestBlock", "rewardPercentiles"),
    "eth_getTransactionReceipt": ("transactionHash",),
    "eth_getTransactionByHash": ("transactionHash",),
    "eth_accounts": (),
}

# State reads that go to the execution client only at the `pending` block: pending state
# (the next nonce once a transaction is in the mempool) exists nowhere else.
PENDING_READS: dict[str, tuple[str, ...]] = {
    "eth_getBalance": ("address", "blockNumber"),
    "eth_getTransactionCount": ("address", "blockNumber"),
    "eth_getCode": ("address", "blockNumber"),
    "eth_getStorageAt": ("address", "position", "blockNumber"),
    "eth_call": ("request", "blockNumber", "stateOverride", "blockOverrides"),
    "eth_getBlockByNumber": ("blockNumber", "full"),
}

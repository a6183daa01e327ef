"""A chain for the trace tests: anvil mines transfers of the three transaction types, a
deployment, storage writes with logs, nested calls (one whose callee reverts), a mined
revert with a reason, an out-of-gas transaction, a DELEGATECALL, a CREATE2, a SELFDESTRUCT
(of an old contract and of one created in the same transaction), a precompile call, and a
block holding several transactions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.evm.conftest import (
    A0,
    A1,
    A2,
    COUNTER_RUNTIME,
    LOOP_RUNTIME,
    PANIC_RUNTIME,
    deploy,
    forwarder_runtime,
    init_code,
    rpc,
    send,
)

# reverts with Error("nope")
REASON_RUNTIME = (
    "7f08c379a0" + "00" * 28 + "600052"  # selector at memory 0
    "6020600452"  # offset 0x20 at 4
    "6004602452"  # length 4 at 0x24
    "7f" + b"nope".hex() + "00" * 28 + "604452"  # the text at 0x44
    "60646000fd"  # REVERT(0, 0x64)
)
# CREATE2(0, 0, CALLDATASIZE, salt 0) of the calldata as init code; returns the address
FACTORY_RUNTIME = "3660006000376000366000" + "6000f5" + "600052" + "60206000f3"
# STATICCALL sha256 (0x02) on 32 bytes of memory; returns the digest
SHA_RUNTIME = "6020600060206000600261fffffa50" + "60206000f3"


def selfdestruct_runtime(beneficiary: str) -> str:
    return "73" + beneficiary[2:] + "ff"


def delegate_runtime(target: str) -> str:
    """DELEGATECALLs `target` with its calldata and returns what it returned."""
    return (
        "366000600037"  # CALLDATACOPY(0, 0, CALLDATASIZE)
        "6000600036600073" + target[2:] + "5af4"  # DELEGATECALL(gas, target, 0, size, 0, 0)
        "50" + "3d600060003e" + "3d6000f3"  # return the return data
    )


@dataclass
class TraceChain:
    """Transaction hashes by what they do, and the blocks that hold them."""

    url: str
    txs: dict[str, str] = field(default_factory=dict)
    blocks: dict[str, int] = field(default_factory=dict)
    contracts: dict[str, str] = field(default_factory=dict)
    multi_block: int = 0
    head: int = 0


def _tx(chain: TraceChain, name: str, tx: dict[str, Any]) -> dict[str, Any]:
    receipt = send(chain.url, tx)
    chain.txs[name] = receipt["transactionHash"]
    chain.blocks[name] = int(receipt["blockNumber"], 16)
    return receipt


def build_trace_chain(url: str) -> TraceChain:
    chain = TraceChain(url=url)
    _tx(chain, "legacy", {"from": A0, "to": A1, "value": "0x10", "gasPrice": "0x77359400"})
    _tx(
        chain,
        "access_list",
        {"from": A0, "to": A1, "value": "0x10", "gasPrice": "0x77359400",
         "accessList": [{"address": A2, "storageKeys": ["0x" + "00" * 31 + "01"]}]},
    )  # fmt: skip
    _tx(chain, "dynamic", {"from": A1, "to": A2, "value": "0x10", "maxFeePerGas": "0x77359400",
                           "maxPriorityFeePerGas": "0x3b9aca00"})  # fmt: skip
    receipt = _tx(chain, "deploy", {"from": A0, "data": init_code(COUNTER_RUNTIME)})
    counter = receipt["contractAddress"]
    c = chain.contracts
    c["counter"] = counter
    c["panic"] = deploy(url, PANIC_RUNTIME)
    c["reason"] = deploy(url, REASON_RUNTIME)
    c["loop"] = deploy(url, LOOP_RUNTIME)
    c["forward_counter"] = deploy(url, forwarder_runtime(counter))
    c["forward_panic"] = deploy(url, forwarder_runtime(c["panic"]))
    c["proxy"] = deploy(url, delegate_runtime(counter))
    c["factory"] = deploy(url, FACTORY_RUNTIME)
    c["sha"] = deploy(url, SHA_RUNTIME)
    c["destructor"] = deploy(url, selfdestruct_runtime(A2))
    _tx(chain, "store_log", {"from": A1, "to": counter})
    _tx(chain, "nested_log", {"from": A1, "to": c["forward_counter"]})
    _tx(chain, "nested_revert", {"from": A1, "to": c["forward_panic"]})
    _tx(chain, "revert", {"from": A1, "to": c["reason"], "gas": "0x20000"})
    _tx(chain, "out_of_gas", {"from": A1, "to": c["loop"], "gas": "0xc350"})
    _tx(chain, "delegate", {"from": A2, "to": c["proxy"]})
    _tx(chain, "create2", {"from": A2, "to": c["factory"], "data": init_code(COUNTER_RUNTIME)})
    _tx(chain, "precompile", {"from": A2, "to": c["sha"]})
    _tx(chain, "selfdestruct", {"from": A0, "to": c["destructor"], "value": "0x100"})
    _tx(chain, "create_destroy", {"from": A0, "data": "0x" + selfdestruct_runtime(A1),
                                  "value": "0x200"})  # fmt: skip
    rpc(url, "evm_setAutomine", [False])
    try:
        hashes = [
            rpc(url, "eth_sendTransaction", [tx])
            for tx in (
                {"from": A0, "to": counter, "gas": "0x20000"},
                {"from": A1, "to": c["forward_counter"], "gas": "0x40000"},
                {"from": A0, "to": A2, "value": "0x5", "gas": "0x5208"},
                {"from": A2, "to": c["proxy"], "gas": "0x40000"},
            )
        ]
        rpc(url, "evm_mine", [])
    finally:
        rpc(url, "evm_setAutomine", [True])
    receipts = [rpc(url, "eth_getTransactionReceipt", [h]) for h in hashes]
    assert len({r["blockNumber"] for r in receipts}) == 1, receipts
    chain.multi_block = int(receipts[0]["blockNumber"], 16)
    for i, h in enumerate(hashes):
        chain.txs[f"multi_{i}"] = h
        chain.blocks[f"multi_{i}"] = chain.multi_block
    chain.head = int(rpc(url, "eth_blockNumber", []), 16)
    return chain

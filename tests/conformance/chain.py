"""The devnet chain the conformance test compares on: blocks of every kind, built block by
block with anvil's mining under the test's control.

Interval mining is stopped first and every block is mined on purpose (`evm_mine`), so the
chain holds still while the answers are compared (anvil would otherwise mine every second
and `latest` would mean two different blocks to the proxy and to anvil). Transactions are
signed here and sent through the proxy, as a wallet does. One transaction is left in the
pool, unmined, for `pending` and `txpool_*`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import rlp
from eth_account import Account
from eth_utils import to_checksum_address

from nodes.devnet.anvil import ensure_openzeppelin
from nodes.devnet.workload import (
    abi_encode_erc20_constructor,
    erc20_transfer_data,
    fresh_address,
    init_code,
    keccak256,
    word,
)
from tests.conformance.rpc import Rpc

MNEMONIC = "test test test test test test test test test test test junk"
CHAIN_ID = 1337
GWEI = 10**9
ETHER = 10**18
ARCHIVE_GAP = 20  # empty blocks mined after the old blocks: more than the test's state window
GAP_STEP = 4  # mined at once: fewer than the window, so the checker confirms before pruning
SETTLE_TIMEOUT = 15.0

Account.enable_unaudited_hdwallet_features()
KEYS = [
    Account.from_mnemonic(MNEMONIC, account_path=f"m/44'/60'/0'/0/{i}").key.hex() for i in range(10)
]
ADDRESSES = [Account.from_key(k).address.lower() for k in KEYS]
DEV = ADDRESSES[0]

# EVM opcodes used by the two hand-assembled contracts below.
OP = {
    "SUB": 0x03, "SHR": 0x1C, "ORIGIN": 0x32, "CALLER": 0x33, "CALLVALUE": 0x34,
    "CALLDATALOAD": 0x35, "CALLDATASIZE": 0x36, "CODECOPY": 0x39, "GASPRICE": 0x3A,
    "BLOCKHASH": 0x40, "COINBASE": 0x41, "TIMESTAMP": 0x42, "NUMBER": 0x43,
    "PREVRANDAO": 0x44, "GASLIMIT": 0x45, "CHAINID": 0x46, "SELFBALANCE": 0x47,
    "BASEFEE": 0x48, "BLOBBASEFEE": 0x4A, "MSTORE": 0x52, "SSTORE": 0x55, "JUMPI": 0x57,
    "JUMPDEST": 0x5B, "PUSH0": 0x5F, "LOG1": 0xA1, "RETURN": 0xF3, "REVERT": 0xFD,
}  # fmt: skip
CALLENV_FIELDS = (
    "ORIGIN", "CALLER", "CALLVALUE", "GASPRICE", "COINBASE", "TIMESTAMP", "NUMBER",
    "PREVRANDAO", "GASLIMIT", "CHAINID", "SELFBALANCE", "BASEFEE", "BLOBBASEFEE",
    "CALLDATASIZE",
)  # fmt: skip
CALLENV_TOPIC = 0x63616C6C  # "call"


def ops(*names: str) -> bytes:
    return bytes(OP[n] for n in names)


def push(value: int, size: int = 1) -> bytes:
    return bytes([0x5F + size]) + value.to_bytes(size, "big")


def callenv_runtime() -> bytes:
    """Returns the call's environment as words (the fields of CALLENV_FIELDS, then
    BLOCKHASH(NUMBER - 1)), stores NUMBER at slot 0 and logs it: a contract whose answer
    shows every value of the transaction environment, like the spec tests' `callenv`."""
    code = b"".join(
        ops(name) + push(i * 32, 2) + ops("MSTORE") for i, name in enumerate(CALLENV_FIELDS)
    )
    words = len(CALLENV_FIELDS) + 1
    code += push(1) + ops("NUMBER", "SUB", "BLOCKHASH") + push((words - 1) * 32, 2) + ops("MSTORE")
    code += ops("NUMBER", "PUSH0", "SSTORE")
    code += push(CALLENV_TOPIC, 4) + push(32) + ops("PUSH0", "LOG1")
    return code + push(words * 32, 2) + ops("PUSH0", "RETURN")


def abi_error(reason: str) -> bytes:
    raw = reason.encode()
    return bytes.fromhex("08c379a0") + word(32) + word(len(raw)) + raw.ljust(32, b"\0")


PANIC_DATA = bytes.fromhex("4e487b71") + word(1)
REVERT_REASON = "user error"


def revert_runtime() -> bytes:
    """Reverts always, like the spec tests' revert contract: with `Error("user error")` when
    the first calldata byte is non-zero, else with `Panic(1)`."""
    error = abi_error(REVERT_REASON)
    head_len, panic_len, error_len = 9, 11, 12
    error_at = head_len + panic_len
    panic_data_at = error_at + error_len
    error_data_at = panic_data_at + len(PANIC_DATA)
    head = ops("PUSH0", "CALLDATALOAD") + push(0xF8) + ops("SHR") + push(error_at, 2) + ops("JUMPI")

    def revert_with(at: int, size: int) -> bytes:
        return (
            push(size)
            + push(at, 2)
            + ops("PUSH0", "CODECOPY")
            + push(size)
            + ops("PUSH0", "REVERT")
        )

    code = head + revert_with(panic_data_at, len(PANIC_DATA))
    code += ops("JUMPDEST") + revert_with(error_data_at, len(error))
    assert len(code) == panic_data_at, "offsets above are wrong"
    return code + PANIC_DATA + error


def erc20_init() -> bytes:
    artifact = json.loads((ensure_openzeppelin() / "ERC20PresetFixedSupply.json").read_text())
    args = abi_encode_erc20_constructor("Conformance Token", "CFT", 10**24, DEV)
    return bytes.fromhex(artifact["bytecode"][2:]) + args


def contract_address(sender: str, nonce: int) -> str:
    """The address a CREATE from `sender` at `nonce` gives: keccak(rlp([sender, nonce]))[12:]."""
    return "0x" + keccak256(rlp.encode([bytes.fromhex(sender[2:]), nonce]))[12:].hex()


@dataclass
class Chain:
    """What the built chain holds: named blocks (number and hash), named transactions,
    contract addresses; everything the cases are made of."""

    blocks: dict[str, int] = field(default_factory=dict)
    hashes: dict[str, str] = field(default_factory=dict)  # block name -> hash
    txs: dict[str, str] = field(default_factory=dict)  # transaction name -> hash
    tx_block: dict[str, str] = field(default_factory=dict)  # transaction name -> block name
    contracts: dict[str, str] = field(default_factory=dict)
    raws: dict[str, str] = field(default_factory=dict)  # transaction hash -> signed bytes
    head: int = 0
    pending_tx: str = ""

    @property
    def archive_blocks(self) -> list[str]:
        return ["transfers", "deploys", "logs", "reverts", "empty_old"]

    @property
    def recent_blocks(self) -> list[str]:
        return ["mixed", "empty_recent", "head"]


class ChainBuilder:
    """Sends the scenario's transactions through the proxy and mines each block on anvil."""

    def __init__(self, anvil: Rpc, proxy: Rpc) -> None:
        self.anvil, self.proxy = anvil, proxy
        self.nonces = [0] * len(KEYS)
        self.chain = Chain()
        self.base_fee = 0

    def build(self) -> Chain:
        self.anvil.call("evm_setIntervalMining", 0)
        self.anvil.call("evm_setAutomine", False)
        self.mine_empty()  # a first block mined by the test: the chain now moves only on demand
        chain = self.chain
        chain.blocks["genesis"] = 0
        chain.hashes["genesis"] = self.anvil.call("eth_getBlockByNumber", "0x0", False)["hash"]
        erc20, callenv, revert = (contract_address(DEV, n) for n in (0, 1, 2))
        chain.contracts.update(erc20=erc20, callenv=callenv, revert=revert)
        self.block(
            "transfers",
            {
                "legacy_transfer": self.legacy(1, fresh_address(1), ETHER),
                "access_list_transfer": self.access_list(2, fresh_address(2), 2 * ETHER),
                "dynamic_fee_transfer": self.dynamic_fee(3, fresh_address(3), 3 * ETHER),
            },
        )
        self.block(
            "deploys",
            {
                "legacy_create": self.legacy(0, None, 0, erc20_init(), gas=2_000_000),
                "callenv_create": self.dynamic_fee(
                    0, None, 0, init_code(callenv_runtime()), gas=200_000
                ),
                "revert_create": self.access_list(
                    0, None, 0, init_code(revert_runtime()), gas=200_000
                ),
            },
        )
        holder1, holder2 = ADDRESSES[8], fresh_address(5)
        self.block(
            "logs",
            {
                "erc20_transfer": self.dynamic_fee(
                    0, erc20, 0, erc20_transfer_data(holder1, 10 * ETHER), gas=100_000
                ),
                "erc20_transfer2": self.legacy(
                    0, erc20, 0, erc20_transfer_data(holder2, 20 * ETHER), gas=100_000
                ),
                "unsigned_transfer": self.unsigned(4, fresh_address(4), 4 * ETHER),
            },
        )
        self.block(
            "reverts",
            {
                "reverted_erc20": self.dynamic_fee(
                    5, erc20, 0, erc20_transfer_data(DEV, 1), gas=100_000
                ),
                "reverted_call": self.legacy(5, revert, 0, "0x01", gas=100_000),
                "callenv_call": self.access_list(5, callenv, 7, "0xabcdef", gas=100_000),
            },
        )
        self.block("empty_old", {})
        for _ in range(ARCHIVE_GAP // GAP_STEP):
            self.anvil.call("anvil_mine", hex(GAP_STEP))
            self.settle()
        recent_callenv = contract_address(ADDRESSES[7], 0)
        chain.contracts["callenv_recent"] = recent_callenv
        self.block(
            "mixed",
            {
                "recent_transfer": self.dynamic_fee(6, fresh_address(6), 6 * ETHER),
                "recent_erc20": self.dynamic_fee(
                    0, erc20, 0, erc20_transfer_data(holder2, 5 * ETHER), gas=100_000
                ),
                "recent_create": self.legacy(7, None, 0, init_code(callenv_runtime()), gas=200_000),
                "recent_panic": self.dynamic_fee(7, revert, 0, "0x00", gas=100_000),
            },
        )
        self.block("empty_recent", {})
        self.block("head", {"head_transfer": self.legacy(8, fresh_address(8), ETHER)})
        chain.pending_tx = self.dynamic_fee(9, fresh_address(9), 9 * ETHER)
        chain.head = chain.blocks["head"]
        return chain

    # -- blocks ------------------------------------------------------------------------------

    def mine_empty(self) -> None:
        self.anvil.call("evm_mine")
        self.base_fee = int(
            self.anvil.call("eth_getBlockByNumber", "latest", False)["baseFeePerGas"], 16
        )
        self.settle()

    def block(self, name: str, txs: dict[str, str]) -> None:
        """Mines the sent `txs` into one block and checks every one of them is in it."""
        self.anvil.call("evm_mine")
        block = self.anvil.call("eth_getBlockByNumber", "latest", False)
        missing = set(txs.values()) - set(block["transactions"])
        assert not missing, (
            f"block {name}: {missing} not mined (anvil left {block['transactions']})"
        )
        number = int(block["number"], 16)
        self.chain.blocks[name], self.chain.hashes[name] = number, block["hash"]
        for tx_name, tx_hash in txs.items():
            self.chain.txs[tx_name] = tx_hash
            self.chain.tx_block[tx_name] = name
        self.base_fee = int(block["baseFeePerGas"], 16)
        self.settle()

    def settle(self) -> None:
        """Waits (a bounded time) until the proxy calls anvil's head `finalized`: the chain
        then grows at the pace of the pipeline, as at a block a second, and the checker
        confirms each height while every replica still holds it (a `state` replica forgets
        heights that fall out of its window, and a height a quorum no longer holds is never
        confirmed)."""
        head = int(self.anvil.call("eth_blockNumber"), 16)
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while time.monotonic() < deadline:
            final = self.proxy.request("eth_getBlockByNumber", "finalized", False).get("result")
            if isinstance(final, dict) and int(final.get("number", "0x0"), 16) >= head:
                return
            time.sleep(0.1)

    # -- transactions (signed here, sent through the proxy) ----------------------------------

    def send(self, who: int, tx: dict[str, Any]) -> str:
        tx = {"nonce": self.nonces[who], "chainId": CHAIN_ID, "gas": 21000, **tx}
        if tx.get("to") is None:
            tx.pop("to", None)
        else:
            tx["to"] = to_checksum_address(tx["to"])
        self.nonces[who] += 1
        raw = "0x" + Account.sign_transaction(tx, KEYS[who]).raw_transaction.hex()
        tx_hash = self.proxy.call("eth_sendRawTransaction", raw)
        self.chain.raws[tx_hash] = raw
        return tx_hash

    def fees(self) -> dict[str, int]:
        return {"maxFeePerGas": 2 * self.base_fee + 2 * GWEI, "maxPriorityFeePerGas": 2 * GWEI}

    def legacy(
        self, who: int, to: str | None, value: int, data: bytes | str = b"", gas: int = 21000
    ) -> str:
        return self.send(
            who,
            {
                "to": to,
                "value": value,
                "data": data,
                "gas": gas,
                "gasPrice": 2 * self.base_fee + GWEI,
            },
        )

    def access_list(
        self, who: int, to: str | None, value: int, data: bytes | str = b"", gas: int = 30000
    ) -> str:
        touched = to or ADDRESSES[who]
        access = [{"address": touched, "storageKeys": ["0x" + word(0).hex()]}]
        tx = {"type": 1, "to": to, "value": value, "data": data, "gas": gas, "accessList": access}
        return self.send(who, {**tx, "gasPrice": 2 * self.base_fee + GWEI})

    def dynamic_fee(
        self, who: int, to: str | None, value: int, data: bytes | str = b"", gas: int = 21000
    ) -> str:
        return self.send(
            who, {"type": 2, "to": to, "value": value, "data": data, "gas": gas, **self.fees()}
        )

    def unsigned(self, who: int, to: str, value: int) -> str:
        """`eth_sendTransaction` through the proxy: the Leader's execution client signs."""
        self.nonces[who] += 1
        return self.proxy.call(
            "eth_sendTransaction", {"from": ADDRESSES[who], "to": to, "value": hex(value)}
        )


def wait_until_served(proxy: Rpc, anvil: Rpc, chain: Chain, timeout: float = 30) -> dict[str, Any]:
    """Waits until the proxy answers the chain's head as `latest` (and, as far as it will, has
    confirmed it as `finalized`); returns what it saw, for the report."""
    deadline = time.monotonic() + timeout
    seen: dict[str, Any] = {}
    while time.monotonic() < deadline:
        seen["latest"] = proxy.request("eth_blockNumber").get("result")
        final = proxy.request("eth_getBlockByNumber", "finalized", False).get("result")
        seen["finalized"] = final and final.get("number")
        if seen["latest"] == hex(chain.head) and seen["finalized"] == hex(chain.head):
            break
        time.sleep(0.2)
    assert anvil.call("eth_blockNumber") == hex(chain.head), "anvil mined past the scenario"
    return seen

"""Synthetic vendor-block chains for the state node tests, and the checks on them.

`SyntheticChain` keeps a model of the full state after every block (the expected answers)
and the `trace_vendorBlock` results a write node would send for it (docs/vendor-block.md).
`ChainSource` serves a chain as a write node would (`eth_blockNumber`, `eth_chainId`,
`trace_vendorBlock`) through a Dispatcher, so tests can use it in process or over HTTP.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from typing import Any

from chainstate.jsonrpc import INVALID_PARAMS, Dispatcher, JsonRpcError, params_list
from nodes.state.blockbody import EMPTY_ROOT, EMPTY_UNCLES
from nodes.state.vendor import compute_validation_hash, keccak256, parse_vendor_block

CHAIN_ID = 1337
ZERO32 = "0x" + "00" * 32


def h32(value: int) -> str:
    return "0x" + value.to_bytes(32, "big").hex()


@dataclass
class Account:
    balance: int = 0
    nonce: int = 0
    code: bytes = b""
    storage: dict[int, int] = field(default_factory=dict)


State = dict[str, Account]


def make_addresses(n: int, salt: str = "acct") -> list[str]:
    return ["0x" + keccak256(f"{salt}{i}".encode())[:20].hex() for i in range(n)]


class SyntheticChain:
    """A chain of vendor blocks with the model state after each block."""

    def __init__(self, tag: str = "main") -> None:
        self.tag = tag
        self.blocks: list[dict[str, Any]] = []
        self.states: list[State] = []

    @property
    def head(self) -> int:
        return len(self.blocks) - 1

    def state(self, height: int) -> State:
        return self.states[height]

    def add_block(self, changes: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """Append a block; `changes[addr]` may set balance, nonce, code, storage{slot: value}.
        Only values that really change are listed, as the write node does."""
        height = len(self.blocks)
        before = self.states[-1] if self.states else {}
        after = copy.deepcopy(before)
        pre: dict[str, Any] = {}
        post: dict[str, Any] = {}
        for addr, fields_ in changes.items():
            old = before.get(addr, Account())
            new = after.setdefault(addr, Account())
            p: dict[str, Any] = {}
            q: dict[str, Any] = {}
            for name in ("balance", "nonce"):
                if name in fields_ and fields_[name] != getattr(old, name):
                    p[name], q[name] = hex(getattr(old, name)), hex(fields_[name])
                    setattr(new, name, fields_[name])
            if "code" in fields_ and fields_["code"] != old.code:
                p["code"], q["code"] = "0x" + old.code.hex(), "0x" + fields_["code"].hex()
                new.code = fields_["code"]
            slots_pre, slots_post = {}, {}
            for slot, value in fields_.get("storage", {}).items():
                was = old.storage.get(slot, 0)
                if value != was:
                    slots_pre[h32(slot)], slots_post[h32(slot)] = h32(was), h32(value)
                    if value:
                        new.storage[slot] = value
                    else:
                        new.storage.pop(slot, None)
            if slots_post:
                p["storage"], q["storage"] = slots_pre, slots_post
            if q:
                pre[addr], post[addr] = p, q
        parent = self.blocks[-1]["Header"]["hash"] if self.blocks else ZERO32
        block_hash = "0x" + keccak256(f"{self.tag}:{height}:{parent}".encode()).hex()
        header = {
            "hash": block_hash,
            "parentHash": parent,
            "number": hex(height),
            "timestamp": hex(1_700_000_000 + 12 * height),
            "miner": make_addresses(1, "miner")[0],
            "gasLimit": hex(30_000_000),
            "gasUsed": "0x0",
            "baseFeePerGas": hex(1_000_000_000 + height),
            "stateRoot": "0x" + keccak256(f"root:{block_hash}".encode()).hex(),
            "mixHash": "0x" + keccak256(f"mix:{block_hash}".encode()).hex(),
            "difficulty": "0x0",
            "extraData": "0x",
            "logsBloom": "0x" + "00" * 256,
            "receiptsRoot": EMPTY_ROOT,
            "transactionsRoot": EMPTY_ROOT,
            "sha3Uncles": EMPTY_UNCLES,
            "nonce": "0x0000000000000000",
            "size": hex(600 + 100 * len(post)),
        }
        diff = {"pre": pre, "post": post}
        block = {
            "BlockFile": {"block": block_object(header, []), "receipts": []},
            "Header": header,
            "StateDiff": diff,
            "ValidationHash": compute_validation_hash(header, diff),
        }
        self.blocks.append(block)
        self.states.append(after)
        return block

    @staticmethod
    def set_receipts(block: dict[str, Any], receipts: list[dict[str, Any]]) -> None:
        """Give a block one transaction per receipt (each receipt has its `transactionHash`
        and `logs`): transaction objects and receipts filled in as an execution client gives
        them, the Header's gas and roots to match, the ValidationHash recomputed."""
        header = block["Header"]
        txs, cumulative = [], 0
        for i, receipt in enumerate(receipts):
            sender = make_addresses(1, f"sender{i}")[0]
            where = {"blockHash": header["hash"], "blockNumber": header["number"]}
            txs.append(
                {"hash": receipt["transactionHash"], **where, "transactionIndex": hex(i),
                 "from": sender, "to": EMPTY_ROOT[:42], "value": "0x0", "input": "0x",
                 "gas": hex(100_000), "type": "0x2"}
            )  # fmt: skip
            cumulative += 21_000 + 1_000 * i
            receipt.update(
                {"transactionIndex": hex(i), **where, "from": sender,
                 "cumulativeGasUsed": hex(cumulative), "gasUsed": hex(21_000 + 1_000 * i),
                 "status": "0x1"}
            )  # fmt: skip
        header["gasUsed"] = hex(cumulative)
        roots = h32(int(header["number"], 16) + 1) if receipts else EMPTY_ROOT
        header["transactionsRoot"] = header["receiptsRoot"] = roots
        block["BlockFile"] = {"block": block_object(header, txs), "receipts": receipts}
        block["ValidationHash"] = compute_validation_hash(header, block["StateDiff"])

    def add_random_block(self, rng: random.Random, addresses: list[str], slots: int = 6) -> None:
        changes: dict[str, dict[str, Any]] = {}
        for addr in rng.sample(addresses, rng.randint(0, min(4, len(addresses)))):
            f: dict[str, Any] = {}
            if rng.random() < 0.7:
                f["balance"] = rng.choice([0, rng.randrange(1, 2**256)])
            if rng.random() < 0.4:
                f["nonce"] = rng.randrange(0, 1000)
            if rng.random() < 0.15:
                f["code"] = rng.choice([b"", bytes(rng.randrange(256) for _ in range(12))])
            if rng.random() < 0.6:
                f["storage"] = {
                    rng.randrange(slots): rng.choice([0, rng.randrange(1, 2**256)])
                    for _ in range(rng.randint(1, 3))
                }
            changes[addr] = f
        self.add_block(changes)

    def fork(self, height: int, tag: str) -> SyntheticChain:
        """A chain sharing blocks 0..height with this one; later blocks get other hashes."""
        other = SyntheticChain(tag)
        other.blocks = self.blocks[: height + 1]
        other.states = self.states[: height + 1]
        return other


def block_object(header: dict[str, Any], txs: list[dict[str, Any]]) -> dict[str, Any]:
    """The execution client's block object of a synthetic Header (full transactions)."""
    return {**header, "transactions": txs, "uncles": []}


def random_chain(
    seed: int, blocks: int, accounts: int = 8, tag: str = "main"
) -> tuple[SyntheticChain, list[str]]:
    rng = random.Random(seed)
    addresses = make_addresses(accounts, f"acct{seed}")
    chain = SyntheticChain(tag)
    chain.add_block({a: {"balance": 10**18 * (i + 1)} for i, a in enumerate(addresses[:3])})
    for _ in range(blocks - 1):
        chain.add_random_block(rng, addresses)
    return chain, addresses


class ChainSource:
    """Serves a SyntheticChain as a write node would; `chain` may be replaced at any time
    (a reorg), and `fail` makes every call fail (a source outage)."""

    def __init__(self, chain: SyntheticChain, visible: int | None = None) -> None:
        self.chain = chain
        self.visible = visible  # serve only blocks up to this height (None: all)
        self.fail = False
        self.calls = 0
        self.dispatcher = Dispatcher("source")
        self.dispatcher.update(
            {
                "eth_blockNumber": self._block_number,
                "eth_chainId": self._chain_id,
                "trace_vendorBlock": self._vendor_block,
            }
        )

    @property
    def head(self) -> int:
        return self.chain.head if self.visible is None else min(self.visible, self.chain.head)

    def _check(self) -> None:
        self.calls += 1
        if self.fail:
            raise JsonRpcError(-32603, "source is down")

    async def _block_number(self, params: Any) -> str:
        self._check()
        return hex(self.head)

    async def _chain_id(self, params: Any) -> str:
        self._check()
        return hex(CHAIN_ID)

    async def _vendor_block(self, params: Any) -> dict[str, Any]:
        self._check()
        (ref,) = params_list(params, ["block"])
        height = self.head if ref == "latest" else int(ref, 16)
        if height > self.head:
            raise JsonRpcError(INVALID_PARAMS, f"block {height} not found")
        return self.chain.blocks[height]

    async def handle_body(self, body: bytes) -> bytes:
        return await self.dispatcher.handle_body(body)


# The checks below keep the builder honest: every other state node test depends on it.


def test_synthetic_blocks_follow_the_vendor_format() -> None:
    chain, _ = random_chain(seed=1, blocks=30)
    for height, raw in enumerate(chain.blocks):
        block = parse_vendor_block(raw)
        assert block.number == height
        if height:
            assert block.parent_hash == chain.blocks[height - 1]["Header"]["hash"]


def test_pre_of_each_block_is_the_state_of_its_parent() -> None:
    chain, _ = random_chain(seed=2, blocks=30)
    for height in range(1, chain.head + 1):
        parent = chain.state(height - 1)
        for addr, fields_ in chain.blocks[height]["StateDiff"]["pre"].items():
            acct = parent.get(addr, Account())
            if "balance" in fields_:
                assert int(fields_["balance"], 16) == acct.balance
            for slot, value in fields_.get("storage", {}).items():
                assert int(value, 16) == acct.storage.get(int(slot, 16), 0)


def test_a_fork_shares_its_prefix_and_differs_after() -> None:
    chain, addresses = random_chain(seed=3, blocks=10)
    other = chain.fork(5, "side")
    other.add_random_block(random.Random(9), addresses)
    assert other.blocks[5] is chain.blocks[5]
    assert other.blocks[6]["Header"]["hash"] != chain.blocks[6]["Header"]["hash"]
    assert other.blocks[6]["Header"]["parentHash"] == chain.blocks[5]["Header"]["hash"]

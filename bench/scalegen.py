"""A synthetic chain of mainnet's shape for the scale benchmark (bench/scale.py).

The genesis state holds `accounts` accounts with balances, the first `contracts` of them a
token contract answering `balanceOf(address)` from its `_balances` mapping (slot 0, as an
OpenZeppelin ERC20), and `slots` balance entries spread over the contracts (a few contracts
hold most of them, as on mainnet). Every later block is what the write node emits
(`nodes.writer.blockdiff.assemble`, served as `output_json`): `txs` transactions with their
receipts (half of them token transfers with a Transfer log), `account_changes` accounts
whose balance (and, for senders, nonce) changes and `storage_writes` slots written, a share
of them new. `pre` is always the stored value, so the state node's `pre` check passes.

The state is kept in numpy arrays (a few hundred bytes per slot would not fit 10 M slots in
Python objects); everything is drawn from one seeded generator, so a size and a seed give
the same chain every run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from Crypto.Hash import keccak

from nodes.state.vendor import AccountDiff, VendorBlock
from nodes.writer.blockdiff import assemble, output_json

# CALLDATA[4:36] is the holder; return SLOAD(keccak256(holder ++ 0)): `balanceOf` of a token
# whose `_balances` mapping is slot 0, without the selector dispatch.
#   PUSH1 4 CALLDATALOAD PUSH1 0 MSTORE PUSH1 0 PUSH1 32 MSTORE PUSH1 64 PUSH1 0 SHA3 SLOAD
#   PUSH1 0 MSTORE PUSH1 32 PUSH1 0 RETURN
BALANCE_OF_RUNTIME = bytes.fromhex("6004356000526000602052604060002054" + "60005260206000f3")
BALANCE_OF_SELECTOR = "70a08231"
TRANSFER_SELECTOR = "a9059cbb"
TRANSFER_TOPIC = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"
EMPTY_UNCLES = "0x1dcc4de8dec75d7aab85b567b6ccd41ad312451b948a7413f0a142fd40d49347"
ZERO32 = "0x" + "00" * 32
CHAIN_ID = 1337
GENESIS_TIME = 1_700_000_000
ETH_GAS, TOKEN_GAS = 21_000, 51_000


@dataclass(frozen=True, slots=True)
class ChainShape:
    """How big the chain is and what one block changes."""

    accounts: int = 1_000_000
    slots: int = 10_000_000
    contracts: int = 10_000
    blocks: int = 10_000
    txs: int = 200
    storage_writes: int = 1_500
    account_changes: int = 400
    new_slot_share: float = 0.2  # of the storage writes, those that create a slot
    seed: int = 0

    def check(self) -> None:
        if not 1 <= self.contracts < self.accounts:
            raise ValueError("need 1 <= contracts < accounts")
        if self.account_changes < self.txs or self.accounts - self.contracts < 2 * (
            self.account_changes
        ):
            raise ValueError("need txs <= account_changes <= (accounts - contracts) / 2")
        if self.slots < 2 * self.storage_writes or self.blocks < 1:
            raise ValueError("need slots >= 2 * storage_writes and blocks >= 1")
        if not 0 <= self.new_slot_share <= 1:
            raise ValueError("new_slot_share must be within [0, 1]")
        pairs = self.contracts * (self.accounts - self.contracts)
        if 2 * (self.slots + self.created_slots) > pairs:
            raise ValueError(
                f"{self.slots:,} slots and {self.created_slots:,} created by the blocks need "
                f"contracts * (accounts - contracts) >= twice as many (distinct contract and "
                f"holder pairs), not {pairs:,}"
            )

    @property
    def created_slots(self) -> int:
        """Slots the blocks create (the rest of their storage writes change existing ones)."""
        return int(self.storage_writes * self.new_slot_share) * self.blocks

    @property
    def writes_per_block(self) -> int:
        """State values one block changes: storage slots, balances, senders' nonces."""
        return self.storage_writes + self.account_changes + self.txs


def keccak256(data: bytes) -> bytes:
    return keccak.new(digest_bits=256, data=data).digest()


def _bloom_bits(value: bytes) -> int:
    digest = keccak256(value)
    bits = 0
    for i in (0, 2, 4):
        bits |= 1 << (((digest[i] << 8) | digest[i + 1]) & 2047)
    return bits


def _word(value: int) -> str:
    return f"0x{value:064x}"


class SyntheticChain:
    """The chain's current state (numpy arrays) and its blocks, made one after another."""

    def __init__(self, shape: ChainShape, progress: Callable[[str], None] = print) -> None:
        shape.check()
        self.shape = shape
        self.rng = np.random.default_rng(shape.seed)
        rng = self.rng
        n_acc = shape.accounts
        progress(f"generating {n_acc:,} accounts")
        self.addresses = rng.integers(0, 256, (n_acc, 20), dtype=np.uint8)
        self.balance = rng.integers(10**15, 10**18, n_acc, dtype=np.uint64)
        self.nonce = np.zeros(n_acc, dtype=np.uint64)
        progress(f"hashing {n_acc:,} mapping keys")
        zeros = bytes(32)
        self.holder_keys = np.frombuffer(
            b"".join(keccak256(bytes(12) + a.tobytes() + zeros) for a in self.addresses),
            dtype=np.uint8,
        ).reshape(n_acc, 32)
        reserve = shape.created_slots
        progress(f"drawing {shape.slots:,} slots (+{reserve:,} to be created)")
        self.slot_contract, self.slot_holder = self._draw_slots(shape.slots + reserve)
        self.slot_value = np.zeros(len(self.slot_contract), dtype=np.uint64)
        self.slot_value[: shape.slots] = rng.integers(1, 2**62, shape.slots, dtype=np.uint64)
        self.live = shape.slots  # rows [0, live) hold a value; the rest are created in order
        self.height = -1
        self.hash = ZERO32

    def _draw_slots(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """Distinct (contract, holder) pairs, shuffled; contract i holds a share falling
        with i (contract 0 holds the most), as storage is concentrated on mainnet."""
        shape, rng = self.shape, self.rng
        pairs = np.empty(0, dtype=np.int64)
        while len(pairs) < rows:
            n = int((rows - len(pairs)) * 1.05) + 16
            contract = (shape.contracts * rng.random(n) ** 2).astype(np.int64)
            holder = rng.integers(shape.contracts, shape.accounts, n, dtype=np.int64)
            pairs = np.unique(np.concatenate([pairs, contract * shape.accounts + holder]))
        pairs = rng.permutation(pairs)[:rows]
        return (pairs // shape.accounts).astype(np.int32), (pairs % shape.accounts).astype(np.int32)

    # names ---------------------------------------------------------------------------

    def address(self, index: int) -> str:
        return "0x" + self.addresses[index].tobytes().hex()

    def slot_key(self, row: int) -> int:
        return int.from_bytes(self.holder_keys[self.slot_holder[row]].tobytes(), "big")

    def live_rows(self, count: int) -> np.ndarray:
        return self.rng.integers(0, self.live, count)

    def random_accounts(self, count: int) -> np.ndarray:
        return self.rng.integers(0, self.shape.accounts, count)

    # genesis -------------------------------------------------------------------------

    def genesis(self) -> VendorBlock:
        """Block 0 as the state node holds it after parsing: the whole allocation in `post`
        (built directly, not as JSON: at 10 M slots the JSON would be 1.5 GB)."""
        shape = self.shape
        post: dict[str, AccountDiff] = {}
        for i, (addr, bal) in enumerate(zip(self.addresses, self.balance.tolist(), strict=True)):
            diff = AccountDiff(balance=bal)
            if i < shape.contracts:
                diff.code = BALANCE_OF_RUNTIME
            post["0x" + addr.tobytes().hex()] = diff
        rows = np.argsort(self.slot_contract[: shape.slots], kind="stable")
        contracts = self.slot_contract[rows].tolist()
        keys = self.holder_keys[self.slot_holder[rows]]
        values = self.slot_value[rows].tolist()
        storage: dict[int, int] = {}
        current = -1
        for contract, key, value in zip(contracts, keys, values, strict=True):
            if contract != current:
                current = contract
                storage = post[self.address(contract)].storage
            storage[int.from_bytes(key.tobytes(), "big")] = value
        header = self._header(0, ZERO32, 0, 0)
        self.height, self.hash = 0, header["hash"]
        return VendorBlock(0, header["hash"], ZERO32, header, ZERO32, {}, post)

    def _header(self, height: int, parent: str, gas_used: int, bloom: int) -> dict[str, Any]:
        return {
            "hash": "0x" + self.rng.bytes(32).hex(),
            "parentHash": parent,
            "number": hex(height),
            "timestamp": hex(GENESIS_TIME + 12 * height),
            "miner": "0x" + "00" * 20,
            "gasLimit": hex(30_000_000),
            "gasUsed": hex(gas_used),
            "baseFeePerGas": hex(7),
            "difficulty": "0x0",
            "mixHash": ZERO32,
            "logsBloom": f"0x{bloom:0512x}",
        }

    # blocks --------------------------------------------------------------------------

    def next_block(self) -> bytes:
        """The next block's `trace_vendorBlock` result, as the write node serves it."""
        shape, rng = self.shape, self.rng
        height = self.height + 1
        changed = self._distinct(rng, shape.contracts, shape.accounts, shape.account_changes)
        senders, others = changed[: shape.txs], changed[shape.txs :]
        state_diff: dict[str, dict[str, dict[str, Any]]] = {"pre": {}, "post": {}}
        pre, post = state_diff["pre"], state_diff["post"]
        amounts = rng.integers(10**9, 10**13, len(changed), dtype=np.uint64)
        for i, acc in enumerate(changed.tolist()):
            addr = self.address(acc)
            old = int(self.balance[acc])
            if i < shape.txs:
                new = max(old - int(amounts[i]), 0)
                nonce = int(self.nonce[acc])
                pre[addr] = {"balance": hex(old), "nonce": hex(nonce)}
                post[addr] = {"balance": hex(new), "nonce": hex(nonce + 1)}
                self.nonce[acc] = nonce + 1
            else:
                new = old + int(amounts[i])
                pre[addr], post[addr] = {"balance": hex(old)}, {"balance": hex(new)}
            self.balance[acc] = new
        rows = self._storage_rows()
        news = rng.integers(1, 2**62, len(rows), dtype=np.uint64).tolist()
        for row, new in zip(rows.tolist(), news, strict=True):
            addr = self.address(int(self.slot_contract[row]))
            key = _word(self.slot_key(row))
            pre.setdefault(addr, {}).setdefault("storage", {})[key] = _word(
                int(self.slot_value[row])
            )
            post.setdefault(addr, {}).setdefault("storage", {})[key] = _word(new)
            self.slot_value[row] = new
        block, receipts = self._body(height, senders, others, rows)
        self.height, self.hash = height, block["hash"]
        return output_json(assemble(block, receipts, state_diff))

    @staticmethod
    def _distinct(rng: np.random.Generator, lo: int, hi: int, count: int) -> np.ndarray:
        """`count` distinct integers of [lo, hi), in random order."""
        out = np.empty(0, dtype=np.int64)
        while len(out) < count:
            out = np.unique(np.concatenate([out, rng.integers(lo, hi, count + 8)]))
        return rng.permutation(out)[:count]

    def _storage_rows(self) -> np.ndarray:
        shape = self.shape
        new = min(
            int(shape.storage_writes * shape.new_slot_share), len(self.slot_value) - self.live
        )
        old = self._distinct(self.rng, 0, self.live, shape.storage_writes - new)
        created = np.arange(self.live, self.live + new)
        self.live += new
        return np.concatenate([old, created])

    def _body(
        self, height: int, senders: np.ndarray, others: np.ndarray, rows: np.ndarray
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The block object with full transactions, and its receipts: each sender sends one
        transaction, every other one a token transfer (one Transfer log) on a written slot's
        contract."""
        rng = self.rng
        header = self._header(height, self.hash, 0, 0)
        block_hash, number = header["hash"], header["number"]
        txs, receipts = [], []
        cumulative, bloom, log_index = 0, 0, 0
        for i, sender in enumerate(senders.tolist()):
            frm = self.address(sender)
            to = self.address(int(others[i % len(others)])) if len(others) else frm
            tx_hash = "0x" + rng.bytes(32).hex()
            logs: list[dict[str, Any]] = []
            value, data, gas = hex(10**15), "0x", ETH_GAS
            receipt_bloom = 0
            if i % 2:
                token = self.address(int(self.slot_contract[rows[i % len(rows)]]))
                data = f"0x{TRANSFER_SELECTOR}{to[2:]:0>64}{10**18:064x}"
                topics = [TRANSFER_TOPIC, f"0x{frm[2:]:0>64}", f"0x{to[2:]:0>64}"]
                logs.append({
                    "address": token, "topics": topics, "data": _word(10**18),
                    "blockHash": block_hash, "blockNumber": number,
                    "blockTimestamp": header["timestamp"], "transactionHash": tx_hash,
                    "transactionIndex": hex(i), "logIndex": hex(log_index), "removed": False,
                })  # fmt: skip
                log_index += 1
                for item in (token, *topics):
                    receipt_bloom |= _bloom_bits(bytes.fromhex(item[2:]))
                to, value, gas = token, "0x0", TOKEN_GAS
            bloom |= receipt_bloom
            cumulative += gas
            nonce = hex(int(self.nonce[sender]) - 1)
            txs.append({
                "type": "0x2", "chainId": hex(CHAIN_ID), "nonce": nonce, "gas": hex(gas + 9_000),
                "maxFeePerGas": hex(2 * 10**9), "maxPriorityFeePerGas": hex(10**9),
                "to": to, "value": value, "accessList": [], "input": data,
                "r": "0x" + rng.bytes(32).hex(), "s": "0x" + rng.bytes(32).hex(),
                "yParity": "0x1", "v": "0x1", "hash": tx_hash, "blockHash": block_hash,
                "blockNumber": number, "transactionIndex": hex(i), "from": frm,
                "gasPrice": hex(10**9 + 7),
            })  # fmt: skip
            receipts.append({
                "status": "0x1", "cumulativeGasUsed": hex(cumulative), "logs": logs,
                "logsBloom": f"0x{receipt_bloom:0512x}", "type": "0x2",
                "transactionHash": tx_hash, "transactionIndex": hex(i), "blockHash": block_hash,
                "blockNumber": number, "gasUsed": hex(gas), "effectiveGasPrice": hex(10**9 + 7),
                "from": frm, "to": to, "contractAddress": None,
            })  # fmt: skip
        header["gasUsed"], header["logsBloom"] = hex(cumulative), f"0x{bloom:0512x}"
        block = {
            **header,
            "stateRoot": "0x" + rng.bytes(32).hex(),
            "transactionsRoot": "0x" + rng.bytes(32).hex(),
            "receiptsRoot": "0x" + rng.bytes(32).hex(),
            "sha3Uncles": EMPTY_UNCLES,
            "nonce": "0x0000000000000000",
            "extraData": "0x",
            "size": hex(1000 + 500 * len(txs)),
            "uncles": [],
            "transactions": txs,
        }
        return block, receipts

    def nbytes(self) -> int:
        """Memory the generator's arrays take (part of the process's RSS)."""
        arrays = (self.addresses, self.balance, self.nonce, self.holder_keys)
        arrays += (self.slot_contract, self.slot_holder, self.slot_value)
        return sum(a.nbytes for a in arrays)

"""Bring the devnet's anvil back to the write nodes' head after a crash.

The write nodes' stores are the devnet's durable record: every block they emitted is
committed (SQLite, `synchronous=FULL`) with the execution client's complete block (header,
signed transactions), its receipts and its StateDiff. anvil's own state file lags behind them
after a kill -9 (it is written every few seconds, and not atomically). Before anvil starts,
`restore_chain` compares its state file with the highest write-node store and, when the file
does not hold that store's head block, writes a state file that does: the file's own chain
up to where it agrees with the store (or nothing, when the file is missing, damaged or on
another chain), then the store's blocks, their transactions and receipts, and the accounts
with every StateDiff applied. anvil loads block headers as given, so every restored block has
its old hash, transactions and receipts, and every balance, nonce, code and storage value is
the one the write nodes stored (docs/write-node.md, "Crash recovery on the devnet").

The file layout is anvil 1.7.1's `anvil_dumpState` JSON (`block`, `accounts`,
`best_block_number`, `blocks`, `transactions`, `historical_states`); a test loads a restored
file into anvil and compares every block and receipt with the original chain.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from nodes.devnet.anvil import damaged_state_path
from nodes.writer.blockdiff import keccak256
from nodes.writer.store import BlockStore

# Fields of an execution client's block object that are not header fields.
NOT_HEADER = frozenset({"hash", "size", "totalDifficulty", "uncles", "transactions", "withdrawals"})
# Fields of a transaction object that describe where it was mined, not the transaction.
NOT_ENVELOPE = frozenset({"blockHash", "blockNumber", "blockTimestamp", "transactionIndex", "from"})
# EIP-4844 blob base fee: MIN_BASE_FEE_PER_BLOB_GAS and Cancun's update fraction.
MIN_BLOB_GASPRICE = 1
BLOB_GASPRICE_UPDATE_FRACTION = 3_338_477


class RecoveryError(RuntimeError):
    """A write node's store cannot be turned into an anvil state (the message says why)."""


class StoredChain:
    """One write node's store, opened for reading its blocks (closed by `close`)."""

    def __init__(self, key: str, path: Path) -> None:
        self.key = key
        self.store = BlockStore(path)

    def close(self) -> None:
        self.store.close()

    def head(self) -> int | None:
        head = self.store.head()
        return head.number if head is not None else None

    def output(self, number: int) -> dict[str, Any]:
        """The stored `trace_vendorBlock` result of block `number`."""
        raw = self.store.output_by_number(number)
        if raw is None:
            raise RecoveryError(f"{self.key}'s store has no block {number}")
        return orjson.loads(raw)

    def block(self, number: int) -> dict[str, Any]:
        """The execution client's block object as the write node stored it."""
        return self.output(number)["BlockFile"]["block"]


def highest_chain(stores: Sequence[tuple[str, Path]]) -> tuple[StoredChain, int] | None:
    """The write-node store with the highest head (the first of equals), and that head;
    the caller closes it."""
    best: tuple[StoredChain, int] | None = None
    for key, path in stores:
        if not path.exists():
            continue
        chain = StoredChain(key, path)
        head = chain.head()
        if head is not None and (best is None or head > best[1]):
            if best is not None:
                best[0].close()
            best = (chain, head)
        else:
            chain.close()
    return best


def read_state(path: Path) -> dict[str, Any] | None:
    """anvil's state file, or None when it is missing or damaged (a dump cut by a kill)."""
    try:
        state = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(state, dict) or not isinstance(state.get("blocks"), list):
        return None
    return state


def write_state(path: Path, state: dict[str, Any]) -> None:
    """Replace `path` atomically (a crash leaves the old file or the new one, never half)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as out:
        out.write(orjson.dumps(state))
        out.flush()
        os.fsync(out.fileno())
    tmp.replace(path)


def restore_chain(state_path: Path, stores: Sequence[tuple[str, Path]]) -> str | None:
    """Make anvil's state file hold the highest write-node store's head block. Returns one
    line saying what was found and done; None when no write node has stored a block yet."""
    found = highest_chain(stores)
    if found is None:
        if state_path.exists() and read_state(state_path) is None:
            kept = _set_aside(state_path)
            return f"anvil: its state file was damaged (kept as {kept.name}): a new chain"
        return None
    chain, head = found
    try:
        return _restore(state_path, chain, head)
    finally:
        chain.close()


def _restore(state_path: Path, chain: StoredChain, head: int) -> str:
    state = read_state(state_path)
    base: dict[str, Any] | None = None
    if state is None:
        what = "missing"
        if state_path.exists():
            what = f"damaged (kept as {_set_aside(state_path).name})"
        why = f"its state file was {what}"
    elif (moved := accounts_past_head(state)) is not None:
        why = (
            f"its state file's accounts are not the state of its head block {moved} (anvil "
            f"wrote it while mining the next block; kept as {_set_aside(state_path).name})"
        )
    else:
        use, why = _judge(state, chain, head)
        if use == KEEP:
            return f"anvil: {why}: kept"
        if use == EXTEND:
            base = state
        elif use == SET_ASIDE:
            why += f"; kept as {_set_aside(state_path).name}"
    restored = extend(base, chain, head)
    write_state(state_path, restored)
    first = 0 if base is None else int(base["best_block_number"]) + 1
    return (
        f"anvil: restored to the write nodes' head {head} from {chain.key}'s blocks "
        f"({head - first + 1} blocks written; {why})"
    )


KEEP, EXTEND, REBUILD, SET_ASIDE = "keep", "extend", "rebuild", "set aside"


def _judge(state: dict[str, Any], chain: StoredChain, head: int) -> tuple[str, str]:
    """What to do with the state file, and why: KEEP it as it is, EXTEND it with the stored
    blocks above its head, or REBUILD it from the stored blocks alone (SET_ASIDE: the same,
    keeping the file for inspection). anvil can run on the file as it is when the file has
    the stored head block, every block it has above it is its child and replayable, and its
    state at the head is what the stored blocks left: anvil writes its file in pieces, and
    one written while it mined may pair blocks with accounts of another block (which the
    file's own history does not always show)."""
    file_head = int(state.get("best_block_number", -1))
    block = chain.block(head)
    if holds(state, block):
        if leaves_at(state, block):
            return REBUILD, (
                f"its state file's blocks above {head} are not built on the write nodes' "
                f"block {head}"
            )
        unreplayable = unreplayable_above(state, head)
        if unreplayable:
            return REBUILD, (
                f"its state file has {len(unreplayable)} blocks above it that anvil can no "
                f"longer replay (from block {unreplayable[0]}); their transactions are dropped"
            )
        if (differs := state_differs(state, chain, head)) is not None:
            return SET_ASIDE, (
                f"its state file's state at block {head} is not the one the write nodes' "
                f"blocks left ({differs})"
            )
        more = f" and {file_head - head} blocks more" if file_head > head else ""
        return KEEP, f"its state file holds the write nodes' head {head}{more}"
    if 0 <= file_head < head and holds(state, chain.block(file_head)):
        if (differs := state_differs(state, chain, file_head)) is not None:
            return SET_ASIDE, (
                f"its state file's state at its head {file_head} is not the one the write "
                f"nodes' blocks left ({differs})"
            )
        return EXTEND, f"its state file ended at block {file_head}"
    return REBUILD, f"its state file holds another chain (head {file_head})"


def state_differs(state: dict[str, Any], chain: StoredChain, number: int) -> str | None:
    """The first account whose balance, nonce, code or storage in the state file at block
    `number` (its accounts at its head, else its kept state of that block) differs from
    what `chain`'s blocks left after `number`; None when all agree or the file keeps no
    state of that block."""
    if number == int(state.get("best_block_number", -1)):
        accounts = {
            a.lower(): _account_of_dump(v) for a, v in (state.get("accounts") or {}).items()
        }
    elif (kept := _historical_state(state, number)) is not None:
        accounts = _history_accounts(kept)
    else:
        return None
    stored = stored_accounts(chain.store.state_at(number))
    for address in sorted(accounts.keys() | stored.keys()):
        if accounts.get(address, _EMPTY_ACCOUNT) != stored.get(address, _EMPTY_ACCOUNT):
            return f"account {address}"
    return None


def stored_accounts(values: dict[str, str]) -> dict[str, tuple]:
    """(balance, nonce, code hash, non-zero storage) per account from a store's values
    (`BlockStore.state_at`), as `_account_of_dump` gives them for a state file."""
    fields: dict[str, dict[str, str]] = {}
    slots: dict[str, dict[str, str]] = {}
    for key, value in values.items():
        address, kind, *slot = key.split(":")
        if slot:
            slots.setdefault(address, {})[slot[0]] = value
        else:
            fields.setdefault(address, {})[kind] = value
    return {
        address: (
            _int(fields.get(address, {}).get("balance")),
            _int(fields.get(address, {}).get("nonce")),
            keccak256(bytes.fromhex(fields.get(address, {}).get("code", "0x")[2:])),
            _slots(slots.get(address) or {}),
        )
        for address in fields.keys() | slots.keys()
    }


def catch_up_writers(state_path: Path, stores: Sequence[tuple[str, Path]]) -> list[str]:
    """A write node new on an existing devnet, or behind the highest store with blocks to
    build that anvil can no longer replay (anvil restored from a store keeps no state of old
    blocks; a kept file only that of its last `state_history` blocks), takes those blocks
    from the highest store: they are the same bytes it would build itself. Without this such
    a write node would stall. Returns one line per write node that took blocks."""
    found = highest_chain(stores)
    state = read_state(state_path)
    if found is None or state is None:
        if found is not None:
            found[0].close()
        return []
    best, head = found
    lines = []
    try:
        for key, path in stores:
            if key == best.key:
                continue
            chain = StoredChain(key, path)  # a new write node's store is created
            try:
                line = _catch_up(chain, best, head, state)
            finally:
                chain.close()
            if line:
                lines.append(line)
    finally:
        best.close()
    return lines


def _catch_up(chain: StoredChain, best: StoredChain, head: int, state: dict[str, Any]) -> str:
    own = chain.head()
    if own is None:
        shared, why = -1, "new on an existing chain"
    elif own >= head:
        return ""
    else:
        shared, why = own, "anvil cannot replay them any more"
        while shared >= 0 and chain.store.hash_at(shared) != best.store.hash_at(shared):
            shared -= 1
        if shared < 0 or not unreplayable_above(state, shared):
            return ""  # another chain entirely, or anvil can replay what it misses
        chain.store.rewind(shared)
    for number in range(shared + 1, head + 1):
        raw = best.store.output_by_number(number)
        if raw is None:
            raise RecoveryError(f"{best.key}'s store has no block {number}")
        header = orjson.loads(raw)["Header"]
        chain.store.append(number, header["hash"], header["parentHash"], raw)
    return f"write node {chain.key}: {why}, took blocks {shared + 1}-{head} from {best.key}'s store"


def _set_aside(state_path: Path) -> Path:
    """Keep a damaged state file for inspection, out of anvil's way."""
    kept = damaged_state_path(state_path)
    state_path.replace(kept)
    return kept


def holds(state: dict[str, Any], block: dict[str, Any]) -> bool:
    """Whether the state file has `block` (same header fields, hence same hash) as its only
    block at that height: anvil would take any other one as its block there (a dump of
    anvil 1.7.1 lists a genesis of its own per reload; `pin_genesis` keeps one)."""
    want = header_of(block)
    number = int(block["number"], 16)
    at = [b for b in state["blocks"] if _number(b["header"]) == number]
    return len(at) == 1 and header_of(at[0]["header"]) == want


def leaves_at(state: dict[str, Any], block: dict[str, Any]) -> bool:
    """Whether the state file has a block above `block` that is not its child: a chain that
    anvil mined on another block at that height (a reload that took its own genesis)."""
    child = int(block["number"], 16) + 1
    parent = str(block["hash"]).lower()
    return any(
        str(b["header"]["parentHash"]).lower() != parent
        for b in state["blocks"]
        if _number(b["header"]) == child
    )


def header_of(block: dict[str, Any]) -> dict[str, str]:
    """The consensus header fields of an execution client's block object."""
    return {k: str(v).lower() for k, v in block.items() if k not in NOT_HEADER}


def accounts_past_head(state: dict[str, Any]) -> int | None:
    """The file's head height when its accounts are not that block's state, else None.

    anvil 1.7.1 does not dump atomically: a dump written while a block is mined can hold
    the blocks up to N but the accounts after N+1. Loaded, anvil would mine on state that no
    block of its chain produced (the write nodes' next StateDiff would not start from their
    stored state, and the state nodes would reject it for good). The file's own historical
    state of block N tells; a file without one (anvil's first dump, a restored file) is
    taken as consistent."""
    head = int(state.get("best_block_number", -1))
    kept = _historical_state(state, head)
    if kept is None:
        return None
    accounts = {a.lower(): _account_of_dump(v) for a, v in (state.get("accounts") or {}).items()}
    expected = _history_accounts(kept)
    empty = _EMPTY_ACCOUNT
    for address in accounts.keys() | expected.keys():
        if accounts.get(address, empty) != expected.get(address, empty):
            return head
    return None


_EMPTY_ACCOUNT = (0, 0, keccak256(b""), ())


def _history_accounts(kept: dict[str, Any]) -> dict[str, tuple]:
    """The accounts of one of anvil's kept block states, as `_account_of_dump` gives them."""
    storage = {a.lower(): s for a, s in (kept.get("storage") or {}).items()}
    return {
        a.lower(): _account_of_history(v, storage.get(a.lower()) or {})
        for a, v in (kept.get("accounts") or {}).items()
    }


def _historical_state(state: dict[str, Any], number: int) -> dict[str, Any] | None:
    """anvil's kept state of block `number` in a dump (`historical_states` entries are
    `[block hash, {accounts, storage, block_hashes}]`; the latter names the hashes)."""
    entries = [
        (str(e[0]).lower(), e[1])
        for e in state.get("historical_states") or []
        if isinstance(e, list | tuple) and len(e) == 2 and isinstance(e[1], dict)
    ]
    hashes: dict[str, str] = {}
    for _, kept in entries:
        for key, value in (kept.get("block_hashes") or {}).items():
            with contextlib.suppress(ValueError):
                hashes[str(value).lower()] = hex(int(str(key), 16))
    for block_hash, kept in entries:
        if hashes.get(block_hash) == hex(number):
            return kept
    return None


def _account_of_dump(account: dict[str, Any]) -> tuple[int, int, bytes, tuple]:
    """(balance, nonce, code hash, non-zero storage) of a dump's `accounts` entry."""
    code = bytes.fromhex(str(account.get("code") or "0x")[2:])
    return (
        _int(account.get("balance")),
        _int(account.get("nonce")),
        keccak256(code),
        _slots(account.get("storage") or {}),
    )


def _account_of_history(account: dict[str, Any], storage: dict[str, Any]) -> tuple:
    """The same of a historical state's account (revm's AccountInfo and its storage)."""
    code_hash = account.get("code_hash")
    return (
        _int(account.get("balance")),
        _int(account.get("nonce")),
        bytes.fromhex(str(code_hash)[2:]) if code_hash else keccak256(b""),
        _slots(storage),
    )


def _slots(storage: dict[str, Any]) -> tuple[tuple[int, int], ...]:
    values = ((_int(k), _int(v)) for k, v in storage.items())
    return tuple(sorted((k, v) for k, v in values if v))


def _int(value: Any) -> int:
    """anvil writes numbers as ints or as hex strings."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    return int(str(value), 16)


def unreplayable_above(state: dict[str, Any], number: int) -> list[int]:
    """Heights above `number` whose transactions anvil could not replay after loading the
    file (it kept no state of their parent), so a write node could not build them."""
    kept = {entry[0].lower() for entry in state.get("historical_states") or []}
    return sorted(
        _number(b["header"])
        for b in state["blocks"]
        if _number(b["header"]) > number
        and b.get("transactions")
        and str(b["header"]["parentHash"]).lower() not in kept
    )


def extend(base: dict[str, Any] | None, chain: StoredChain, head: int) -> dict[str, Any]:
    """`base` (a state file's content, or an empty chain) with `chain`'s blocks after the
    base's head up to `head` appended and their StateDiffs applied to the accounts."""
    state: dict[str, Any] = (
        {"accounts": {}, "blocks": [], "transactions": [], "historical_states": None}
        if base is None
        else dict(base)
    )
    accounts: dict[str, dict[str, Any]] = dict(state["accounts"])
    blocks, transactions = list(state["blocks"]), list(state["transactions"])
    first = 0 if base is None else int(base["best_block_number"]) + 1
    block: dict[str, Any] | None = None
    for number in range(first, head + 1):
        output = chain.output(number)
        block = output["BlockFile"]["block"]
        receipts = output["BlockFile"]["receipts"]
        txs = [] if number == 0 else block.get("transactions") or []  # 0: synthetic ones
        if len(txs) != len(receipts) and number != 0:
            raise RecoveryError(f"block {number} of {chain.key} has receipts missing")
        blocks.append(
            {
                "header": {k: v for k, v in block.items() if k not in NOT_HEADER},
                "transactions": [_pool_transaction(tx) for tx in txs],
                "ommers": [],
                "withdrawals": block.get("withdrawals") or None,
            }
        )
        transactions.extend(_mined(tx, r, block) for tx, r in zip(txs, receipts, strict=True))
        _apply(accounts, output["StateDiff"]["post"])
    if block is None:
        raise RecoveryError(f"{chain.key}'s store has no blocks after {first - 1}")
    state.update(
        block=_block_env(block, state.get("block")),
        accounts=accounts,
        best_block_number=head,
        blocks=blocks,
        transactions=transactions,
    )
    return state


def _number(header: dict[str, Any]) -> int:
    return int(str(header["number"]), 16)


def _pool_transaction(tx: dict[str, Any]) -> dict[str, Any]:
    """A transaction as anvil keeps it in a block: the signed envelope, and the sender when
    anvil made it up (an impersonated account's transaction has no real signature)."""
    envelope = {k: v for k, v in tx.items() if k not in NOT_ENVELOPE}
    if tx.get("type") not in (None, "0x0", "0x1"):
        envelope.pop("gasPrice", None)  # the effective price: not part of a 1559+ envelope
    if _quantity(tx.get("r")) == 0 and _quantity(tx.get("s")) == 0:
        # anvil_impersonateAccount: no signature; anvil takes the sender from here.
        return {"transaction": envelope, "impersonated_sender": tx["from"]}
    return {"transaction": envelope, "impersonated_sender": None}


def _quantity(value: Any) -> int | None:
    try:
        return int(str(value), 16)
    except ValueError:
        return None


def _mined(tx: dict[str, Any], receipt: dict[str, Any], block: dict[str, Any]) -> dict[str, Any]:
    """A transaction's record in anvil's state: where it was mined and its receipt. Call
    traces are not kept by the write node, so anvil has none for restored transactions."""
    ok = receipt.get("status") == "0x1"
    return {
        "info": {
            "transaction_hash": tx["hash"],
            "transaction_index": int(tx["transactionIndex"], 16),
            "from": tx["from"],
            "to": tx.get("to"),
            "contract_address": receipt.get("contractAddress"),
            "traces": [],
            "exit": "Stop" if ok else "Revert",
            "out": "0x",
            "nonce": int(tx["nonce"], 16),
            "gas_used": int(receipt["gasUsed"], 16),
        },
        "receipt": {
            "type": receipt.get("type", "0x0"),
            "status": receipt.get("status", "0x1"),
            "cumulativeGasUsed": receipt["cumulativeGasUsed"],
            "logs": [
                {"address": x["address"], "topics": x["topics"], "data": x["data"]}
                for x in receipt.get("logs") or []
            ],
            "logsBloom": receipt["logsBloom"],
        },
        "block_hash": block["hash"],
        "block_number": int(block["number"], 16),
    }


def _apply(accounts: dict[str, dict[str, Any]], post: dict[str, Any]) -> None:
    """Write one block's `post` values (every changed field, zeros included)."""
    for address, change in post.items():
        account = accounts.setdefault(
            address, {"nonce": 0, "balance": "0x0", "code": "0x", "storage": {}}
        )
        account = accounts[address] = dict(account)
        if "balance" in change:
            account["balance"] = change["balance"]
        if "nonce" in change:
            account["nonce"] = int(change["nonce"], 16)
        if "code" in change:
            account["code"] = change["code"]
        if change.get("storage"):
            account["storage"] = {**account.get("storage", {}), **change["storage"]}


def _block_env(block: dict[str, Any], previous: dict[str, Any] | None) -> dict[str, Any]:
    """anvil's block environment of the head block (the next block is built on it)."""
    excess = int(block.get("excessBlobGas") or "0x0", 16)
    return {
        "number": block["number"],
        "beneficiary": block["miner"],
        "timestamp": block["timestamp"],
        "gas_limit": int(block["gasLimit"], 16),
        "basefee": int(block.get("baseFeePerGas") or "0x0", 16),
        "difficulty": block.get("difficulty", "0x0"),
        "prevrandao": block.get("mixHash"),
        "blob_excess_gas_and_price": {
            "excess_blob_gas": excess,
            "blob_gasprice": _blob_gasprice(excess),
        },
        "slot_num": (previous or {}).get("slot_num", 0),
    }


def _blob_gasprice(excess_blob_gas: int) -> int:
    """EIP-4844 `fake_exponential(MIN_BASE_FEE_PER_BLOB_GAS, excess, UPDATE_FRACTION)`."""
    i, output, numerator_accum = 1, 0, MIN_BLOB_GASPRICE * BLOB_GASPRICE_UPDATE_FRACTION
    while numerator_accum > 0:
        output += numerator_accum
        numerator_accum = numerator_accum * excess_blob_gas // (BLOB_GASPRICE_UPDATE_FRACTION * i)
        i += 1
    return output // BLOB_GASPRICE_UPDATE_FRACTION

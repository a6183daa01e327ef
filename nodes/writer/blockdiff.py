"""Turning one block of the execution client into the four parts of `trace_vendorBlock`.

Pure functions, no I/O: the follower fetches, these encode (see docs/vendor-block.md).

The StateDiff is computed in two steps. The traces of the block's transactions (Parity
`stateDiff` replays, or the prestateTracer in `diffMode`) name every account and slot the
block may have changed; the values
are then read from the execution client at the parent block and at the block itself
(`eth_get*` with the blocks' hashes). This fills exactly what the tracer omits (zero slots
absent from `pre`, unchanged fields absent from `post`, accounts created in the block), and
drops a field changed by one transaction and restored by a later one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from Crypto.Hash import keccak

ZERO_ADDRESS = "0x" + "00" * 20
ZERO_WORD = "0x" + "00" * 32
HEADER_QUANTITIES = (
    "number",
    "timestamp",
    "gasLimit",
    "gasUsed",
    "baseFeePerGas",
    "difficulty",
    "size",
    "blobGasUsed",  # Cancun (EIP-4844)
    "excessBlobGas",
)
HEADER_DATA = (
    "hash",
    "parentHash",
    "miner",
    "stateRoot",
    "mixHash",
    "extraData",
    "logsBloom",
    "receiptsRoot",
    "transactionsRoot",
    "sha3Uncles",
    "nonce",
    "withdrawalsRoot",  # Shanghai (EIP-4895)
    "parentBeaconBlockRoot",  # Cancun (EIP-4788)
    "requestsHash",  # Prague (EIP-7685)
)
ACCOUNT_FIELDS = ("balance", "nonce", "code")


class BlockDataError(ValueError):
    """The execution client returned something that cannot be encoded (bad hex, shape)."""


def keccak256(data: bytes) -> bytes:
    return keccak.new(digest_bits=256, data=data).digest()


# -- canonical encodings ------------------------------------------------------------


def quantity(value: Any) -> str:
    """Canonical quantity: `0x` hex without leading zeros. Accepts hex strings and ints."""
    if isinstance(value, bool):
        raise BlockDataError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str):
        try:
            number = int(value, 16) if value.startswith(("0x", "0X")) else int(value, 10)
        except ValueError:
            raise BlockDataError(f"not a quantity: {value!r}") from None
    else:
        raise BlockDataError(f"not a quantity: {value!r}")
    if number < 0:
        raise BlockDataError(f"negative quantity: {value!r}")
    return hex(number)


def data(value: Any) -> str:
    """Lowercase `0x` hex bytes."""
    if not isinstance(value, str) or not value.startswith(("0x", "0X")) or len(value) % 2:
        raise BlockDataError(f"not hex data: {value!r}")
    try:
        bytes.fromhex(value[2:])
    except ValueError:
        raise BlockDataError(f"not hex data: {value!r}") from None
    return "0x" + value[2:].lower()


def word(value: Any) -> str:
    """A 32-byte storage slot or value, zero-padded, lowercase."""
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and value.startswith(("0x", "0X")) and 2 < len(value) <= 66:
        try:
            number = int(value, 16)
        except ValueError:
            raise BlockDataError(f"not a 32-byte word: {value!r}") from None
    else:
        raise BlockDataError(f"not a 32-byte word: {value!r}")
    if not 0 <= number < 2**256:
        raise BlockDataError(f"not a 32-byte word: {value!r}")
    return "0x" + number.to_bytes(32, "big").hex()


def address(value: Any) -> str:
    if not isinstance(value, str):
        raise BlockDataError(f"not an address: {value!r}")
    out = data(value if value.startswith(("0x", "0X")) else "0x" + value)
    if len(out) != 42:
        raise BlockDataError(f"not an address: {value!r}")
    return out


def canonical_json(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)


def output_json(output: dict[str, Any]) -> bytes:
    """A `trace_vendorBlock` result as stored and served: canonical JSON, except BlockFile,
    kept in the execution client's own key order (so nodes answer with the client's JSON)."""
    block_file = orjson.Fragment(orjson.dumps(output["BlockFile"]))
    return canonical_json({**output, "BlockFile": block_file})


def validation_hash(header: dict[str, Any], state_diff: dict[str, Any]) -> str:
    """keccak256 of the canonical JSON of Header and StateDiff."""
    payload = canonical_json({"Header": header, "StateDiff": state_diff})
    return "0x" + keccak256(payload).hex()


# -- header ------------------------------------------------------------------------


def make_header(block: dict[str, Any]) -> dict[str, Any]:
    """The Header part: the listed fields of the block, canonically encoded. A field the
    execution client does not have (e.g. `baseFeePerGas` before London) is left out."""
    header: dict[str, Any] = {}
    for name in HEADER_QUANTITIES:
        if block.get(name) is not None:
            header[name] = quantity(block[name])
    for name in HEADER_DATA:
        if block.get(name) is not None:
            header[name] = data(block[name])
    for name in ("hash", "parentHash", "number"):
        if name not in header:
            raise BlockDataError(f"block has no {name}")
    return header


# -- state diff -------------------------------------------------------------------------


@dataclass
class Touched:
    """Accounts and slots a block may have changed (from its traces)."""

    accounts: set[str] = field(default_factory=set)
    slots: dict[str, set[str]] = field(default_factory=dict)

    def add_account(self, addr: str) -> None:
        self.accounts.add(address(addr))

    def add_slot(self, addr: str, slot: str) -> None:
        a = address(addr)
        self.accounts.add(a)
        self.slots.setdefault(a, set()).add(word(slot))

    def reads(self) -> list[tuple[str, str, str | None]]:
        """(kind, address, slot) reads needed to value this set, in a stable order."""
        out: list[tuple[str, str, str | None]] = []
        for addr in sorted(self.accounts):
            out += [(kind, addr, None) for kind in ACCOUNT_FIELDS]
            out += [("storage", addr, slot) for slot in sorted(self.slots.get(addr, ()))]
        return out


def touched_from_traces(traces: Iterable[Any], extra: Iterable[str] = ()) -> Touched:
    """Union of the accounts and slots in every transaction's prestate diff."""
    touched = Touched()
    for item in traces:
        if not isinstance(item, dict) or "result" not in item:
            reason = item.get("error") if isinstance(item, dict) else item
            raise BlockDataError(f"transaction trace failed: {reason!r}")
        result = item["result"] or {}
        for part in ("pre", "post"):
            accounts = result.get(part) or {}
            if not isinstance(accounts, dict):
                raise BlockDataError(f"trace {part} is not an object")
            for addr, acct in accounts.items():
                touched.add_account(addr)
                for slot in (acct or {}).get("storage") or {}:
                    touched.add_slot(addr, slot)
    for addr in extra:
        touched.add_account(addr)
    return touched


def _parity_change(kind: str, delta: Any) -> tuple[str, str] | None:
    """(before, after) of one Parity stateDiff entry, canonically encoded; None for "="."""
    if delta == "=":
        return None
    if isinstance(delta, dict) and len(delta) == 1:
        (op, value), zero = next(iter(delta.items())), zero_of(kind)
        if op == "*" and isinstance(value, dict):
            return encode_value(kind, value["from"]), encode_value(kind, value["to"])
        if op == "+":
            return zero, encode_value(kind, value)
        if op == "-":
            return encode_value(kind, value), zero
    raise BlockDataError(f"unexpected stateDiff entry for {kind}: {delta!r:.200}")


def state_diff_from_parity(items: Iterable[Any]) -> dict[str, Any]:
    """The block's StateDiff from its transactions' Parity `stateDiff` replays
    (`trace_replayBlockTransactions(block, ["stateDiff"])`): each field's value before the
    first transaction that changed it and after the last one. These replays state every
    changed value explicitly ("=" marks the unchanged), so nothing has to be read back."""
    first: dict[tuple[str, str, str | None], str] = {}
    last: dict[tuple[str, str, str | None], str] = {}
    for item in items:
        diff = item.get("stateDiff") if isinstance(item, dict) else None
        if not isinstance(diff, dict):
            raise BlockDataError(f"transaction replay has no stateDiff: {item!r:.200}")
        for raw_addr, acct in diff.items():
            addr = address(raw_addr)
            if not isinstance(acct, dict):
                raise BlockDataError(f"stateDiff of {addr} is not an object")
            changes = [((kind, addr, None), acct.get(kind, "=")) for kind in ACCOUNT_FIELDS]
            changes += [
                (("storage", addr, word(slot)), delta)
                for slot, delta in (acct.get("storage") or {}).items()
            ]
            for key, delta in changes:
                change = _parity_change(key[0], delta)
                if change is not None:
                    first.setdefault(key, change[0])
                    last[key] = change[1]
    reads = sorted(first, key=lambda k: (k[1], k[0] == "storage", k[0], k[2] or ""))
    return make_state_diff(reads, [first[k] for k in reads], [last[k] for k in reads])


def read_calls(reads: list[tuple[str, str, str | None]], block_hash: str) -> list[tuple[str, list]]:
    """JSON-RPC calls reading each value at exactly `block_hash` (EIP-1898)."""
    at = {"blockHash": block_hash}
    calls: list[tuple[str, list]] = []
    for kind, addr, slot in reads:
        if kind == "balance":
            calls.append(("eth_getBalance", [addr, at]))
        elif kind == "nonce":
            calls.append(("eth_getTransactionCount", [addr, at]))
        elif kind == "code":
            calls.append(("eth_getCode", [addr, at]))
        else:
            calls.append(("eth_getStorageAt", [addr, slot, at]))
    return calls


def encode_value(kind: str, value: Any) -> str:
    if kind in ("balance", "nonce"):
        return quantity(value)
    if kind == "code":
        return data(value)
    return word(value)


def make_state_diff(
    reads: list[tuple[str, str, str | None]], before: list[Any], after: list[Any]
) -> dict[str, Any]:
    """`pre`/`post` holding exactly the fields and slots whose value differs."""
    pre: dict[str, dict[str, Any]] = {}
    post: dict[str, dict[str, Any]] = {}
    for (kind, addr, slot), old_raw, new_raw in zip(reads, before, after, strict=True):
        old, new = encode_value(kind, old_raw), encode_value(kind, new_raw)
        if old == new:
            continue
        pre_acct, post_acct = pre.setdefault(addr, {}), post.setdefault(addr, {})
        if slot is None:
            pre_acct[kind], post_acct[kind] = old, new
        else:
            pre_acct.setdefault("storage", {})[slot] = old
            post_acct.setdefault("storage", {})[slot] = new
    return {"pre": pre, "post": post}


def diff_values(part: dict[str, Any]) -> list[tuple[str, str]]:
    """(value key, value) of every field and slot in one side (`pre` or `post`) of a
    StateDiff; the key names the field: `<address>:<kind>` or `<address>:storage:<slot>`."""
    out: list[tuple[str, str]] = []
    for addr, acct in part.items():
        out += [(f"{addr}:{kind}", acct[kind]) for kind in ACCOUNT_FIELDS if kind in acct]
        out += [(f"{addr}:storage:{slot}", v) for slot, v in (acct.get("storage") or {}).items()]
    return out


def zero_of_key(key: str) -> str:
    """The value a field or slot has before anything wrote it (see `diff_values`)."""
    return zero_of(key.split(":")[1])


def assemble(block: dict[str, Any], receipts: list[Any], state_diff: dict[str, Any]) -> dict:
    """The complete `trace_vendorBlock` result for one block."""
    header = make_header(block)
    return {
        "BlockFile": {"block": block, "receipts": receipts},
        "Header": header,
        "StateDiff": state_diff,
        "ValidationHash": validation_hash(header, state_diff),
    }


# -- genesis ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GenesisAccount:
    address: str
    balance: str
    nonce: str
    code: str
    storage: dict[str, str]


def parse_alloc(genesis: dict[str, Any]) -> list[GenesisAccount]:
    """The `alloc` of a geth-style genesis file, canonically encoded, sorted by address."""
    alloc = genesis.get("alloc")
    if not isinstance(alloc, dict):
        raise BlockDataError("genesis file has no `alloc` object")
    accounts = []
    for raw_addr, entry in alloc.items():
        if not isinstance(entry, dict):
            raise BlockDataError(f"genesis alloc entry for {raw_addr} is not an object")
        storage = {word(k): word(v) for k, v in (entry.get("storage") or {}).items()}
        accounts.append(
            GenesisAccount(
                address=address(raw_addr),
                balance=quantity(entry.get("balance", "0x0")),
                nonce=quantity(entry.get("nonce", "0x0")),
                code=data(entry.get("code", "0x")),
                storage={k: v for k, v in storage.items() if v != ZERO_WORD},
            )
        )
    return sorted(accounts, key=lambda a: a.address)


def genesis_reads(alloc: list[GenesisAccount]) -> list[tuple[str, str, str | None]]:
    out: list[tuple[str, str, str | None]] = []
    for acct in alloc:
        out += [(kind, acct.address, None) for kind in ACCOUNT_FIELDS]
        out += [("storage", acct.address, slot) for slot in sorted(acct.storage)]
    return out


def genesis_values(alloc: list[GenesisAccount]) -> list[str]:
    """The allocation's values in the order of `genesis_reads`."""
    out: list[str] = []
    for acct in alloc:
        out += [acct.balance, acct.nonce, acct.code]
        out += [acct.storage[slot] for slot in sorted(acct.storage)]
    return out


def zero_of(kind: str) -> str:
    return {"balance": "0x0", "nonce": "0x0", "code": "0x"}.get(kind, ZERO_WORD)


def synthetic_transaction(acct: GenesisAccount) -> dict[str, Any]:
    return {
        "hash": "0x" + keccak256(f"genesis:{acct.address}".encode()).hex(),
        "from": ZERO_ADDRESS,
        "to": acct.address,
        "value": acct.balance,
        "input": "0x",
        "synthetic": True,
    }


def assemble_genesis(block: dict[str, Any], alloc: list[GenesisAccount]) -> dict[str, Any]:
    """Height 0: the allocation as synthetic transactions and as `post` over a zero `pre`."""
    reads = genesis_reads(alloc)
    state_diff = make_state_diff(
        reads, [zero_of(kind) for kind, _, _ in reads], genesis_values(alloc)
    )
    block = dict(block)
    block["transactions"] = [synthetic_transaction(acct) for acct in alloc]
    return assemble(block, [], state_diff)

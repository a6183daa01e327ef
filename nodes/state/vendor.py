"""Parse and check one `trace_vendorBlock` result (docs/vendor-block.md) before it is stored.

Everything the store writes comes through here, so a malformed or tampered block from the
source is rejected as a whole and never half-applied.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import orjson
from Crypto.Hash import keccak

from chainstate.hexcodec import decode_data, is_address, is_hash, is_quantity
from nodes.state.blockbody import BlockBody, BlockBodyError, parse_block_body
from nodes.state.blocklogs import BlockLog, BlockLogsError, parse_block_logs
from nodes.state.hexbulk import all_hex

ACCOUNT_FIELDS = ("balance", "nonce", "code", "storage")
_FIELDS = frozenset(ACCOUNT_FIELDS)
_QUANTITIES = re.compile(r"(?:0x(?:0|[1-9a-f][0-9a-f]*),)*")  # lowercase quantities, each + ","


class VendorBlockError(ValueError):
    """The source sent a block that does not follow docs/vendor-block.md."""


@dataclass(slots=True)
class AccountDiff:
    """Fields of one account in `pre` or `post`; None = field not listed."""

    balance: int | None = None
    nonce: int | None = None
    code: bytes | None = None
    storage: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class VendorBlock:
    number: int
    hash: str
    parent_hash: str
    header: dict[str, Any]
    validation_hash: str
    pre: dict[str, AccountDiff]
    post: dict[str, AccountDiff]
    logs: tuple[BlockLog, ...] = ()  # from BlockFile's receipts, checked against the Header
    body: BlockBody | None = None  # BlockFile's block and receipts, checked against the Header
    # (key prefix, value) of every version `post` writes, in key order, as the store encodes
    # them (nodes.state.store.block_writes): encoded once, by the first store to apply the
    # block, for the hot view and any other store applying it too. Not an init field, so a
    # block made from another with `dataclasses.replace` (another `post`) encodes its own.
    writes: tuple[tuple[bytes, bytes], ...] | None = field(
        default=None, init=False, compare=False, repr=False
    )


def keccak256(data: bytes) -> bytes:
    return keccak.new(digest_bits=256, data=data).digest()


def compute_validation_hash(header: dict[str, Any], state_diff: dict[str, Any]) -> str:
    """keccak256 of the canonical JSON of Header and StateDiff (docs/vendor-block.md)."""
    canonical = orjson.dumps(
        {"Header": header, "StateDiff": state_diff}, option=orjson.OPT_SORT_KEYS
    )
    return "0x" + keccak256(canonical).hex()


def parse_vendor_block(obj: Any, *, verify_hash: bool = True) -> VendorBlock:
    """Decode and check a `trace_vendorBlock` result; raises VendorBlockError."""
    if not isinstance(obj, dict):
        raise VendorBlockError("trace_vendorBlock result is not an object")
    header = obj.get("Header")
    diff = obj.get("StateDiff")
    vhash = obj.get("ValidationHash")
    if not isinstance(header, dict) or not isinstance(diff, dict):
        raise VendorBlockError("Header and StateDiff must be objects")
    vhash = _hash(vhash, "ValidationHash")
    number = _quantity(header.get("number"), "Header.number")
    block_hash = _hash(header.get("hash"), "Header.hash")
    parent = _hash(header.get("parentHash"), "Header.parentHash")
    for name in ("timestamp", "gasLimit", "gasUsed"):
        _quantity(header.get(name), f"Header.{name}")
    for name in ("baseFeePerGas", "difficulty"):
        if header.get(name) is not None:
            _quantity(header[name], f"Header.{name}")
    _address(header.get("miner"), "Header.miner")
    if verify_hash and compute_validation_hash(header, diff) != vhash:
        raise VendorBlockError(f"block {number}: ValidationHash does not match Header+StateDiff")
    pre = _diff_side(diff.get("pre", {}), "pre")
    post = _diff_side(diff.get("post", {}), "post")
    try:
        logs = parse_block_logs(obj.get("BlockFile"), header)
        body = parse_block_body(obj.get("BlockFile"), header)
    except (BlockLogsError, BlockBodyError) as exc:
        raise VendorBlockError(str(exc)) from None
    return VendorBlock(number, block_hash, parent, header, vhash, pre, post, logs, body)


def _diff_side(side: Any, name: str) -> dict[str, AccountDiff]:
    if not isinstance(side, dict):
        raise VendorBlockError(f"StateDiff.{name} must be an object")
    accounts = _decoded_side(side) if _side_ok(side) else None
    return _checked_side(side, name) if accounts is None else accounts


def _side_ok(side: dict[Any, Any]) -> bool:
    """Whether every address, quantity and slot of a side is well formed, checked in bulk:
    all addresses at once, all balances and nonces, all slots and their values (a block
    lists thousands; a call and a match for each cost more than the block's decoding).
    Codes are checked as they are decoded."""
    try:
        if not all_hex(list(side), 42):
            return False
        fields_ = list(side.values())
        for f in fields_:
            if type(f) is not dict or not f.keys() <= _FIELDS:
                return False
        quantities = [f["balance"] for f in fields_ if "balance" in f]
        quantities += [f["nonce"] for f in fields_ if "nonce" in f]
        joined = ",".join([*quantities, ""])  # (a value holding a comma changes the count)
        if joined.count(",") != len(quantities) or _QUANTITIES.fullmatch(joined) is None:
            return False
        storages = [f["storage"] for f in fields_ if "storage" in f]
        for storage in storages:
            if type(storage) is not dict:
                return False
        slots = list(chain.from_iterable(storages))
        slots += chain.from_iterable(map(dict.values, storages))
        return all_hex(slots, 66)
    except TypeError:  # a key or value that is not a string
        return False


def _decoded_side(side: dict[str, dict[str, Any]]) -> dict[str, AccountDiff] | None:
    """The accounts of a side `_side_ok` passed; None when a code is not hex bytes."""
    out: dict[str, AccountDiff] = {}
    for addr, f in side.items():
        balance, nonce, storage = f.get("balance"), f.get("nonce"), f.get("storage")
        code = None
        if "code" in f and (code := decode_data(f["code"], lower=True)) is None:
            return None
        out[addr] = AccountDiff(
            None if balance is None else int(balance, 16),
            None if nonce is None else int(nonce, 16),
            code,
            {int(slot, 16): int(value, 16) for slot, value in storage.items()} if storage else {},
        )
    return out


def _checked_side(side: dict[Any, Any], name: str) -> dict[str, AccountDiff]:
    """A side that failed the bulk check, account by account, to name what is wrong."""
    out: dict[str, AccountDiff] = {}
    for addr, fields_ in side.items():
        if not (
            is_address(addr, lower=True) and type(fields_) is dict and fields_.keys() <= _FIELDS
        ):
            _reject_account(name, addr, fields_)
        out[addr] = _account(fields_, f"StateDiff.{name}", addr)
    return out


def _reject_account(name: str, addr: Any, fields_: Any) -> None:
    """Raise the error of an account entry that is not an address → object of known fields."""
    where = f"StateDiff.{name}[{addr!r}]"
    _address(addr, f"StateDiff.{name} address")
    if not isinstance(fields_, dict):
        raise VendorBlockError(f"{where} must be an object")
    unknown = set(fields_) - _FIELDS
    raise VendorBlockError(f"{where}: unknown fields {sorted(unknown)}")


def _account(fields_: dict[str, Any], side: str, addr: str) -> AccountDiff:
    """One account's fields (the error messages are built only for a bad value: a block
    lists hundreds of accounts)."""
    acc = AccountDiff()
    if "balance" in fields_:
        value = fields_["balance"]
        ok = is_quantity(value, lower=True)
        acc.balance = int(value, 16) if ok else _quantity(value, f"{side}[{addr!r}].balance")
    if "nonce" in fields_:
        value = fields_["nonce"]
        ok = is_quantity(value, lower=True)
        acc.nonce = int(value, 16) if ok else _quantity(value, f"{side}[{addr!r}].nonce")
    if "code" in fields_:
        acc.code = _data(fields_["code"], f"{side}[{addr!r}].code")
    if "storage" in fields_:
        storage = fields_["storage"]
        if not isinstance(storage, dict):
            raise VendorBlockError(f"{side}[{addr!r}].storage must be an object")
        if storage:
            acc.storage = _storage(storage, f"{side}[{addr!r}]")
    return acc


def _storage(storage: dict[Any, Any], where: str) -> dict[int, int]:
    """Slot → value of one account's storage, every key and value a lowercase 32-byte hash.

    A block writes thousands of slots: all of them are checked by one match over their
    concatenation (a wrong one is then looked for one by one, to name it)."""
    try:
        ok = all_hex([*storage, *storage.values()], 66)
    except TypeError:  # a value that is not a string
        ok = False
    if not ok:
        for slot, value in storage.items():
            _hash(slot, f"{where} slot")
            _hash(value, f"{where} slot value")
    return {int(slot, 16): int(value, 16) for slot, value in storage.items()}


def _quantity(value: Any, what: str) -> int:
    if is_quantity(value, lower=True):
        return int(value, 16)
    raise VendorBlockError(f"{what}: expected a lowercase 0x hex quantity, got {value!r:.80}")


def _hash(value: Any, what: str) -> str:
    if is_hash(value, lower=True):
        return value
    raise VendorBlockError(f"{what}: expected a lowercase 32-byte 0x hash, got {value!r:.80}")


def _address(value: Any, what: str) -> str:
    if is_address(value, lower=True):
        return value
    raise VendorBlockError(f"{what}: expected a lowercase 0x address, got {value!r:.80}")


def _data(value: Any, what: str) -> bytes:
    data = decode_data(value, lower=True)
    if data is not None:
        return data
    raise VendorBlockError(f"{what}: expected lowercase 0x hex bytes")

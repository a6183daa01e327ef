"""Parse and check one `trace_vendorBlock` result (docs/vendor-block.md) before it is stored.

Everything the store writes comes through here, so a malformed or tampered block from the
source is rejected as a whole and never half-applied.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from Crypto.Hash import keccak

from chainstate.hexcodec import decode_data, is_address, is_hash, is_quantity
from nodes.state.blockbody import BlockBody, BlockBodyError, parse_block_body
from nodes.state.blocklogs import BlockLog, BlockLogsError, parse_block_logs

ACCOUNT_FIELDS = ("balance", "nonce", "code", "storage")


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
    out: dict[str, AccountDiff] = {}
    for addr, fields_ in side.items():
        where = f"StateDiff.{name}[{addr!r}]"
        addr = _address(addr, f"StateDiff.{name} address")
        if not isinstance(fields_, dict):
            raise VendorBlockError(f"{where} must be an object")
        unknown = set(fields_) - set(ACCOUNT_FIELDS)
        if unknown:
            raise VendorBlockError(f"{where}: unknown fields {sorted(unknown)}")
        acc = AccountDiff()
        if "balance" in fields_:
            acc.balance = _quantity(fields_["balance"], f"{where}.balance")
        if "nonce" in fields_:
            acc.nonce = _quantity(fields_["nonce"], f"{where}.nonce")
        if "code" in fields_:
            acc.code = _data(fields_["code"], f"{where}.code")
        storage = fields_.get("storage", {})
        if not isinstance(storage, dict):
            raise VendorBlockError(f"{where}.storage must be an object")
        for slot, value in storage.items():
            acc.storage[int(_hash(slot, f"{where} slot"), 16)] = int(
                _hash(value, f"{where} slot value"), 16
            )
        out[addr] = acc
    return out


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

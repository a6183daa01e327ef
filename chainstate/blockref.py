"""Block references: one parser for every way a request names a block.

Used by the proxy (to route by the targeted block) and by the state node (to answer at it):
eth_* `blockNumber` params (tags, hex heights, EIP-1898 objects, bare hashes), the vendor
`blockCtx` (`{"block_id", "type": "Equals"|"Contains"}`) and plain block ids.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from chainstate.jsonrpc import INVALID_BLOCK_ID, JsonRpcError

TAGS = frozenset({"latest", "pending", "safe", "finalized", "earliest"})
_HEX_HEIGHT = re.compile(r"^0x(0|[1-9a-fA-F][0-9a-fA-F]{0,15})$")
_DEC_HEIGHT = re.compile(r"^(0|[1-9][0-9]{0,19})$")
_HASH = re.compile(r"^0x[0-9a-fA-F]{64}$")
MAX_HEIGHT = 2**63 - 1


@dataclass(frozen=True, slots=True)
class BlockRef:
    """Exactly one of tag, number, hash is set. `contains` is the vendor `Contains` type."""

    tag: str | None = None
    number: int | None = None
    hash: str | None = None
    contains: bool = False
    require_canonical: bool = False

    @property
    def is_latest_like(self) -> bool:
        return self.tag in ("latest", "pending", "safe", "finalized")

    def describe(self) -> str:
        if self.tag is not None:
            return self.tag
        if self.number is not None:
            return str(self.number)
        return str(self.hash)


LATEST = BlockRef(tag="latest")


def _bad(value: Any) -> JsonRpcError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return JsonRpcError(INVALID_BLOCK_ID, f"invalid block id: {shown}")


def parse_block_id(value: Any, *, contains: bool = False) -> BlockRef:
    """A block id: tag, hex or decimal height, integer height, or 32-byte hash."""
    if isinstance(value, bool):
        raise _bad(value)
    if isinstance(value, int):
        if 0 <= value <= MAX_HEIGHT:
            return BlockRef(number=value, contains=contains)
        raise _bad(value)
    if not isinstance(value, str):
        raise _bad(value)
    return _text_block_id(value, contains)


# Requests name the same few blocks again and again (tags, the recent heights): a string is
# parsed once and its (immutable) BlockRef shared. Bounded; failures are not kept.
@functools.lru_cache(maxsize=4096)
def _text_block_id(value: str, contains: bool) -> BlockRef:
    if value in TAGS:
        return BlockRef(tag=value, contains=contains)
    if _HASH.fullmatch(value):
        return BlockRef(hash=value.lower(), contains=contains)
    if _HEX_HEIGHT.fullmatch(value):
        return BlockRef(number=int(value, 16), contains=contains)
    if _DEC_HEIGHT.fullmatch(value) and int(value) <= MAX_HEIGHT:
        return BlockRef(number=int(value), contains=contains)
    raise _bad(value)


@functools.lru_cache(maxsize=4096)
def _text_block_number(value: str) -> BlockRef:
    if value in TAGS or _HASH.fullmatch(value) or _HEX_HEIGHT.fullmatch(value):
        return _text_block_id(value, False)
    raise _bad(value)


def parse_block_number_param(value: Any, default: BlockRef | None = LATEST) -> BlockRef:
    """An eth_* `blockNumber` param: tag, hex height, bare hash, or an EIP-1898 object."""
    if type(value) is str:  # the common case first (each item of a batch comes here)
        return _text_block_number(value)
    if value is None:
        if default is None:
            raise _bad(value)
        return default
    if isinstance(value, dict):
        if "blockHash" in value and "blockNumber" not in value:
            h = value["blockHash"]
            if not (isinstance(h, str) and _HASH.fullmatch(h)):
                raise _bad(value)
            return BlockRef(hash=h.lower(), require_canonical=bool(value.get("requireCanonical")))
        if "blockNumber" in value and "blockHash" not in value:
            return parse_block_number_param(value["blockNumber"], default=None)
        raise _bad(value)
    if isinstance(value, str):
        return _text_block_number(value)
    raise _bad(value)


def parse_block_ctx(value: Any) -> BlockRef:
    """The vendor `blockCtx` object; omitted means latest (Equals)."""
    if value is None:
        return LATEST
    if not isinstance(value, dict):
        raise _bad(value)
    kind = value.get("type", "Equals")
    if kind not in ("Equals", "Contains"):
        msg = f'invalid blockCtx type {kind!r}: expected "Equals" or "Contains"'
        raise JsonRpcError(INVALID_BLOCK_ID, msg)
    block_id = value.get("block_id", "latest")
    return parse_block_id(block_id, contains=kind == "Contains")

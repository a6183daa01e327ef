"""Strict hex codecs for Ethereum quantities, data, addresses and hashes."""

from __future__ import annotations

import re

from chainstate.jsonrpc import INVALID_PARAMS, JsonRpcError

_QUANTITY = re.compile(r"^0x(0|[1-9a-fA-F][0-9a-fA-F]*)$")
_DATA = re.compile(r"^0x([0-9a-fA-F]{2})*$")
_ADDRESS = re.compile(r"^0x[0-9a-fA-F]{40}$")
_HASH = re.compile(r"^0x[0-9a-fA-F]{64}$")

UINT256_MAX = 2**256 - 1


def to_hex(value: int) -> str:
    """Quantity encoding: 0x-prefixed, no leading zeros."""
    return hex(value)


def to_data(value: bytes) -> str:
    return "0x" + value.hex()


def to_hash32(value: int | bytes) -> str:
    if isinstance(value, int):
        return "0x" + value.to_bytes(32, "big").hex()
    return "0x" + value.rjust(32, b"\0").hex()


def parse_quantity(value: object, what: str = "quantity", lenient: bool = False) -> int:
    """Parse a hex quantity. `lenient` accepts leading zeros (as geth does for slots)."""
    if isinstance(value, str):
        if _QUANTITY.match(value):
            return int(value, 16)
        if lenient and re.match(r"^0x[0-9a-fA-F]{1,64}$", value):
            return int(value, 16)
    raise JsonRpcError(INVALID_PARAMS, f"invalid {what}: expected a 0x-prefixed hex quantity")


def parse_data(value: object, what: str = "data") -> bytes:
    if isinstance(value, str) and _DATA.match(value):
        return bytes.fromhex(value[2:])
    raise JsonRpcError(INVALID_PARAMS, f"invalid {what}: expected 0x-prefixed hex bytes")


def parse_address(value: object, what: str = "address") -> str:
    """Returns the lowercase 0x address."""
    if isinstance(value, str) and _ADDRESS.match(value):
        return value.lower()
    raise JsonRpcError(INVALID_PARAMS, f"invalid {what}: expected a 20-byte 0x address")


def parse_hash(value: object, what: str = "hash") -> str:
    """Returns the lowercase 0x 32-byte hash."""
    if isinstance(value, str) and _HASH.match(value):
        return value.lower()
    raise JsonRpcError(INVALID_PARAMS, f"invalid {what}: expected a 32-byte 0x hash")


def is_hash(value: object) -> bool:
    return isinstance(value, str) and bool(_HASH.match(value))

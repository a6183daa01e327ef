"""Strict hex codecs for Ethereum quantities, data, addresses and hashes.

Every check here takes time linear in the text, with a small constant: calldata, code and
log data can be megabytes, and they are checked on the event loop. (A pattern such as
`^0x([0-9a-fA-F]{2})*$` repeats a group per byte: ~1 s per 5 MB on this project's VMs.)
`fullmatch`, never `^…$` with `match`: `$` also matches before a trailing newline.
"""

from __future__ import annotations

import binascii
import re

from chainstate.jsonrpc import INVALID_PARAMS, JsonRpcError

_QUANTITY = re.compile(r"0x(?:0|[1-9a-fA-F][0-9a-fA-F]*)")
_LENIENT = re.compile(r"0x[0-9a-fA-F]{1,64}")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}")
_HASH = re.compile(r"0x[0-9a-fA-F]{64}")
_QUANTITY_LOWER = re.compile(r"0x(?:0|[1-9a-f][0-9a-f]*)")
_ADDRESS_LOWER = re.compile(r"0x[0-9a-f]{40}")
_HASH_LOWER = re.compile(r"0x[0-9a-f]{64}")

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


# ---- checks (bool), shared by every component ------------------------------------------


def decode_data(value: object, lower: bool = False) -> bytes | None:
    """The bytes of `0x`-prefixed hex data with an even number of digits, or None.
    `lower`: uppercase digits are refused (the vendor block format is lowercase).
    binascii decodes in C and refuses anything but hex digits (no whitespace, unlike
    `bytes.fromhex`)."""
    if type(value) is not str or not value.startswith("0x"):
        return None
    if lower and not value.islower():  # ("0x…" has a cased `x`: digits alone pass)
        return None
    try:
        return binascii.a2b_hex(value[2:])
    except (binascii.Error, ValueError):  # odd length, a non-hex or non-ASCII character
        return None


def is_data(value: object, lower: bool = False) -> bool:
    return decode_data(value, lower) is not None


def is_quantity(value: object, lower: bool = False) -> bool:
    pattern = _QUANTITY_LOWER if lower else _QUANTITY
    return type(value) is str and pattern.fullmatch(value) is not None


def is_address(value: object, lower: bool = False) -> bool:
    pattern = _ADDRESS_LOWER if lower else _ADDRESS
    return type(value) is str and len(value) == 42 and pattern.fullmatch(value) is not None


def is_hash(value: object, lower: bool = False) -> bool:
    pattern = _HASH_LOWER if lower else _HASH
    return type(value) is str and len(value) == 66 and pattern.fullmatch(value) is not None


# ---- parsers for JSON-RPC params (-32602 on anything else) -------------------------------


def parse_quantity(value: object, what: str = "quantity", lenient: bool = False) -> int:
    """Parse a hex quantity. `lenient` accepts leading zeros (as geth does for slots)."""
    if isinstance(value, str):
        if _QUANTITY.fullmatch(value):
            return int(value, 16)
        if lenient and _LENIENT.fullmatch(value):
            return int(value, 16)
    raise JsonRpcError(INVALID_PARAMS, f"invalid {what}: expected a 0x-prefixed hex quantity")


def parse_data(value: object, what: str = "data") -> bytes:
    data = decode_data(value)
    if data is None:
        raise JsonRpcError(INVALID_PARAMS, f"invalid {what}: expected 0x-prefixed hex bytes")
    return data


def parse_address(value: object, what: str = "address") -> str:
    """Returns the lowercase 0x address."""
    if is_address(value):
        return value.lower()  # type: ignore[union-attr]
    raise JsonRpcError(INVALID_PARAMS, f"invalid {what}: expected a 20-byte 0x address")


def parse_hash(value: object, what: str = "hash") -> str:
    """Returns the lowercase 0x 32-byte hash."""
    if is_hash(value):
        return value.lower()  # type: ignore[union-attr]
    raise JsonRpcError(INVALID_PARAMS, f"invalid {what}: expected a 32-byte 0x hash")

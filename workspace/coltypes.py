"""Logical column types: how a JSON value is checked and stored, and how it reads back.

Storage is chosen so that SQL comparison and ORDER BY on the stored value follow the logical
order on both SQLite and PostgreSQL: UINT256/TOKENID are zero-padded 78-digit text, DECIMAL is
an order-preserving text encoding, BOOLEAN is 0/1. Reads return 64-bit integers (INT,
BLOCKHEIGHT, TIMESTAMP), UINT256, TOKENID and DECIMAL as strings (spec convention 7).
"""

from __future__ import annotations

import decimal
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UINT256_MAX = 2**256 - 1
FLOAT_EXACT = 2**53  # floats are exact integers only up to here (1e30 is 1000…19884624838656)
_DEC_INT_DIGITS, _DEC_FRAC_DIGITS = 40, 38
_DEC_RANGE = f"must have at most {_DEC_INT_DIGITS} integer and {_DEC_FRAC_DIGITS} fraction digits"
_DEC_MAX_CHARS = 1000  # a longer text is no decimal these columns can hold
_HEX40 = re.compile(r"0x[0-9a-fA-F]{40}")
_HEX64 = re.compile(r"0x[0-9a-fA-F]{64}")
_DIGITS = re.compile(r"[0-9]+")
_SIGNED = re.compile(r"-?[0-9]+")
MAX_INT_DIGITS = 78  # 2^256 - 1 has 78 digits: no integer column holds a longer one


class BadValue(ValueError):
    """A value that does not fit its column type; the message says why."""


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise BadValue("must be a string")
    if "\x00" in v:
        raise BadValue("must not contain NUL characters")
    return v


def _address(v: Any) -> str:
    if not isinstance(v, str) or not _HEX40.fullmatch(v):
        raise BadValue("must be a 0x-prefixed 20-byte hex address")
    return v.lower()


def _hash(v: Any) -> str:
    if not isinstance(v, str) or not _HEX64.fullmatch(v):
        raise BadValue("must be a 0x-prefixed 32-byte hex hash")
    return v.lower()


def _chain_id(v: Any) -> str:
    if not isinstance(v, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", v):
        raise BadValue("must be a chain id (1-64 of A-Z a-z 0-9 _ -)")
    return v


def _integer(v: Any, lo: int, hi: int, what: str) -> int:
    if isinstance(v, str) and _SIGNED.fullmatch(v.strip()):
        text = v.strip()
        digits = text.lstrip("-").lstrip("0") or "0"
        if len(digits) > MAX_INT_DIGITS:  # beyond every column's range (and Python's int limit)
            raise BadValue(f"must be {what} between {lo} and {hi}")
        v = -int(digits) if text.startswith("-") else int(digits)
    elif isinstance(v, float) and v.is_integer():
        if abs(v) > FLOAT_EXACT:
            raise BadValue(
                f"must be {what}; a JSON number above 2^53 is not exact, "
                "send it as a JSON integer or a decimal string"
            )
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadValue(f"must be {what} (a JSON integer or a decimal string)")
    if not lo <= v <= hi:
        raise BadValue(f"must be {what} between {lo} and {hi}")
    return v


def _int64(v: Any) -> int:
    return _integer(v, INT64_MIN, INT64_MAX, "a 64-bit integer")


def _uint64(v: Any) -> int:
    return _integer(v, 0, INT64_MAX, "a non-negative 64-bit integer")


def _uint256(v: Any) -> str:
    if isinstance(v, str) and v.startswith(("0x", "0X")) and re.fullmatch(r"0[xX][0-9a-fA-F]+", v):
        v = int(v, 16)
    n = _integer(v, 0, UINT256_MAX, "an unsigned 256-bit integer")
    return str(n).zfill(78)


def _uint256_out(v: Any) -> Any:
    return None if v is None else (str(v).lstrip("0") or "0")


def _float(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise BadValue("must be a number")
    f = float(v)
    if not math.isfinite(f):
        raise BadValue("must be a finite number")
    return f


def _bool(v: Any) -> int:
    if not isinstance(v, bool):
        raise BadValue("must be true or false")
    return int(v)


def _complement(digits: str) -> str:
    return digits.translate(str.maketrans("0123456789", "9876543210"))


def decimal_encode(v: Any) -> str:
    """Order-preserving text for a decimal: 'p' + 40 integer digits + '.' + fraction for
    values >= 0; 'n' + nines' complement + '~' for negatives (so text order = numeric order)."""
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise BadValue("must be a decimal number or a decimal string")
    if isinstance(v, int) and abs(v) >= 10**_DEC_INT_DIGITS:
        raise BadValue(_DEC_RANGE)
    text = v.strip() if isinstance(v, str) else repr(v)
    if len(text) > _DEC_MAX_CHARS:
        raise BadValue(f"must be a decimal of at most {_DEC_MAX_CHARS} characters")
    try:
        d = decimal.Decimal(text)
    except decimal.InvalidOperation:
        raise BadValue("must be a decimal number or a decimal string") from None
    if not d.is_finite():
        raise BadValue("must be a finite decimal")
    if not d:
        return f"p{'0' * _DEC_INT_DIGITS}."  # zero, whatever its sign or exponent
    _check_decimal_digits(d)  # before any formatting: 1e1000000 must not be expanded
    text = format(d.copy_abs(), "f")
    whole, _, frac = text.partition(".")
    frac = frac.rstrip("0")
    whole = whole.lstrip("0")
    if len(whole) > _DEC_INT_DIGITS or len(frac) > _DEC_FRAC_DIGITS:
        raise BadValue(_DEC_RANGE)
    whole = whole.zfill(_DEC_INT_DIGITS)
    if d >= 0 or (not whole.strip("0") and not frac):
        return f"p{whole}.{frac}"
    return f"n{_complement(whole)}.{_complement(frac)}~"


def _check_decimal_digits(d: decimal.Decimal) -> None:
    """Refuse a decimal with too many integer or fraction digits from its exponent alone."""
    _, digits, exponent = d.as_tuple()
    assert isinstance(exponent, int)  # finite
    significant = len(digits)
    while significant > 1 and digits[significant - 1] == 0:
        significant -= 1
        exponent += 1
    if significant + exponent > _DEC_INT_DIGITS or -exponent > _DEC_FRAC_DIGITS:
        raise BadValue(_DEC_RANGE)


def decimal_decode(s: Any) -> Any:
    if s is None:
        return None
    s = str(s)
    if s.startswith("p"):
        whole, frac, sign = s[1:41], s[42:], ""
    else:
        whole, frac, sign = _complement(s[1:41]), _complement(s[42:-1]), "-"
    whole = whole.lstrip("0") or "0"
    return sign + whole + (f".{frac}" if frac else "")


def _as_str(v: Any) -> Any:
    return None if v is None else str(v)


def _as_bool(v: Any) -> Any:
    return None if v is None else bool(v)


def _as_float(v: Any) -> Any:
    return None if v is None else float(v)


def _same(v: Any) -> Any:
    return v


@dataclass(frozen=True)
class ColType:
    """One logical type: physical SQL type, input check/encode, output decode, JSON schema."""

    name: str
    sql: str
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]
    schema: dict[str, Any]
    doc: str


_STR = {"type": "string"}
TYPES: dict[str, ColType] = {
    t.name: t
    for t in (
        ColType("STRING", "TEXT", _str, _same, _STR, "any text"),
        ColType("ADDRESS", "TEXT", _address, _same, _STR, "0x + 40 hex, stored lowercase"),
        ColType("HASH", "TEXT", _hash, _same, _STR, "0x + 64 hex, stored lowercase"),
        ColType("BLOCKID", "TEXT", _hash, _same, _STR, "block hash: 0x + 64 hex"),
        ColType("TXID", "TEXT", _hash, _same, _STR, "transaction hash: 0x + 64 hex"),
        ColType("TOKENID", "TEXT", _uint256, _uint256_out, _STR, "token id, 0..2^256-1"),
        ColType("CHAINID", "TEXT", _chain_id, _same, _STR, "chain id, 1-64 of A-Za-z0-9_-"),
        ColType("BLOCKHEIGHT", "BIGINT", _uint64, _as_str, _STR, "0..2^63-1, read as string"),
        ColType("TIMESTAMP", "BIGINT", _uint64, _as_str, _STR, "Unix seconds, read as string"),
        ColType("INT", "BIGINT", _int64, _as_str, _STR, "64-bit signed, read as string"),
        ColType("FLOAT", "DOUBLE PRECISION", _float, _as_float, {"type": "number"}, "double"),
        ColType("BOOLEAN", "SMALLINT", _bool, _as_bool, {"type": "boolean"}, "true/false"),
        ColType("UINT256", "TEXT", _uint256, _uint256_out, _STR, "0..2^256-1, read as string"),
        ColType("DECIMAL", "TEXT", decimal_encode, decimal_decode, _STR, "exact decimal"),
    )
}

# Primary key types (GET /v1/table/id_types), in the spec's order.
ID_TYPES = ("STRING", "ADDRESS", "TOKENID", "HASH", "BLOCKID", "CHAINID", "TXID")

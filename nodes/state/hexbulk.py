"""Checks of many hex strings at once, for the parse of an ingested block.

A block lists thousands of hashes and addresses. A regular expression walks their
concatenation a character at a time in Python's engine, and a call per item costs more than
the block's decoding; these check the concatenation's bytes in a few passes in C.
"""

from __future__ import annotations

import re
from itertools import repeat
from typing import Any

_HEX_DIGITS = b"0123456789abcdef"
_QUANTITIES = re.compile(r"(?:0x(?:0|[1-9a-f][0-9a-f]*),)*")  # lowercase quantities, each + ","


def all_hex(items: list[str], width: int) -> bool:
    """Whether every item is `0x` and `width - 2` lowercase hex digits (an address at 42, a
    32-byte hash at 66). Raises TypeError when an item is not a string."""
    count = len(items)
    # each exactly `width` long (an empty string and a double one would pass the checks of
    # their concatenation), ASCII (so each character is one byte of the encoding)
    if not set(map(len, items)) <= {width}:
        return False
    joined = "".join(items)
    if not joined.isascii():
        return False
    raw, prefixes = joined.encode(), b"x" * count
    # "0x" at the start of each, and nothing but lowercase hex digits besides those x
    return (
        raw[1::width] == prefixes
        and raw[0::width] == b"0" * count
        and raw.translate(None, _HEX_DIGITS) == prefixes
    )


def quantities(values: list[Any]) -> list[int] | None:
    """The numbers of lowercase hex quantities (no leading zeros), checked by one match over
    all of them (each short: the match costs less than a call per item); None when one is
    not a quantity so written."""
    try:
        joined = ",".join([*values, ""])
    except TypeError:  # not a string
        return None
    if joined.count(",") != len(values) or _QUANTITIES.fullmatch(joined) is None:
        return None  # (a value holding a comma changes the count)
    return list(map(int, values, repeat(16)))


def column(items: list[dict[str, Any]], name: str) -> list[Any]:
    """Each item's `name` (None where it has none), in one pass in C."""
    return list(map(dict.get, items, repeat(name)))

"""Revert data as Solidity writes it: `Error(string)` and `Panic(uint256)`.

Calls (the error message of a reverted eth_call) and traces (callTracer's `revertReason`)
decode the same data and word it as geth words each.
"""

from __future__ import annotations

ERROR_SELECTOR = bytes.fromhex("08c379a0")
PANIC_SELECTOR = bytes.fromhex("4e487b71")
# geth's wording of Solidity panic codes
PANIC_REASONS = {
    0x00: "generic panic",
    0x01: "assert(false)",
    0x11: "arithmetic underflow or overflow",
    0x12: "division or modulo by zero",
    0x21: "enum overflow",
    0x22: "invalid encoded storage byte array accessed",
    0x31: "out-of-bounds array access; popping on an empty array",
    0x32: "out-of-bounds access of an array or bytesN",
    0x41: "out of memory",
    0x51: "uninitialized function",
}


def error_string(output: bytes) -> str | None:
    """The message of `Error(string)` revert data (None for other or malformed data)."""
    if output[:4] != ERROR_SELECTOR or len(output) < 68:
        return None
    body = output[4:]
    offset = int.from_bytes(body[0:32], "big")
    if offset + 32 > len(body):
        return None
    length = int.from_bytes(body[offset : offset + 32], "big")
    if offset + 32 + length > len(body):
        return None
    return body[offset + 32 : offset + 32 + length].decode("utf-8", errors="replace")


def panic_code(output: bytes) -> int | None:
    """The code of `Panic(uint256)` revert data (None for other data)."""
    if output[:4] != PANIC_SELECTOR or len(output) != 36:
        return None
    return int.from_bytes(output[4:36], "big")

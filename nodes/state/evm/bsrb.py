"""BSRB/1: the binary batch state-read format of `blockx_stateReadBatch` (docs/evm.md).

Request (big-endian):   "BSRB" | u8 version=1 | u64 height (2^64-1 = latest) | u32 count |
                        count × ( u8 kind | 20-byte address | [32-byte slot if kind=4] )
Response:               "BSRB" | u8 version=1 | u64 height | 32-byte block hash | u32 count |
                        count × ( u8 kind | value )
kinds and values: 1 balance → 32 bytes; 2 nonce → u64; 3 code → u32 length + bytes;
4 storage → 32 bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = b"BSRB"
VERSION = 1
LATEST = 2**64 - 1
BALANCE, NONCE, CODE, STORAGE = 1, 2, 3, 4
KINDS = {BALANCE: "balance", NONCE: "nonce", CODE: "code", STORAGE: "storage"}
_HEAD = struct.Struct(">4sBQI")


class BsrbError(ValueError):
    """The payload does not follow BSRB/1; the message says where."""


class BsrbLimitError(BsrbError):
    """The payload is well formed but asks for more reads than allowed."""


@dataclass(frozen=True, slots=True)
class Read:
    kind: int
    address: str  # lowercase 0x hex
    slot: int = 0


@dataclass(frozen=True, slots=True)
class Request:
    height: int | None  # None = latest
    reads: list[Read]


def decode_request(payload: bytes, max_reads: int) -> Request:
    if len(payload) < _HEAD.size:
        raise BsrbError(
            f"payload of {len(payload)} bytes is shorter than the {_HEAD.size}-byte head"
        )
    magic, version, height, count = _HEAD.unpack_from(payload)
    if magic != MAGIC:
        raise BsrbError("bad magic: expected 'BSRB'")
    if version != VERSION:
        raise BsrbError(f"unsupported version {version}: expected 1")
    if count == 0:
        raise BsrbError("no reads")
    if count > max_reads:
        raise BsrbLimitError(f"{count} reads, at most {max_reads}")
    reads: list[Read] = []
    pos = _HEAD.size
    for i in range(count):
        if pos + 21 > len(payload):
            raise BsrbError(f"read {i}: truncated")
        kind = payload[pos]
        if kind not in KINDS:
            raise BsrbError(f"read {i}: unknown kind {kind}")
        address = "0x" + payload[pos + 1 : pos + 21].hex()
        pos += 21
        slot = 0
        if kind == STORAGE:
            if pos + 32 > len(payload):
                raise BsrbError(f"read {i}: truncated slot")
            slot = int.from_bytes(payload[pos : pos + 32], "big")
            pos += 32
        reads.append(Read(kind, address, slot))
    if pos != len(payload):
        raise BsrbError(f"{len(payload) - pos} trailing bytes after {count} reads")
    return Request(None if height == LATEST else height, reads)


def encode_request(height: int | None, reads: list[Read]) -> bytes:
    out = bytearray(_HEAD.pack(MAGIC, VERSION, LATEST if height is None else height, len(reads)))
    for r in reads:
        out.append(r.kind)
        out += bytes.fromhex(r.address[2:])
        if r.kind == STORAGE:
            out += r.slot.to_bytes(32, "big")
    return bytes(out)


def encode_value(kind: int, value: int | bytes) -> bytes:
    if kind == CODE:
        assert isinstance(value, bytes)
        return bytes([kind]) + struct.pack(">I", len(value)) + value
    assert isinstance(value, int)
    if kind == NONCE:
        return bytes([kind]) + struct.pack(">Q", value)
    return bytes([kind]) + value.to_bytes(32, "big")


def encode_response(height: int, block_hash: str, values: list[tuple[int, int | bytes]]) -> bytes:
    head = MAGIC + struct.pack(">BQ", VERSION, height) + bytes.fromhex(block_hash[2:])
    body = b"".join(encode_value(k, v) for k, v in values)
    return head + struct.pack(">I", len(values)) + body


def decode_response(data: bytes) -> tuple[int, str, list[tuple[int, int | bytes]]]:
    """For clients and tests: (height, block hash, [(kind, value)])."""
    if data[:4] != MAGIC or data[4] != VERSION:
        raise BsrbError("bad response head")
    height = struct.unpack_from(">Q", data, 5)[0]
    block_hash = "0x" + data[13:45].hex()
    (count,) = struct.unpack_from(">I", data, 45)
    pos = 49
    values: list[tuple[int, int | bytes]] = []
    for _ in range(count):
        kind = data[pos]
        pos += 1
        if kind == CODE:
            (length,) = struct.unpack_from(">I", data, pos)
            values.append((kind, data[pos + 4 : pos + 4 + length]))
            pos += 4 + length
        elif kind == NONCE:
            values.append((kind, struct.unpack_from(">Q", data, pos)[0]))
            pos += 8
        else:
            values.append((kind, int.from_bytes(data[pos : pos + 32], "big")))
            pos += 32
    return height, block_hash, values

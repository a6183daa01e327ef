"""The log index: every log of every block the node holds, kept in the block's own LMDB write
transaction (a `StoreExtension`), so a crash, a reorg or a window move can never leave it out of
step with the state.

Databases:

- `logs`: `height(8) | position(4)` → the log object as JSON (position = order in the block).
- `logkeys`: `b"a" | address(20) | height | position` and `b"t" | i(1) | topic(32) | height |
  position` → empty. A query reads, per criterion, only the keys of matching logs: one cursor
  per address (or per topic alternative) seeks to the range start, and the criteria are
  intersected by leapfrogging (each cursor seeks to the largest key another one found), so
  a selective filter touches few keys whatever the range or the chain's other logs.
- `logblocks`: `b"h" | height` → block hash and `b"#" | hash` → height, for the blocks
  indexed (a `blockHash` query), and `b"lo"`/`b"hi"`: the heights the index covers.

The covered heights are `[lo, hi]`, `hi` = the head. A store that held blocks before the
index existed starts with `lo = head + 1` and is filled downwards by the backfill
(`nodes/state/logs.py`); `lo` also moves up with a `state` node's window.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import lmdb
import orjson

from nodes.state.vendor import VendorBlock

_BE = struct.Struct(">Q")
_Q = struct.Struct(">q")  # the covered range's bounds (`hi` may be -1)
_POS = struct.Struct(">I")
_AT = struct.Struct(">QI")  # a log's key: height, position
_KEY = 12  # height(8) + position(4)
_LO = b"lo"
_HI = b"hi"
_NO_BLOCK = -1  # `hi` before the first block


class LogIndex:
    """The log index of one store; reads open their own transaction on the store's env.

    Reads pass `txn.cursor` and `txn.get` their database positionally: py-lmdb parses a
    keyword argument at a cost near that of the seek itself."""

    def __init__(self) -> None:
        self.env: lmdb.Environment | None = None
        # (id of the write transaction a read sees, its covered range): a read transaction
        # sees the state of one commit, and only a commit can move the range, so reads of
        # the same commit share one look-up.
        self._covered: tuple[int, tuple[int, int]] = (-1, (_NO_BLOCK, _NO_BLOCK))

    # StoreExtension --------------------------------------------------------------------

    def attached(self, env: lmdb.Environment, txn: lmdb.Transaction, bounds: Any) -> None:
        self.env = env
        self._covered = (-1, (_NO_BLOCK, _NO_BLOCK))
        self._logs = env.open_db(b"logs", txn=txn)
        self._keys = env.open_db(b"logkeys", txn=txn)
        self._blocks = env.open_db(b"logblocks", txn=txn)
        if txn.get(_LO, db=self._blocks) is None:
            # A new store indexes from its first block; one that held blocks before the index
            # existed covers nothing yet (the backfill fills it downwards).
            start = 0 if bounds is None else bounds[1] + 1
            self._set(txn, _LO, start)
            self._set(txn, _HI, start - 1 if bounds is not None else _NO_BLOCK)

    def applied(self, txn: lmdb.Transaction, block: VendorBlock) -> None:
        self._index(txn, block.number, block.hash, block.logs)
        self._set(txn, _HI, block.number)

    def rolled_back(self, txn: lmdb.Transaction, height: int) -> None:
        self._drop(txn, height)
        self._set(txn, _HI, height - 1)
        if self._get(txn, _LO) > height:
            self._set(txn, _LO, height)  # empty coverage [height, height - 1]

    def pruned(self, txn: lmdb.Transaction, earliest: int) -> None:
        lo = self._get(txn, _LO)
        for height in range(lo, earliest):
            self._drop(txn, height)
        if earliest > lo:
            self._set(txn, _LO, earliest)

    # backfill (blocks stored before the index existed) -----------------------------------

    def backfilled(self, txn: lmdb.Transaction, height: int, block_hash: str, logs: Any) -> bool:
        """Index block `height` below the covered range, in a write transaction of the store;
        False (nothing written) when it is no longer the block just below the range."""
        if self._get(txn, _LO) != height + 1:
            return False
        self._index(txn, height, block_hash, logs)
        self._set(txn, _LO, height)
        return True

    # reading ---------------------------------------------------------------------------

    def covered(self, txn: lmdb.Transaction) -> tuple[int, int]:
        """(lo, hi): the heights indexed; hi < lo when none."""
        lo, hi = txn.get(_LO, db=self._blocks), txn.get(_HI, db=self._blocks)
        return (
            _NO_BLOCK if lo is None else _Q.unpack(lo)[0],
            _NO_BLOCK if hi is None else _Q.unpack(hi)[0],
        )

    def covered_read(self, txn: lmdb.Transaction) -> tuple[int, int]:
        """`covered` in a read transaction (never a write one: its id is not yet a commit's,
        and it may still change the range or abort)."""
        seen = txn.id()
        known = self._covered
        if known[0] == seen:
            return known[1]
        found = self.covered(txn)
        self._covered = (seen, found)
        return found

    def height_of(self, txn: lmdb.Transaction, block_hash: str) -> int | None:
        raw = txn.get(b"#" + bytes.fromhex(block_hash[2:]), db=self._blocks)
        return None if raw is None else _BE.unpack(raw)[0]

    def scan(
        self,
        txn: lmdb.Transaction,
        lo: int,
        hi: int,
        addresses: list[bytes],
        topics: list[list[bytes] | None],
    ) -> Iterator[tuple[int, bytes]]:
        """(height, log JSON) of the logs in `[lo, hi]` that match, in chain order.
        `addresses` empty = any; `topics[i]` None = any."""
        return self.scan_prefixed(txn, lo, hi, criteria_prefixes(addresses, topics))

    def scan_prefixed(
        self, txn: lmdb.Transaction, lo: int, hi: int, prefixes: list[list[bytes]]
    ) -> Iterator[tuple[int, bytes]]:
        """`scan` with the criteria as their index key prefixes (`criteria_prefixes`), which
        a caller that sends the same filter again and again builds once."""
        start, end = _BE.pack(lo) + _POS.pack(0), _BE.pack(hi + 1) + _POS.pack(0)
        # Every seek positions the cursor afresh (`set_range`), so the criteria share one.
        keys = txn.cursor(self._keys)
        criteria = [_criterion(keys, options, end) for options in prefixes]
        if not criteria:
            cur = txn.cursor(self._logs)
            if not cur.set_range(start):
                return
            for key, raw in cur:
                if key >= end:
                    return
                yield _BE.unpack_from(key)[0], raw
            return
        for key in _intersect(criteria, start):
            yield _BE.unpack_from(key)[0], txn.get(key, None, self._logs)

    def keys_single(
        self, txn: lmdb.Transaction, prefixes: list[bytes], lo: int, hi: int, most: int
    ) -> list[bytes]:
        """The `height | position` keys of the logs in `[lo, hi]` under every one of
        `prefixes` (criteria of one prefix each, at least one), in chain order, at most
        `most` of them: `scan` for the filters most are (one address, single topics), as
        a list from one loop, with no generator or object per criterion in between."""
        start, end = _AT.pack(lo, 0), _AT.pack(hi + 1, 0)
        cur = txn.cursor(self._keys)
        set_range, current = cur.set_range, cur.key
        heads = [b""] * len(prefixes)  # each prefix's last answer (kept while ≥ `at`)
        sizes = [len(p) for p in prefixes]
        out: list[bytes] = []
        at = start
        while True:  # the leapfrog of `_intersect`
            agreed = True
            for i, prefix in enumerate(prefixes):
                head = heads[i]
                if head < at:
                    if not set_range(prefix + at):
                        return out
                    key = current()
                    size = sizes[i]
                    if key[:size] != prefix:
                        return out
                    head = key[size:]
                    if head >= end:
                        return out
                    heads[i] = head
                if head != at:
                    at, agreed = head, False
            if agreed:
                out.append(at)
                if len(out) >= most:
                    return out
                at = _next(at)

    def keys_cursor(self, txn: lmdb.Transaction) -> lmdb.Cursor:
        """A cursor on the index's keys, for `block_keys` (a caller reading many blocks in one
        transaction keeps one: every seek positions it afresh)."""
        return txn.cursor(self._keys)

    def block_keys(
        self, txn: lmdb.Transaction, seeks: list[bytes], most: int, cur: lmdb.Cursor | None = None
    ) -> list[bytes]:
        """`keys_single` over one block: `seeks` are the criteria's prefixes each followed by
        the block's height (`block_seeks`). Every key sought lies in that block, so a
        criterion with no log there (most blocks, for a selective filter) ends the query
        after one seek, with no range bounds to build or compare. `cur`: a `keys_cursor` of
        `txn` to use (else one is opened)."""
        if cur is None:
            cur = txn.cursor(self._keys)
        seek = seeks[0]
        if not cur.set_range(seek):
            return []
        key = cur.key()
        if not key.startswith(seek):
            return []
        set_range, current, following = cur.set_range, cur.key, cur.next
        height = seek[-8:]
        at = key[len(seek) :]  # the position (4 bytes) every criterion must reach
        count = len(seeks)
        agreed, i = 1, 0  # criteria at `at` so far; the one the cursor is on
        out: list[bytes] = []
        while True:  # the leapfrog of `_intersect`, over positions in the block
            if agreed == count:
                out.append(height + at)
                if len(out) >= most:
                    return out
                # The cursor is on criterion i's key at `at`: its next key is that
                # criterion's next log, with no seek from the root.
                if not following():
                    return out
                key = current()
                if not key.startswith(seek):
                    return out
                at, agreed = key[len(seek) :], 1
                continue
            i = i + 1 if i + 1 < count else 0
            seek = seeks[i]
            if not set_range(seek + at):
                return out
            key = current()
            if not key.startswith(seek):
                return out
            found = key[len(seek) :]
            if found == at:
                agreed += 1
            else:
                at, agreed = found, 1

    def logs_of(self, txn: lmdb.Transaction, keys: list[bytes]) -> list[bytes]:
        """The stored log JSON of each key (`keys_single`'s or `block_keys`')."""
        get, logs = txn.get, self._logs
        out = []
        for key in keys:  # (a loop: a comprehension costs a call, and most answers are short)
            out.append(get(key, None, logs))
        return out

    @staticmethod
    def height_of_key(key: bytes) -> int:
        return int(_BE.unpack_from(key)[0])

    # helpers ---------------------------------------------------------------------------

    def _index(self, txn: lmdb.Transaction, height: int, block_hash: str, logs: Any) -> None:
        hb = _BE.pack(height)
        hash_raw = bytes.fromhex(block_hash[2:])
        txn.put(b"h" + hb, hash_raw, db=self._blocks)
        txn.put(b"#" + hash_raw, hb, db=self._blocks)
        for position, log in enumerate(logs):
            key = hb + _POS.pack(position)
            txn.put(key, log.raw, db=self._logs)
            txn.put(b"a" + log.address + key, b"", db=self._keys)
            for i, topic in enumerate(log.topics):
                txn.put(b"t" + bytes([i]) + topic + key, b"", db=self._keys)

    def _drop(self, txn: lmdb.Transaction, height: int) -> None:
        """Delete block `height` from the index (nothing when it is not indexed)."""
        hb = _BE.pack(height)
        hash_raw = txn.pop(b"h" + hb, db=self._blocks)
        if hash_raw is None:
            return
        txn.delete(b"#" + hash_raw, db=self._blocks)
        cur = txn.cursor(db=self._logs)
        found = cur.set_range(hb)
        while found and cur.key()[:8] == hb:
            key = cur.key()
            address, topics = _keys_of(cur.value())
            txn.delete(b"a" + address + key, db=self._keys)
            for i, topic in enumerate(topics):
                txn.delete(b"t" + bytes([i]) + topic + key, db=self._keys)
            found = cur.delete()  # moves to the next entry

    def _get(self, txn: lmdb.Transaction, key: bytes) -> int:
        raw = txn.get(key, db=self._blocks)
        return _NO_BLOCK if raw is None else struct.unpack(">q", raw)[0]

    def _set(self, txn: lmdb.Transaction, key: bytes, value: int) -> None:
        txn.put(key, struct.pack(">q", value), db=self._blocks)


def _keys_of(raw: bytes) -> tuple[bytes, list[bytes]]:
    """The address and topics of a stored log (to delete its index keys)."""
    log = orjson.loads(raw)
    return bytes.fromhex(log["address"][2:]), [bytes.fromhex(t[2:]) for t in log["topics"]]


def criteria_prefixes(
    addresses: list[bytes], topics: list[list[bytes] | None]
) -> list[list[bytes]]:
    """The index key prefixes of a filter's criteria: one list per criterion (the addresses,
    then each constrained topic position), any of whose prefixes matches."""
    out = [[b"a" + a for a in addresses]] if addresses else []
    for i, options in enumerate(topics):
        if options is not None:
            out.append([b"t" + bytes([i]) + t for t in options])
    return out


def block_seeks(prefixes: list[bytes], height: int) -> list[bytes]:
    """`block_keys`' seeks: each of `prefixes` (one per criterion) followed by `height`."""
    hb = _BE.pack(height)
    return [prefix + hb for prefix in prefixes]


def _criterion(cur: lmdb.Cursor, prefixes: list[bytes], end: bytes) -> _Prefix | _Union:
    """The keys under any of `prefixes` (one prefix: itself, without the union's books)."""
    if len(prefixes) == 1:
        return _Prefix(cur, prefixes[0], end)
    return _Union([_Prefix(cur, p, end) for p in prefixes])


class _Prefix:
    """The `height | position` suffixes of the keys under one prefix, below `end`."""

    __slots__ = ("cur", "end", "head", "prefix", "size")

    def __init__(self, cur: lmdb.Cursor, prefix: bytes, end: bytes) -> None:
        self.cur = cur
        self.prefix = prefix
        self.size = len(prefix)
        self.end = end
        self.head: bytes | None = b""  # the last answer (`at` only grows: kept while ≥ it)

    def seek(self, at: bytes) -> bytes | None:
        """The first suffix ≥ `at`, or None when there is none below the end."""
        head = self.head
        if head is None or head >= at:
            return head
        found = None
        if self.cur.set_range(self.prefix + at):
            key = self.cur.key()
            if key[: self.size] == self.prefix:
                suffix = key[self.size :]
                found = suffix if suffix < self.end else None
        self.head = found
        return found


class _Union:
    """Any of several prefixes (an OR-list): the smallest suffix ≥ `at` among them."""

    __slots__ = ("done", "heads", "parts")

    def __init__(self, parts: list[_Prefix]) -> None:
        self.parts = parts
        self.heads: list[bytes | None] = [b""] * len(parts)  # each part's last answer
        self.done = [False] * len(parts)

    def seek(self, at: bytes) -> bytes | None:
        best: bytes | None = None
        for i, part in enumerate(self.parts):
            if self.done[i]:
                continue
            head = self.heads[i]
            if head is None or head < at:  # only parts behind `at` move
                head = part.seek(at)
                self.heads[i] = head
                if head is None:
                    self.done[i] = True
                    continue
            if best is None or head < best:
                best = head
        return best


def _intersect(criteria: list[_Prefix | _Union], start: bytes) -> Iterator[bytes]:
    """Keys every criterion holds, in order (leapfrog join)."""
    at = start
    while True:
        agreed = True
        for criterion in criteria:
            found = criterion.seek(at)
            if found is None:
                return
            if found != at:
                at, agreed = found, False
        if agreed:
            yield at
            at = _next(at)


def _next(key: bytes) -> bytes:
    """The smallest key after `key` (same length)."""
    return (int.from_bytes(key, "big") + 1).to_bytes(_KEY, "big")

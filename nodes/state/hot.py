"""The hot view: the newest blocks' state in memory, so near-head reads need no LMDB seek.

Ingest keeps it: after a block is committed to the store, `applied(height, writes)` records
the versions that block wrote; after a rollback is committed, `rolled_back(height)` drops
them. Reads and updates all run in the node's event loop, so a read never sees half a block.

It holds, for the covered heights `[lo, hi]` (at most `blocks` of them):

- `versions`: store key prefix → `(height, raw value, height, raw value, …)` in height
  order, the values the covered blocks wrote (raw = the store's encoding: minimal big-endian
  integers, raw code). One flat tuple per key, not a list of pairs: the collector untracks a
  tuple of ints and bytes, so the view's hundreds of thousands of keys are not walked by the
  collections that ingest's next blocks trigger, and a block's write allocates one object;
- `base`: store key prefix → raw value as of height `lo - 1`, filled by reads (one LMDB
  read per key, then memory) and moved forward exactly when the oldest block leaves: the
  values that block wrote become the new base values, every other base value stays true.
  At most `base_entries` entries (a cache, not the truth). Once full it admits nothing
  until `RESTART` times as many further misses have passed, then starts again empty: reads
  spread over far more keys than it holds (a big store's) would otherwise insert, evict and
  free on nearly every read for a few percent of hits, while a working set that fits stays
  in it, and one that moves is learnt again at the next restart. Its reader may also turn
  it off (`caching` False: emptied, neither consulted nor filled) while its hit rate says
  it cannot pay for its lookups (`nodes/state/reads.py`, `CacheGate`).

A read at `h` in `[lo, hi]` takes the newest version at or below `h`; without one the key
was not written in `[lo, h]`, so its value is the base value. A rollback of the newest
covered block drops its versions; one the view cannot undo (below what it covers) empties
it, and it fills again from the next blocks. The store stays the truth: the view never
answers for a height it does not cover.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

MISSING = None  # what `value` answers when the view cannot answer (the caller reads LMDB)
RESTART = 4  # a full base cache starts again after this many times its size in misses


class HotState:
    """The newest `blocks` blocks' written values plus a read cache of the values below."""

    def __init__(self, blocks: int, base_entries: int) -> None:
        self.blocks = max(0, blocks)
        self.base_entries = max(0, base_entries)
        self.lo = 0
        self.hi = -1  # empty: hi < lo
        self.versions: dict[bytes, tuple[Any, ...]] = {}
        self.base: dict[bytes, bytes] = {}
        self._unadmitted = 0  # misses not cached since the base cache was last full
        self.caching = True  # the base cache is consulted and filled (`set_caching`)
        self.misses = 0  # base values read from the store (`remember_base` calls), ever
        self._written: deque[list[bytes]] = deque()  # per covered height, oldest first

    @property
    def empty(self) -> bool:
        return self.hi < self.lo

    def covers(self, height: int) -> bool:
        return self.lo <= height <= self.hi

    def reset(self, head: int) -> None:
        """Forget everything; the next block applied after `head` starts the view again."""
        self.versions.clear()
        self.base.clear()
        self._unadmitted = 0
        self._written.clear()
        self.lo, self.hi = head + 1, head

    # ingest side ---------------------------------------------------------------------

    def applied(self, height: int, writes: Iterable[tuple[bytes, bytes]], earliest: int) -> None:
        """Block `height` was committed with these (prefix, raw value) writes.

        `earliest` is the store's earliest height after the commit: the view never covers
        it (its base would be the value just below, which a `state` node has pruned).
        """
        if self.blocks == 0:
            return
        if height != self.hi + 1:  # not the next block (first block, or after a gap)
            self.reset(height - 1)
        prefixes = []
        for prefix, value in writes:
            versions = self.versions.get(prefix)
            if versions is None:
                self.versions[prefix] = (height, value)
            elif versions[-2] == height:  # the same field twice in one block: last wins
                self.versions[prefix] = (*versions[:-1], value)
                continue
            else:
                self.versions[prefix] = (*versions, height, value)
            prefixes.append(prefix)
        self._written.append(prefixes)
        self.hi = height
        while self._written and (self.hi - self.lo + 1 > self.blocks or self.lo <= earliest):
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        """The oldest covered block leaves: its values become the base values."""
        for prefix in self._written.popleft():
            versions = self.versions[prefix]
            value = versions[1]
            if len(versions) == 2:
                del self.versions[prefix]
            else:
                self.versions[prefix] = versions[2:]
            if prefix in self.base or (self.caching and len(self.base) < self.base_entries):
                self.base[prefix] = value
        self.lo += 1

    def rolled_back(self, height: int) -> None:
        """Block `height` (the store's old head) was rolled back."""
        if self.blocks == 0:
            return
        if self.empty or height != self.hi:
            self.reset(height - 1)
            return
        for prefix in self._written.pop():
            versions = self.versions[prefix]
            if len(versions) == 2:
                del self.versions[prefix]
            else:
                self.versions[prefix] = versions[:-2]
        self.hi -= 1
        if self.empty:  # nothing covered: the base (values at lo - 1 = hi) is still true
            self.lo = self.hi + 1

    # read side -----------------------------------------------------------------------

    def value(self, prefix: bytes, height: int) -> bytes | None:
        """The raw value of `prefix` at a covered `height` (b"" when never written), or
        MISSING when the view does not know it (not covered, or no base value cached)."""
        versions = self.versions.get(prefix)
        if versions is not None:
            if versions[-2] <= height:  # the newest version (reads at the head: the most)
                newest: bytes = versions[-1]
                return newest
            for i in range(len(versions) - 4, -1, -2):
                if versions[i] <= height:
                    value: bytes = versions[i + 1]
                    return value
        return self.base.get(prefix)  # (empty while `caching` is off)

    def set_caching(self, on: bool) -> None:
        """Consult and fill the base cache, or not (then it is emptied: a cache, never the
        truth, so dropping it is always exact)."""
        self.caching = on
        if not on:
            self.base.clear()
            self._unadmitted = 0

    def remember_base(self, prefix: bytes, value: bytes) -> None:
        """Cache the value at `lo - 1` read from the store, unless the cache is full (see
        the module: it then restarts empty after `RESTART * base_entries` such misses)."""
        self.misses += 1
        if len(self.base) < self.base_entries:
            self.base[prefix] = value
            return
        self._unadmitted += 1
        if self._unadmitted >= RESTART * self.base_entries:
            self._unadmitted = 0
            self.base.clear()

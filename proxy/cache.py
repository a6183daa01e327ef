"""Answers of pure reads at a block hash, kept in memory, bounded in bytes.

A key names the pool, the block hash, the method and the params as sent to the node (which
name the block by that hash), so an answer is only ever served for the block it was computed
at: a reorg cannot make a cached answer wrong, it only makes it unreachable. There is no
time-to-live for the same reason. Entries are evicted least recently used first when the
byte budget is reached, and the entries of every block a reorg dropped
are removed at once (`drop`); blocks the checker confirmed are not dropped by reorgs above
them, so their entries stay until evicted.

Only `result` answers are stored: errors, `pending` reads and methods with side effects never
reach the cache (proxy/reads.py decides what is asked).

With `cache_tier_url` set, a shared tier in Redis lies under this cache (proxy/sharedcache.py):
answers the fleet may share are written there too (`put(..., share=True)`), a local miss of
such an answer may be found there (`fetch_shared`), and drops and flushes reach every proxy.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    from proxy.sharedcache import SharedTier

# Pure reads at a block, answered by state/archive nodes: what may be cached by default.
DEFAULT_METHODS = (
    "eth_call",
    "eth_multiCall",
    "eth_getBalance",
    "eth_getCode",
    "eth_getStorageAt",
    "eth_getTransactionCount",
    "eth_getBlockByNumber",
    "eth_getBlockByHash",
    "eth_baseFee",
    "getAddressBalance",
    "getAddressNonce",
    "getAddressCode",
    "getStorageAt",
    "contractMultiCall",
    "simulateTransactions",
    "estimateGas",
    "getBlockById",
    "pre_traceCall",
    "pre_traceMany",
)
ENTRY_OVERHEAD = 240  # bytes counted per entry beyond its key and answer (dict slot, tuple)

Key = tuple[str, str, str, bytes]  # pool id, block hash, method, params as sent (JSON)


@dataclass(slots=True)
class CacheStats:
    """Counters of one pool (read by the admin API and /metrics)."""

    hits: int = 0
    misses: int = 0
    stores: int = 0
    batches: int = 0  # of the stores: whole batches (answered as a whole on a hit)
    coalesced: int = 0  # reads that shared another's upstream call
    local: int = 0  # answered by the proxy from its pinned head (eth_blockNumber)
    evicted: int = 0  # entries evicted to stay within max_bytes
    dropped: int = 0  # entries of blocks a reorg dropped
    flushed: int = 0  # entries removed by a flush
    shared_hits: int = 0  # local misses found in the shared tier (stored here too)
    shared_misses: int = 0  # local misses looked up in the shared tier and not found there
    entries: int = 0  # held now
    bytes: int = 0  # held now (answers, keys and a fixed overhead per entry)

    def to_obj(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class ByteLru:
    """A map bounded by the bytes of its entries, least recently used evicted first.

    On an OrderedDict, whose lookup, reordering and eviction run in C: cachetools' LRUCache
    (the first version of this cache) goes through three Python frames per lookup, measured
    at 13 % of the proxy's CPU under the dapp benchmark's load of cache hits.
    """

    def __init__(self, max_bytes: int, evicted: Callable[[Key, int], None]) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self._data: OrderedDict[Key, tuple[bytes, int]] = OrderedDict()
        self._evicted = evicted

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: Key) -> bool:
        return key in self._data

    def get(self, key: Key) -> bytes | None:
        """The value of `key`, now the most recently used, or None."""
        entry = self._data.get(key)
        if entry is None:
            return None
        self._data.move_to_end(key)
        return entry[0]

    def put(self, key: Key, value: bytes, size: int) -> None:
        """Keep `value` (counted as `size` bytes), evicting what no longer fits."""
        self._data[key] = (value, size)
        self.size += size
        data = self._data
        while self.size > self.max_bytes:
            old, (_, old_size) = data.popitem(last=False)
            self.size -= old_size
            self._evicted(old, old_size)

    def pop(self, key: Key) -> int | None:
        """Remove `key`; its size, or None when it was not there."""
        entry = self._data.pop(key, None)
        if entry is None:
            return None
        self.size -= entry[1]
        return entry[1]


class ResponseCache:
    """The cache of one proxy process, shared by its pools (one byte budget)."""

    def __init__(
        self, max_bytes: int, pools: Iterable[str] = ("*",), tier: SharedTier | None = None
    ) -> None:
        self.max_bytes = max_bytes
        self.pools = frozenset(pools)
        self._lru = ByteLru(max_bytes, self._evicted)
        self._blocks: dict[tuple[str, str], set[Key]] = {}  # (pool, block hash) → keys
        self.stats: dict[str, CacheStats] = {}
        # pool id → how many times it was flushed: an answer asked for before a flush is
        # not stored after it (proxy/reads.py), nor shared with reads made after it
        self.epochs: dict[str, int] = {}
        self.tier = tier  # the shared tier under this cache (None: this process's alone)
        if tier is not None:
            tier.on_flush = self.flush_local
            tier.on_drop = self.drop_local

    def enabled(self, pool_id: str) -> bool:
        """Whether answers of this pool are cached (`cache_pools`, `cache_max_bytes`)."""
        return self.max_bytes > 0 and ("*" in self.pools or pool_id in self.pools)

    def stats_of(self, pool_id: str) -> CacheStats:
        stats = self.stats.get(pool_id)
        if stats is None:
            stats = self.stats[pool_id] = CacheStats()
        return stats

    @property
    def bytes(self) -> int:
        return self._lru.size

    def __len__(self) -> int:
        return len(self._lru)

    def get(self, key: Key) -> orjson.Fragment | None:
        """The cached result for `key` (as JSON to embed in an answer), counted."""
        stats = self.stats.get(key[0]) or self.stats_of(key[0])
        value = self._lru.get(key)
        if value is None:
            stats.misses += 1
            return None
        stats.hits += 1
        return orjson.Fragment(value)

    def put(self, key: Key, result: bytes, share: bool = False) -> None:
        """Keep `result` (the JSON of an answer's `result`) for `key`; `share`: the fleet
        may use it too (written to the shared tier behind the request path)."""
        size = len(result) + len(key[3]) + len(key[1]) + len(key[2]) + ENTRY_OVERHEAD
        if size > self.max_bytes or key in self._lru:
            return  # larger than the whole budget, or there already
        self._put(key, result, size)
        tier = self.tier
        if share and tier is not None:
            tier.put(key[0], key[1], tier.field(key[2], key[3]), result)

    def shares(self, pool_id: str) -> bool:
        """Whether a local miss of this pool may be looked up in the shared tier now."""
        tier = self.tier
        return tier is not None and tier.ready(pool_id)

    def fetch_shared(
        self, key: Key, epoch: int, done: Callable[[orjson.Fragment | None], None]
    ) -> None:
        """Look `key` up in the shared tier: `done` gets its answer (kept here too), or None
        (not there, the tier did not answer in time, or the pool was flushed since
        `epoch`)."""
        tier = self.tier
        if tier is None:
            done(None)
            return

        def found(value: bytes | None) -> None:
            stats = self.stats_of(key[0])
            if value is None or self.epochs.get(key[0], 0) != epoch:
                stats.shared_misses += 1
                done(None)
                return
            stats.shared_hits += 1
            self.put(key, value)
            done(orjson.Fragment(value))

        tier.get(key[0], key[1], tier.field(key[2], key[3]), found)

    def _put(self, key: Key, value: bytes, size: int) -> None:
        self._lru.put(key, value, size)
        block = (key[0], key[1])
        keys = self._blocks.get(block)
        if keys is None:
            self._blocks[block] = {key}
        else:
            keys.add(key)
        stats = self.stats_of(key[0])
        stats.stores += 1
        stats.entries += 1
        stats.bytes += size

    def get_batch(self, key: Key) -> tuple[bytes, tuple[tuple[str, int], ...]] | None:
        """A whole batch's answer and its items per method, counted as that many hits."""
        found = self._lru.get(key)
        if found is not None:
            self.stats_of(key[0]).hits += sum(n for _, n in found[1])  # type: ignore[index]
        return found  # type: ignore[return-value]

    def put_batch(self, key: Key, out: bytes, methods: tuple[tuple[str, int], ...]) -> None:
        """Keep the answer of a whole batch every item of which was answered at the block
        its key names (by the hash of the request's `latest`)."""
        size = len(out) + len(key[3]) + len(key[1]) + ENTRY_OVERHEAD
        if size > self.max_bytes or key in self._lru:
            return
        self._put(key, (out, methods), size)  # type: ignore[arg-type]
        self.stats_of(key[0]).batches += 1

    def _evicted(self, key: Key, size: int) -> None:
        self._unindex(key)
        stats = self.stats_of(key[0])
        stats.evicted += 1
        stats.entries -= 1
        stats.bytes -= size

    def _unindex(self, key: Key) -> None:
        block = (key[0], key[1])
        keys = self._blocks.get(block)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._blocks[block]

    def drop(self, pool_id: str, hashes: Iterable[str]) -> int:
        """Remove the entries of blocks a reorg dropped, here and in the shared tier (the
        other proxies are told); how many here."""
        hashes = list(hashes)
        if self.tier is not None:
            self.tier.drop(pool_id, hashes)
        return self.drop_local(pool_id, hashes)

    def drop_local(self, pool_id: str, hashes: Iterable[str]) -> int:
        """Remove the entries of blocks a reorg dropped from this process; how many."""
        removed = self._remove(pool_id, [(pool_id, h) for h in hashes])
        self.stats_of(pool_id).dropped += removed
        return removed

    def flush(self, pool_id: str) -> int:
        """Remove every entry of a pool (and start its next epoch), and flush the shared
        tier's (the other proxies are told); how many here."""
        if self.tier is not None:
            self.tier.flush(pool_id)
        return self.flush_local(pool_id)

    def flush_local(self, pool_id: str | None) -> int:
        """Remove every entry of a pool from this process (and start its next epoch); None:
        of every pool (the shared tier was flushed while this proxy could not hear it)."""
        if pool_id is None:
            return sum(self.flush_local(p) for p in list(self.stats))
        self.epochs[pool_id] = self.epochs.get(pool_id, 0) + 1
        removed = self._remove(pool_id, [b for b in self._blocks if b[0] == pool_id])
        self.stats_of(pool_id).flushed += removed
        return removed

    def _remove(self, pool_id: str, blocks: list[tuple[str, str]]) -> int:
        stats = self.stats_of(pool_id)
        removed = 0
        for block in blocks:
            for key in self._blocks.pop(block, ()):
                size = self._lru.pop(key)
                if size is not None:
                    removed += 1
                    stats.entries -= 1
                    stats.bytes -= size
        return removed

"""The proxy's routing state, built ONLY from the store's snapshot and watch events.

One code path applies configuration: the file store (this process's own changes) and the etcd
store (changes of every proxy process) both feed `apply`. Admin writes wait with
`wait_applied(revision)` until their change has gone through that path. Local nodes
(`addLocalNode`) are the only in-memory exception, as the spec says.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson

from proxy.applied import AppliedRevision
from proxy.breaker import BreakerSettings
from proxy.model import (
    DEFAULT_BREAKER,
    EntryError,
    MirrorEntry,
    Node,
    NodeEntry,
    Pool,
    RouteRule,
    WriterEntry,
    check_key,
    check_version,
    normalize_chain,
    normalize_pool,
)
from proxy.store import StoreEvent

log = logging.getLogger(__name__)


class RoutingState:
    """Pools by id and the version of each chain in version mode."""

    def __init__(
        self, max_weight: int = 1_000_000, breaker: BreakerSettings = DEFAULT_BREAKER
    ) -> None:
        self.pools: dict[str, Pool] = {}
        self.versions: dict[str, str] = {}  # chain id → V (chain routes to pool "C-V")
        self.applied = AppliedRevision()  # the store revision applied, and who waits for one
        # Bumped whenever the pool a chain id names may change (pools added or removed,
        # versions set): the data route keeps what `Engine.resolve` found per path until then.
        self.changes = 0
        self.max_weight = max_weight
        # Called with a pool id when `pools/{pool}/cache/flush` is written (an admin flush
        # reaches every proxy process sharing the store).
        self.on_cache_flush: Callable[[str], Any] | None = None
        self.breaker = breaker  # every node's breaker settings

    # ---- lookups -------------------------------------------------------------------------

    def pool_for_chain(self, chain: str) -> Pool | None:
        """The pool serving a (normalized) chain id: `C-V` in version mode, else `C`."""
        version = self.versions.get(chain)
        return self.pools.get(f"{chain}-{version}" if version else chain)

    def chains(self) -> list[str]:
        ids = {pid.partition("-")[0] for pid in self.pools} | set(self.versions)
        return sorted(ids, key=lambda c: int(c))

    def pool(self, pool_id: str, create: bool = False) -> Pool | None:
        pool = self.pools.get(pool_id)
        if pool is None and create:
            pool = self.pools[pool_id] = Pool(pool_id)
            self.changes += 1
        return pool

    def remove(self, pool_id: str) -> None:
        """Drop a pool (it has no nodes left)."""
        if self.pools.pop(pool_id, None) is not None:
            self.changes += 1

    # ---- applying ------------------------------------------------------------------------

    def load(self, items: dict[str, bytes], revision: int) -> None:
        """Replace everything persisted with a snapshot (local nodes are kept)."""
        locals_ = {pid: pool.local for pid, pool in self.pools.items() if pool.local}
        self.pools = {}
        self.versions = {}
        self.changes += 1
        for pid, local in locals_.items():
            self.pool(pid, create=True).local = local
        for key, value in sorted(items.items()):
            self._apply(key, value)
        for pool in self.pools.values():
            pool.rebuild()
        self._set_revision(revision)

    def apply(self, event: StoreEvent) -> None:
        pool = self._apply(event.key, event.value)
        if pool is not None:
            pool.rebuild()
            if pool.empty:
                self.remove(pool.id)
        self._set_revision(event.revision)

    @property
    def revision(self) -> int:
        return self.applied.revision

    def _set_revision(self, revision: int) -> None:
        self.applied.advance(revision)

    async def wait_applied(self, revision: int, within: float) -> bool:
        """True once the change at `revision` has been applied (False after `within` seconds)."""
        return await self.applied.wait(revision, within)

    def _apply(self, key: str, value: bytes | None) -> Pool | None:
        """Apply one key; returns the pool it touched. Bad keys/values are logged, ignored."""
        parts = key.split("/")
        try:
            if len(parts) == 2 and parts[1] == "version":
                self._apply_version(parts[0], value)
                return None
            if parts[0] != "pools" or len(parts) < 3:
                return None  # not ours (e.g. seed markers)
            pool_id = normalize_pool(parts[1])
            if pool_id is None or pool_id != parts[1]:
                raise EntryError(f"bad pool id {parts[1]!r}")
            if parts[2:] == ["cache", "flush"]:  # a command, not configuration
                if value is not None and self.on_cache_flush is not None:
                    self.on_cache_flush(pool_id)
                return self.pools.get(pool_id)
            pool = self.pool(pool_id, create=value is not None)
            if pool is None:
                return None
            obj = None if value is None else orjson.loads(value)
            self._apply_pool_key(pool, parts[2:], obj)
            return pool
        except (EntryError, orjson.JSONDecodeError, ValueError, TypeError) as exc:
            log.warning("ignoring stored key %s: %s", key, exc)
            return self.pools.get(parts[1]) if len(parts) > 1 else None

    def _apply_version(self, chain_raw: str, value: bytes | None) -> None:
        chain = normalize_chain(chain_raw)
        if chain is None:
            raise EntryError(f"bad chain id {chain_raw!r}")
        self.changes += 1
        if value is None:
            self.versions.pop(chain, None)
            return
        self.versions[chain] = check_version(parse_version(value))

    def _apply_pool_key(self, pool: Pool, rest: list[str], obj: Any) -> None:
        what = rest[0]
        if what == "leader" and len(rest) == 1:
            pool.leader = None if obj is None else check_key(_field(obj, "key"))
            return
        if len(rest) != 2:
            raise EntryError(f"unknown key shape {'/'.join(rest)}")
        name = rest[1]
        if what == "nodes":
            self._apply_node(pool, name, obj)
        elif what == "weights":
            if obj is None:
                pool.weights.pop(name, None)
            else:
                weight = _field(obj, "weight")
                if isinstance(weight, bool) or not isinstance(weight, int) or weight < 0:
                    raise EntryError("weight must be an integer >= 0")
                pool.weights[check_key(name)] = weight
        elif what == "routes":
            if obj is None:
                pool.routes.pop(name, None)
            else:
                rules = [RouteRule.from_obj(r) for r in obj] if isinstance(obj, list) else None
                if not rules or any(r.method != name for r in rules):
                    raise EntryError("routes value must be a list of rules for this method")
                pool.routes[name] = rules
        elif what == "mirrors":
            if obj is None:
                pool.mirrors.pop(name, None)
            else:
                mirror = MirrorEntry.from_obj({k: v for k, v in obj.items() if k != "id"})
                pool.mirrors[mirror.id] = mirror
        elif what == "writers":
            if obj is None:
                pool.writers.pop(name, None)
            else:
                writer = WriterEntry.from_obj(obj)
                old = pool.writers.get(writer.key)
                if old is None or old.entry.url != writer.url:
                    entry = NodeEntry(key=writer.key, url=writer.url, kind="writer")
                    pool.writers[writer.key] = Node(entry, breaker_settings=self.breaker)
        else:
            raise EntryError(f"unknown key kind {what!r}")

    def _apply_node(self, pool: Pool, key: str, obj: Any) -> None:
        if obj is None:
            pool.nodes.pop(key, None)
            return
        entry = NodeEntry.from_obj(obj, self.max_weight)
        if entry.key != key:
            raise EntryError(f"node key {entry.key!r} does not match its store key {key!r}")
        old = pool.nodes.get(key)
        if old is not None and old.entry.url == entry.url:
            old.take_entry(entry)  # keep what was observed about the same endpoint
        else:
            pool.nodes[key] = Node(entry, breaker_settings=self.breaker)


def parse_version(value: bytes) -> Any:
    """A `{chainId}/version` value: raw text (`blue`), a JSON string or {"version": V}."""
    try:
        obj = orjson.loads(value)
    except orjson.JSONDecodeError:
        return value.decode("utf-8", "replace").strip()
    if isinstance(obj, dict):
        return obj.get("version")
    return obj


def _field(obj: Any, name: str) -> Any:
    if not isinstance(obj, dict) or name not in obj:
        raise EntryError(f"value needs {name!r}")
    return obj[name]

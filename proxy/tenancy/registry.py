"""Projects, keys and pool access as the config store holds them, followed by its watch.

Key layout (relative to the store's prefix; docs/tenancy.md):

    tenancy/projects/{projectId}   {"id","name","limits","rules","created"}
    tenancy/keys/{keyId}           {"id","project","hash","prefix","name","limits","rules",
                                    "created","revoked"?}
    tenancy/pools/{poolId}         {"anonymous","limits","rules"}

Like the routing state, this is built only from a snapshot and the watch after it, so an
admin change made through any proxy (or `etcdctl`) reaches every proxy the same way; a
revoked key is refused as soon as its change arrives (etcd's watch: tens of milliseconds).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import orjson

from chainstate.tasks import stop_task
from proxy.applied import AppliedRevision
from proxy.model import EntryError, normalize_pool
from proxy.store import ConfigStore, StoreEvent, StoreUnavailable
from proxy.tenancy.model import KeyRecord, PoolAccess, Project

log = logging.getLogger(__name__)
PREFIX = "tenancy/"
RETRY_DELAY = 1.0  # seconds between attempts to reach the store or re-open its watch


class Registry:
    def __init__(self, store: ConfigStore) -> None:
        self.store = store
        self.projects: dict[str, Project] = {}
        self.keys: dict[str, KeyRecord] = {}  # key id → record
        self.by_hash: dict[str, KeyRecord] = {}  # sha256 hex → record
        self.pools: dict[str, PoolAccess] = {}
        self.applied = AppliedRevision()
        # Bumped on every applied change: what was derived from the records (the gate's
        # subjects) is derived again after it.
        self.version = 0
        self.on_change: Callable[[], None] | None = None
        self.loaded = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def empty(self) -> bool:
        """No key and no pool setting: every pool serves anonymous clients unchecked."""
        return not self.keys and not self.pools

    async def start(self) -> None:
        """Loads what the store has now (when it answers), then follows it in the background.
        The store itself is started and closed by the routing state's sync."""
        try:
            revision: int | None = await self._load()
        except StoreUnavailable as exc:
            # (the routing state's sync says so once for the store; this follows it quietly)
            log.debug("tenancy: config store unavailable at start (%s); retrying", exc)
            revision = None
        self._task = asyncio.create_task(self._follow(revision))

    async def close(self) -> None:
        await stop_task(self._task)
        self._task = None

    async def _load(self) -> int:
        items, revision = await self.store.snapshot(PREFIX)
        self.projects, self.keys, self.by_hash, self.pools = {}, {}, {}, {}
        for key, value in sorted(items.items()):
            self._apply(key, value)
        self._changed(revision)
        self.loaded.set()
        return revision

    async def _follow(self, revision: int | None) -> None:
        while True:
            try:
                if revision is None:
                    revision = await self._load()
                async for event in self.store.watch(PREFIX, revision + 1):
                    self.apply(event)
                    revision = max(revision, event.revision)
                return
            except StoreUnavailable as exc:
                log.debug("tenancy: config store unavailable: %s", exc)
            except Exception:
                log.exception("tenancy: config store watch failed; retrying")
            await asyncio.sleep(RETRY_DELAY)

    def apply(self, event: StoreEvent) -> None:
        self._apply(event.key, event.value)
        self._changed(event.revision)

    @property
    def revision(self) -> int:
        return self.applied.revision

    def _changed(self, revision: int) -> None:
        self.version += 1
        if self.on_change is not None:
            self.on_change()
        self.applied.advance(revision)

    async def wait_applied(self, revision: int, within: float) -> bool:
        return await self.applied.wait(revision, within)

    def _apply(self, key: str, value: bytes | None) -> None:
        parts = key.split("/")
        if len(parts) != 3 or parts[0] != "tenancy":
            return
        kind, name = parts[1], parts[2]
        try:
            obj = None if value is None else orjson.loads(value)
            if kind == "projects":
                self._project(name, obj)
            elif kind == "keys":
                self._key(name, obj)
            elif kind == "pools":
                self._pool(name, obj)
        except (EntryError, orjson.JSONDecodeError, ValueError, TypeError) as exc:
            log.warning("tenancy: ignoring stored key %s: %s", key, exc)

    def _project(self, name: str, obj: object) -> None:
        if obj is None:
            self.projects.pop(name, None)
            return
        project = Project.from_obj(obj)
        if project.id != name:
            raise EntryError(f"project id {project.id!r} does not match its store key")
        self.projects[name] = project

    def _key(self, name: str, obj: object) -> None:
        old = self.keys.pop(name, None)
        if old is not None:
            self.by_hash.pop(old.hash, None)
        if obj is None:
            return
        record = KeyRecord.from_obj(obj)
        if record.id != name:
            raise EntryError(f"key id {record.id!r} does not match its store key")
        self.keys[name] = record
        self.by_hash[record.hash] = record

    def _pool(self, name: str, obj: object) -> None:
        if normalize_pool(name) != name:
            raise EntryError(f"bad pool id {name!r}")
        if obj is None:
            self.pools.pop(name, None)
        else:
            self.pools[name] = PoolAccess.from_obj(obj)

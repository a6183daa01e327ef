"""Keeps the routing state in step with the store: seed, snapshot, then follow the watch.

Config-file entries (`[[proxy.nodes]]`, `[[proxy.writers]]`) are written to the store once:
an entry is seeded only when its marker `seeded/{poolId}/{nodes|writers}/{key}` is absent,
so a node deleted through the admin API stays deleted after a restart, and a node added to
the file later is picked up. If the store is unreachable at start, the proxy serves what it
has (nothing) and keeps retrying in the background.
"""

from __future__ import annotations

import asyncio
import logging

import orjson

from chainstate.tasks import stop_task
from proxy.model import EntryError, NodeEntry, WriterEntry, normalize_pool
from proxy.settings import ProxySettings
from proxy.state import RoutingState
from proxy.store import ConfigStore, StoreUnavailable

log = logging.getLogger(__name__)
RETRY_DELAY = 1.0  # seconds between attempts to reach the store or re-open its watch


class StoreSync:
    def __init__(self, store: ConfigStore, state: RoutingState, settings: ProxySettings) -> None:
        self.store = store
        self.state = state
        self.settings = settings
        self._task: asyncio.Task[None] | None = None
        self.loaded = asyncio.Event()

    async def start(self) -> None:
        """Start the store; load it now when it answers, else keep trying in the background."""
        await self.store.start()
        try:
            revision = await self._load()
        except StoreUnavailable as exc:
            log.warning("config store unavailable at start (%s); retrying in background", exc)
            revision = None
        self._task = asyncio.create_task(self._follow(revision))

    async def close(self) -> None:
        await stop_task(self._task)
        self._task = None
        await self.store.close()

    async def _load(self) -> int:
        await self._seed()
        items, revision = await self.store.snapshot("")
        self.state.load(items, revision)
        self.loaded.set()
        return revision

    async def _seed(self) -> None:
        items, _ = await self.store.snapshot("seeded/")
        for node in self.settings.nodes:
            pool = _pool(node.chain)
            entry = NodeEntry.from_obj(
                {
                    "key": node.key,
                    "url": node.url,
                    "kind": node.kind,
                    "weight": node.weight,
                    "enabled": node.enabled,
                    "budget": node.budget,
                },
                self.settings.max_weight,
            )
            await self._seed_one(items, f"pools/{pool}/nodes/{node.key}", entry.to_obj())
        for writer in self.settings.writers:
            pool = _pool(writer.chain)
            w = WriterEntry.from_obj({"key": writer.key, "url": writer.url})
            seeded = await self._seed_one(items, f"pools/{pool}/writers/{w.key}", w.to_obj())
            if seeded and writer.leader:
                await self.store.put(f"pools/{pool}/leader", orjson.dumps({"key": w.key}))

    async def _seed_one(self, markers: dict[str, bytes], key: str, obj: dict) -> bool:
        marker = "seeded/" + key.removeprefix("pools/")
        if marker in markers:
            return False
        await self.store.put(key, orjson.dumps(obj))
        await self.store.put(marker, b"1")
        return True

    async def _follow(self, revision: int | None) -> None:
        # An outage is said once (start() already said it when the store was down at start),
        # then retried quietly every RETRY_DELAY until the store answers again.
        quiet = revision is None
        while True:
            try:
                if revision is None:
                    revision = await self._load()
                    if quiet:
                        log.warning("config store reachable; configuration loaded")
                quiet = False
                async for event in self.store.watch("", revision + 1):
                    self.state.apply(event)
                    revision = max(revision, event.revision)
                return  # the store closed its watch
            except StoreUnavailable as exc:
                if quiet:
                    log.debug("config store still unavailable: %s", exc)
                else:
                    log.warning("config store watch interrupted (%s); retrying", exc)
                    quiet = True
            except Exception:
                log.exception("config store watch failed; retrying")
            await asyncio.sleep(RETRY_DELAY)


def _pool(chain: str) -> str:
    pool = normalize_pool(chain)
    if pool is None:
        raise EntryError(f"[[proxy.nodes]] chain {chain!r} is not a chain id")
    return pool

"""Tenancy's parts and their background work: the registry's watch, the Redis sync, the
usage flushes; `/health` and metrics say whether the shared counters can be reached."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from chainstate.tasks import stop_task
from proxy.store import ConfigStore
from proxy.tenancy.gate import Gate
from proxy.tenancy.registry import Registry
from proxy.tenancy.settings import TenancySettings
from proxy.tenancy.shared import Shared, prune
from proxy.tenancy.usage import RedisSink, SqliteSink, Usage

log = logging.getLogger(__name__)


class Tenancy:
    def __init__(self, settings: TenancySettings, store: ConfigStore) -> None:
        self.settings = settings
        self.registry = Registry(store)
        self.usage = Usage(settings.max_project_labels)
        self.gate = Gate(settings, self.registry, self.usage)
        self.shared: Shared | None = None
        if settings.redis_url is not None:
            self.shared = Shared(
                settings.redis_url,
                settings.redis_prefix,
                settings.redis_timeout,
                settings.sync_interval,
            )
        self._tasks: list[asyncio.Task[None]] = []

    def register_metrics(self, registry: CollectorRegistry) -> None:
        registry.register(self.usage.collector())
        registry.register(_StateCollector(self))

    async def start(self) -> None:
        if self.shared is not None:
            self.usage.sink = RedisSink(
                self.shared.redis, self.settings.redis_prefix, self.settings.usage_retention_days
            )
        else:
            self.usage.sink = SqliteSink(
                self.settings.usage_path, self.settings.usage_retention_days
            )
        await self.registry.start()
        self._tasks = [
            asyncio.create_task(self._sync_loop()),
            asyncio.create_task(self._flush_loop()),
        ]

    async def close(self) -> None:
        for task in self._tasks:
            await stop_task(task)
        self._tasks = []
        with contextlib.suppress(Exception):
            await self.usage.flush()
        await self.registry.close()
        if self.shared is not None:
            await self.shared.close()
        sink = self.usage.sink
        if isinstance(sink, SqliteSink):
            sink.close()

    async def _sync_loop(self) -> None:
        active = self.gate.active_limiters
        closed = self.settings.quota_fail == "closed"
        while True:
            await asyncio.sleep(self.settings.sync_interval)
            self.gate.settle()  # (what the leases hold unused goes back before the counts go)
            prune(active, time.monotonic(), time.time())
            shared = self.shared
            if shared is None:
                for bucket in active.buckets:
                    bucket.pending = 0
                continue
            try:
                await shared.sync(active)
            except Exception:
                log.exception("tenancy: sync failed")
            self.gate.quota_closed = closed and shared.up is False

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.usage_flush)
            await self.usage.flush()

    def health(self) -> dict[str, Any]:
        shared = self.shared
        if shared is None:
            redis = "off"
        else:
            redis = {None: "starting", True: "up", False: "down"}[shared.up]
        out: dict[str, Any] = {
            "redis": redis,
            "limits": "local" if redis != "up" else "shared",
            "projects": len(self.registry.projects),
            "keys": len(self.registry.keys),
        }
        if shared is not None:
            out["fleet"] = shared.fleet
            if shared.up is False:
                out["redis_error"] = shared.last_error
        return out


class _StateCollector(Collector):
    def __init__(self, tenancy: Tenancy) -> None:
        self.tenancy = tenancy

    def collect(self) -> Iterator[Any]:
        shared = self.tenancy.shared
        up = GaugeMetricFamily(
            "chainstate_tenancy_redis_up",
            "1 while the shared counters answer, 0 while limits are local (-1: no Redis set)",
        )
        up.add_metric([], -1 if shared is None else (1 if shared.up else 0))
        yield up
        fleet = GaugeMetricFamily(
            "chainstate_tenancy_fleet_proxies", "proxies sharing the limits (last seen)"
        )
        fleet.add_metric([], 1 if shared is None else shared.fleet)
        yield fleet
        keys = GaugeMetricFamily("chainstate_tenancy_keys", "API keys in the config store")
        keys.add_metric([], len(self.tenancy.registry.keys))
        yield keys

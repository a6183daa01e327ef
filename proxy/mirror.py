"""Mirrors: copies of matching requests sent fire-and-forget to mirror targets.

Copies wait in one bounded queue drained by a few workers; when the queue is full the copy is
dropped (and counted). Nothing here can delay or change a client's response.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import orjson
from opentelemetry import context as otel_context
from opentelemetry import trace

from proxy import nesting
from proxy.metrics import ProxyMetrics
from proxy.model import Pool
from proxy.upstream import Upstream, UpstreamError

log = logging.getLogger(__name__)


class Mirrors:
    def __init__(
        self,
        upstream: Upstream,
        metrics: ProxyMetrics,
        tracer: trace.Tracer | None,
        queue_size: int,
        workers: int,
        timeout: float,
    ) -> None:
        self.upstream = upstream
        self.metrics = metrics
        self.tracer = tracer
        self.timeout = timeout
        self._queue: asyncio.Queue[tuple[str, bytes, Any]] = asyncio.Queue(maxsize=queue_size)
        self._workers = workers
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._run()) for _ in range(self._workers)]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    def offer_single(self, pool: Pool, method: str, body: bytes) -> None:
        for mirror in pool.mirrors.values():
            if mirror.wants(method):
                self._put(mirror.url, body)

    def offer_batch(self, pool: Pool, items: list[tuple[str, Any]]) -> None:
        """`items`: (method, request object) of the valid items of a batch."""
        for mirror in pool.mirrors.values():
            chosen = [obj for method, obj in items if mirror.wants(method)]
            if chosen:
                try:
                    body = orjson.dumps(chosen)
                except TypeError:  # items too deep to write again are not copied
                    gone = set(nesting.deep(chosen))
                    chosen = [obj for i, obj in enumerate(chosen) if i not in gone]
                    if not chosen:
                        continue
                    body = orjson.dumps(chosen)
                self._put(mirror.url, body)

    def _put(self, url: str, body: bytes) -> None:
        try:
            ctx = otel_context.get_current() if self.tracer is not None else None
            self._queue.put_nowait((url, body, ctx))
        except asyncio.QueueFull:
            self.metrics.mirror("dropped")

    async def _run(self) -> None:
        while True:
            url, body, ctx = await self._queue.get()
            try:
                await self._copy(url, body, ctx)
            except Exception:  # a mirror must never take a worker down
                log.exception("mirror copy to %s failed unexpectedly", url)

    async def _copy(self, url: str, body: bytes, ctx: Any) -> None:
        outcome = "sent"
        span = None
        if self.tracer is not None:  # a child of the client's request span
            span = self.tracer.start_span("mirror.copy", context=ctx)
        try:
            await self.upstream.send(url, body, self.timeout)
        except UpstreamError as exc:
            outcome = "failed"
            log.info("mirror copy to %s failed: %s", url, exc)
        finally:
            self.metrics.mirror(outcome)
            if span is not None:
                span.set_attribute("target", url)
                span.set_attribute("outcome", outcome)
                span.end()

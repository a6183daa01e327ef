"""A request's books once it is answered: its latency, its span's attributes, its access log.

Nothing here is on the client's wait when the answer could be written first: the pipeline
writes a node's final bytes to the client, then closes the books.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace

from proxy.metrics import ProxyMetrics
from proxy.request import Ctx

access_log = logging.getLogger("chainstate.proxy.access")
SOURCE_HEADERS = ("x-vendor-biz", "x-vendor-source", "x-vendor-source-host", "x-vendor-env")
MAX_HEADER_VALUE = 256  # longer client header values are cut in logs and spans


class Books:
    def __init__(self, metrics: ProxyMetrics, tracer: trace.Tracer | None) -> None:
        self.metrics = metrics
        self.tracer = tracer

    def quiet(self) -> bool:
        """Whether nothing is traced or logged per item (a whole batch may then be answered
        without being parsed)."""
        return self.tracer is None and not access_log.isEnabledFor(logging.INFO)

    def close(
        self,
        ctx: Ctx,
        shape: str,
        size: int,
        answer: tuple[int, bytes],
        started: float,
        headers: Mapping[str, str],
        span: Any = None,
    ) -> tuple[int, bytes]:
        """The request's own books once it is answered: its latency, span and access log."""
        elapsed = time.perf_counter() - started
        self.metrics.observe(ctx.chain, shape, elapsed)
        if span is not None:
            self._annotate(span, ctx, size, headers)
        if access_log.isEnabledFor(logging.INFO):
            self._log(ctx, size, answer[0], elapsed, headers)
        return answer

    @staticmethod
    def _annotate(span: Any, ctx: Ctx, size: int, headers: Mapping[str, str]) -> None:
        span.set_attribute("chain", ctx.chain)
        span.set_attribute("pool", ctx.pool.id)
        span.set_attribute("rpc.methods", sorted(set(ctx.methods)))
        span.set_attribute("batch.size", size)
        client_id = headers.get("client-id")
        if client_id:
            span.set_attribute("client_id", client_id[:MAX_HEADER_VALUE])
        for name in SOURCE_HEADERS:
            value = headers.get(name)
            if value:
                span.set_attribute(name.replace("-", "_"), value[:MAX_HEADER_VALUE])

    @staticmethod
    def _log(ctx: Ctx, size: int, status: int, elapsed: float, headers: Mapping[str, str]) -> None:
        extra: dict[str, Any] = {
            "chain": ctx.chain,
            "pool": ctx.pool.id,
            "methods": sorted(set(ctx.methods)),
            "nodes": ctx.nodes,
            "items": size,
            "status": status,
            "ms": round(elapsed * 1000, 3),
            "client_id": _cut(headers.get("client-id")),
        }
        for name in SOURCE_HEADERS:
            extra[name.replace("-", "_")] = _cut(headers.get(name))
        access_log.info("request", extra=extra)


def _cut(value: str | None) -> str | None:
    return None if value is None else value[:MAX_HEADER_VALUE]

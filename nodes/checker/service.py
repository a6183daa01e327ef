"""The consistency checker as a component: ledger + replica poller + JSON-RPC + metrics."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from chainstate.inproc import InprocRegistry
from chainstate.jsonrpc import DATABASE_FAILED, Dispatcher, JsonRpcError
from chainstate.rpcclient import RpcClient
from chainstate.rpcserver import rpc_handler
from nodes.checker.ledger import Ledger
from nodes.checker.methods import checker_methods
from nodes.checker.poller import CheckerMetrics, Poller
from nodes.checker.settings import CheckerSettings


class CheckerNode:
    def __init__(
        self, settings: CheckerSettings, *, data_dir: Path | None, registry: InprocRegistry | None
    ) -> None:
        self.settings = settings
        self.data_dir = data_dir
        self.registry = registry
        self.metrics_registry = CollectorRegistry()
        self.metrics = CheckerMetrics(self.metrics_registry)
        self.dispatcher = Dispatcher("checker", error_code=DATABASE_FAILED)
        self.ledger: Ledger | None = None
        self.poller: Poller | None = None
        self._clients: dict[str, RpcClient] = {}
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def from_config(
        cls, section: dict[str, Any], *, data_dir: Path, registry: InprocRegistry | None = None
    ) -> CheckerNode:
        return cls(CheckerSettings.from_section(section), data_dir=data_dir, registry=registry)

    async def start(self) -> None:
        path = self.data_dir / "checker.sqlite" if self.data_dir else None
        self.ledger = Ledger(path)
        self.dispatcher.update(checker_methods(self.ledger))
        timeout = self.settings.request_timeout
        self._clients = {
            url: RpcClient(url, registry=self.registry, timeout=timeout)
            for url in self.settings.replicas
        }
        self.poller = Poller(self.settings, self.ledger, self._clients, self.metrics)
        self.dispatcher.update({"checker_status": self._status})
        self._task = asyncio.create_task(self.poller.run(), name="checker-poller")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for client in self._clients.values():
            await client.close()
        if self.ledger is not None:
            self.ledger.close()

    async def _status(self, params: Any) -> dict[str, Any]:
        """`checker_status` (no params): what the routing proxy follows (docs/checker.md)."""
        if params not in (None, [], {}):
            raise JsonRpcError(DATABASE_FAILED, "checker_status takes no params")
        assert self.poller is not None
        return self.poller.status()

    async def handle_body(self, body: bytes) -> bytes:
        return await self.dispatcher.handle_body(body)

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/", rpc_handler(self.handle_body))
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        return app

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.metrics_registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    def health(self) -> dict[str, Any]:
        """The confirmed height, and the replicas' disagreement confirmation waits at."""
        latest = self.ledger.latest() if self.ledger else None
        dispute = self.poller.dispute if self.poller else None
        return {
            "status": "ok" if dispute is None else "disagreement",
            "confirmed": latest.num if latest else None,
            "disagreement": dispute,
            "diverged": self.ledger.diverged() if self.ledger else {},
        }

    async def _health(self, request: web.Request) -> web.Response:
        # 200 even with a disagreement: restarting the checker would not resolve it.
        return web.json_response(self.health())

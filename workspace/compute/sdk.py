"""The SDK gateway: the workspace API over a Unix socket for code running in the sandbox.

Runs have no network, so `chainstate_sdk` talks HTTP over a Unix socket (a file, reachable
across network namespaces). Each run gets a random token bound to the caller's `Principal`;
the gateway serves a fixed subset of the workspace's own endpoints (table get, rows, row
query, chain-state calls) with that principal, so the SDK has exactly the caller's rights.
Successful table calls are recorded as table access (read or write) for table/instance/list
and `deps`; chain-state calls, tasks and blocks feed the instance's blockx metrics.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from cachetools import TTLCache

from workspace.auth import Principal
from workspace.errors import UNAUTHENTICATED, ApiError, invalid, ok
from workspace.http import (
    AppCtx,
    Call,
    Endpoint,
    envelope_middleware,
    json_response,
    read_json_body,
)
from workspace.validate import parse_fields

log = logging.getLogger("workspace.compute.sdk")

SDK_PATHS = {
    "/v1/table": "read",
    "/v1/table/row/get": "read",
    "/v1/table/row/list": "read",
    "/v1/table/row/query": "read",
    "/v1/table/row/create": "write",
    "/v1/table/row/update": "write",
    "/v1/table/row/delete": "write",
    "/v1/chainstate/{chain_id}": "chain",
}
ACCESS_RECORD_INTERVAL_S = 1.0  # one access write per (table, run, kind) per second at most

Metric = Callable[[str, dict[str, Any]], None]  # (kind, event) -> None
RecordAccess = Callable[[str, str, str, str, int], Awaitable[None]]


@dataclass(frozen=True)
class SdkSession:
    """One run's SDK identity: who it acts as and what to attribute its accesses to."""

    token: str
    principal: Principal
    run_id: str  # instance id, or the saved Function's id (access is recorded per Function)
    reader: str  # notebook id or Function id (counted in `deps`)
    on_metric: Metric | None


class SdkGateway:
    """Serves SDK calls of running code; one per server, on `socket_path`."""

    def __init__(
        self,
        ctx: AppCtx,
        endpoints: list[Endpoint],
        record_access: RecordAccess,
        socket_path: Path,
    ) -> None:
        self.ctx = ctx
        self.endpoints = [ep for ep in endpoints if ep.path in SDK_PATHS]
        self.record_access = record_access
        self.socket_path = socket_path
        self._sessions: dict[str, SdkSession] = {}
        self._recent: TTLCache[tuple[str, str, str], bool] = TTLCache(
            maxsize=10000, ttl=ACCESS_RECORD_INTERVAL_S
        )
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application(middlewares=[envelope_middleware], client_max_size=64 * 1024**2)
        for ep in self.endpoints:
            app.router.add_route(ep.method, ep.path, self._handler(ep))
        app.router.add_post("/sdk/metric", self._metric)
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.UnixSite(self._runner, str(self.socket_path)).start()
        self.socket_path.chmod(0o666)  # runs use their own uids; the token is the credential

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def open_session(
        self, principal: Principal, run_id: str, reader: str, on_metric: Metric | None = None
    ) -> dict[str, str]:
        """Register a run; returns the environment variables that let its SDK connect."""
        token = secrets.token_urlsafe(32)
        self._sessions[token] = SdkSession(token, principal, run_id, reader, on_metric)
        return {"CHAINSTATE_SDK_SOCKET": str(self.socket_path), "CHAINSTATE_SDK_TOKEN": token}

    def close_session(self, env: dict[str, str]) -> None:
        self._sessions.pop(env.get("CHAINSTATE_SDK_TOKEN", ""), None)

    def _session(self, request: web.Request) -> SdkSession:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        sess = self._sessions.get(token) if scheme == "Run" else None
        if sess is None:
            raise ApiError(UNAUTHENTICATED, "unknown or finished run token")
        return sess

    def _handler(self, ep: Endpoint) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        access = SDK_PATHS[ep.path]

        async def handle(request: web.Request) -> web.StreamResponse:
            sess = self._session(request)
            if ep.raw:
                params: dict[str, Any] = {}
            elif ep.method == "GET":
                params = parse_fields(ep.params, dict(request.query), query=True)
            else:
                settings = self.ctx.settings
                body = await read_json_body(
                    request, settings.max_body_bytes, settings.max_json_depth
                )
                params = parse_fields(ep.params, body, query=False)
            result = await ep.handler(Call(request, self.ctx, params, sess.principal))
            if access == "chain":
                if sess.on_metric is not None:
                    sess.on_metric("call", {})
            else:
                table_id = params.get("table_id") or params.get("id")
                if isinstance(table_id, str):
                    await self._record(sess, table_id, access)
            if isinstance(result, web.StreamResponse):
                return result
            return json_response(ok(result))

        return handle

    async def _record(self, sess: SdkSession, table_id: str, access: str) -> None:
        if not sess.reader:
            return  # an ad-hoc run: no table's dependency, nothing to record
        key = (table_id, sess.run_id, access)
        if key in self._recent:
            return
        self._recent[key] = True
        now_ms = int(time.time() * 1000)
        await self.record_access(table_id, sess.run_id, access, sess.reader, now_ms)

    async def _metric(self, request: web.Request) -> web.StreamResponse:
        sess = self._session(request)
        body = await read_json_body(request, 64 * 1024)
        kind = body.get("kind")
        if kind not in ("task", "block"):
            raise invalid("kind must be task or block")
        if sess.on_metric is not None:
            sess.on_metric(str(kind), body)
        return json_response(ok(None))

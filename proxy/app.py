"""The proxy's aiohttp application: data path, metrics, admin API and their lifecycle.

`create_app` builds every part once per app (no globals): the routing state fed by the store,
the upstream session, the selector, the engine, the head tracker, the mirror workers and the
events part (filters, WebSocket subscriptions: proxy/events.py, docs/events.md).
Background work starts and stops through `cleanup_ctx`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from opentelemetry import trace
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from chainstate.config import ConfigError
from chainstate.httpserver import Handler, HttpServer, Request, Response, ServerLimits
from chainstate.inproc import InprocRegistry
from chainstate.rpcserver import read_body
from proxy.admin import AdminApi
from proxy.breaker import BreakerSettings
from proxy.cache import ResponseCache
from proxy.engine import Engine
from proxy.events import Events
from proxy.eventsettings import EventSettings
from proxy.heads import Heads
from proxy.health import HeadTracker
from proxy.metrics import ProxyMetrics
from proxy.mirror import Mirrors
from proxy.model import EntryError, Pool
from proxy.reads import Reads, ReadSettings
from proxy.select import Selector
from proxy.settings import ProxySettings
from proxy.sharedcache import shared_tier, tier_health
from proxy.state import RoutingState
from proxy.store import ConfigStore
from proxy.sync import StoreSync
from proxy.tenancy.admin import TenancyAdmin
from proxy.tenancy.gate import Gate, Ticket
from proxy.tenancy.http import KEY_ROUTE, key_path, raw_headers
from proxy.tenancy.service import Tenancy
from proxy.tenancy.settings import TenancySettings
from proxy.tenancy.websocket import message_gate
from proxy.upstream import Upstream
from proxy.verdicts import CheckerVerdicts

JSON = "application/json"
MAX_DATA_PATHS = 1024  # data paths whose handler the data route keeps (then cleared)


@dataclass(slots=True)
class Proxy:
    """Every part of one proxy app."""

    settings: ProxySettings
    state: RoutingState
    store: ConfigStore
    upstream: Upstream
    selector: Selector
    metrics: ProxyMetrics
    mirrors: Mirrors
    engine: Engine
    tracker: HeadTracker
    verdicts: CheckerVerdicts
    sync: StoreSync
    admin: AdminApi
    reads: Reads
    events: Events  # filters and WebSocket subscriptions (the engine diverts their bodies)
    tenancy: Tenancy  # keys, limits, rules and usage: `Gate.admit` at admission

    @classmethod
    def build(
        cls,
        settings: ProxySettings,
        store: ConfigStore,
        registry: InprocRegistry | None,
        tracer: trace.Tracer | None,
        event_settings: EventSettings,
        tenancy_settings: TenancySettings | None = None,
    ) -> Proxy:
        s = settings
        real_tracer = None if tracer is None or isinstance(tracer, trace.NoOpTracer) else tracer
        breaker = BreakerSettings(s.breaker_failures, s.breaker_cooldown, s.breaker_cooldown_max)
        state = RoutingState(max_weight=s.max_weight, breaker=breaker)
        upstream = Upstream(
            registry,
            s.upstream_connections,
            s.upstream_keepalive,
            s.max_buffered_bytes,
            s.max_answer_bytes,
        )
        selector = Selector(s.state_window, s.known_hashes, latency_decay=s.latency_decay)
        metrics = ProxyMetrics(s.client_id_top_n)
        mirrors = Mirrors(
            upstream,
            metrics,
            real_tracer,
            s.mirror_queue_size,
            s.mirror_workers,
            s.mirror_timeout,
        )
        reads = cls.build_reads(s, upstream, selector)
        state.on_cache_flush = reads.cache.flush
        engine = Engine(s, state, upstream, selector, metrics, mirrors, real_tracer, reads)
        metrics.watch_reads(reads)
        admission = engine.admission
        metrics.watch_nodes(
            lambda: state.pools,
            lambda: engine.inflight,
            lambda pool: admission.limit(pool, time.perf_counter()),
        )
        tracker = HeadTracker(
            lambda: state.pools,
            upstream,
            selector,
            s.head_poll_interval,
            s.poll_timeout,
            s.unhealthy_after,
            on_block=reads.heads.observe,
        )
        verdicts = CheckerVerdicts(
            s.checkers,
            lambda: state.pools,
            upstream,
            s.checker_poll_interval,
            s.poll_timeout,
            on_flagged=reads.cache.flush,
        )
        sync = StoreSync(store, state, s)
        admin = AdminApi(s, state, store, engine, tracker, reads)
        events = Events.for_engine(
            event_settings, s, engine, lambda: state.pools, registry, metrics.registry
        )
        tenancy = Tenancy(tenancy_settings or TenancySettings(), store)
        tenancy.register_metrics(metrics.registry)
        return cls(
            s,
            state,
            store,
            upstream,
            selector,
            metrics,
            mirrors,
            engine,
            tracker,
            verdicts,
            sync,
            admin,
            reads,
            events,
            tenancy,
        )

    @staticmethod
    def build_reads(s: ProxySettings, upstream: Upstream, selector: Selector) -> Reads:
        """Heads, response cache and coalescing (docs/proxy.md: the read path)."""
        cache = ResponseCache(s.cache_max_bytes, s.cache_pools, shared_tier(s))
        heads = Heads(
            upstream,
            selector,
            history=s.head_history,
            timeout=s.poll_timeout,
            interval=s.head_poll_interval,
            checkers={c.chain: c.url for c in s.checkers},
            on_dropped=cache.drop,
            backfill=cache.tier is not None,
        )
        return Reads(heads, cache, ReadSettings(frozenset(s.cache_methods), s.coalesce))

    async def lifecycle(self, _app: web.Application) -> AsyncIterator[None]:
        await self.upstream.start()
        try:
            try:
                await self.sync.start()
            except EntryError as exc:
                raise ConfigError(f"[proxy] {exc}") from None
            await self.mirrors.start()
            await self.reads.heads.start()
            if self.reads.cache.tier is not None:
                await self.reads.cache.tier.start()
            await self.tracker.start()
            await self.verdicts.start()
            await self.events.start()
            await self.tenancy.start()
            yield
        finally:
            await self.tenancy.close()
            await self.events.close()
            await self.verdicts.close()
            await self.tracker.close()
            await self.reads.heads.close()
            if self.reads.cache.tier is not None:
                await self.reads.cache.tier.close()
            await self.mirrors.close()
            await self.sync.close()
            await self.upstream.close()


PROXY = web.AppKey("proxy", Proxy)


def get_proxy(app: web.Application) -> Proxy:
    return app[PROXY]


def get_engine(app: web.Application) -> Engine:
    """The engine of a proxy app, for in-process forwarding:
    `await get_engine(app).handle(chain_id, body, headers) -> (status, body)`."""
    return app[PROXY].engine


def server_limits(settings: ProxySettings) -> ServerLimits:
    """The client-facing limits of the proxy's data listener (docs/proxy.md)."""
    return ServerLimits(
        max_body=settings.max_body_bytes,
        body_limit_name="max_body_bytes",
        max_head=settings.max_head_bytes,
        idle_timeout=settings.client_idle_timeout,
        read_timeout=settings.client_read_timeout,
        max_connections=settings.max_client_connections,
        shutdown_timeout=settings.shutdown_timeout,
        busy_poll=settings.busy_poll_us / 1e6,
    )


def _data_handler(proxy: Proxy):
    """`POST /:chainId` for connections aiohttp already serves (after an admin call on the
    same connection); the lean server answers it otherwise (`create_server`)."""
    engine = proxy.engine
    gate = proxy.tenancy.gate
    limits = server_limits(proxy.settings)

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await read_body(request, limits)
        if isinstance(body, web.Response):
            return body
        chain = request.match_info["chain"]
        found = engine.resolve(chain)
        verdict = None
        if found is not None:
            raw = raw_headers(request.headers)
            key = request.match_info.get("key")
            verdict = gate.admit(found[1], key, raw, body, request)
        if type(verdict) is tuple:
            answer = verdict
        else:
            headers = PeerHeaders(request.headers, request.remote or "unknown")
            tally = None if verdict is None else verdict.tally
            answer = await engine.handle(chain, body, headers, tally=tally)
            if verdict is not None:
                answer = verdict.finish(answer)
        status, out = answer[0], answer[1]
        headers = _header_lines(answer[2]) if len(answer) > 2 else None
        if status == 204:
            return web.Response(status=204, headers=headers)
        return web.Response(status=status, body=out, content_type=JSON, headers=headers)

    return handle


class PeerHeaders(Mapping[str, str]):
    """aiohttp's request headers (case-insensitive) and the client's address, `peer()`, as
    the lean server's headers carry it: filters count against their client's quota."""

    __slots__ = ("_headers", "_peer")

    def __init__(self, headers: Mapping[str, str], peer: str) -> None:
        self._headers = headers
        self._peer = peer

    def __getitem__(self, name: str) -> str:
        return self._headers[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._headers)

    def __len__(self) -> int:
        return len(self._headers)

    def get(self, name: str, default: Any = None) -> Any:
        return self._headers.get(name, default)

    def peer(self) -> str:
        return self._peer


def _header_lines(raw: bytes) -> dict[str, str]:
    """`Name: value\r\n` lines (the engine's extra headers) as a dict for aiohttp."""
    out = {}
    for line in raw.decode("latin-1").split("\r\n"):
        name, sep, value = line.partition(":")
        if sep:
            out[name.strip()] = value.strip()
    return out


def create_server(app: web.Application) -> HttpServer:
    """The proxy's data listener: the lean server answers `POST /:chainId` itself and hands
    every other request (admin API, /metrics, WebSocket upgrades) to `app`, which owns the
    lifecycle (it starts with the server and stops after it)."""
    proxy = app[PROXY]
    engine = proxy.engine
    # The paths the data route took → their handler, which holds the path's chain id
    # (`/1337` → "1337") and what `Engine.resolve` found for it: the route decides once per
    # path. Bytes `count`, `in` and `decode` cost ~0.2-0.4 µs each per
    # request on these machines, a dict lookup ~0.05; a handler per path also saves the
    # handler's own lookup of the path.
    handlers: dict[bytes, Handler] = {}
    gate = proxy.tenancy.gate

    def route(method: bytes, path: bytes) -> Any:
        # One path segment: `/1337`, `/0x539`, `/1337-blue`, or two with a key in the second
        # (`/1337/<key>`); %-escapes go to aiohttp, which decodes them. (`find`, not `in`:
        # bytes' `in` tries the operand as an int first and clears the TypeError, twice the
        # cost.)
        if method != b"POST":
            return _preflight(proxy, path) if method == b"OPTIONS" else None
        handler = handlers.get(path)
        if handler is not None:
            return handler
        if path.count(b"/") <= 2 and path.find(b"%") < 0:
            found = key_path(path)
            if found is None:
                return None
            if len(handlers) >= MAX_DATA_PATHS:
                handlers.clear()
            handler = handlers[path] = _data(engine, found[0], gate, found[1])
            return handler
        return None

    # (A path's handler is the same for good, whichever object holds it: a connection's
    # kept head keeps it, no `route` call per request.)
    limits = server_limits(proxy.settings)
    # Answers a client has not read count in max_buffered_bytes as the answers in flight do
    # (its 503 refuses new requests while they hold it).
    held = proxy.upstream.budget
    return HttpServer(route, limits=limits, fallback=app, name="proxy", kept_routes=True, held=held)


def _data(engine: Engine, chain_id: str, gate: Gate, path_key: str | None = None) -> Handler:
    """The data route's handler of one path (`chain_id`, and a key in the path if any):
    tenancy's admission first when it has anything to look at (`Gate.admit`: a refusal at
    once, or a ticket that follows the answer), then the engine's synchronous start
    (`Engine.start`: an answer at once, None when it answers later itself, or a coroutine
    the server runs). The path's (chain, pool) as `Engine.resolve` found them (None:
    unknown) is kept until the routing state changes (`RoutingState.changes`): resolving
    the path again for every request cost ~3k instructions of it."""
    state = engine.state
    start = engine.start
    found: tuple[str, Pool] | None = None
    pool: Pool | None = None
    resolved_at = -1  # (`changes` counts from 0: resolved at the first request)

    def data(request: Request) -> Awaitable[Response] | Response | None:
        nonlocal found, pool, resolved_at
        if resolved_at != state.changes:
            found = engine.resolve(chain_id)
            pool = None if found is None else found[1]
            resolved_at = state.changes
        # Tenancy first (proxy/tenancy/gate.py): with nothing configured only a browser's
        # request (an Origin header) is looked at.
        if pool is not None and (
            gate.active or path_key is not None or b"origin" in request.headers.raw
        ):
            return gated(request)
        return start(chain_id, found, request)

    def gated(request: Request) -> Awaitable[Response] | Response | None:
        """`data` after `Gate.admit`: refused, or served by the same steps with the ticket
        (when there is one) following the answer through its `early` and `later`."""
        conn = request._conn
        verdict = gate.admit(pool, path_key, request.headers.raw, request.body, conn)  # type: ignore[arg-type]
        if verdict is None:
            return start(chain_id, found, request)
        if type(verdict) is tuple:
            return verdict
        ticketed = Ticketed(request, verdict)  # type: ignore[arg-type]
        return verdict.finish(start(chain_id, found, ticketed, verdict.tally))  # type: ignore[union-attr]

    return data


class Ticketed:
    """A request whose answers go through its tenancy ticket (its usage, its place in
    flight, the CORS headers a browser needs), as `Engine.start` reads a request."""

    __slots__ = ("answer_early", "answer_later", "body", "headers")

    def __init__(self, request: Request, ticket: Ticket) -> None:
        ticket.request = request
        self.body = request.body
        self.headers = request.headers
        self.answer_early = ticket.early
        self.answer_later = ticket.later


def _preflight(proxy: Proxy, path: bytes) -> Handler | None:
    """`OPTIONS /:chainId[/:key]`: a CORS preflight, answered by the gate."""
    found = key_path(path) if path.find(b"%") < 0 else None
    if found is None:
        return None
    chain_id, key = found
    engine, gate = proxy.engine, proxy.tenancy.gate

    def preflight(request: Request) -> Response:
        resolved = engine.resolve(chain_id)
        return gate.preflight(None if resolved is None else resolved[1], key, request.headers.raw)

    return preflight


def _metrics_handler(proxy: Proxy):
    """`GET /metrics` under the admin API's rules (proxy/adminguard.py: Host, Origin and
    the admin token): where the admin API is served, since it names nodes and clients."""
    registry = proxy.metrics.registry
    guard = proxy.admin.guard

    async def handle(request: web.Request) -> web.Response:
        refused = guard.refusal(request)
        if refused is not None:
            return refused
        return web.Response(
            body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    return handle


def create_app(
    settings: ProxySettings,
    *,
    store: ConfigStore,
    registry: InprocRegistry | None = None,
    tracer: trace.Tracer | None = None,
    events: EventSettings | None = None,
    tenancy: TenancySettings | None = None,
) -> web.Application:
    """The proxy app: `POST /:chainId`, `GET /metrics`, the admin API unless
    `settings.admin_port` puts it on its own listener (then use `create_admin_app`), and
    `GET /:chainId` with an Upgrade: the WebSocket endpoint (`events`: `[proxy.events]`,
    `EventSettings.from_config`; defaults when None)."""
    settings.check_exposure()
    events = events if events is not None else EventSettings()
    proxy = Proxy.build(settings, store, registry, tracer, events, tenancy)
    # Bodies over the limit are refused by the handler with a JSON-RPC error, not by aiohttp.
    app = web.Application(client_max_size=settings.max_body_bytes + 1024)
    app[PROXY] = proxy
    # The data route first: aiohttp tries dynamic routes in order.
    app.router.add_post("/{chain}", _data_handler(proxy))
    app.router.add_get("/health", _health_handler(proxy))
    if settings.admin_port is None:
        app.router.add_get("/metrics", _metrics_handler(proxy))
        app.router.add_routes(_admin_routes(proxy))
    app.router.add_post(KEY_ROUTE, _data_handler(proxy))
    # After the admin API's one-segment GETs (`/getChains`): the lean server hands every
    # Upgrade request to this app, whatever its path.
    websocket = _gated_websocket(proxy)
    app.router.add_get("/{chain}", websocket)
    app.router.add_get(KEY_ROUTE, websocket)
    app.cleanup_ctx.append(proxy.lifecycle)
    return app


def create_admin_app(app: web.Application) -> web.Application:
    """The admin API alone, for a separate listener; it shares `app`'s state, and `app`
    (which owns the lifecycle) must be running too."""
    admin = web.Application(client_max_size=1024 * 1024)
    admin.router.add_get("/metrics", _metrics_handler(app[PROXY]))
    admin.router.add_routes(_admin_routes(app[PROXY]))
    return admin


def _admin_routes(proxy: Proxy) -> list[web.RouteDef]:
    """The admin API's routes and tenancy's, under the same guard."""
    admin = proxy.admin
    apply_timeout = proxy.settings.admin_apply_timeout
    tenancy = TenancyAdmin(proxy.tenancy, proxy.store, apply_timeout)
    return [*admin.routes(), *(admin.guarded(*r) for r in tenancy.routes())]


def _gated_websocket(proxy: Proxy):
    """The WebSocket upgrade after `Gate.upgrade` (the credential, the pool's anonymous access
    and the rules a message does not change), then each message after `Gate.admit`
    (proxy/tenancy/websocket.py)."""
    engine, gate, websocket = proxy.engine, proxy.tenancy.gate, proxy.events.websocket

    async def handle(request: web.Request) -> web.StreamResponse:
        found = engine.resolve(request.match_info["chain"])
        key = request.match_info.get("key")
        if found is None or not (gate.active or key is not None or "Origin" in request.headers):
            return await websocket(request)
        raw = raw_headers(request.headers)
        refused = gate.upgrade(found[1], key, raw, request)
        if refused is not None:
            headers = _header_lines(refused[2]) if len(refused) > 2 else None
            return web.Response(
                status=refused[0], body=refused[1], content_type=JSON, headers=headers
            )
        return await websocket(request, message_gate(gate, found[1], key, raw, request))

    return handle


def _health_handler(proxy: Proxy):
    """`GET /health`: the proxy answers; whether its config store and shared limits do."""

    async def handle(_request: web.Request) -> web.Response:
        body = {
            "status": "ok",
            "config_store": "available" if proxy.store.available else "unavailable",
            "tenancy": proxy.tenancy.health(),
            "cache_tier": tier_health(proxy.reads.cache.tier),
        }
        return web.json_response(body)

    return handle

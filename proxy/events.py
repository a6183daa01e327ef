"""The proxy's events: filters and WebSocket subscriptions on top of the routing engine.

The methods the proxy keeps state for are answered here: the filter methods
(proxy/filters.py) and, on a WebSocket, eth_subscribe/eth_unsubscribe (proxy/subscriptions.py).
The engine hands over a body that names one of them (`Engine.divert`: it finds out where it
would answer "Method not found", so other bodies pay nothing); `Events.divert` answers it as
`Engine.handle` would, the local items here and the other items sent back to the engine as
one sub-batch, the answers put back in order.

`Events.websocket(request)` is the aiohttp handler of `GET /:chainId` with an Upgrade: the
same port and path as `POST /:chainId` (ws://127.0.0.1:8663/1337); the lean data server hands
every Upgrade request to the aiohttp app on the same loop (docs/http-server.md). Connections
are counted per client address and in total, each against a named limit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from aiohttp import WSMsgType, web
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily

from chainstate.inproc import InprocRegistry
from chainstate.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    JsonRpcError,
    check_request,
    error_response,
    request_id,
)
from chainstate.rpcclient import RpcClient
from proxy import nesting
from proxy.chainfeed import ChainFeed
from proxy.eventsettings import EventSettings
from proxy.filters import NO_MEMPOOL, Filters
from proxy.listeners import ListenerQuota
from proxy.model import Pool
from proxy.subscriptions import Answer as SessionAnswer
from proxy.subscriptions import Session, Unread

if TYPE_CHECKING:
    from proxy.engine import Answer, Engine
    from proxy.settings import ProxySettings

log = logging.getLogger(__name__)

FILTER_METHODS = (
    "eth_newFilter",
    "eth_newBlockFilter",
    "eth_getFilterChanges",
    "eth_getFilterLogs",
    "eth_uninstallFilter",
    "eth_newPendingTransactionFilter",
)
SUBSCRIPTION_METHODS = ("eth_subscribe", "eth_unsubscribe")
LOCAL_METHODS = frozenset(FILTER_METHODS + SUBSCRIPTION_METHODS)

CLOSE_WAIT = 1.0  # seconds a closing WebSocket waits for the client's close frame

# The engine's entry point: (chain id, body, headers) -> (HTTP status, body).
Handle = Callable[[str, bytes, Mapping[str, str]], Awaitable["Answer"]]
Resolve = Callable[[str], "tuple[str, Pool] | None"]


class Events:
    """Filters, chain feeds and WebSocket sessions of one proxy process."""

    def __init__(
        self,
        settings: EventSettings,
        handle: Handle,
        resolve: Resolve,
        pools: Callable[[], dict[str, Pool]],
        *,
        registry: InprocRegistry | None = None,
        metrics: CollectorRegistry | None = None,
        max_batch: int = 1000,
        max_message_bytes: int = 10 * 1024 * 1024,
    ) -> None:
        self.settings = settings
        self._engine_handle = handle
        self._resolve = resolve
        self._pools = pools
        self._registry = registry
        self.max_batch = max_batch
        self.max_message_bytes = max_message_bytes
        self.feeds: dict[str, ChainFeed] = {}
        self.quota = ListenerQuota(settings)  # filters and subscriptions, per client
        self.unread = Unread()  # bytes the WebSocket clients have not read (ws_unread_max_bytes)
        self.filters = Filters(
            settings, self.feed, self._filter_logs, self.quota, leader=self._leader_call
        )
        self.sessions: set[Session] = set()
        self.per_client: dict[str, int] = {}
        self._clients: dict[str, RpcClient] = {}
        self._http: aiohttp.ClientSession | None = None
        metrics = metrics if metrics is not None else CollectorRegistry()
        self.closed_connections = Counter(
            "chainstate_proxy_ws_closed",
            "WebSocket connections closed, by reason",
            ["reason"],
            registry=metrics,
        )
        metrics.register(_Gauges(self))

    @classmethod
    def for_engine(
        cls,
        settings: EventSettings,
        proxy: ProxySettings,
        engine: Engine,
        pools: Callable[[], dict[str, Pool]],
        registry: InprocRegistry | None,
        metrics: CollectorRegistry,
    ) -> Events:
        """The events part of a proxy app (proxy/app.py): the engine hands it the bodies
        with filter or subscription methods; the proxy's batch and message limits."""
        events = cls(
            settings,
            engine.handle,
            engine.resolve,
            pools,
            registry=registry,
            metrics=metrics,
            max_batch=proxy.max_batch_items,
            max_message_bytes=proxy.max_body_bytes,
        )
        engine.divert(LOCAL_METHODS, events.divert)
        return events

    # lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        await self.filters.start()

    async def close(self) -> None:
        for session in list(self.sessions):
            await session.close("the proxy stopped")
        await self.filters.close()
        for feed in self.feeds.values():
            await feed.close()
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
        if self._http is not None:
            await self._http.close()
            self._http = None

    def feed(self, pool_id: str) -> ChainFeed:
        feed = self.feeds.get(pool_id)
        if feed is None:
            feed = self.feeds[pool_id] = ChainFeed(
                pool_id, lambda: self._pools().get(pool_id), self._client, self.settings.feed()
            )
        return feed

    def _client(self, url: str) -> RpcClient:
        client = self._clients.get(url)
        if client is None:
            if self._http is None and not url.startswith("inproc://"):
                self._http = aiohttp.ClientSession()
            client = self._clients[url] = RpcClient(
                url,
                registry=self._registry,
                session=None if url.startswith("inproc://") else self._http,
                timeout=self.settings.feed_timeout,
            )
        return client

    # HTTP and WebSocket bodies ---------------------------------------------------------

    def divert(self, chain: str, body: bytes, headers: Mapping[str, str]) -> Awaitable[Answer]:
        """A body the engine handed over (it names a filter or subscription method), from
        HTTP or from an in-process caller: no WebSocket, so no subscriptions."""
        return self._handle_local(chain, body, headers, None)

    @staticmethod
    def _client_of(headers: Mapping[str, str], session: Session | None) -> str:
        """Who a filter or subscription counts against: the connection's peer address (the
        lean server's headers carry it), `inproc` for callers in this process."""
        if session is not None:
            return session.client
        peer = getattr(headers, "peer", None)
        return peer() if callable(peer) else "inproc"

    async def _handle_local(
        self,
        chain: str,
        body: bytes,
        headers: Mapping[str, str],
        session: Session | None,
    ) -> Answer:
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            return await self._engine_handle(chain, body, headers)
        items = payload if isinstance(payload, list) else [payload]
        found = self._resolve(chain)
        if found is None or not any(_is_local(item) for item in items):
            return await self._engine_handle(chain, body, headers)
        pool = found[1]
        client = self._client_of(headers, session)
        if isinstance(payload, dict):
            answer = await self._local(pool, payload, session, client)
            return (200, orjson.dumps(answer)) if answer is not None else (204, b"")
        if len(payload) > self.max_batch:
            msg = f"batch has {len(payload)} items, more than max_batch_items={self.max_batch}"
            return 200, orjson.dumps(error_response(None, INVALID_REQUEST, msg))
        return await self._batch(chain, pool, payload, headers, session, client)

    async def _batch(
        self,
        chain: str,
        pool: Pool,
        payload: list[Any],
        headers: Mapping[str, str],
        session: Session | None,
        client: str,
    ) -> tuple[int, bytes]:
        answers: list[Any] = [None] * len(payload)
        routed = []
        for i, item in enumerate(payload):
            bad = check_request(item)
            if bad is not None:  # answered here: its id may be what is wrong with it
                answers[i] = error_response(request_id(item), bad.code, bad.message)
            elif not _is_local(item):
                routed.append(i)
        sub, routed = _writable(payload, routed, answers)
        if routed:  # first, so a subscription starts after everything else is answered
            out = (await self._engine_handle(chain, sub, headers))[1]
            by_id = _answers_by_id(out)
            for j, i in enumerate(routed):
                if "id" not in payload[i]:
                    continue  # a notification: no answer
                answer = by_id.get(j) or error_response(None, INTERNAL_ERROR, "no answer")
                answers[i] = {**answer, "id": payload[i]["id"]}
        for i, item in enumerate(payload):
            if answers[i] is None and _is_local(item):
                answers[i] = await self._local(pool, item, session, client)
        out_items = [a for a in answers if a is not None]
        return (200, orjson.dumps(out_items)) if out_items else (204, b"")

    async def _local(
        self, pool: Pool, item: dict[str, Any], session: Session | None, client: str
    ) -> Any:
        """The answer to one filter/subscription request (None for a notification)."""
        bad = check_request(item)
        rid = item.get("id")
        if bad is not None:
            return error_response(request_id(item), bad.code, bad.message)
        params = item.get("params", [])
        try:
            result = await self._call(pool, item["method"], params, session, client)
        except JsonRpcError as exc:
            answer = error_response(rid, exc.code, exc.message, exc.data)
        else:
            answer = {"jsonrpc": "2.0", "id": rid, "result": result}
        return None if "id" not in item else answer

    async def _call(
        self, pool: Pool, method: str, params: Any, session: Session | None, client: str
    ) -> Any:
        filters = self.filters
        if method == "eth_newFilter":
            return await filters.new_filter(pool.id, params, client)
        if method == "eth_newBlockFilter":
            return await filters.new_block_filter(pool.id, params, client)
        if method == "eth_getFilterChanges":
            return await filters.get_filter_changes(pool.id, params)
        if method == "eth_getFilterLogs":
            return await filters.get_filter_logs(pool.id, params)
        if method == "eth_uninstallFilter":
            return await filters.uninstall_filter(pool.id, params)
        if method == "eth_newPendingTransactionFilter":
            return await filters.new_pending_transaction_filter(pool.id, params, client)
        if session is None:
            raise JsonRpcError(
                METHOD_NOT_FOUND,
                f"notifications not supported: {method} needs a WebSocket connection to the "
                f"same path (ws://…/{pool.id})",
            )
        if method == "eth_subscribe":
            return await session.subscribe(params)
        return await session.unsubscribe(params)

    async def _leader_call(self, pool_id: str, method: str, params: list[Any]) -> tuple[str, Any]:
        """`method` asked of the pool's Leader write node (which passes it to its execution
        client): its key and the result. Errors it answers raise JsonRpcError, a Leader that
        cannot be reached RpcUnavailable."""
        pool = self._pools().get(pool_id)
        node = pool.leader_node() if pool is not None else None
        if pool is None or node is None or pool.leader is None:
            raise JsonRpcError(METHOD_NOT_FOUND, NO_MEMPOOL)
        return pool.leader, await self._client(node.entry.url).call(method, params)

    async def _filter_logs(self, pool_id: str, raw: dict[str, Any]) -> orjson.Fragment:
        """eth_getFilterLogs: eth_getLogs with the filter's criteria, routed as usual."""
        body = orjson.dumps({"jsonrpc": "2.0", "id": 0, "method": "eth_getLogs", "params": [raw]})
        out = (await self._engine_handle(pool_id, body, {"client-id": "proxy-filters"}))[1]
        answer = orjson.loads(out)
        if "error" in answer:
            err = answer["error"]
            raise JsonRpcError(err.get("code", -32603), err.get("message", ""), err.get("data"))
        return answer["result"]

    # WebSocket -------------------------------------------------------------------------

    async def websocket(
        self, request: web.Request, wrap: Callable[[SessionAnswer], SessionAnswer] | None = None
    ) -> web.StreamResponse:
        """`GET /:chainId` with `Upgrade: websocket`: JSON-RPC and subscriptions. `wrap`:
        what answers each client message around the proxy's own answer (tenancy admits
        every message against its key's limits)."""
        chain = request.match_info["chain"]
        found = self._resolve(chain)
        if found is None:
            return _refuse(404, f"unknown chain {chain[:80]!r}: no node pool is configured for it")
        client = request.remote or "unknown"
        refused = self._admit(client)
        if refused is not None:
            return _refuse(429, refused)
        ws = web.WebSocketResponse(
            heartbeat=self.settings.ws_heartbeat,
            max_msg_size=self.max_message_bytes,
            compress=False,  # a deflate context per connection would cost more than the bytes
        )
        if not ws.can_prepare(request).ok:
            self._leave(client)
            return _refuse(426, "this path takes JSON-RPC POSTs or a WebSocket upgrade")
        await ws.prepare(request)
        headers = dict(request.headers)

        def answer(data: bytes, s: Session) -> Awaitable[bytes]:
            return self._ws_answer(chain, data, headers, s)

        session = Session(
            _AiohttpTransport(ws, request.transport),
            self.feed(found[1].id),
            answer if wrap is None else wrap(answer),
            self.settings,
            client,
            self.quota,
            self.unread,
        )
        self.sessions.add(session)
        reason = "client closed"
        try:
            async for msg in ws:
                if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                    data = msg.data.encode() if isinstance(msg.data, str) else msg.data
                    await session.receive(data)
                elif msg.type == WSMsgType.ERROR:
                    reason = "error"
                    break
                if session.closed is not None:
                    break
        finally:
            if session.closed is not None and session.closed.startswith("slow consumer"):
                reason = "slow_consumer"
            elif session.closed is not None and session.closed.startswith("message too big"):
                reason = "too_big"
            await session.close(reason)
            self.sessions.discard(session)
            self._leave(client)
            self.closed_connections.labels(reason=reason.replace(" ", "_")).inc()
            if not ws.closed:
                await ws.close()
        return ws

    async def _ws_answer(
        self, chain: str, data: bytes, headers: Mapping[str, str], session: Session
    ) -> bytes:
        if data.find(b"ubscribe") >= 0:  # eth_subscribe/eth_unsubscribe need this connection
            out = (await self._handle_local(chain, data, headers, session))[1]
        else:  # the engine hands filter methods to divert()
            out = (await self._engine_handle(chain, data, headers))[1]
        return out  # b"" when there is nothing to answer (notifications)

    def _admit(self, client: str) -> str | None:
        s = self.settings
        if len(self.sessions) >= s.max_connections:
            total = s.max_connections
            return f"too many WebSocket connections on this proxy ({total}, max_connections)"
        if self.per_client.get(client, 0) >= s.max_connections_per_client:
            return (
                f"too many WebSocket connections from {client} "
                f"({s.max_connections_per_client}, max_connections_per_client)"
            )
        self.per_client[client] = self.per_client.get(client, 0) + 1
        return None

    def _leave(self, client: str) -> None:
        left = self.per_client.get(client, 1) - 1
        if left > 0:
            self.per_client[client] = left
        else:
            self.per_client.pop(client, None)


class _AiohttpTransport:
    """A Session's transport over an aiohttp WebSocket: each message is written to the
    socket as one unmasked text frame, at once (aiohttp writes its control frames, pings and
    close, to the same transport, also whole)."""

    def __init__(self, ws: web.WebSocketResponse, transport: Any) -> None:
        self.ws = ws
        self.transport = transport

    def write(self, message: bytes) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        size = len(message)
        if size < 126:
            head = bytes((0x81, size))
        elif size < 65536:
            head = b"\x81\x7e" + size.to_bytes(2, "big")
        else:
            head = b"\x81\x7f" + size.to_bytes(8, "big")
        transport.write(head + message)

    def buffered(self) -> int:
        transport = self.transport
        return 0 if transport is None else transport.get_write_buffer_size()

    async def close(self, code: int, reason: str) -> None:
        """A close frame with `code` and `reason` written as the messages are (no wait for
        the socket to drain: the client may be one that does not read), then the
        connection cut once it is read, or after CLOSE_WAIT seconds."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        payload = code.to_bytes(2, "big") + reason.encode()[:123]
        transport.write(bytes((0x88, len(payload))) + payload)
        waited = 0.0
        while transport.get_write_buffer_size() and waited < CLOSE_WAIT:
            await asyncio.sleep(0.05)
            waited += 0.05
        transport.abort()


class _Gauges:
    """Gauges read at scrape time: connections, subscriptions, filters, feeds."""

    def __init__(self, events: Events) -> None:
        self.events = events

    def collect(self) -> Any:
        events = self.events
        for name, doc, value in (
            ("chainstate_proxy_ws_connections", "open WebSocket connections", len(events.sessions)),
            (
                "chainstate_proxy_ws_subscriptions",
                "active eth_subscribe subscriptions",
                sum(len(s.subscriptions) for s in events.sessions),
            ),
            ("chainstate_proxy_filters", "installed filters", len(events.filters.installed)),
            (
                "chainstate_proxy_ws_unread_bytes",
                "bytes written to WebSocket clients not read yet (as last seen per connection)",
                events.unread.total,
            ),
        ):
            gauge = GaugeMetricFamily(name, doc)
            gauge.add_metric([], value)
            yield gauge
        head = GaugeMetricFamily(
            "chainstate_proxy_feed_head",
            "last block announced by a pool's chain feed",
            labels=["pool"],
        )
        announced = GaugeMetricFamily(
            "chainstate_proxy_feed_announced_unixtime",
            "when the chain feed handed that block to its listeners",
            labels=["pool"],
        )
        for pool_id, feed in events.feeds.items():
            if feed.tip is not None:
                head.add_metric([pool_id], feed.tip.number)
                announced.add_metric([pool_id], feed.tip.announced_at)
        yield head
        yield announced


def _is_local(item: Any) -> bool:
    return isinstance(item, dict) and item.get("method") in LOCAL_METHODS


def _writable(payload: list[Any], routed: list[int], answers: list[Any]) -> tuple[bytes, list[int]]:
    """The sub-batch of the items at `routed` for the engine (ids: their positions in it),
    and those positions; items too deep to write again are left out, answered -32602
    (proxy/nesting.py)."""
    sub = [_with_id(payload[i], j) for j, i in enumerate(routed)]
    try:
        return orjson.dumps(sub), routed
    except TypeError:
        deep = {routed[j] for j in nesting.deep(sub)}
    for i in deep:
        answers[i] = error_response(request_id(payload[i]), INVALID_PARAMS, nesting.MESSAGE)
    return _writable(payload, [i for i in routed if i not in deep], answers)


def _with_id(item: Any, position: int) -> Any:
    """A batch item for the engine, its id replaced by its position (ids may repeat)."""
    if isinstance(item, dict) and "id" in item:
        return {**item, "id": position}
    return item


def _answers_by_id(out: bytes) -> dict[Any, dict[str, Any]]:
    try:
        answers = orjson.loads(out) if out else []
    except orjson.JSONDecodeError:
        return {}
    if isinstance(answers, dict):
        answers = [answers]
    return {a.get("id"): a for a in answers if isinstance(a, dict) and a.get("id") is not None}


def _refuse(status: int, message: str) -> web.Response:
    body = orjson.dumps(error_response(None, INVALID_REQUEST, message))
    return web.Response(status=status, body=body, content_type="application/json")

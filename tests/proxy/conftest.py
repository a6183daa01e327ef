"""Proxy test fixtures: fake nodes on loopback and a proxy in front of them.

`make_api` serves the proxy as `chainstate proxy` does: its data listener (the lean server,
`proxy.app.create_server`) on a real loopback socket, admin calls and /metrics handed from it
to the aiohttp app. JSON-RPC goes over one client session and admin calls over another, so
data requests take the lean path (a connection that carried an admin call stays with
aiohttp).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from chainstate.httpserver import HttpServer
from proxy import face
from proxy.app import create_app, create_server, get_proxy
from proxy.methods import METHODS
from proxy.settings import ProxySettings
from proxy.store_file import FileStore
from tests.proxy.fakes import FakeNode

ADDR = "0x" + "11" * 20
FAST = {
    "head_poll_interval": 0.05,
    "poll_timeout": 0.5,
    "upstream_timeout": 1.0,
    "unhealthy_after": 2,
}


def req(method: str, params=None, rid=1) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params or []}


def balance(block: str = "latest", rid=1) -> dict:
    return req("eth_getBalance", [ADDR, block], rid)


def client_sees(body: bytes, raw: bytes) -> bytes:
    """A node's answer `raw` to `body` (a request object, or a batch answered in order) as a
    client of the standard API sees it through the proxy: its final -39xxx codes translated
    (proxy/face.py; a final -39006 of a block getter as for a block that does not exist)."""
    if raw.find(b"-390") < 0:
        return raw
    request, answer = orjson.loads(body), orjson.loads(raw)
    if isinstance(request, dict):
        return face.public_raw(METHODS[request["method"]], raw)
    for one, got in zip(request, answer, strict=True):
        face.public(METHODS[one["method"]], got)
    return orjson.dumps(answer)


def fast_settings(**overrides: Any) -> ProxySettings:
    return ProxySettings(**{**FAST, **overrides})


async def wait_until(check: Callable[[], bool], within: float = 3.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


class LeanClient:
    """The proxy's real data listener on a free loopback port, called like aiohttp's
    TestClient (`get`, `post`, `app`, `close`)."""

    def __init__(self, app: web.Application, server: HttpServer) -> None:
        self.app = app
        self.server = server
        base = f"http://127.0.0.1:{server.port}"
        self.session = aiohttp.ClientSession(base_url=base)
        self.data = aiohttp.ClientSession(base_url=base)  # JSON-RPC only: the lean path

    def get(self, path: str, **kw: Any) -> Any:
        return self.session.get(path, **kw)

    def post(self, path: str, **kw: Any) -> Any:
        return self.session.post(path, **kw)

    async def close(self) -> None:
        await self.session.close()
        await self.data.close()
        await self.server.close()


class Api:
    """A test client for one proxy app with helpers for JSON-RPC and admin calls."""

    def __init__(self, client: TestClient | LeanClient) -> None:
        self.client = client
        self.proxy = get_proxy(client.app)

    async def rpc(self, chain: str, payload: Any, headers: dict[str, str] | None = None):
        body = payload if isinstance(payload, bytes) else orjson.dumps(payload)
        data = getattr(self.client, "data", self.client)
        resp = await data.post(f"/{chain}", data=body, headers=headers or {})
        raw = await resp.read()
        return resp.status, (orjson.loads(raw) if raw else None)

    async def call(self, chain: str, method: str, params: Any = None, rid: Any = 1) -> Any:
        req = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params or []}
        return (await self.rpc(chain, req))[1]

    async def get(self, path: str, **kw: Any) -> tuple[int, Any]:
        resp = await self.client.get(path, **kw)
        return resp.status, orjson.loads(await resp.read())

    async def post(self, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        data = body if isinstance(body, bytes) else orjson.dumps(body if body is not None else {})
        kw["headers"] = {"Content-Type": "application/json", **kw.get("headers", {})}
        resp = await self.client.post(path, data=data, **kw)
        return resp.status, orjson.loads(await resp.read())

    async def add(self, chain: str, node: FakeNode, weight: int = 1) -> None:
        status, answer = await self.post(f"/{chain}/addNode", node.entry(weight))
        assert status == 201, answer

    async def heads_known(self, chain: str) -> None:
        pool = self.proxy.state.pools[chain]
        await wait_until(lambda: all(n.head is not None for n in pool.readers))


@pytest.fixture
async def fake_nodes() -> AsyncIterator[Callable[..., Awaitable[FakeNode]]]:
    made: list[FakeNode] = []

    async def make(name: str, kind: str = "state", **kw: Any) -> FakeNode:
        node = await FakeNode(name, kind, **kw).start()
        made.append(node)
        return node

    yield make
    for node in made:
        await node.stop()


@pytest.fixture
async def make_api() -> AsyncIterator[Callable[..., Awaitable[Api]]]:
    clients: list[LeanClient] = []

    async def make(settings: ProxySettings | None = None, store: Any = None, **kw: Any) -> Api:
        app = create_app(
            settings or fast_settings(), store=store if store is not None else FileStore(None), **kw
        )
        server = create_server(app)
        await server.start("127.0.0.1", 0)
        client = LeanClient(app, server)
        clients.append(client)
        return Api(client)

    yield make
    for client in clients:
        await client.close()


@pytest.fixture
async def node_api(make_api, fake_nodes):
    """(api, node): one fake state node behind a proxy with the response cache off."""
    node = await fake_nodes("one", "state")
    api = await make_api(fast_settings(cache_pools=[]))
    await api.add("1337", node)
    await api.heads_known("1337")
    return api, node


@pytest.fixture
async def two(make_api, fake_nodes):
    """A proxy with one state node (window 128) and one archive node, heads at 1000."""
    state = await fake_nodes("state-1", "state")
    archive = await fake_nodes("archive-1", "archive")
    api = await make_api()
    await api.add("1337", state)
    await api.add("1337", archive)
    await api.heads_known("1337")
    return api, state, archive

"""Proxy test fixtures: fake nodes on loopback and a proxy app in front of them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient

from proxy.app import create_app, get_proxy
from proxy.settings import ProxySettings
from proxy.store_file import FileStore
from tests.proxy.fakes import FakeNode

FAST = {
    "head_poll_interval": 0.05,
    "poll_timeout": 0.5,
    "upstream_timeout": 1.0,
    "unhealthy_after": 2,
}


def fast_settings(**overrides: Any) -> ProxySettings:
    return ProxySettings(**{**FAST, **overrides})


async def wait_until(check: Callable[[], bool], within: float = 3.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


class Api:
    """A test client for one proxy app with helpers for JSON-RPC and admin calls."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.proxy = get_proxy(client.app)

    async def rpc(self, chain: str, payload: Any, headers: dict[str, str] | None = None):
        body = payload if isinstance(payload, bytes) else orjson.dumps(payload)
        resp = await self.client.post(f"/{chain}", data=body, headers=headers or {})
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
def make_api(aiohttp_client) -> Callable[..., Awaitable[Api]]:
    async def make(settings: ProxySettings | None = None, store: Any = None, **kw: Any) -> Api:
        app = create_app(
            settings or fast_settings(), store=store if store is not None else FileStore(None), **kw
        )
        return Api(await aiohttp_client(app))

    return make

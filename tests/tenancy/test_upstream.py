"""Upstream budgets and rate-limit backoff through a `chainstate proxy` process: a node that
answers HTTP 429 or a rate-limit JSON-RPC error is backed off and its requests retried on
another node; a node's budget (requests per second) keeps its traffic under it; getAllNodes
shows both."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio

from chainstate.httpserver import Request, Response
from tests.etcd.conftest import ProxyProcess
from tests.proxy.fakes import POLLS, FakeNode

pytestmark = pytest.mark.asyncio(loop_scope="module")  # the fake nodes live in the module's loop
JSON = {"content-type": "application/json"}
BODY = orjson.dumps(
    {"jsonrpc": "2.0", "id": 1, "method": "eth_getBalance", "params": ["0x" + "11" * 20, "0x3e0"]}
)


class LimitedNode(FakeNode):
    """A fake provider (tests only) that answers data requests with a rate limit while
    `limited` says so: "http" (HTTP 429 with Retry-After) or "rpc" (-32005 in a 200)."""

    def __init__(self, name: str) -> None:
        super().__init__(name, "state")
        self.limited: str | None = None
        self.refused = 0

    def _handle(self, request: Request) -> Response | Any:
        payload = orjson.loads(request.body)
        items = payload if isinstance(payload, list) else [payload]
        if self.limited is None or any(i.get("method") in POLLS for i in items):
            return super()._handle(request)
        self.refused += 1
        if self.limited == "http":
            return 429, b'{"message":"Too Many Requests"}'
        error = {"code": -32005, "message": "daily request count exceeded"}
        answers = [{"jsonrpc": "2.0", "id": i.get("id"), "error": error} for i in items]
        return 200, orjson.dumps(answers if isinstance(payload, list) else answers[0])


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    workdir: Path = tmp_path_factory.mktemp("budgets")
    store = workdir / "store"
    process = ProxyProcess(workdir, "p", "--store", str(store))
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def nodes(proxy: ProxyProcess) -> AsyncIterator[dict[str, Any]]:
    limited = await LimitedNode("provider-a").start()
    other = await FakeNode("provider-b", "state").start()
    async with aiohttp.ClientSession() as http:
        # (the weight makes it the choice whenever it is in rotation: two nodes are compared
        # by cost / weight)
        await admin(http, proxy.url, "/1337/addNode", limited.entry(1000))
        await admin(http, proxy.url, "/1337/addNode", other.entry(1))
        yield {"http": http, "url": proxy.url, "limited": limited, "other": other}
    await limited.stop()
    await other.stop()


async def admin(http: aiohttp.ClientSession, base: str, path: str, body: Any = None) -> Any:
    async with http.post(f"{base}{path}", data=orjson.dumps(body or {}), headers=JSON) as resp:
        answer = await resp.json(content_type=None)
        assert resp.status in (200, 201), answer
        return answer


async def budget_of(http: aiohttp.ClientSession, base: str, key: str) -> dict[str, Any]:
    async with http.get(f"{base}/1337/getAllNodes") as resp:
        answer = await resp.json()
    [node] = [n for n in answer["nodes"] if n["key"] == key]
    return node["upstream_budget"]


async def rpc(http: aiohttp.ClientSession, base: str) -> tuple[int, Any]:
    async with http.post(f"{base}/1337", data=BODY, headers=JSON) as resp:
        return resp.status, await resp.json(content_type=None)


@pytest.mark.parametrize("how", ["http", "rpc"])
async def test_a_rate_limited_node_is_backed_off_and_its_requests_retried(
    nodes: dict[str, Any], how: str
) -> None:
    http, base, limited = nodes["http"], nodes["url"], nodes["limited"]
    limited.limited, limited.refused = how, 0
    for _ in range(10):
        status, answer = await rpc(http, base)
        assert status == 200 and answer["result"]["node"] == "provider-b", answer
    assert limited.refused == 1  # asked first, then backed off
    shown = await budget_of(http, base, "provider-a")
    assert shown["backed_off"] is True and shown["rate_limited"] >= 1, shown
    assert 0 < shown["back_in_s"] <= 30
    # the row of rate limits ends with the first answer after the backoff
    limited.limited = None
    deadline = time.monotonic() + 40
    while (await budget_of(http, base, "provider-a"))["backed_off"]:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    status, answer = await rpc(http, base)
    assert status == 200 and answer["result"]["node"] == "provider-a", answer
    assert (await budget_of(http, base, "provider-a"))["rate_limits_in_a_row"] == 0


async def test_a_budget_keeps_a_nodes_traffic_under_it(nodes: dict[str, Any]) -> None:
    http, base, limited, other = nodes["http"], nodes["url"], nodes["limited"], nodes["other"]
    await admin(http, base, "/1337/updateNode/provider-a", {"budget": 5})
    shown = await budget_of(http, base, "provider-a")
    assert shown["budget_per_s"] == 5.0
    before_a, before_b = len(limited.received), len(other.received)
    started = time.monotonic()
    results = await asyncio.gather(*(rpc(http, base) for _ in range(60)))
    elapsed = time.monotonic() - started
    assert all(status == 200 for status, _ in results)
    to_a = len(limited.received) - before_a
    # a full bucket (5) plus what refilled while the requests ran
    assert 1 <= to_a <= 5 + 5 * elapsed + 1, (to_a, elapsed)
    assert len(other.received) - before_b >= 60 - to_a  # (and the second attempts of hedges)
    assert (await budget_of(http, base, "provider-a"))["budget_spent"] >= 1


async def test_a_bad_budget_is_refused(nodes: dict[str, Any]) -> None:
    http, base = nodes["http"], nodes["url"]
    for bad in (-1, "5", True):
        body = orjson.dumps({"budget": bad})
        async with http.post(f"{base}/1337/updateNode/provider-a", data=body, headers=JSON) as resp:
            assert resp.status == 400, bad
            assert "budget" in (await resp.json())["error"]


async def test_a_keys_retried_request_counts_two_upstream_calls(nodes: dict[str, Any]) -> None:
    http, base, limited = nodes["http"], nodes["url"], nodes["limited"]
    await admin(http, base, "/1337/updateNode/provider-a", {"budget": 0})
    deadline = time.monotonic() + 40
    while (await budget_of(http, base, "provider-a"))["backed_off"]:  # (the budget test's)
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    await admin(http, base, "/tenancy/projects", {"id": "calls"})
    made = await admin(http, base, "/tenancy/keys", {"project": "calls"})
    limited.limited, limited.refused = "http", 0
    try:
        async with http.post(f"{base}/1337/{made['key']}", data=BODY, headers=JSON) as resp:
            answer = await resp.json(content_type=None)
        assert resp.status == 200 and answer["result"]["node"] == "provider-b", answer
    finally:
        limited.limited = None
    assert limited.refused == 1
    async with http.get(f"{base}/tenancy/usage?key={made['id']}") as resp:
        [row] = (await resp.json())["usage"]
    assert (row["requests"], row["upstream"], row["errors"]) == (1, 2, 0)

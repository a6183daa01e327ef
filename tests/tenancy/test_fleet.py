"""Two `chainstate proxy` processes sharing one real etcd (keys) and one real Redis (limits):
a key's rate holds across both, a revocation reaches both within a second, and a Redis
outage fails no request and ends with the limits shared again."""

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

from tests.etcd.conftest import EtcdServer, ProxyProcess
from tests.proxy.fakes import FakeNode
from tests.tenancy.redisserver import RedisServer, redis_binary

JSON = {"content-type": "application/json"}  # the admin API takes JSON bodies only

pytestmark = pytest.mark.asyncio(loop_scope="module")  # the fake node lives in the module's loop
RATE = 40  # requests per second of the test key
CHAIN = "1337"
BODY = orjson.dumps(
    {"jsonrpc": "2.0", "id": 1, "method": "eth_getBalance", "params": ["0x" + "11" * 20, "0x3e0"]}
)


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(redis_binary(), tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def proxies(
    etcd_server: EtcdServer, redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ProxyProcess, ProxyProcess]]:
    workdir: Path = tmp_path_factory.mktemp("fleet")
    config = workdir / "fleet.toml"
    config.write_text(
        "[proxy]\nhead_poll_interval = 0.2\ncache_pools = []\n"
        f'[proxy.tenancy]\nredis_url = "{redis.url}"\n'
    )
    args = ("--store", etcd_server.url("/fleet/"), "--config", str(config))
    a = ProxyProcess(workdir, "a", *args)
    b = ProxyProcess(workdir, "b", *args)
    try:
        a.wait_ready()
        b.wait_ready()
        yield a, b
    finally:
        a.stop()
        b.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fleet(proxies: tuple[ProxyProcess, ProxyProcess]) -> AsyncIterator[dict[str, Any]]:
    node = await FakeNode("state-1", "state").start()
    a, b = proxies
    async with aiohttp.ClientSession() as http:
        await admin(http, a.url, f"/{CHAIN}/addNode", node.entry(1))
        await admin(http, a.url, "/tenancy/projects", {"id": "fleet"})
        made = await admin(
            http,
            a.url,
            "/tenancy/keys",
            {"project": "fleet", "limits": {"requests_per_second": RATE}},
        )
        for proxy in (a, b):
            await wait_for(lambda p=proxy: served(http, p.url, made["key"]), 10)
        yield {"a": a.url, "b": b.url, "key": made["key"], "id": made["id"], "node": node}
    await node.stop()


async def admin(http: aiohttp.ClientSession, base: str, path: str, body: Any = None) -> Any:
    async with http.post(f"{base}{path}", data=orjson.dumps(body or {}), headers=JSON) as resp:
        answer = await resp.json(content_type=None)
        assert resp.status in (200, 201), answer
        return answer


async def rpc(http: aiohttp.ClientSession, url: str, body: bytes = BODY) -> tuple[int, Any]:
    async with http.post(url, data=body) as resp:
        return resp.status, await resp.json(content_type=None)


async def served(http: aiohttp.ClientSession, base: str, key: str) -> bool:
    status, answer = await rpc(http, f"{base}/{CHAIN}/{key}")
    return status == 200 and "result" in answer


async def wait_for(check: Any, within: float) -> float:
    started = time.monotonic()
    while not await check():
        if time.monotonic() - started > within:
            raise AssertionError(f"not reached within {within}s")
        await asyncio.sleep(0.02)
    return time.monotonic() - started


async def load(
    http: aiohttp.ClientSession, urls: list[str], seconds: float, per_url: int = 3
) -> list[tuple[float, int, Any, str]]:
    """Clients sending as fast as answers come for `seconds`: (sent at, status, answer, url)."""
    out: list[tuple[float, int, Any, str]] = []
    stop = time.monotonic() + seconds

    async def client(url: str) -> None:
        while (sent := time.monotonic()) < stop:
            try:
                status, answer = await rpc(http, url)
            except aiohttp.ClientError as exc:
                status, answer = -1, repr(exc)
            out.append((sent, status, answer, url))

    await asyncio.gather(*(client(u) for u in urls for _ in range(per_url)))
    return out


def admitted(results: list[tuple[float, int, Any, str]], start: float, end: float) -> int:
    return sum(1 for t, s, _, _ in results if start <= t < end and s == 200)


async def test_a_key_over_its_rate_through_two_proxies(fleet: dict[str, Any]) -> None:
    urls = [f"{fleet['a']}/{CHAIN}/{fleet['key']}", f"{fleet['b']}/{CHAIN}/{fleet['key']}"]
    async with aiohttp.ClientSession() as http:
        started = time.monotonic()
        results = await load(http, urls, 12.5)
    assert {s for _, s, _, _ in results} <= {200, 429}, {s for _, s, _, _ in results}
    refused = [a for _, s, a, _ in results if s == 429]
    assert refused and all(a["error"]["code"] == -32005 for a in refused)
    assert "requests_per_second=40" in refused[0]["error"]["message"]
    # after the buckets' first burst (two seconds), ten seconds at the key's rate
    n = admitted(results, started + 2, started + 12)
    assert abs(n - RATE * 10) <= RATE * 10 * 0.05, (n, len(results))
    # both proxies admitted a share: the limit is the fleet's, not each one's
    per = [admitted([r for r in results if r[3] == url], started + 2, started + 12) for url in urls]
    assert all(per), per
    # ...and a fair one: the buckets' levels are averaged, so neither lags behind for good
    assert min(per) >= n / 4, per


async def test_denied_method_and_preflight_on_a_proxy(fleet: dict[str, Any]) -> None:
    async with aiohttp.ClientSession() as http:
        made = await admin(
            http, fleet["a"], "/tenancy/keys",
            {"project": "fleet", "rules": {"methods_denied": ["eth_getBalance"]}},
        )  # fmt: skip
        url = f"{fleet['b']}/{CHAIN}/{made['key']}"
        await wait_for(lambda: _status_is(http, url, 403), 5)
        status, answer = await rpc(http, url)
        assert status == 403 and answer["error"]["code"] == -32002
        headers = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
        async with http.options(url, headers=headers) as resp:
            assert resp.status == 200
            assert resp.headers["Access-Control-Allow-Origin"] == "https://app.example"


async def _status_is(http: aiohttp.ClientSession, url: str, status: int) -> bool:
    return (await rpc(http, url))[0] == status


async def test_a_revoked_key_is_refused_on_every_proxy_within_a_second(
    fleet: dict[str, Any],
) -> None:
    async with aiohttp.ClientSession() as http:
        made = await admin(http, fleet["a"], "/tenancy/keys", {"project": "fleet"})
        urls = [f"{base}/{CHAIN}/{made['key']}" for base in (fleet["a"], fleet["b"])]
        for url in urls:
            await wait_for(lambda u=url: _status_is(http, u, 200), 5)
        revoked_at = time.monotonic()
        await admin(http, fleet["b"], f"/tenancy/keys/{made['id']}/revoke")
        for url in urls:
            await wait_for(lambda u=url: _status_is(http, u, 401), 5)
        assert time.monotonic() - revoked_at < 1.0


async def test_a_keys_concurrent_requests_are_counted_across_the_fleet(
    fleet: dict[str, Any],
) -> None:
    node = fleet["node"]
    async with aiohttp.ClientSession() as http:
        made = await admin(
            http, fleet["a"], "/tenancy/keys", {"project": "fleet", "limits": {"concurrent": 2}}
        )
        on_a, on_b = (f"{base}/{CHAIN}/{made['key']}" for base in (fleet["a"], fleet["b"]))
        for url in (on_a, on_b):
            await wait_for(lambda u=url: _status_is(http, u, 200), 5)
        node.delay = 1.5
        try:
            held = [asyncio.create_task(rpc(http, on_a)) for _ in range(2)]
            await asyncio.sleep(0.5)  # (a's syncs report its two in flight)
            status, answer = await rpc(http, on_b)
            assert status == 429 and "concurrent=2" in answer["error"]["message"], answer
            assert [s for s, _ in await asyncio.gather(*held)] == [200, 200]
        finally:
            node.delay = 0.0
        await wait_for(lambda: _status_is(http, on_b, 200), 2)


async def test_redis_killed_mid_run_fails_no_request(
    fleet: dict[str, Any], redis: RedisServer
) -> None:
    urls = [f"{fleet['a']}/{CHAIN}/{fleet['key']}", f"{fleet['b']}/{CHAIN}/{fleet['key']}"]
    async with aiohttp.ClientSession() as http:

        async def outage() -> None:  # (the load runs on for 1.5 s after Redis is back)
            await asyncio.sleep(1.0)
            redis.kill()
            await asyncio.sleep(2.0)
            redis.start()

        results, _ = await asyncio.gather(load(http, urls, 4.5), outage())
        assert {s for _, s, _, _ in results} <= {200, 429}, [
            r for r in results if r[1] not in (200, 429)
        ][:3]

        async def shared_again() -> bool:
            for base in (fleet["a"], fleet["b"]):
                async with http.get(f"{base}/health") as resp:
                    if (await resp.json())["tenancy"]["redis"] != "up":
                        return False
            return True

        await wait_for(shared_again, 5)
        # both proxies' buckets filled while idle: that burst spent first (as in the rate test)
        started = time.monotonic()
        results = await load(http, urls, 7.5)
        n = admitted(results, started + 2.5, started + 7.5)
        assert abs(n - RATE * 5) <= RATE * 5 * 0.1, n

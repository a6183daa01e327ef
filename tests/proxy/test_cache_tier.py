"""The response cache's shared tier: `chainstate proxy` processes sharing one real Redis.

A FAKE state node serves the chain (it counts what it was asked; a block every 0.1 s), a FAKE
checker confirms the block ten below its head (`getLatestBlock` as `chainstate checker`
answers it). Answers of settled blocks one proxy asked
are served by another without the node; `latest` answers are not shared; a flush or a reorg
seen by one proxy reaches the others; Redis killed mid-run fails no request, and the tier is
used again once Redis is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio
import redis as redis_sync

from chainstate.config import ConfigError
from proxy.settings import ProxySettings
from proxy.sharedcache import shared_tier, tier_health
from tests.etcd.conftest import ProxyProcess
from tests.proxy.fakes import FakeNode
from tests.tenancy.redisserver import RedisServer, redis_binary

pytestmark = pytest.mark.asyncio(loop_scope="module")  # the fake nodes live in the module's loop
CHAIN = "1337"
START = 1000  # the fake node's first head; a block every BLOCK_S
BLOCK_S = 0.1
BEHIND = 10  # the checker confirms the block this far below the head
JSON = {"content-type": "application/json"}
_address = iter(range(1, 1 << 30))
MINING = asyncio.Event()  # cleared: the fake node's head stays put
MINING.set()


def fresh_address() -> str:
    """An address no test asked about before (its answers are cached nowhere yet)."""
    return "0x" + f"{next(_address):040x}"


def balance(address: str, block: Any, rid: int = 1) -> bytes:
    return orjson.dumps(
        {"jsonrpc": "2.0", "id": rid, "method": "eth_getBalance", "params": [address, block]}
    )


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(redis_binary(), tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


class FakeChecker(FakeNode):
    """FAKE checker: `getLatestBlock` answers `{num, id}` of the block BEHIND its node's head."""

    def __init__(self, node: FakeNode) -> None:
        super().__init__("checker")
        self.node = node

    def _result(self, item: dict[str, Any], polling: bool) -> Any:
        if item["method"] == "getLatestBlock":
            height = self.node.head - BEHIND
            return {"num": height, "id": self.node.hash_at(height)}
        return super()._result(item, polling)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def nodes() -> AsyncIterator[tuple[FakeNode, FakeNode]]:
    state = await FakeNode("state-1", "state", head=START).start()
    checker = await FakeChecker(state).start()

    async def mine() -> None:
        while True:
            await asyncio.sleep(BLOCK_S)
            if MINING.is_set():
                state.head += 1

    miner = asyncio.get_running_loop().create_task(mine())
    yield state, checker
    miner.cancel()
    await state.stop()
    await checker.stop()


def config(workdir: Path, name: str, redis: RedisServer, node: FakeNode, checker: FakeNode,
           poll: float = 0.2) -> Path:  # fmt: skip
    path = workdir / f"{name}-tier.toml"
    path.write_text(
        f"[proxy]\nhead_poll_interval = {poll}\n"
        f'cache_tier_url = "{redis.url}"\ncache_tier_retry = 0.2\n'
        # lookups are given time here: under the test machine's load a 20 ms lookup may
        # time out (then the node answers, which is right but not what a test can count on)
        "cache_tier_timeout = 0.5\n"
        f'[[proxy.nodes]]\nchain = "{CHAIN}"\nkey = "{node.name}"\nurl = "{node.url}"\n'
        f'[[proxy.checkers]]\nchain = "{CHAIN}"\nurl = "{checker.url}"\n'
    )
    return path


def start(workdir: Path, name: str, *args: Any, **kw: Any) -> ProxyProcess:
    path = config(workdir, name, *args, **kw)
    return ProxyProcess(workdir, name, "--config", str(path), "--store", ":memory:")


@pytest.fixture(scope="module")
def proxies(
    redis: RedisServer,
    nodes: tuple[FakeNode, FakeNode],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ProxyProcess, ProxyProcess]]:
    workdir = tmp_path_factory.mktemp("tier")
    a = start(workdir, "a", redis, *nodes)
    b = start(workdir, "b", redis, *nodes)
    try:
        a.wait_ready()
        b.wait_ready()
        yield a, b
    finally:
        a.stop()
        b.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fleet(
    proxies: tuple[ProxyProcess, ProxyProcess],
) -> AsyncIterator[tuple[str, str]]:
    a, b = proxies
    async with aiohttp.ClientSession() as http:
        for proxy in (a, b):
            await wait_for(lambda p=proxy: ready(http, p.url), 15)
    yield a.url, b.url


async def ready(http: aiohttp.ClientSession, base: str) -> bool:
    """The tier is up and the proxy knows 30 blocks below a confirmed head."""
    if (await health(http, base))["cache_tier"] != {"state": "up"}:
        return False
    chain = await known(http, base)
    low, confirmed = chain.get("lowest_known"), chain.get("confirmed")
    return low is not None and confirmed is not None and confirmed - low >= 30


async def known(http: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    async with http.get(f"{base}/{CHAIN}/cache") as resp:
        return (await resp.json(content_type=None)).get("chain") or {}


async def settled(http: aiohttp.ClientSession, base: str, below: int = 5) -> int:
    """A height `below` blocks under the proxy's confirmed head (known to every proxy)."""
    return (await known(http, base))["confirmed"] - below


async def health(http: aiohttp.ClientSession, base: str) -> Any:
    async with http.get(f"{base}/health") as resp:
        return await resp.json(content_type=None)


async def figures(http: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    async with http.get(f"{base}/{CHAIN}/cache") as resp:
        return (await resp.json(content_type=None))["cache"]


async def rpc(http: aiohttp.ClientSession, base: str, body: bytes) -> tuple[int, Any]:
    async with http.post(f"{base}/{CHAIN}", data=body) as resp:
        return resp.status, await resp.json(content_type=None)


async def result(http: aiohttp.ClientSession, base: str, body: bytes) -> Any:
    status, answer = await rpc(http, base, body)
    assert status == 200 and "result" in answer, answer
    return answer["result"]


async def wait_for(check: Any, within: float) -> float:
    started = time.monotonic()
    while not await check():
        if time.monotonic() - started > within:
            raise AssertionError(f"not reached within {within}s")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def written(http: aiohttp.ClientSession, base: str, at_least: int) -> None:
    """Wait until `base` wrote `at_least` answers to the tier (writes leave the request path)."""

    async def check() -> bool:
        async with http.get(f"{base}/metrics") as resp:
            text = await resp.text()
        for line in text.splitlines():
            if line.startswith("chainstate_proxy_cache_tier_writes_total "):
                return float(line.split()[1]) >= at_least
        return False

    try:
        await wait_for(check, 5)
    except AssertionError:
        raise AssertionError([await tier_lines(http, base), await known(http, base)]) from None


def asked(node: FakeNode, address: str) -> int:
    return sum(1 for i in node.data_items("eth_getBalance") if i["params"][0] == address)


async def test_a_settled_answer_is_served_by_the_other_proxy_without_the_node(
    fleet: tuple[str, str], nodes: tuple[FakeNode, FakeNode]
) -> None:
    a, b = fleet
    node = nodes[0]
    below, above = fresh_address(), fresh_address()
    async with aiohttp.ClientSession() as http:
        height = await settled(http, a)
        by_height = balance(below, hex(height))  # at or below the confirmed head
        above_confirmed = node.hash_at(height + 8)
        by_hash = balance(above, {"blockHash": above_confirmed})  # above it, named by hash
        before = (await figures(http, b))["shared_hits"]
        writes = await tier_writes(http, a)
        first = [await result(http, a, body) for body in (by_height, by_hash)]
        await written(http, a, writes + 2)
        second = [await result(http, b, body) for body in (by_height, by_hash)]
        assert second == first
        tier = await tier_lines(http, b)
        assert (asked(node, below), asked(node, above)) == (1, 1), tier  # A asked; B did not
        assert (await figures(http, b))["shared_hits"] == before + 2
        # B keeps them itself now: asked again, its own cache answers (no lookup)
        await result(http, b, by_height)
        assert (await figures(http, b))["shared_hits"] == before + 2
        assert asked(node, below) == 1


async def tier_lines(http: aiohttp.ClientSession, base: str) -> list[str]:
    async with http.get(f"{base}/metrics") as resp:
        text = await resp.text()
    return [line for line in text.splitlines() if line.startswith("chainstate_proxy_cache_tier")]


async def tier_writes(http: aiohttp.ClientSession, base: str) -> float:
    async with http.get(f"{base}/metrics") as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith("chainstate_proxy_cache_tier_writes_total "):
            return float(line.split()[1])
    return 0.0


async def test_batch_items_and_finalized_reads_are_shared_too(
    fleet: tuple[str, str], nodes: tuple[FakeNode, FakeNode]
) -> None:
    a, b = fleet
    node = nodes[0]
    accounts = [fresh_address() for _ in range(3)]
    async with paused(), aiohttp.ClientSession() as http:  # one confirmed head for both
        for base in (a, b):
            await wait_for(lambda p=base: at_tip(http, p, node.head), 5)
            await wait_for(lambda p=base: confirmed_at(http, p, node.head - BEHIND), 5)
        height = await settled(http, a)
        batch = b"[" + b",".join(balance(x, hex(height - i), i) for i, x in enumerate(accounts))
        batch += b"]"
        final = balance(fresh_address(), "finalized")
        writes = await tier_writes(http, a)
        status, first = await rpc(http, a, batch)
        assert status == 200 and all("result" in x for x in first), first
        finalized = await result(http, a, final)
        await written(http, a, writes + 4)
        status, second = await rpc(http, b, batch)
        assert status == 200 and sorted(second, key=lambda x: x["id"]) == sorted(
            first, key=lambda x: x["id"]
        )
        assert await result(http, b, final) == finalized
        assert [asked(node, x) for x in accounts] == [1, 1, 1]
        assert asked(node, orjson.loads(final)["params"][0]) == 1


async def confirmed_at(http: aiohttp.ClientSession, base: str, height: int) -> bool:
    return (await known(http, base)).get("confirmed") == height


async def test_latest_and_unconfirmed_heights_stay_with_their_proxy(
    fleet: tuple[str, str], nodes: tuple[FakeNode, FakeNode]
) -> None:
    a, b = fleet
    node = nodes[0]
    at_latest, unconfirmed = fresh_address(), fresh_address()
    # `latest` stays put: A's second read is at the block of its first
    async with paused(), aiohttp.ClientSession() as http:
        for base in (a, b):
            await wait_for(lambda p=base: at_tip(http, p, node.head), 5)
        height = await settled(http, a, below=-3)
        bodies = (balance(at_latest, "latest"), balance(unconfirmed, hex(height)))
        writes = await tier_writes(http, a)
        for body in bodies:
            await result(http, a, body)
            await result(http, a, body)  # A's own cache answers the second
        assert (asked(node, at_latest), asked(node, unconfirmed)) == (1, 1)
        await asyncio.sleep(0.3)
        assert await tier_writes(http, a) == writes  # nothing of these was shared
        for body in bodies:
            await result(http, b, body)
        assert (asked(node, at_latest), asked(node, unconfirmed)) == (2, 2)


@contextlib.asynccontextmanager
async def paused() -> AsyncIterator[None]:
    """The fake node's head stays put meanwhile."""
    MINING.clear()
    try:
        yield
    finally:
        MINING.set()


async def at_tip(http: aiohttp.ClientSession, base: str, head: int) -> bool:
    return (await known(http, base)).get("tip") == head


async def test_a_flush_on_one_proxy_reaches_the_other(
    fleet: tuple[str, str], nodes: tuple[FakeNode, FakeNode]
) -> None:
    a, b = fleet
    node = nodes[0]
    address = fresh_address()
    async with aiohttp.ClientSession() as http:
        body = balance(address, hex(await settled(http, a)))
        writes = await tier_writes(http, a)
        await result(http, a, body)
        await written(http, a, writes + 1)
        await result(http, b, body)  # from the tier, and now B's own
        assert asked(node, address) == 1
        flushed = (await figures(http, b))["flushed"]
        # each proxy has its own config store here: only the tier can tell B
        async with http.post(f"{a}/{CHAIN}/cache/flush", data=b"{}", headers=JSON) as resp:
            assert resp.status == 200, await resp.text()

        async def b_flushed() -> bool:
            return (await figures(http, b))["flushed"] > flushed

        await wait_for(b_flushed, 3)
        await result(http, b, body)  # neither B's cache nor the tier (a new generation)
        assert asked(node, address) == 2


async def test_a_reorg_seen_by_one_proxy_drops_the_blocks_in_the_other(
    fleet: tuple[str, str],
    nodes: tuple[FakeNode, FakeNode],
    redis: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    a, _ = fleet
    node = nodes[0]
    MINING.clear()  # the head stays put: the reorg is above the confirmed head
    workdir = tmp_path_factory.mktemp("slow")
    # C polls its nodes every 60 s: it can only learn of the reorg from the tier
    c = start(workdir, "c", redis, *nodes, poll=60.0)
    try:
        c.wait_ready()
        async with aiohttp.ClientSession() as http:
            await wait_for(lambda: tier_up(http, c.url), 10)
            tip = (await known(http, c.url))["tip"]
            address = fresh_address()
            body = balance(address, {"blockHash": node.hash_at(tip)})
            await result(http, c.url, body)
            await result(http, a, body)
            assert (await figures(http, c.url))["entries"] >= 1
            dropped = (await figures(http, c.url))["dropped"]
            held = redis_sync.Redis.from_url(redis.url).keys(f"*:{node.hash_at(tip)}")
            assert len(held) == 1  # the block's entries in the tier
            # (the node stays on the new fork: the proxies take a node back on a chain they
            # dropped for one that lags, docs/proxy.md "Reorgs")
            node.reorg(tip - 1, fork=1)

            async def c_dropped() -> bool:
                return (await figures(http, c.url))["dropped"] > dropped

            await wait_for(c_dropped, 5)
            assert redis_sync.Redis.from_url(redis.url).keys(held[0]) == []  # deleted too
    finally:
        MINING.set()
        c.stop()


async def test_a_cold_proxy_answers_older_heights_from_the_tier(
    fleet: tuple[str, str],
    nodes: tuple[FakeNode, FakeNode],
    redis: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    a, _ = fleet
    node = nodes[0]
    address = fresh_address()
    async with aiohttp.ClientSession() as http:
        body = balance(address, hex(await settled(http, a, below=20)))
        writes = await tier_writes(http, a)
        expected = await result(http, a, body)
        await written(http, a, writes + 1)
        # D starts after that block: it reads the blocks below its first head at start
        d = start(tmp_path_factory.mktemp("cold"), "d", redis, *nodes)
        try:
            d.wait_ready()
            await wait_for(lambda: ready(http, d.url), 15)
            assert await result(http, d.url, body) == expected
            assert asked(node, address) == 1
            assert (await figures(http, d.url))["shared_hits"] == 1
        finally:
            d.stop()


async def test_redis_killed_mid_run_fails_no_request_and_the_tier_comes_back(
    fleet: tuple[str, str], nodes: tuple[FakeNode, FakeNode], redis: RedisServer
) -> None:
    a, b = fleet
    node = nodes[0]
    addresses = [fresh_address() for _ in range(20)]
    out: list[tuple[int, Any]] = []
    async with aiohttp.ClientSession() as http:
        height = await settled(http, a)
        bodies = [balance(x, hex(height - i)) for i, x in enumerate(addresses)]
        stop = time.monotonic() + 4.5  # (1.5 s of load after Redis is back)

        async def client(base: str, k: int) -> None:
            i = k
            while time.monotonic() < stop:
                try:
                    out.append(await rpc(http, base, bodies[i % len(bodies)]))
                except aiohttp.ClientError as exc:
                    out.append((-1, repr(exc)))
                i += 1

        async def outage() -> None:
            await asyncio.sleep(1.0)
            redis.kill()
            await asyncio.sleep(2.0)
            redis.start()

        clients = [client(base, k) for base in (a, b) for k in range(3)]
        await asyncio.gather(*clients, outage())
        failed = [r for r in out if r[0] != 200 or "result" not in r[1]]
        assert not failed, failed[:3]
        assert len(out) > 100
        for base in (a, b):
            try:
                await wait_for(lambda p=base: tier_up(http, p), 5)
            except AssertionError:
                raise AssertionError(await health(http, base)) from None
        # the tier is used again: what A asks now, B answers without the node
        address = fresh_address()
        body = balance(address, hex(await settled(http, a)))
        writes = await tier_writes(http, a)
        await result(http, a, body)
        await written(http, a, writes + 1)
        await result(http, b, body)
        assert asked(node, address) == 1


async def test_a_hung_redis_costs_one_timeout_per_lookup_until_the_tier_is_off(
    fleet: tuple[str, str], redis: RedisServer
) -> None:
    a, _ = fleet
    assert redis.proc is not None
    async with aiohttp.ClientSession() as http:
        height = await settled(http, a)
        opens = await metric(http, a, "chainstate_proxy_cache_tier_breaker_opens_total")
        os.kill(redis.proc.pid, signal.SIGSTOP)  # Redis hangs: connections stay open
        try:
            times = []
            for i in range(12):
                started = time.monotonic()
                await result(http, a, balance(fresh_address(), hex(height - i % 5)))
                times.append(time.monotonic() - started)
            assert (await health(http, a))["cache_tier"]["state"] == "down"
        finally:
            os.kill(redis.proc.pid, signal.SIGCONT)
        # each lookup waited at most the timeout (0.5 s here) and, once the third failed,
        # none was sent: the rest were answered by the node at once
        assert max(times) < 1.5, times
        assert sum(1 for t in times if t >= 0.4) <= 3, times
        assert await metric(http, a, "chainstate_proxy_cache_tier_breaker_opens_total") > opens
        await wait_for(lambda: tier_up(http, a), 5)


async def metric(http: aiohttp.ClientSession, base: str, name: str) -> float:
    async with http.get(f"{base}/metrics") as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


async def tier_up(http: aiohttp.ClientSession, base: str) -> bool:
    return (await health(http, base))["cache_tier"] == {"state": "up"}


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("cache_tier_url", "http://127.0.0.1:6379"),
        ("cache_tier_url", 6379),
        ("cache_tier_prefix", ""),
        ("cache_tier_timeout", 0),
        ("cache_tier_retry", -1.0),
        ("cache_tier_ttl", 0),
        ("cache_tier_failures", 1.5),
        ("cache_tier_queue", True),
        ("cache_tier_connections", "8"),
    ],
)
async def test_bad_tier_settings_are_refused_by_name(setting: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=setting):
        ProxySettings.from_config({"proxy": {setting: value}})


async def test_the_tier_is_off_without_a_url_and_said_so() -> None:
    settings = ProxySettings.from_config({"proxy": {}})
    assert settings.cache_tier_url is None and shared_tier(settings) is None
    assert tier_health(None) == "off"
    # a proxy with no cache has no tier either (nothing to put under)
    url = {"cache_tier_url": "redis://127.0.0.1:1/0", "cache_max_bytes": 0}
    assert shared_tier(ProxySettings.from_config({"proxy": url})) is None

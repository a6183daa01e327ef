"""End to end: `chainstate proxy` processes sharing one real etcd.

Two proxies (A, B) on one etcd prefix serve the whole module; each test uses its own chain id
and its own fake nodes (tests.proxy.fakes: real HTTP nodes outside the project). The etcd
outage test runs last because it kills the module's etcd.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.store_etcd import EtcdStore
from tests.conftest import free_port
from tests.etcd.conftest import EtcdServer, ProxyProcess
from tests.proxy.fakes import FakeNode

TOKEN = "s3cret-admin"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ADDR = "0x" + "22" * 20
PREFIX = "/e2e/"
# Console spans leave the batch processor quickly instead of every 5 s.
SPAN_ENV = {"OTEL_BSP_SCHEDULE_DELAY": "50"}


@pytest.fixture(scope="module")
def proxies(
    etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ProxyProcess, ProxyProcess]]:
    workdir = tmp_path_factory.mktemp("proxies")
    args = ("--store", etcd_server.url(PREFIX), "--admin-token", TOKEN)
    a = ProxyProcess(workdir, "a", *args, "--trace", "console", env=SPAN_ENV)
    b = ProxyProcess(workdir, "b", *args)
    try:
        a.wait_ready()
        b.wait_ready()
        yield a, b
    finally:
        a.stop()
        b.stop()


@pytest.fixture
async def http() -> Any:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def nodes() -> Any:
    started: list[FakeNode] = []

    async def make(name: str, kind: str = "state") -> FakeNode:
        node = await FakeNode(name, kind).start()
        started.append(node)
        return node

    yield make
    for node in started:
        await node.stop()


async def admin(
    http: aiohttp.ClientSession, base: str, path: str, body: Any = None, auth: bool = True
) -> tuple[int, Any]:
    headers = AUTH if auth else {}
    if body is None:  # admin reads are GETs, changes POST a body
        request = http.get(f"{base}{path}", headers=headers)
    else:
        request = http.post(f"{base}{path}", json=body, headers=headers)
    async with request as resp:
        return resp.status, await resp.json(content_type=None)


async def balance(
    http: aiohttp.ClientSession, base: str, chain: str, address: str = ADDR, **headers: str
) -> Any:
    body = {"jsonrpc": "2.0", "id": 7, "method": "eth_getBalance", "params": [address, "latest"]}
    async with http.post(f"{base}/{chain}", json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def node_keys(http: aiohttp.ClientSession, base: str, pool: str) -> dict[str, Any]:
    status, body = await admin(http, base, f"/{pool}/getAllNodes")
    if status == 404:
        return {}
    assert status == 200, body
    return {n["key"]: n for n in body["nodes"]}


async def eventually(check: Any, within: float = 5.0) -> float:
    """Await `check()` until it is truthy; returns the seconds it took."""
    t0 = time.monotonic()
    while not await check():
        if time.monotonic() - t0 > within:
            raise AssertionError(f"not reached within {within}s")
        await asyncio.sleep(0.02)
    return time.monotonic() - t0


async def wait_heads(http: aiohttp.ClientSession, bases: list[str], pool: str, n: int) -> None:
    async def ready() -> bool:
        for base in bases:
            found = await node_keys(http, base, pool)
            if len(found) != n or not all(x.get("head") == 1000 for x in found.values()):
                return False
        return True

    await eventually(ready, within=10)


# -- admin changes are shared ----------------------------------------------------------------


async def test_two_proxies_route_identically_after_add_node(proxies, http, nodes) -> None:
    a, b = proxies
    state, archive = await nodes("s-1001"), await nodes("a-1001", "archive")

    status, _ = await admin(http, a.url, "/1001/addNode", state.entry())
    assert status == 201
    assert await eventually(lambda: has(http, b.url, "1001", "s-1001")) < 1.0
    status, _ = await admin(http, b.url, "/0x3e9/addNode", archive.entry())  # hex chain id
    assert status == 201
    assert await eventually(lambda: has(http, a.url, "1001", "a-1001")) < 1.0
    await wait_heads(http, [a.url, b.url], "1001", 2)

    for block in ("latest", "0x10"):
        query = f"/1001/debug_chooseOneNode?method=eth_getBalance&block={block}"
        choices = [(await admin(http, base, query))[1]["node"]["key"] for base in (a.url, b.url)]
        assert choices == (["s-1001"] * 2 if block == "latest" else ["a-1001"] * 2)
    batch = [
        {"jsonrpc": "2.0", "id": i, "method": "eth_getBalance", "params": [ADDR, block]}
        for i, block in enumerate(["latest", "0x10", "0x3e7"])
    ]
    answers = []
    for base in (a.url, b.url):
        async with http.post(f"{base}/1001", json=batch) as resp:
            answers.append([r["result"]["node"] for r in await resp.json()])
    assert answers[0] == answers[1] == ["s-1001", "a-1001", "s-1001"]

    status, _ = await admin(http, b.url, "/1001/deleteNode/a-1001", {})
    assert status == 200
    await eventually(lambda: lacks(http, a.url, "1001", "a-1001"), within=1.0)
    assert "etcd store" not in a.stderr() + b.stderr()  # quiet while all is well


async def has(http: aiohttp.ClientSession, base: str, pool: str, key: str) -> bool:
    return key in await node_keys(http, base, pool)


async def lacks(http: aiohttp.ClientSession, base: str, pool: str, key: str) -> bool:
    return key not in await node_keys(http, base, pool)


async def test_admin_token_is_enforced_and_the_data_path_has_no_admin(proxies, http) -> None:
    a, _ = proxies
    assert (await admin(http, a.url, "/getChains", auth=False))[0] == 401
    async with http.get(f"{a.url}/getChains", headers={"Authorization": "Bearer nope"}) as r:
        assert r.status == 401
    node = {"key": "sneaky", "url": "http://127.0.0.1:1", "kind": "state"}
    status, _ = await admin(http, a.url, "/1001/addNode", node, auth=False)
    assert status == 401
    # Admin operations are not JSON-RPC methods of the data path.
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "addNode", "params": [node]}
    async with http.post(f"{a.url}/1001", json=rpc) as resp:
        assert (await resp.json())["error"]["code"] == -32601
    assert "sneaky" not in await node_keys(http, a.url, "1001")


async def test_separate_admin_listener(etcd, start_proxy, http) -> None:
    admin_port = str(free_port())
    c = start_proxy(
        "c", "--store", etcd.url(PREFIX), "--admin-token", TOKEN, "--admin-port", admin_port
    ).wait_ready()
    admin_url = f"http://127.0.0.1:{admin_port}"
    async with http.get(f"{c.url}/getChains", headers=AUTH) as resp:
        assert resp.status in (404, 405)  # not served on the data port
    assert (await admin(http, admin_url, "/getChains", auth=False))[0] == 401
    status, body = await admin(http, admin_url, "/getChains")
    assert status == 200 and "1001" in {ch["chain"] for ch in body["chains"]}


# -- version mode --------------------------------------------------------------------------------


async def test_version_flip_under_load_moves_traffic_without_failures(
    proxies, etcd, http, nodes
) -> None:
    a, b = proxies
    blue, green = await nodes("blue-1002"), await nodes("green-1002")
    assert (await admin(http, a.url, "/1002-blue/addNode", blue.entry()))[0] == 201
    assert (await admin(http, a.url, "/1002-green/addNode", green.entry()))[0] == 201
    status, body = await admin(http, b.url, "/1002/setVersion", {"version": "blue"})
    assert status == 200 and body["active_pool"] == "1002-blue"
    await wait_heads(http, [a.url, b.url], "1002-blue", 1)
    await wait_heads(http, [a.url, b.url], "1002-green", 1)

    stop = asyncio.Event()
    seen: dict[int, list[str]] = {}
    failures: list[str] = []

    async def client(i: int, base: str) -> None:
        connector = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(connector=connector) as s:
            while not stop.is_set():
                try:
                    answer = await balance(s, base, "1002")
                    seen.setdefault(i, []).append(answer["result"]["node"])
                except Exception as exc:  # every failure is reported below
                    failures.append(repr(exc))

    clients = [asyncio.create_task(client(i, (a.url, b.url)[i % 2])) for i in range(8)]
    await asyncio.sleep(0.5)
    status, body = await admin(http, a.url, "/1002/setVersion", {"version": "green"})
    assert status == 200 and body["active_pool"] == "1002-green"
    await asyncio.sleep(1.0)  # both proxies apply the flip well within a second
    stop.set()
    await asyncio.gather(*clients)

    assert failures == []
    assert len(seen) == 8 and sum(map(len, seen.values())) > 200
    for answers in seen.values():
        # Per client: blue until the flip, then green for good (no flapping back).
        flip = answers.index("green-1002")
        assert flip > 0 and set(answers[:flip]) == {"blue-1002"}
        assert set(answers[flip:]) == {"green-1002"}
        assert len(answers[flip:]) >= 5

    # An operator's raw `etcdctl put` flips the fleets the same way (docs/etcd.md).
    etcdctl = shutil.which("etcdctl")
    if etcdctl:
        put = await asyncio.create_subprocess_exec(
            *(etcdctl, f"--endpoints={etcd.endpoint}", "put", f"{PREFIX}1002/version", "blue"),
            stdout=subprocess.DEVNULL,
            env={**os.environ, "ETCDCTL_API": "3"},
        )
        assert await put.wait() == 0
        for base in (a.url, b.url):
            await eventually(lambda base=base: routes_to(http, base, "1002", "blue-1002"), 1.0)


async def routes_to(http: aiohttp.ClientSession, base: str, chain: str, key: str) -> bool:
    return (await balance(http, base, chain))["result"]["node"] == key


# -- tracing -------------------------------------------------------------------------------------


async def test_spans_show_each_retry(proxies, http, nodes) -> None:
    a, _ = proxies
    bad, good = await nodes("bad-1005"), await nodes("good-1005")
    bad.error_code = -39006  # BlockNotFound: retried on another node
    assert (await admin(http, a.url, "/1005/addNode", bad.entry(weight=1000)))[0] == 201
    assert (await admin(http, a.url, "/1005/addNode", good.entry(weight=1)))[0] == 201
    await wait_heads(http, [a.url], "1005", 2)

    headers = {"client-id": "e2e-client", "x-vendor-biz": "payments", "x-vendor-env": "test"}
    for _ in range(5):
        answer = await balance(http, a.url, "1005", **headers)
        assert answer["result"]["node"] == "good-1005"

    async def retried_trace() -> dict[str, Any] | None:
        spans = [orjson.loads(line) for line in a.stdout().splitlines() if line.startswith("{")]
        by_trace: dict[str, list[dict[str, Any]]] = {}
        for span in spans:
            by_trace.setdefault(span["context"]["trace_id"], []).append(span)
        for trace in by_trace.values():
            names = sorted(s["name"] for s in trace)
            if names != ["jsonrpc.request", "upstream.attempt", "upstream.attempt"]:
                continue
            root = next(s for s in trace if s["name"] == "jsonrpc.request")
            if root["attributes"].get("chain") == "1005":
                return {"root": root, "attempts": [s for s in trace if s is not root]}
        return None

    await eventually(retried_trace, within=5)
    found = await retried_trace()
    assert found is not None
    root, attempts = found["root"], found["attempts"]
    assert root["attributes"]["client_id"] == "e2e-client"
    assert root["attributes"]["x_vendor_biz"] == "payments"
    assert root["attributes"]["x_vendor_env"] == "test"
    attempts.sort(key=lambda s: s["attributes"]["attempt"])
    assert [(s["attributes"]["attempt"], s["attributes"]["node"]) for s in attempts] == [
        (1, "bad-1005"),
        (2, "good-1005"),
    ]
    assert attempts[0]["attributes"]["outcome"] != attempts[1]["attributes"]["outcome"]
    assert all(s["parent_id"] == root["context"]["span_id"] for s in attempts)


# -- --workers ---------------------------------------------------------------------------------


async def test_workers_share_the_configuration(proxies, etcd, start_proxy, http, nodes) -> None:
    a, _ = proxies
    w = start_proxy("w", "--store", etcd.url(PREFIX), "--admin-token", TOKEN, "--workers", "2")
    w.wait_ready()
    first, second = await nodes("n1-1006"), await nodes("n2-1006")
    assert (await admin(http, a.url, "/1006/addNode", first.entry()))[0] == 201

    asked = itertools.count(1)

    async def every_worker_routes_to(key: str) -> bool:
        # New connections spread over the workers (SO_REUSEPORT): 30 of them reach both
        # workers except with probability 2**-29. Each asks an address not asked before: a
        # read asked again is the proxy's cached answer at that block (by hash), whichever
        # node computed it (these fake nodes name themselves in the answer; real nodes at
        # one block hash answer alike).
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector) as fresh:
            for _ in range(30):
                address = f"0x{next(asked):040x}"
                try:
                    answer = await balance(fresh, w.url, "1006", address)
                except AssertionError:
                    return False  # a worker without the node yet: 404 unknown chain
                if answer.get("result", {}).get("node") != key:
                    return False
        return True

    await eventually(lambda: every_worker_routes_to("n1-1006"), within=10)
    # An admin call answered by whichever worker is seen by the other proxy (and workers).
    assert (await admin(http, w.url, "/1006/addNode", second.entry()))[0] == 201
    assert (await admin(http, w.url, "/1006/deleteNode/n1-1006", {}))[0] == 200
    await eventually(lambda: has(http, a.url, "1006", "n2-1006"), within=1.0)
    await eventually(lambda: every_worker_routes_to("n2-1006"), within=10)
    assert w.stop() == 0


# -- etcd down at start ------------------------------------------------------------------------


async def test_proxy_starts_while_etcd_is_down_and_catches_up(
    etcd_not_started, start_proxy, http, nodes
) -> None:
    server: EtcdServer = etcd_not_started
    t0 = time.monotonic()
    p = start_proxy("late", "--store", server.url(PREFIX), "--admin-token", TOKEN).wait_ready()
    assert time.monotonic() - t0 < 10
    node = await nodes("s-1004")
    async with http.post(f"{p.url}/1004", json={"jsonrpc": "2.0", "id": 1, "method": "x"}) as r:
        assert r.status == 404  # no configuration yet: unknown chain
    status, body = await admin(http, p.url, "/1004/addNode", node.entry())
    assert status == 503 and "unavailable" in body["error"]
    assert "\n" not in body["error"]  # gRPC's multi-line error text is condensed
    assert await store_gauge(http, p.url) == 0.0
    await asyncio.sleep(2.5)  # the store keeps being retried: said once, not every second
    warnings = [line for line in p.stderr().splitlines() if '"warning"' in line]
    assert len(warnings) == 1 and "unavailable at start" in warnings[0], warnings
    assert "\\n" not in warnings[0]

    server.start()

    async def added() -> bool:
        return (await admin(http, p.url, "/1004/addNode", node.entry()))[0] in (201, 409)

    await eventually(added, within=10)
    await wait_heads(http, [p.url], "1004", 1)
    assert (await balance(http, p.url, "1004"))["result"]["node"] == "s-1004"
    assert await store_gauge(http, p.url) == 1.0


async def store_gauge(http: aiohttp.ClientSession, base: str) -> float:
    """The proxy's `chainstate_proxy_config_store_available` gauge."""
    async with http.get(f"{base}/metrics", headers=AUTH) as resp:  # (behind the token)
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith("chainstate_proxy_config_store_available "):
            return float(line.split()[1])
    raise AssertionError("no chainstate_proxy_config_store_available metric")


# -- etcd outage (last: kills the module's etcd) ------------------------------------------------


async def test_etcd_outage_keeps_serving_refuses_writes_and_loses_nothing(
    proxies, etcd_server: EtcdServer, http, nodes
) -> None:
    a, b = proxies
    first, second, third = await nodes("n1-1003"), await nodes("n2-1003"), await nodes("n3-1003")
    assert (await admin(http, a.url, "/1003/addNode", first.entry()))[0] == 201
    await wait_heads(http, [a.url, b.url], "1003", 1)

    etcd_server.kill()
    for base in (a.url, b.url):  # the last known configuration keeps serving
        for _ in range(3):
            assert (await balance(http, base, "1003"))["result"]["node"] == "n1-1003"
    status, body = await admin(http, a.url, "/1003/addNode", second.entry())
    assert status == 503 and "unavailable" in body["error"]
    assert "n2-1003" not in await node_keys(http, b.url, "1003")  # reads still answer
    for base in (a.url, b.url):  # metrics say so (within the probe interval)
        await eventually(lambda base=base: gauge_is(http, base, 0.0), within=5)

    etcd_server.start()
    # A change written straight into etcd right after the restart, before the proxies have
    # re-opened their watches, must still reach them.
    writer = EtcdStore(etcd_server.endpoint, PREFIX)
    await writer.start()
    try:
        entry = {**third.entry(), "enabled": True}
        await eventually(lambda: put_ok(writer, "pools/1003/nodes/n3-1003", entry), within=10)
    finally:
        await writer.close()
    for base in (a.url, b.url):
        await eventually(lambda base=base: has(http, base, "1003", "n3-1003"), within=10)

    async def added() -> bool:
        return (await admin(http, a.url, "/1003/addNode", second.entry()))[0] == 201

    await eventually(added, within=10)
    assert await eventually(lambda: has(http, b.url, "1003", "n2-1003")) < 1.0
    for base in (a.url, b.url):
        await eventually(lambda base=base: gauge_is(http, base, 1.0), within=5)
    for proxy in (a, b):
        assert "etcd store unreachable" in proxy.stderr()
        assert "etcd store reachable again" in proxy.stderr()


async def gauge_is(http: aiohttp.ClientSession, base: str, value: float) -> bool:
    return await store_gauge(http, base) == value


async def put_ok(store: EtcdStore, key: str, obj: Any) -> bool:
    try:
        await store.put(key, orjson.dumps(obj))
    except Exception:
        return False
    return True

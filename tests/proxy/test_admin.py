"""The admin API: good and bad bodies, persistence, local nodes, token, separate listener."""

from __future__ import annotations

import copy

import orjson
import pytest
from aiohttp import web

from proxy.admin import LEADER_MAX_LAG
from proxy.app import create_admin_app, create_app
from proxy.settings import ProxySettings, SeedNode, SeedWriter
from proxy.store import StoreUnavailable
from proxy.store_file import FileStore
from tests.conftest import free_port
from tests.proxy.conftest import FAST, Api, fast_settings, wait_until

URL = "http://127.0.0.1:9"


def snapshot(api: Api) -> dict:
    """Everything an admin call could change, to check that a refused call changed nothing."""
    state = api.proxy.state
    return copy.deepcopy(
        {
            pid: {
                "nodes": {k: n.entry for k, n in p.nodes.items()},
                "local": {k: n.entry for k, n in p.local.items()},
                "weights": dict(p.weights),
                "routes": dict(p.routes),
                "mirrors": dict(p.mirrors),
                "writers": {k: n.entry for k, n in p.writers.items()},
                "leader": p.leader,
            }
            for pid, p in state.pools.items()
        }
        | {"versions": dict(state.versions), "revision": state.revision}
    )


@pytest.fixture
async def api(make_api) -> Api:
    api = await make_api()
    status, _ = await api.post("/1337/addNode", {"key": "s1", "url": URL, "kind": "state"})
    assert status == 201
    # URL does not answer: a Leader that is down has to be forced in.
    w1 = {"key": "w1", "url": URL, "leader": True, "force": True}
    status, _ = await api.post("/1337/writers/addWriter", w1)
    assert status == 201
    return api


async def test_node_lifecycle(api: Api) -> None:
    status, body = await api.post(
        "/0x539/addNode", {"key": "a1", "url": URL, "kind": "archive", "weight": 3}
    )
    assert status == 201 and body["pool"] == "1337"
    assert body["node"] | {"head": None} == {
        "key": "a1",
        "url": URL,
        "kind": "archive",
        "weight": 3,
        "enabled": True,
        "head": None,
        "earliest": None,
        "healthy": True,
        "latency_ms": None,
        "inflight": 0,
        "local": False,
    }
    status, body = await api.post("/1337/updateNode/a1", {"enabled": False, "weight": 5})
    assert status == 200 and body["node"]["enabled"] is False and body["node"]["weight"] == 5
    status, body = await api.get("/1337/getAllNodes")
    assert [n["key"] for n in body["nodes"]] == ["s1", "a1"]
    status, body = await api.post("/1337/deleteNode/a1")
    assert status == 200 and body["deleted"] == "a1"
    assert (await api.post("/1337/deleteNode/a1"))[0] == 404
    status, body = await api.get("/getChains")
    assert body["chains"] == [
        {
            "chain": "1337",
            "version": None,
            "active_pool": "1337",
            "pools": ["1337"],
            "head": None,
            "nodes": 1,
        }
    ]


async def test_adding_a_node_to_an_unknown_chain_creates_its_pool(api: Api) -> None:
    status, _ = await api.post("/1/addNode", {"key": "n", "url": URL})
    assert status == 201
    status, body = await api.get("/1/getAllNodes")
    assert status == 200 and body["nodes"][0]["kind"] == "state"
    status, body = await api.get("/1-blue/getAllNodes")
    assert status == 404
    status, _ = await api.post("/1-blue/addNode", {"key": "n", "url": URL})
    status, body = await api.get("/getChains")
    assert [c["pools"] for c in body["chains"]] == [["1", "1-blue"], ["1337"]]


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/1337/addNode", b"{bad json", 400),
        ("/1337/addNode", [], 400),
        ("/1337/addNode", {"key": "x"}, 400),
        ("/1337/addNode", {"key": "x", "url": "gopher://x"}, 400),
        ("/1337/addNode", {"key": "x", "url": "http://a:99999"}, 400),
        ("/1337/addNode", {"key": "x", "url": "http://a:port"}, 400),
        ("/1337/addNode", {"key": "x", "url": "http://a b:1"}, 400),
        ("/1337/addNode", {"key": "x", "url": "http://[::1:1"}, 400),
        ("/1337/addNode", {"key": "x", "url": "http://:8545"}, 400),
        ("/1337/addNode", {"key": "x", "url": "inproc://s:1"}, 400),
        ("/1337/addNode", {"key": "x y", "url": URL}, 400),
        ("/1337/addNode", {"key": "x", "url": URL, "kind": "light"}, 400),
        ("/1337/addNode", {"key": "x", "url": URL, "weight": -2}, 400),
        ("/1337/addNode", {"key": "x", "url": URL, "weight": 10**9}, 400),
        ("/1337/addNode", {"key": "x", "url": URL, "healthy": False}, 400),
        ("/1337/addNode", {"key": "s1", "url": URL}, 409),
        ("/nochain/addNode", {"key": "x", "url": URL}, 400),
        ("/1337/updateNode/s1", {}, 400),
        ("/1337/updateNode/s1", {"kind": "light"}, 400),
        ("/1337/updateNode/s1", {"key": "other"}, 400),
        ("/1337/updateNode/zz", {"weight": 2}, 404),
        ("/1337/deleteNode/zz", None, 404),
        ("/9/deleteNode/s1", None, 404),
        ("/1337/addLocalNode", {"key": "s1", "url": URL}, 409),
        ("/1337/addLocalNode", {"url": URL}, 400),
        ("/1337/deleteLocalNode/s1", None, 404),
        ("/1337/setWeight", {"key": "s1"}, 400),
        ("/1337/setWeight", {"key": "s1", "weight": "2"}, 400),
        ("/1337/setWeight", {"key": "zz", "weight": 2}, 404),
        ("/1337/setWeight", {"key": "s1", "weight": 2, "x": 1}, 400),
        ("/1337/deleteWeight", {"key": "s1"}, 404),
        ("/1337/addMethodRoute", {"method": "eth_call"}, 400),
        ("/1337/addMethodRoute", {"method": "eth_call", "kind": "light"}, 400),
        ("/1337/addMethodRoute", {"method": "eth_call", "nodes": ["zz"]}, 400),
        (
            "/1337/addMethodRoute",
            {"method": "eth_mining", "kind": "state"},
            400,
        ),
        ("/1337/addMethodRoute", {"method": "eth_sendRawTransaction", "kind": "state"}, 400),
        ("/1337/removeMethodRoute", {"method": "eth_call", "kind": "state"}, 404),
        ("/1337/deleteMethodRoute/eth_call", None, 404),
        ("/1337/addMirror", {"url": "nope"}, 400),
        ("/1337/addMirror", {"url": URL, "methods": "eth_call"}, 400),
        ("/1337/addMirror", {"url": URL, "methods": ["eth_nope"]}, 400),
        ("/1337/deleteMirror", {}, 400),
        ("/1337/deleteMirror", {"url": URL}, 404),
        ("/1337/writers/switchLeader", {"key": "zz"}, 404),
        ("/1337/writers/switchLeader", {}, 400),
        ("/1337/writers/switchLeader", {"key": "w1", "force": "yes"}, 400),
        ("/1337/writers/switchLeader", {"key": "w1", "why": "x"}, 400),
        ("/1337/writers/switchLeader", {"key": "w1"}, 409),  # it does not answer
        ("/1337/writers/addWriter", {"key": "w2", "url": URL, "leader": True}, 409),
        ("/1337/writers/addWriter", {"key": "w2", "url": URL, "force": 1}, 400),
        ("/1337/writers/addWriter", {"key": "w1", "url": URL}, 409),
        ("/1337/writers/addWriter", {"key": "w2", "url": URL, "leader": "yes"}, 400),
        ("/1337/writers/deleteWriter/w1", None, 409),
        ("/1337/setVersion", {"version": ""}, 400),
        ("/1337/setVersion", {"v": "blue"}, 400),
        ("/1337-blue/setVersion", {"version": "x"}, 400),
    ],
)
async def test_bad_admin_calls_change_nothing(api: Api, path, body, status) -> None:
    before = snapshot(api)
    got, answer = await api.post(path, body)
    assert got == status, answer
    assert isinstance(answer["error"], str) and answer["error"]
    assert snapshot(api) == before


async def test_weights(api: Api) -> None:
    status, body = await api.post("/1337/setWeight", {"key": "s1", "weight": 7})
    assert status == 200 and body["weight"] == 7 and body["base"] == 1
    status, body = await api.get("/1337/getWeight", params={"key": "s1"})
    assert (body["weight"], body["override"]) == (7, 7)
    status, body = await api.get("/1337/getAllNodes")
    assert body["nodes"][0]["weight"] == 7
    status, body = await api.get("/1337/getWeight")
    assert body["weights"] == [{"key": "s1", "weight": 7, "base": 1, "override": 7}]
    assert (await api.get("/1337/getWeight", params={"key": "zz"}))[0] == 404
    status, body = await api.post("/1337/deleteWeight", {"key": "s1"})
    assert status == 200 and body["weight"] == 1 and body["override"] is None


async def test_routes_listing(api: Api) -> None:
    rule = {"method": "eth_call", "nodes": ["s1"]}
    status, body = await api.post("/1337/addMethodRoute", rule)
    assert status == 200 and body["rules"] == [rule]
    status, body = await api.post("/1337/addMethodRoute", rule)  # no duplicate
    assert body["rules"] == [rule]
    status, body = await api.get("/1337/getMethodRoutes")
    assert body["routes"] == {"eth_call": [rule]}


async def test_writers_listing(api: Api) -> None:
    _, body = await api.get("/1337/writers")
    (w1,) = body["writers"]
    assert w1 | {"last_error": None, "healthy": None} == {
        "key": "w1",
        "url": URL,
        "leader": True,
        "head": None,
        "behind": None,
        "execution_head": None,  # the writer's own report (writer_health), when it answers
        "lag": None,
        "state": None,
        "healthy": None,
        "latency_ms": None,
        "last_error": None,
    }
    assert "127.0.0.1:9" in w1["last_error"]  # polled: nothing listens there
    _, body = await api.get("/1337/writers/leader")
    assert body["leader"]["key"] == "w1"
    await api.post("/1337/writers/addWriter", {"key": "w2", "url": URL})
    assert (await api.post("/1337/writers/deleteWriter/w2"))[0] == 200
    assert (await api.get("/9/writers/leader"))[0] == 404


async def test_writer_health_guards_the_leader_switch(make_api, fake_nodes) -> None:
    """Writers are polled like nodes; only a writer that answers becomes the Leader, unless
    the operator forces it; requests for a Leader that is down get a clear error."""
    live = await fake_nodes("live", "state", head=42)
    gone = await fake_nodes("gone", "state", head=40)
    api = await make_api()
    status, body = await api.post(
        "/1337/writers/addWriter", {"key": "live", "url": live.url, "leader": True}
    )
    assert status == 201 and body["writer"]["head"] == 42 and body["writer"]["healthy"]
    assert (await api.post("/1337/writers/addWriter", {"key": "gone", "url": gone.url}))[0] == 201
    await gone.stop()

    def writer(body: dict, key: str) -> dict:
        return next(w for w in body["writers"] if w["key"] == key)

    async def listed(key: str) -> dict:
        return writer((await api.get("/1337/writers"))[1], key)

    pool = api.proxy.state.pools["1337"]
    await wait_until(lambda: not pool.writers["gone"].healthy)
    gone_now = await listed("gone")
    assert gone_now["healthy"] is False and gone_now["head"] == 40
    assert "cannot connect" in gone_now["last_error"]
    live_now = await listed("live")
    assert live_now["healthy"] is True and live_now["last_error"] is None
    assert live_now["latency_ms"] > 0

    status, body = await api.post("/1337/writers/switchLeader", {"key": "gone"})
    assert status == 409 and "gone is unhealthy" in body["error"]
    assert '"force": true' in body["error"]
    assert (await api.get("/1337/writers/leader"))[1]["leader"]["key"] == "live"

    status, body = await api.post("/1337/writers/switchLeader", {"key": "gone", "force": True})
    assert status == 200 and body["forced"] is True and body["previous"] == "live"
    assert body["leader"]["key"] == "gone" and body["leader"]["healthy"] is False
    error = (await api.call("1337", "eth_sendRawTransaction", ["0x02f8"]))["error"]
    assert error["code"] == -32603 and gone.url.split("//")[1] in error["message"]

    status, body = await api.post("/1337/writers/switchLeader", {"key": "live"})
    assert status == 200 and body["forced"] is False and body["leader"]["key"] == "live"
    assert body["leader"]["behind"] == 0

    # A writer that answers but lags far behind (stuck, or still catching up) would stall
    # every state node following the Leader: refused unless forced.
    slow = await fake_nodes("slow", "state", head=42 - LEADER_MAX_LAG - 1)
    assert (await api.post("/1337/writers/addWriter", {"key": "slow", "url": slow.url}))[0] == 201
    assert (await listed("slow"))["behind"] == LEADER_MAX_LAG + 1
    status, body = await api.post("/1337/writers/switchLeader", {"key": "slow"})
    assert status == 409 and f"{LEADER_MAX_LAG + 1} blocks behind the Leader live" in body["error"]
    slow.head = 42 - LEADER_MAX_LAG
    status, body = await api.post("/1337/writers/switchLeader", {"key": "slow"})
    assert status == 200 and body["leader"]["key"] == "slow"
    assert (await api.post("/1337/writers/switchLeader", {"key": "live"}))[0] == 200
    answer = await api.call("1337", "eth_sendRawTransaction", ["0x02f8"])
    assert answer["result"]["node"] == "live"


async def test_local_nodes_live_in_memory_only(make_api, tmp_path) -> None:
    path = tmp_path / "store.json"
    api = await make_api(store=FileStore(path))
    status, body = await api.post("/1337/addLocalNode", {"key": "l1", "url": URL})
    assert status == 201 and body["node"]["local"] is True
    status, body = await api.post("/1337/updateNode/l1", {"weight": 4})
    assert status == 200 and body["node"]["weight"] == 4 and body["node"]["local"]
    assert (await api.post("/1337/deleteNode/l1"))[0] == 404
    assert not path.exists() or b"l1" not in path.read_bytes()
    status, body = await api.get("/1337/getAllNodes")
    assert [n["key"] for n in body["nodes"]] == ["l1"]
    assert (await api.post("/1337/deleteLocalNode/l1"))[0] == 200
    assert (await api.get("/1337/getAllNodes"))[0] == 404


async def test_persistence_across_restart_and_config_seeding(aiohttp_client, tmp_path) -> None:
    path = tmp_path / "store.json"
    settings = fast_settings(
        nodes=(SeedNode("0x539", "seed-1", URL), SeedNode("1337", "seed-2", URL, "archive", 2)),
        writers=(SeedWriter("1337", "w1", URL, leader=True),),
    )
    first = Api(await aiohttp_client(create_app(settings, store=FileStore(path))))
    _, body = await first.get("/1337/getAllNodes")
    assert [(n["key"], n["kind"]) for n in body["nodes"]] == [
        ("seed-1", "state"),
        ("seed-2", "archive"),
    ]
    assert (await first.get("/1337/writers/leader"))[1]["leader"]["key"] == "w1"
    await first.post("/1337/deleteNode/seed-1")
    await first.post("/1337/addNode", {"key": "added", "url": URL})
    await first.post("/1337/setWeight", {"key": "added", "weight": 9})
    await first.post("/1337/addMethodRoute", {"method": "eth_call", "kind": "archive"})
    await first.post("/1337/addMirror", {"url": URL})
    await first.post("/1337/writers/addWriter", {"key": "w2", "url": URL})
    await first.post("/1337/writers/switchLeader", {"key": "w2", "force": True})
    await first.post("/1337/addLocalNode", {"key": "mem", "url": URL})
    await first.client.close()

    second = Api(await aiohttp_client(create_app(settings, store=FileStore(path))))
    _, body = await second.get("/1337/getAllNodes")
    assert [(n["key"], n["weight"]) for n in body["nodes"]] == [("added", 9), ("seed-2", 2)]
    assert (await second.get("/1337/getMethodRoutes"))[1]["routes"] == {
        "eth_call": [{"method": "eth_call", "kind": "archive"}]
    }
    assert len((await second.get("/1337/getMirrors"))[1]["mirrors"]) == 1
    assert (await second.get("/1337/writers/leader"))[1]["leader"]["key"] == "w2"
    doc = orjson.loads(path.read_bytes())
    assert "pools/1337/nodes/added" in doc["data"] and doc["revision"] > 5


class FlakyStore(FileStore):
    """A file store whose backend can be made unreachable (the etcd store's behaviour)."""

    def __init__(self) -> None:
        super().__init__(None)
        self.up = True

    @property
    def available(self) -> bool:
        return self.up

    async def put(self, key: str, value: bytes) -> int:
        if not self.up:
            raise StoreUnavailable("connection refused")
        return await super().put(key, value)


async def test_store_unavailable_refuses_writes_and_keeps_serving(make_api, fake_nodes) -> None:
    store = FlakyStore()
    node = await fake_nodes("s1", "state")
    api = await make_api(store=store)
    await api.add("1337", node)
    store.up = False
    before = snapshot(api)
    status, body = await api.post("/1337/addNode", {"key": "x", "url": URL})
    assert status == 503 and "unavailable" in body["error"]
    status, body = await api.post("/1337/setWeight", {"key": "s1", "weight": 3})
    assert status == 503
    assert snapshot(api) == before
    answer = await api.call("1337", "eth_getBalance", ["0x" + "11" * 20])
    assert answer["result"]["node"] == "s1"
    resp = await api.client.get("/getChains")  # reads answer, and say the config may be stale
    assert resp.headers["X-Config-Store"] == "unavailable"
    assert (await resp.json())["config_store"] == "unavailable"
    status, _ = await api.post("/1337/addLocalNode", {"key": "l", "url": URL})
    assert status == 201  # memory-only entries need no store
    store.up = True
    resp = await api.client.get("/1337/getAllNodes")
    assert resp.headers["X-Config-Store"] == "available"


async def test_admin_token(make_api) -> None:
    api = await make_api(fast_settings(admin_token="s3cret"))
    assert (await api.get("/getChains"))[0] == 401
    bad = {"Authorization": "Bearer wrong"}
    assert (await api.post("/1/addNode", {"key": "x", "url": URL}, headers=bad))[0] == 401
    good = {"Authorization": "Bearer s3cret"}
    assert (await api.post("/1/addNode", {"key": "x", "url": URL}, headers=good))[0] == 201
    assert (await api.get("/getChains", headers=good))[0] == 200
    status, _ = await api.rpc("1", {"jsonrpc": "2.0", "id": 1, "method": "eth_chainId"})
    assert status == 200  # the data path needs no token
    assert (await api.client.get("/metrics")).status == 401  # /metrics is the admin's
    assert (await api.client.get("/metrics", headers=good)).status == 200


async def test_cross_site_and_rebinding_requests_are_refused(api: Api) -> None:
    """What a web page could make the operator's browser send: a text/plain or form POST
    (no CORS preflight), a request with a foreign Origin, a Host that is another name
    (DNS rebinding); none of them changes anything, and a plain admin call still works."""
    before = snapshot(api)
    body = orjson.dumps({"url": "http://127.0.0.1:9"})
    for headers in (
        {"Content-Type": "text/plain"},
        {"Content-Type": "application/x-www-form-urlencoded"},
    ):
        resp = await api.client.post("/1337/addMirror", data=body, headers=headers)
        assert resp.status == 415, headers
        assert "application/json" in (await resp.json())["error"]
    resp = await api.client.post("/1337/deleteAllMirrors")  # no content type at all
    assert resp.status == 415
    evil = {"Content-Type": "application/json", "Origin": "http://evil.example"}
    resp = await api.client.post("/1337/addMirror", data=body, headers=evil)
    assert resp.status == 403 and "Origin" in (await resp.json())["error"]
    rebound = {"Content-Type": "application/json", "Host": "evil.example:8663"}
    resp = await api.client.post("/1337/addMirror", data=body, headers=rebound)
    assert resp.status == 403 and "DNS rebinding" in (await resp.json())["error"]
    assert (await api.client.get("/getChains", headers={"Host": "evil.example"})).status == 403
    assert (await api.client.get("/metrics", headers={"Host": "evil.example"})).status == 403
    assert snapshot(api) == before
    port = api.client.server.port
    same = {"Content-Type": "application/json", "Origin": f"http://127.0.0.1:{port}"}
    resp = await api.client.post("/1337/addMirror", data=body, headers=same)
    assert resp.status == 201  # the same origin (a page the proxy itself served) is fine
    assert (await api.client.get("/getChains", headers={"Host": "localhost:1"})).status == 200


def test_a_tokenless_admin_off_loopback_refuses_to_start() -> None:
    from chainstate.config import ConfigError

    for settings in (
        ProxySettings(host="0.0.0.0"),
        ProxySettings(host="127.0.0.1", admin_host="10.1.2.3", admin_port=8670),
    ):
        with pytest.raises(ConfigError, match="without a token"):
            create_app(settings, store=FileStore(None))
    for settings in (
        ProxySettings(host="0.0.0.0", admin_token="s3cret"),
        ProxySettings(host="0.0.0.0", insecure_admin=True),
        ProxySettings(host="0.0.0.0", admin_host="127.0.0.1", admin_port=8670),
        ProxySettings(host="::1"),
    ):
        settings.check_exposure()


async def test_separate_admin_listener(aiohttp_client) -> None:
    settings = ProxySettings(**FAST, admin_port=free_port())
    app = create_app(settings, store=FileStore(None))
    data = Api(await aiohttp_client(app))
    admin_client = await aiohttp_client(create_admin_app(app))
    resp = await admin_client.post("/1/addNode", json={"key": "x", "url": URL})
    assert resp.status == 201
    # the data listener serves no admin path
    assert (await data.client.get("/getChains")).status in (404, 405)
    resp = await data.client.post("/1/addNode", json={"key": "y", "url": URL})
    assert resp.status == 404
    assert (await data.client.get("/metrics")).status == 404  # with the admin API now
    assert (await admin_client.get("/metrics")).status == 200
    status, _ = await data.rpc("1", {"jsonrpc": "2.0", "id": 1, "method": "eth_chainId"})
    assert status == 200  # the data path sees the node added through the admin listener
    assert isinstance(app, web.Application)


async def test_concurrent_changes_do_not_lose_each_other(api: Api) -> None:
    import asyncio

    for key in ("a", "b", "c", "d"):
        await api.post("/1337/addNode", {"key": key, "url": URL})
    rules = [{"method": "eth_call", "nodes": [k]} for k in ("a", "b", "c", "d")]
    await asyncio.gather(*(api.post("/1337/addMethodRoute", r) for r in rules))
    _, body = await api.get("/1337/getMethodRoutes")
    assert sorted(r["nodes"][0] for r in body["routes"]["eth_call"]) == ["a", "b", "c", "d"]


class SlowReads(FileStore):
    """An in-memory store whose reads take a moment, as over the network to etcd."""

    def __init__(self) -> None:
        super().__init__(None)

    async def snapshot(self, prefix: str = "") -> tuple[dict[str, bytes], int]:
        import asyncio

        view = await super().snapshot(prefix)
        await asyncio.sleep(0.01)
        return view


async def test_two_proxies_sharing_a_store_lose_no_change(aiohttp_client) -> None:
    """Like two proxy processes on one etcd: each change is compare-and-set in the store."""
    import asyncio

    store = SlowReads()
    one = Api(await aiohttp_client(create_app(fast_settings(), store=store)))
    two = Api(await aiohttp_client(create_app(fast_settings(), store=store)))
    for key in ("a", "b", "c", "d"):
        assert (await one.post("/1337/addNode", {"key": key, "url": URL}))[0] == 201
    rules = [{"method": "eth_call", "nodes": [k]} for k in ("a", "b", "c", "d")]
    await asyncio.gather(
        *(api.post("/1337/addMethodRoute", r) for api, r in zip([one, two] * 2, rules, strict=True))
    )
    for api in (one, two):
        _, body = await api.get("/1337/getMethodRoutes")
        assert sorted(r["nodes"][0] for r in body["routes"]["eth_call"]) == ["a", "b", "c", "d"]
    answers = await asyncio.gather(
        one.post("/1337/addNode", {"key": "same", "url": URL}),
        two.post("/1337/addNode", {"key": "same", "url": URL}),
    )
    assert sorted(status for status, _ in answers) == [201, 409]


async def test_file_store_compare_and_set() -> None:
    store = FileStore(None)
    await store.start()
    rev = await store.replace("k", None, b"1")
    assert rev == 1
    assert await store.replace("k", None, b"2") is None  # not absent any more
    assert await store.replace("k", b"1", b"2") == 2
    assert await store.replace("k", b"2", None) == 3
    assert await store.snapshot() == ({}, 3)


async def test_a_cut_off_admin_request_leaves_the_admin_api_answering(api: Api) -> None:
    """A client that announces a body, sends part of it and closes: the hand-off from the
    lean server passes the end of input on, the handler (waiting for the body, before the
    write lock) ends, the socket is closed, and the next admin POST is answered."""
    import asyncio

    port = api.client.server.port
    for _ in range(20):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /1337/deleteWeight HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"key"'
        )
        await writer.drain()
        writer.close()
        await writer.wait_closed()
    status, _ = await asyncio.wait_for(api.post("/1337/addNode", {"key": "n", "url": URL}), 5)
    assert status == 201
    status, _ = await asyncio.wait_for(api.post("/1337/setWeight", {"key": "n", "weight": 2}), 5)
    assert status == 200
    # every cut-off connection was closed on the server's side (none left in CLOSE-WAIT)
    await wait_until(lambda: not api.client.server.shims)

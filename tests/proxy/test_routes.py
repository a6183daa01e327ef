"""The route cache of first attempts over HTTP (proxy/routes.py) and batches whose items were
only pinned to blocks, sent as one body with the client's ids (fake nodes)."""

from __future__ import annotations

import random
from typing import Any

import orjson

from chainstate.blockref import BlockRef, parse_block_ctx
from chainstate.jsonrpc import BLOCK_NOT_FOUND, INTERNAL_ERROR
from proxy.breaker import OPEN
from proxy.model import WATCHED, Node, NodeEntry, Pool
from proxy.routes import UNCACHED, RouteCache, block_class, signature
from proxy.select import Selector
from tests.proxy.conftest import fast_settings, req, wait_until
from tests.proxy.fakes import block_hash
from tests.proxy.test_reads import chain_known

NO_CACHE = {"cache_pools": (), "coalesce": False}  # every read goes to a node


def account(i: int) -> str:
    return f"0x{i:040x}"


def served(api: Any, method: str = "eth_getBalance") -> dict[tuple[str, str], int]:
    """Requests for `method` counted per (node key, outcome) (chainstate_proxy_requests)."""
    out: dict[tuple[str, str], int] = {}
    for (_, m, node, result), n in api.proxy.metrics.hot.requests.items():
        if m == method:
            out[node, result] = out.get((node, result), 0) + n
    return out


def test_block_classes_never_clash() -> None:
    """A blockCtx `Contains` is a class of its own, not the first height range (True == 1
    would make them one key), a tag is its own, a hash and `pending` are not kept."""
    points = [900, 1001]
    contains = parse_block_ctx({"block_id": "0x5", "type": "Contains"})
    in_window = BlockRef(number=950)
    assert block_class(points, in_window) == 1
    assert ("m", block_class(points, contains)) != ("m", block_class(points, in_window))
    assert block_class(points, BlockRef(number=5)) == 0
    assert block_class(points, BlockRef(tag="latest")) == "latest"
    assert block_class(points, None) is None
    assert block_class(points, BlockRef(tag="pending")) is UNCACHED
    assert block_class(points, BlockRef(hash=block_hash(5))) is UNCACHED


async def test_a_cached_route_follows_heads_breakers_and_health(make_api, fake_nodes) -> None:
    """The engine keeps each pool's candidates per (method, block class) across requests;
    a head that moved a height out of the state window, a breaker that opened and a node
    the health poll marked down each change where the same kind of request goes."""
    state = await fake_nodes("state-1", "state")
    archive = await fake_nodes("archive-1", "archive")
    api = await make_api(fast_settings(**NO_CACHE))
    await api.add("1337", state)
    await api.add("1337", archive)
    await api.heads_known("1337")
    pool = api.proxy.state.pools["1337"]
    accounts = iter(range(1, 10_000))

    async def served_by(height: int) -> str:
        """The node that answered, the only one asked (no retry hides a wrong first pick)."""
        params = [account(next(accounts)), hex(height)]  # no two reads alike
        asked = [*state.data_items("eth_getBalance"), *archive.data_items("eth_getBalance")]
        answer = await api.call("1337", "eth_getBalance", params)
        now = [*state.data_items("eth_getBalance"), *archive.data_items("eth_getBalance")]
        assert len(now) == len(asked) + 1
        return answer["result"]["node"]

    assert [await served_by(990) for _ in range(3)] == ["state-1"] * 3
    assert api.proxy.engine.routes.routes(pool).table  # kept
    # Both heads move on: 990 leaves the state window (1200 - 990 >= 128).
    state.head = archive.head = 1200
    await wait_until(lambda: pool.head() == 1200)
    assert await served_by(990) == "archive-1"
    assert await served_by(1190) == "state-1"
    state.http_status = 503  # the health poll marks it down
    await wait_until(lambda: not pool.find("state-1").healthy, within=5)
    assert await served_by(1190) == "archive-1"
    state.http_status = None
    await wait_until(lambda: pool.find("state-1").healthy, within=5)
    assert await served_by(1190) == "state-1"
    breaker = pool.find("state-1").breaker
    while breaker.state is not OPEN:
        breaker.failure("state-1", "a failed attempt")
    assert await served_by(1190) == "archive-1"


async def pinned_proxy(make_api, fake_nodes, *names: str):
    nodes = [await fake_nodes(name, "state") for name in names]
    api = await make_api(fast_settings(coalesce=False))
    for node in nodes:
        await api.add("1337", node)
    await chain_known(api)
    return api, nodes


async def test_a_pinned_batch_goes_as_one_body_with_the_clients_ids(make_api, fake_nodes) -> None:
    """Items at heights are pinned to block hashes (the read path); with nothing answered
    from the cache the pinned items go as one body with the client's own ids, and the
    node's answer comes back with every id as the client wrote it, an error item as the
    node gave it, and each item counted per method and outcome."""
    api, (node,) = await pinned_proxy(make_api, fake_nodes, "state-1")
    node.method_errors["eth_getCode"] = -32000
    ids = [b'"a"', b"18446744073709551615", b"-7", b'"\\u00e9x"', b"0"]
    items = [
        b'{"jsonrpc":"2.0","id":%s,"method":"%s","params":["%s","%s"]}'
        % (rid, b"eth_getCode" if i == 2 else b"eth_getBalance", account(i + 1).encode(), b"0x3e8")
        for i, rid in enumerate(ids)
    ]
    body = b"[" + b",".join(items) + b"]"
    before = len(node.bodies)
    async with api.client.data.post("/1337", data=body) as resp:
        raw = await resp.read()
    assert resp.status == 200
    assert len(node.bodies) == before + 1
    sent = orjson.loads(node.bodies[-1])
    assert [i["id"] for i in sent] == ["a", 18446744073709551615, -7, "éx", 0]  # not positions
    assert [i["params"][1] for i in sent] == [{"blockHash": block_hash(0x3E8)}] * 5
    answers = orjson.loads(raw)
    assert [a["id"] for a in answers] == ["a", 18446744073709551615, -7, "éx", 0]
    assert raw.count(b'"id":18446744073709551615,') == 1
    assert [("error" in a) for a in answers] == [False, False, True, False, False]
    assert answers[2]["error"]["code"] == -32000
    assert served(api) == {("state-1", "ok"): 4}
    assert served(api, "eth_getCode") == {("state-1", "error"): 1}
    # The good answers were kept: the same batch again asks the node only for the error.
    async with api.client.data.post("/1337", data=body) as resp:
        again = orjson.loads(await resp.read())
    assert again == answers
    assert len(node.bodies) == before + 2
    assert [i["method"] for i in orjson.loads(node.bodies[-1])] == ["eth_getCode"]


async def test_a_pinned_batch_a_node_cannot_answer_is_retried_item_by_item(
    make_api, fake_nodes
) -> None:
    """A node that answers every item of a pinned batch with BlockNotFound (-39001): the
    items go to the other node (with the client's ids), and the answers are that node's,
    in the client's order; nothing is answered with the first node's errors."""
    api, (a, b) = await pinned_proxy(make_api, fake_nodes, "a", "b")
    a.method_errors["eth_getBalance"] = BLOCK_NOT_FOUND
    b.delay = 0.02  # slower: the pick by latency tries `a` first soon
    ids = [f"id-{i}" for i in range(6)]
    for round_ in range(30):  # until the batch lands on the failing node first
        batch = [
            req("eth_getBalance", [account(round_ * 10 + i), "0x3e0"], ids[i]) for i in range(6)
        ]
        status, answers = await api.rpc("1337", batch)
        assert status == 200
        assert [x["id"] for x in answers] == ids
        assert all(x["result"]["node"] == "b" for x in answers), answers
        if a.bodies:
            break
    else:
        raise AssertionError("the batch never went to the failing node first")
    assert [i["id"] for i in orjson.loads(a.bodies[-1])] == ids  # one body, the client's ids
    assert sorted(i["id"] for i in orjson.loads(b.bodies[-1])) == ids  # retried there
    assert served(api) == {("b", "ok"): 6 * (round_ + 1)}
    assert INTERNAL_ERROR not in [x.get("error", {}).get("code") for x in answers]


async def test_a_pinned_batch_answered_as_one_body_is_kept_whole(make_api, fake_nodes) -> None:
    """A pinned batch whose node answer went back as it is is still kept for the batch
    cache: the same bytes again at the same `latest` are answered without the node."""
    api, (node,) = await pinned_proxy(make_api, fake_nodes, "state-1")
    batch = [req("eth_getBalance", [account(i), "0x3e8"], i) for i in range(1, 4)]
    status, first = await api.rpc("1337", batch)
    assert status == 200 and [a["id"] for a in first] == [1, 2, 3]
    asked = len(node.bodies)
    assert [i["id"] for i in orjson.loads(node.bodies[-1])] == [1, 2, 3]  # one body, as sent
    status, figures = await api.get("/1337/cache")
    assert status == 200 and figures["cache"]["batches"] == 1, figures  # kept at once
    assert (await api.rpc("1337", batch))[1] == first
    assert len(node.bodies) == asked


def _pool_of_two() -> Pool:
    pool = Pool("1337")
    for key, kind in (("state-1", "state"), ("archive-1", "archive")):
        pool.nodes[key] = Node(NodeEntry(key=key, url=f"http://{key}", kind=kind))
        pool.nodes[key].head = 100
    pool.rebuild()
    return pool


CHANGED = {"head": 101, "earliest": 7, "healthy": False, "blocked": True, "diverged": {"h": 1}}


def test_every_change_the_routes_depend_on_starts_them_afresh() -> None:
    """The routes are checked against one counter that every assignment of a reader's head,
    earliest block, health, breaker (`blocked`) or checker verdict bumps, whichever code
    assigns it: each kind starts a pool's routes afresh, an assignment of the same value
    keeps them, and so does a change of what the routes do not depend on."""
    assert set(CHANGED) == set(WATCHED)
    cache = RouteCache(Selector(128, 16, rng=random.Random(1)))
    for name, value in CHANGED.items():
        pool = _pool_of_two()
        node = pool.readers[1]
        routes = cache.routes(pool)
        before = signature(pool.readers)
        setattr(node, name, getattr(node, name))  # the same value: nothing changed
        node.inflight += 1  # not a thing the candidates depend on
        node.latency_ms = 3.0
        assert cache.routes(pool) is routes, name
        setattr(node, name, value)
        assert signature(pool.readers) != before, name  # what the pull compared
        fresh = cache.routes(pool)
        assert fresh is not routes, name
        assert cache.routes(pool) is fresh, name


def test_breakers_health_polls_and_verdicts_reach_the_routes_through_their_setters() -> None:
    """The setters the proxy uses (a breaker opening, failed health polls, a verdict) each
    start the routes afresh."""
    cache = RouteCache(Selector(128, 16, rng=random.Random(1)))
    pool = _pool_of_two()
    node = pool.readers[0]
    steps = [
        lambda: [node.breaker.failure(node.key, "x") for _ in range(100)],
        lambda: [node.failed(unhealthy_after=1)],
        lambda: [node.succeeded()],
        lambda: [setattr(node, "diverged", {"height": 5}), node.update_blocked()],
    ]
    for step in steps:
        routes = cache.routes(pool)
        step()
        assert cache.routes(pool) is not routes
    assert node.breaker.state is OPEN and node.blocked


def test_readers_not_built_by_the_pool_are_compared_by_their_state() -> None:
    """A readers list assembled without `Pool.rebuild` (its nodes count their changes apart)
    falls back to comparing each reader's state."""
    cache = RouteCache(Selector(128, 16, rng=random.Random(1)))
    pool = Pool("1337")
    pool.readers = [Node(NodeEntry(key="s", url="http://s"), head=100)]
    routes = cache.routes(pool)
    assert cache.routes(pool) is routes
    pool.readers[0].head = 101
    assert cache.routes(pool) is not routes


def test_a_node_moved_to_another_pool_counts_there() -> None:
    """`Pool.rebuild` gives each reader the pool's counter."""
    pool = _pool_of_two()
    node = pool.readers[0]
    other = Pool("1338")
    other.nodes[node.key] = pool.nodes.pop(node.key)
    other.rebuild()
    pool.rebuild()
    at = other.changes[0], pool.changes[0]
    node.head = 500
    assert (other.changes[0], pool.changes[0]) == (at[0] + 1, at[1])

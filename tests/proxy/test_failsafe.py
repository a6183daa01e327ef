"""Failsafe routing: slow, hung, failing, overloaded and lying nodes cost clients nothing.

Every test asserts counts a client can see (answers, errors, which node served), never
timings. Fake nodes (tests/proxy/fakes.py) sit on real loopback sockets.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import socket
import time
from typing import Any

import orjson
import pytest

from chainstate.config import ConfigError
from proxy.breaker import OPEN
from proxy.hedge import BURST, HedgeBudget
from proxy.latency import MIN_SAMPLES
from proxy.methods import MethodTable
from proxy.model import Node, NodeEntry, Pool
from proxy.select import Selector
from proxy.settings import ProxySettings
from tests.proxy.conftest import ADDR, balance, fast_settings, req, wait_until

SPEC = MethodTable().spec("eth_getBalance")
ACCOUNTS = itertools.count()  # accounts `load` has not read yet


def served_by(answer: dict[str, Any]) -> str:
    return answer["result"]["node"]


def read(i: int, block: str = "latest") -> dict[str, Any]:
    """eth_getBalance of an account of its own: no two reads alike (the proxy would answer
    a repeated one from its response cache, or share one upstream call)."""
    return req("eth_getBalance", [f"0x{i + 1:040x}", block], i)


def fresh(rid: Any) -> dict[str, Any]:
    """`read` of an account no request read before, with id `rid`."""
    return req("eth_getBalance", [f"0x{next(ACCOUNTS) + 1:040x}", "latest"], rid)


async def load(api: Any, n: int, concurrency: int, block: str = "latest") -> list[dict[str, Any]]:
    """`n` single eth_getBalance requests (each of its own account), `concurrency` at a time:
    the answers."""
    answers: list[dict[str, Any]] = []
    queue = [next(ACCOUNTS) for _ in range(n)]  # new accounts on every call

    async def client() -> None:
        while queue:
            rid = queue.pop()
            _, answer = await api.rpc("1337", read(rid, block))
            answers.append(answer)

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return answers


async def pool_of(api: Any, fake_nodes: Any, *names: str) -> list[Any]:
    nodes = [await fake_nodes(name, "state") for name in names]
    for node in nodes:
        await api.add("1337", node)
    await api.heads_known("1337")
    return nodes


def node_of(api: Any, key: str) -> Node:
    return api.proxy.state.pools["1337"].find(key)


def prefer(api: Any, key: str) -> None:
    """Make `key` look by far the fastest node (its latency cost), so the next pick is it."""
    now = time.monotonic()
    for node in api.proxy.state.pools["1337"].readers:
        node.cost, node.cost_at = (0.0001 if node.key == key else 1000.0), now


async def metrics_text(api: Any) -> str:
    return await (await api.client.get("/metrics")).text()


def sample(text: str, series: str) -> float:
    """The value of `series` (its name and labels as a scrape shows them) in `text`; 0 when
    it is not there yet."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# ---- latency-aware choice ------------------------------------------------------------------


async def test_a_slow_node_gets_little_traffic(make_api, fake_nodes) -> None:
    api = await make_api(fast_settings(hedge_budget=0))  # the choice alone, no hedging
    a, b, slow = await pool_of(api, fake_nodes, "a", "b", "slow")
    slow.delay = 0.05
    answers = await load(api, 300, concurrency=6)
    assert all("result" in answer for answer in answers)
    # Without latency-aware choice the slow node takes a third (100) of the items.
    assert len(slow.received) < 30, len(slow.received)
    assert len(a.received) + len(b.received) > 270


def test_power_of_two_draws_two_different_nodes() -> None:
    """With replacement, a busy node drawn twice is picked (1 time in 4 with two nodes)."""
    selector = Selector(128, 16, rng=random.Random(3))
    busy, idle = (Node(NodeEntry(key=k, url=f"http://{k}")) for k in ("busy", "idle"))
    busy.inflight = 50
    picks = [selector.pick([busy, idle]).key for _ in range(2000)]
    assert picks.count("busy") == 0
    third = Node(NodeEntry(key="third", url="http://third"))
    third.inflight = 50
    picks = [selector.pick([busy, idle, third]).key for _ in range(3000)]
    assert picks.count("idle") > 1800  # idle is drawn into 2 of every 3 pairs and always wins


def test_weights_bound_the_share_of_equally_fast_nodes() -> None:
    """Equally fast nodes: in-flight requests per unit of weight decide, so under load their
    shares follow the weights; weight 0 gets nothing."""
    selector = Selector(128, 16, rng=random.Random(5))
    x, y, z = (
        Node(NodeEntry(key=k, url=f"http://{k}", weight=w))
        for k, w in (("x", 1), ("y", 3), ("z", 0))
    )
    x.inflight, y.inflight = 2, 5  # per unit of weight: x 3, y 2
    assert {selector.pick([x, y]).key for _ in range(100)} == {"y"}
    y.inflight = 9  # y 10/3 > x 3
    assert {selector.pick([x, y]).key for _ in range(100)} == {"x"}
    pool = Pool("1", nodes={n.key: n for n in (x, y, z)})
    pool.rebuild()
    chosen = {selector.choose(pool, "eth_getBalance", SPEC, None).node.key for _ in range(200)}
    assert "z" not in chosen


async def test_shares_follow_the_weights_under_load(make_api, fake_nodes) -> None:
    api = await make_api(fast_settings(hedge_budget=0))
    light = await fake_nodes("light", "state")
    heavy = await fake_nodes("heavy", "state")
    await api.add("1337", light, weight=1)
    await api.add("1337", heavy, weight=3)
    await api.heads_known("1337")
    light.delay = heavy.delay = 0.01  # equally fast, slow enough to keep requests in flight
    await load(api, 400, concurrency=8)
    share = len(heavy.received) / (len(heavy.received) + len(light.received))
    assert 0.6 < share < 0.9, share


# ---- hedging -------------------------------------------------------------------------------


async def test_a_slow_attempt_is_hedged_and_the_first_answer_wins(make_api, fake_nodes) -> None:
    api = await make_api(fast_settings(upstream_timeout=5.0, attempt_timeout_min=3.0))
    a, _ = await pool_of(api, fake_nodes, "a", "b")
    await load(api, 100, concurrency=2)  # latency samples: the hedge delay is known
    # (counted from here: an attempt of the load that a loaded machine delayed past the
    # hedge delay was hedged too, as it should be)
    before = await metrics_text(api)
    a.delay = 4.0  # answers long after the hedge delay, within the ceiling
    prefer(api, "a")
    answer = await api.call("1337", "eth_getBalance", [ADDR])
    assert served_by(answer) == "b"  # b's answer, long before a's
    text = await metrics_text(api)
    for series in (
        'chainstate_proxy_hedges_total{chain="1337",trigger="hedge"}',
        'chainstate_proxy_upstream_attempts_total{chain="1337",node="a",outcome="lost"}',
    ):
        assert sample(text, series) - sample(before, series) == 1, series


async def test_without_budget_the_attempt_timeout_starts_the_retry(make_api, fake_nodes) -> None:
    settings = fast_settings(hedge_budget=0, upstream_timeout=5.0, attempt_timeout_min=0.2)
    api = await make_api(settings)
    a, _ = await pool_of(api, fake_nodes, "a", "b")
    await load(api, 100, concurrency=2)
    before = await metrics_text(api)  # (a load attempt a loaded machine delayed counts too)
    a.delay = 4.0
    prefer(api, "a")
    failures = node_of(api, "a").breaker.failures
    assert served_by(await api.call("1337", "eth_getBalance", [ADDR])) == "b"
    text = await metrics_text(api)
    series = 'chainstate_proxy_hedges_total{chain="1337",trigger="timeout"}'
    assert sample(text, series) - sample(before, series) == 1
    assert 'trigger="hedge"' not in text
    assert node_of(api, "a").breaker.failures == failures + 1  # the timeout counts against a


@pytest.mark.parametrize("batch", [False, True])
async def test_one_server_entered_under_two_kinds_is_not_hedged_to_itself(
    make_api, fake_nodes, batch: bool
) -> None:
    """A slow read whose other candidate is the same URL (one archive node entered as a
    state and an archive node) waits for its answer: a second attempt would wait on the
    same server, so none is sent, by hedge or attempt timeout."""
    api = await make_api(fast_settings(upstream_timeout=5.0, attempt_timeout_min=0.2))
    node = await fake_nodes("a", "archive")
    await api.add("1337", node)
    twin = {**node.entry(), "key": "a-state", "kind": "state"}
    assert (await api.post("/1337/addNode", twin))[0] == 201
    await api.heads_known("1337")
    for i in range(MIN_SAMPLES + 16):  # latency samples: hedge delays and timeouts known
        body = [fresh(2 * i), fresh(2 * i + 1)] if batch else fresh(i)
        await api.rpc("1337", body)
    before = await metrics_text(api)
    sent = len(node.received)
    node.delay = 0.5  # past any hedge delay and the 0.2 s attempt timeout, within the ceiling
    if batch:
        _, answers = await api.rpc("1337", [fresh(1), fresh(2)])
    else:
        answers = [await api.call("1337", "eth_getBalance", [ADDR])]
    assert [served_by(x) for x in answers] == ["a"] * len(answers)
    assert len(node.received) == sent + len(answers)  # each item sent once
    text = await metrics_text(api)
    for trigger in ("hedge", "timeout"):
        series = f'chainstate_proxy_hedges_total{{chain="1337",trigger="{trigger}"}}'
        assert sample(text, series) == sample(before, series), series


async def test_the_transaction_lifecycle_is_never_hedged(make_api, fake_nodes) -> None:
    api = await make_api(fast_settings(upstream_timeout=5.0, attempt_timeout_min=0.2))
    await pool_of(api, fake_nodes, "a", "b")
    leader = await fake_nodes("w1", "state")
    entry = {"key": "w1", "url": leader.url, "leader": True}
    assert (await api.post("/1337/writers/addWriter", entry))[0] == 201
    raw = "0x" + "02" * 100
    for _ in range(70):
        await api.call("1337", "eth_sendRawTransaction", [raw])
    leader.delay = 0.5  # past any hedge delay and the 0.2 s attempt timeout
    answer = await api.call("1337", "eth_sendRawTransaction", [raw])
    assert "result" in answer
    assert len(leader.data_items("eth_sendRawTransaction")) == 71  # sent once each, no copy
    assert "chainstate_proxy_hedges_total{" not in await metrics_text(api)


def test_the_hedge_budget_caps_extra_attempts() -> None:
    budget = HedgeBudget(0.1)
    taken = 0
    for _ in range(10_000):
        budget.earn()
        taken += budget.take()
    assert taken <= 10_000 * 0.1 + BURST
    idle = HedgeBudget(0.1)
    assert sum(idle.take() for _ in range(200)) == BURST  # a sudden hang is covered at once


# ---- hung and failing nodes: the breaker ---------------------------------------------------


async def test_a_hung_node_costs_no_request_and_its_breaker_opens(
    make_api, fake_nodes, caplog
) -> None:
    caplog.set_level(logging.WARNING, logger="proxy")
    # (a short latency decay: the choice, which soon avoids the hung node, tries it again
    # within a fraction of a second, so its failures add up however the machine's load
    # spaces the requests)
    settings = fast_settings(
        upstream_timeout=5.0, attempt_timeout_min=0.2, breaker_cooldown=60, latency_decay=0.2
    )
    api = await make_api(settings)
    a, _, _ = await pool_of(api, fake_nodes, "a", "b", "c")
    await load(api, 100, concurrency=3)
    a.delay = 30.0  # hung: never answers within the ceiling
    hung = node_of(api, "a")
    answers: list[dict[str, Any]] = []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # until its breaker has opened
        answers += await load(api, 30, concurrency=6)
        if hung.breaker.state is OPEN:
            break
    assert [x for x in answers if "result" not in x] == []
    assert hung.breaker.state is OPEN
    _, nodes = await api.get("/1337/getAllNodes")
    shown = {n["key"]: n for n in nodes["nodes"]}
    assert shown["a"]["breaker"]["state"] == "open" and shown["a"]["routable"] is False
    assert shown["b"]["breaker"]["state"] == "closed" and shown["b"]["routable"] is True
    opened = [
        r.getMessage() for r in caplog.records if "node a breaker closed → open" in r.getMessage()
    ]
    assert len(opened) == 1, opened
    text = await metrics_text(api)
    labels = 'kind="state",node="a",pool="1337"'
    assert f"chainstate_proxy_node_breaker_state{{{labels}}} 2.0" in text
    assert f'chainstate_proxy_node_breaker_transitions_total{{{labels},state="open"}} 1.0' in text
    before = len(a.received)
    await load(api, 30, concurrency=3)
    assert len(a.received) == before  # open: no traffic


async def test_an_open_breaker_probes_and_closes(make_api, fake_nodes, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="proxy")
    api = await make_api(fast_settings(breaker_failures=3, breaker_cooldown=0.2))
    a, _ = await pool_of(api, fake_nodes, "a", "b")
    a.http_status = 503  # polls too: the node is taken out by polls and by its breaker
    for _ in range(4):
        node_of(api, "a").breaker.failure("a", "test")
    assert node_of(api, "a").breaker.state is OPEN
    a.http_status = None
    await wait_until(lambda: node_of(api, "a").breaker.state == "half_open")
    await wait_until(lambda: node_of(api, "a").healthy)
    prefer(api, "a")  # the next choice picks it: the probe
    assert served_by(await api.call("1337", "eth_getBalance", [ADDR])) == "a"
    assert node_of(api, "a").breaker.state == "closed"
    moves = [r.getMessage() for r in caplog.records if "node a breaker" in r.getMessage()]
    assert [m.split(":")[0] for m in moves] == [
        "node a breaker closed → open",
        "node a breaker open → half_open",
        "node a breaker half_open → closed",
    ]


async def test_every_breaker_open_still_tries_them(make_api, fake_nodes) -> None:
    api = await make_api()
    await pool_of(api, fake_nodes, "a", "b")
    for key in ("a", "b"):
        for _ in range(5):
            node_of(api, key).breaker.failure(key, "test")
    answer = await api.call("1337", "eth_getBalance", [ADDR])
    assert "result" in answer  # failing open beats refusing everything


async def test_every_other_answer_a_503_costs_nothing(make_api, fake_nodes) -> None:
    api = await make_api()
    _, b, _ = await pool_of(api, fake_nodes, "a", "b", "c")
    b.fail_every = 2
    answers = await load(api, 200, concurrency=4)
    assert [x for x in answers if "result" not in x] == []
    assert len(b.bodies) > 1  # it was tried (and failed every other time)


# ---- a slow node is not a dead node --------------------------------------------------------


def test_polls_may_take_as_long_as_a_request() -> None:
    settings = ProxySettings()
    assert settings.poll_timeout == settings.upstream_timeout


async def test_a_node_that_answers_slowly_stays_in_rotation(make_api, fake_nodes) -> None:
    settings = fast_settings(upstream_timeout=3.0, poll_timeout=3.0, attempt_timeout_min=0.2)
    api = await make_api(settings)
    (only,) = await pool_of(api, fake_nodes, "only")
    only.delay = only.poll_delay = 0.6  # slower than every derived timeout, within the ceiling
    answers = await load(api, 12, concurrency=4)
    assert all(served_by(x) == "only" for x in answers)
    node = node_of(api, "only")
    assert node.healthy and node.breaker.state == "closed"


# ---- admission control ---------------------------------------------------------------------


async def test_an_overloaded_pool_refuses_at_once_with_503(make_api, fake_nodes) -> None:
    settings = fast_settings(upstream_connections=4, admission_wait=0.5, upstream_timeout=5.0)
    api = await make_api(settings)
    (slow,) = await pool_of(api, fake_nodes, "slow")
    slow.delay = 0.5  # limit: 4 connections × (1 + 0.5 s / 0.5 s) = 8 in flight
    node = node_of(api, "slow")
    node.latency_ms = 500.0
    session = api.client.data
    body = orjson.dumps(balance())

    async def one() -> tuple[int, Any, str | None]:
        async with session.post("/1337", data=body) as resp:
            return resp.status, orjson.loads(await resp.read()), resp.headers.get("Retry-After")

    results = await asyncio.gather(*(one() for _ in range(40)))
    ok = [r for r in results if r[0] == 200 and "result" in r[1]]
    refused = [r for r in results if r[0] == 503]
    assert len(ok) + len(refused) == 40  # nothing else: no timeout, no -32603
    assert 4 <= len(ok) <= 12 and len(refused) >= 28
    _, answer, retry_after = refused[0]
    assert retry_after == "1" and answer["error"]["code"] == -32005
    assert "overloaded" in answer["error"]["message"] and answer["id"] is None
    assert node.healthy and node.breaker.state == "closed"  # saturated is not dead
    text = await metrics_text(api)
    assert f'chainstate_proxy_refused_total{{chain="1337"}} {len(refused)}.0' in text


async def test_a_fixed_pool_limit(make_api, fake_nodes) -> None:
    api = await make_api(fast_settings(max_pool_inflight=3))
    (slow,) = await pool_of(api, fake_nodes, "slow")
    slow.delay = 0.3
    results = await asyncio.gather(*(api.rpc("1337", balance()) for _ in range(10)))
    assert sorted(status for status, _ in results) == [200] * 3 + [503] * 7
    assert "max_pool_inflight=3" in next(a for s, a in results if s == 503)["error"]["message"]


# ---- large answers -------------------------------------------------------------------------


async def test_large_answers_wait_for_room_and_none_fails(make_api, fake_nodes) -> None:
    settings = fast_settings(max_buffered_bytes=1_000_000, max_answer_bytes=1_000_000)
    api = await make_api(settings)
    a, b = await pool_of(api, fake_nodes, "a", "b")
    a.pad = b.pad = 300_000  # three answers fit in the budget at once
    a.delay = b.delay = 0.05
    answers = await asyncio.gather(*(api.rpc("1337", read(i)) for i in range(12)))
    assert all(status == 200 and len(x["result"]["pad"]) == 300_000 for status, x in answers)
    budget = api.proxy.upstream.budget
    assert budget.waits > 0 and budget.used == 0  # some waited; all released
    assert budget.peak <= 1_000_000 + 300_000  # (at most one overshoot: a batch's overdraft)


async def test_answers_a_client_does_not_read_count_in_the_budget(make_api, fake_nodes) -> None:
    """An answer written to a client that does not read waits in its connection's buffer:
    counted in max_buffered_bytes until the client reads it (or is gone), so while such
    answers hold more, new requests get 503 before the process grows."""
    settings = fast_settings(max_buffered_bytes=1_000_000, max_answer_bytes=40_000_000)
    api = await make_api(settings)
    a, b = await pool_of(api, fake_nodes, "a", "b")
    a.pad = b.pad = 20_000_000  # more than the kernel's socket buffers take
    budget = api.proxy.upstream.budget
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.connect(("127.0.0.1", api.client.server.port))
    body = orjson.dumps(read(1))
    slow.sendall(
        b"POST /1337 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
    )
    try:
        engine = api.proxy.engine  # (answered: the bytes wait in the client's connection)
        await wait_until(lambda: engine.inflight == 0 and budget.used > 10_000_000, within=10)
        assert budget.used < 21_000_000  # (the answer once: what waits, not counted twice)
        status, answer = await api.rpc("1337", read(2))
        assert status == 503 and "max_buffered_bytes" in answer["error"]["message"], answer
    finally:
        slow.close()
    await wait_until(lambda: budget.used == 0, within=10)
    assert (await api.rpc("1337", read(3)))[0] == 200


async def test_an_answer_over_max_answer_bytes_is_refused_not_retried(make_api, fake_nodes) -> None:
    api = await make_api(fast_settings(max_answer_bytes=100_000))
    a, b = await pool_of(api, fake_nodes, "a", "b")
    a.pad = b.pad = 200_000
    answer = await api.call("1337", "eth_getBalance", [ADDR])
    assert answer["error"]["code"] == -32603
    assert "max_answer_bytes" in answer["error"]["message"]
    assert len(a.received) + len(b.received) == 1  # every node would send the same answer
    assert node_of(api, "a").breaker.failures == node_of(api, "b").breaker.failures == 0


async def test_batches_wait_for_room_in_the_budget_too(make_api, fake_nodes) -> None:
    settings = fast_settings(max_buffered_bytes=1_000_000, max_answer_bytes=1_000_000)
    api = await make_api(settings)
    a, b = await pool_of(api, fake_nodes, "a", "b")
    a.pad = b.pad = 150_000  # a batch of two: a 300 kB answer, three fit at once
    a.delay = b.delay = 0.05

    async def batch(i: int) -> tuple[int, Any]:
        return await api.rpc("1337", [fresh(2 * i), fresh(2 * i + 1)])

    results = await asyncio.gather(*(batch(i) for i in range(10)))
    items = [x for status, answer in results if status == 200 for x in answer]
    assert len(items) == 20 and all(len(x["result"]["pad"]) == 150_000 for x in items)
    assert sorted(x["id"] for x in items) == list(range(20))
    budget = api.proxy.upstream.budget
    assert budget.waits > 0 and budget.used == 0


async def test_a_batch_answer_over_max_answer_bytes_fails_every_item_once(
    make_api, fake_nodes
) -> None:
    api = await make_api(fast_settings(max_answer_bytes=100_000))
    a, b = await pool_of(api, fake_nodes, "a", "b")
    a.pad = b.pad = 60_000  # one item fits, the batch's answer does not
    assert "result" in await api.call("1337", "eth_getBalance", [ADDR])
    sent = len(a.received) + len(b.received)
    status, answer = await api.rpc("1337", [fresh(i) for i in range(3)])
    assert status == 200 and [x["id"] for x in answer] == [0, 1, 2]
    for item in answer:
        assert item["error"]["code"] == -32603 and "max_answer_bytes" in item["error"]["message"]
    assert len(a.received) + len(b.received) == sent + 3  # sent once, not retried elsewhere
    assert node_of(api, "a").breaker.failures == node_of(api, "b").breaker.failures == 0
    assert "result" in (await api.rpc("1337", fresh(9)))[1]  # the pool still works


# ---- batches go through the same loop ------------------------------------------------------


async def test_a_hung_node_costs_no_batch_item(make_api, fake_nodes) -> None:
    settings = fast_settings(upstream_timeout=5.0, attempt_timeout_min=0.2, breaker_cooldown=60)
    api = await make_api(settings)
    a, _, _ = await pool_of(api, fake_nodes, "a", "b", "c")
    for i in range(MIN_SAMPLES + 6):  # batch latency samples: hedge delay, attempt timeout known
        await api.rpc("1337", [fresh(10 * i + j) for j in range(10)])
    a.delay = 30.0  # hung
    hung = node_of(api, "a")
    items: list[Any] = []
    for _ in range(20):  # each batch sent to it first is one failure (5 open the breaker)
        prefer(api, "a")
        status, answer = await api.rpc("1337", [fresh(j) for j in range(10)])
        assert status == 200
        items += answer
        if hung.breaker.state is OPEN:
            break
    assert hung.breaker.state is OPEN
    before = len(a.received)
    for _ in range(10):
        prefer(api, "a")  # however fast it looks, an open breaker gets no traffic
        items += (await api.rpc("1337", [fresh(j) for j in range(10)]))[1]
    assert len(a.received) == before
    assert len(items) >= 150 and [x for x in items if "result" not in x] == []
    assert {x["result"]["node"] for x in items} <= {"b", "c"}  # every item from a working node
    assert hung.breaker.state is OPEN


async def test_batch_items_of_a_503_node_are_retried_elsewhere(make_api, fake_nodes) -> None:
    api = await make_api(fast_settings(hedge_budget=0))
    a, _ = await pool_of(api, fake_nodes, "a", "b")
    a.http_status = 503
    prefer(api, "a")
    status, answer = await api.rpc("1337", [fresh(i) for i in range(5)])
    assert status == 200 and [x["result"]["node"] for x in answer] == ["b"] * 5
    assert [x["id"] for x in answer] == [0, 1, 2, 3, 4]
    text = await metrics_text(api)
    assert 'chainstate_proxy_retries_total{chain="1337",reason="http"} 5.0' in text


# ---- hedging costs little without faults ---------------------------------------------------


async def test_hedging_adds_at_most_its_budget_without_faults(make_api, fake_nodes) -> None:
    api = await make_api(fast_settings(hedge_budget=0.1))
    nodes = await pool_of(api, fake_nodes, "a", "b", "c")
    answers = await load(api, 600, concurrency=6)
    assert all("result" in x for x in answers)
    sent = sum(len(n.received) for n in nodes)
    assert sent <= 600 * 1.1 + BURST, sent  # the budget, plus the burst it starts with


# ---- settings ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("hedge_quantile", 1.5, "between 0 and 1"),
        ("hedge_quantile", 0, "between 0 and 1"),
        ("hedge_budget", -0.1, "between 0"),
        ("hedge_budget", 2, "between 0"),
        ("max_pool_inflight", -1, "integer >= 0"),
        ("max_pool_inflight", 2.5, "integer >= 0"),
        ("breaker_failures", 0, "breaker_failures"),
        ("breaker_cooldown", -1, "breaker_cooldown"),
        ("attempt_timeout_min", 0, "attempt_timeout_min"),
        ("admission_wait", 0, "admission_wait"),
        ("max_buffered_bytes", 0, "max_buffered_bytes"),
        ("max_answer_bytes", -5, "max_answer_bytes"),
        ("latency_decay", "fast", "latency_decay"),
    ],
)
def test_bad_failsafe_settings_are_refused(name: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ProxySettings.from_config({"proxy": {name: value}})


def test_failsafe_settings_defaults_load() -> None:
    settings = ProxySettings.from_config({"proxy": {"hedge_budget": 0, "max_pool_inflight": 50}})
    assert settings.hedge_budget == 0 and settings.max_pool_inflight == 50

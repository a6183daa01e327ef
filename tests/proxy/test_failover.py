"""The only node of a kind goes silent: another kind that holds the block answers in about
the attempt timeout, not `upstream_timeout`.

A pool of one `state` node and one `archive` node (which holds recent blocks too). The state
node's host is cut off as a fake node can be: it accepts connections and requests and never
answers (data requests and health polls alike), so only the request path can route around
it before the health poll gives up on it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from proxy.breaker import HALF_OPEN, OPEN
from proxy.latency import MIN_SAMPLES
from tests.proxy.conftest import fast_settings, wait_until
from tests.proxy.test_failsafe import load, metrics_text, node_of, read, sample, served_by

CEILING = 5.0  # upstream_timeout: what a read routed to the silent node would wait
# a read answered in under this was not held for the ceiling (the attempt timeout is 0.3 s;
# the rest is room for a loaded machine)
WELL_UNDER = CEILING / 2
RESCUES = 'chainstate_proxy_hedges_total{chain="1337",trigger="timeout"}'


def settings(**overrides: Any) -> Any:
    return fast_settings(
        upstream_timeout=CEILING,
        attempt_timeout_min=0.3,
        # the health poll would take the silent node out after 3 polls of 5 s: later than
        # the test looks (only the request path routes around it here)
        poll_timeout=CEILING,
        unhealthy_after=3,
        **overrides,
    )


async def pair(make_api: Any, fake_nodes: Any, **overrides: Any) -> tuple[Any, Any, Any]:
    """A proxy over one state and one archive node, with latency samples of eth_getBalance
    (the attempt timeout is known), every read so far served by the state node."""
    api = await make_api(settings(**overrides))
    state = await fake_nodes("s", "state")
    archive = await fake_nodes("a", "archive")
    await api.add("1337", state)
    await api.add("1337", archive)
    await api.heads_known("1337")
    answers = await load(api, MIN_SAMPLES + 16, concurrency=1)
    assert {served_by(x) for x in answers} == {"s"}
    return api, state, archive


def silence(node: Any) -> None:
    """The node's host is cut off: it takes requests and answers none (nor its polls)."""
    node.delay = node.poll_delay = 60.0


async def timed_read(api: Any, rid: int, block: str = "latest") -> tuple[dict[str, Any], float]:
    t0 = time.monotonic()
    _, answer = await api.rpc("1337", read(rid, block))
    return answer, time.monotonic() - t0


async def test_a_silent_lone_state_node_is_raced_with_the_archive_node(
    make_api, fake_nodes
) -> None:
    api, state, _ = await pair(make_api, fake_nodes, breaker_failures=3, breaker_cooldown=60)
    before = sample(await metrics_text(api), RESCUES)
    silence(state)
    sent = len(state.received)
    for i in range(3):  # up to breaker_failures: each one goes to the state node first
        answer, took = await timed_read(api, 10_000 + i)
        assert served_by(answer) == "a", answer
        assert took < WELL_UNDER, took
    assert len(state.received) == sent + 3  # each was sent there, and none answered
    text = await metrics_text(api)
    assert sample(text, RESCUES) - before == 3
    silent = node_of(api, "s")
    assert silent.breaker.state is OPEN  # each late attempt counted as a timeout
    assert silent.healthy  # (the health poll has not given up on it yet)
    answer, took = await timed_read(api, 10_100)  # open: straight to the archive node
    assert served_by(answer) == "a" and took < WELL_UNDER
    assert len(state.received) == sent + 3


@pytest.mark.parametrize("batch", [False, True])
async def test_half_open_probes_do_not_hold_reads_for_the_ceiling(
    make_api, fake_nodes, batch: bool
) -> None:
    api, state, _ = await pair(make_api, fake_nodes, breaker_failures=2, breaker_cooldown=0.3)
    if batch:  # samples of batches' attempts (their attempt timeout is their own)
        for i in range(MIN_SAMPLES + 16):
            _, answers = await api.rpc("1337", [read(40_000 + 2 * i), read(40_001 + 2 * i)])
            assert [served_by(x) for x in answers] == ["s", "s"]
    silence(state)
    silent = node_of(api, "s")
    sent = len(state.received)
    deadline = time.monotonic() + 10
    i = 0
    while time.monotonic() < deadline:  # until it has been half-open twice, and is open
        i += 1
        if batch:  # one body of two reads: no kept route, the rounds' exchange races it
            t0 = time.monotonic()
            _, answers = await api.rpc("1337", [read(20_000 + 2 * i), read(20_001 + 2 * i)])
            took = time.monotonic() - t0
            assert [served_by(x) for x in answers] == ["a", "a"], answers
        else:
            answer, took = await timed_read(api, 20_000 + i)
            assert served_by(answer) == "a", answer
        assert took < WELL_UNDER, (i, took)
        if silent.breaker.transitions.get(HALF_OPEN, 0) >= 2 and silent.breaker.state is OPEN:
            break
    # half-open twice, each time probed by a client's read (raced: answered above)
    assert silent.breaker.transitions.get(HALF_OPEN, 0) >= 2
    assert silent.breaker.state is OPEN
    per_read = 2 if batch else 1
    assert len(state.received) >= sent + per_read * (2 + 2)  # 2 to open it, 2 probes


async def test_a_read_still_waiting_for_a_connection_is_answered_by_the_race(
    make_api, fake_nodes
) -> None:
    """Reads that have no connection to the silent node yet (its one connection slot is
    held by a read it never answers) are answered by the archive node too: the second
    attempt's answer does not wait for the first to be sent."""
    api, state, _ = await pair(make_api, fake_nodes, upstream_connections=1)
    silence(state)
    t0 = time.monotonic()
    answers = await asyncio.gather(*(api.rpc("1337", read(50_000 + i)) for i in range(3)))
    took = time.monotonic() - t0
    assert [served_by(x) for _, x in answers] == ["a", "a", "a"], answers
    assert took < WELL_UNDER, took
    await wait_until(lambda: node_of(api, "s").inflight == 0)


async def test_a_lone_node_with_nobody_to_take_over_is_not_struck(make_api, fake_nodes) -> None:
    """A read only the state node can take (the archive node has not reached its block yet)
    waits for the state node, and its late attempt is not counted against it."""
    api, state, archive = await pair(make_api, fake_nodes)
    archive.head = 900  # the blocks after 900 are the state node's alone
    pool = api.proxy.state.pools["1337"]
    await wait_until(lambda: node_of(api, "a").head == 900)
    state.delay = 0.8  # late past the attempt timeout (0.3 s), within the ceiling
    answer, _ = await timed_read(api, 30_000, hex(950))
    assert served_by(answer) == "s"
    assert node_of(api, "s").breaker.failures == 0
    assert len(archive.received) == 0
    assert pool.head() == 1000

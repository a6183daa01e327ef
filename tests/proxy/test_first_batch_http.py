"""A batch's first attempt to nodes over HTTP without a task (proxy/firstbatch.py
`FirstBatch._over_http`): the client gets the bytes the general steps (`Pipeline.run` in a
task) give, whatever the node answers; a failed attempt goes on in the rounds; a method the
proxy answers itself is handed over; and every request leaves the pool's count of requests
in flight. A real proxy app in front of fake state nodes, the response cache off."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from proxy import firstbatch
from tests.proxy.conftest import fast_settings, req
from tests.proxy.test_batch_answers import N, reads, results
from tests.proxy.test_dataport import raw_rpc

Answer = Callable[[list[dict[str, Any]]], bytes]


def answered(name: str) -> Answer:
    """The fake node's answer to a batch: its results one per id in order, or otherwise."""

    def answer(items: list[dict[str, Any]]) -> bytes:
        got: list[Any] = results(items)
        if name == "error":
            got[1] = {"jsonrpc": "2.0", "id": got[1]["id"], "error": {"code": 3, "message": "x"}}
        elif name == "missing":
            del got[4]
        elif name == "reversed":
            got.reverse()
        elif name == "object results":
            got[2]["result"] = {"balance": "0x1"}
        return orjson.dumps(got) + (b"\n" if name == "whitespace" else b"")

    return answer


def sent_now(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many batches had their first attempt's answer classified from the node
    connection's callback (`_BatchThen.then`)."""
    calls = [0]
    real = firstbatch._BatchThen.then

    def spied(self: Any, *args: Any) -> None:
        calls[0] += 1
        real(self, *args)

    monkeypatch.setattr(firstbatch._BatchThen, "then", spied)
    return calls


def in_flight(api: Any) -> tuple[int, int]:
    return api.proxy.engine.inflight, api.proxy.state.pools["1337"].inflight


@pytest.mark.parametrize(
    "name", ["results", "whitespace", "error", "missing", "reversed", "object results"]
)
async def test_a_batch_sent_now_gets_the_general_steps_answer(
    node_api, monkeypatch, name: str
) -> None:
    api, node = node_api
    node.batch_answer = answered(name)
    body = orjson.dumps(reads())
    await raw_rpc(api, body)  # (its block texts learnt: the next is read from its bytes)
    calls = sent_now(monkeypatch)
    now = await raw_rpc(api, body)
    assert calls == [1] and now[0] == 200
    monkeypatch.setattr(firstbatch.FirstBatch, "_over_http", lambda *a: firstbatch._GENERAL)
    assert await raw_rpc(api, body) == now and calls == [1]
    ids = [a["id"] for a in orjson.loads(now[1])]
    assert sorted(ids) == list(range(N)), now
    assert in_flight(api) == (0, 0)


async def test_a_failed_first_attempt_goes_on_to_the_other_node(make_api, fake_nodes) -> None:
    """The state node answers HTTP 503: the batch's items are retried on the archive node
    (the rounds, in a task) and the client gets every answer."""
    state = await fake_nodes("state-1", "state")
    archive = await fake_nodes("archive-1", "archive")
    api = await make_api(fast_settings(cache_pools=[]))
    await api.add("1337", state)
    await api.add("1337", archive)
    await api.heads_known("1337")
    body = orjson.dumps(reads())
    status, raw = await raw_rpc(api, body)  # (learnt: the next is read from its bytes)
    assert status == 200
    first = len(archive.bodies)
    state.fail_every = 1
    status, raw = await raw_rpc(api, body)
    answers = orjson.loads(raw)
    assert status == 200 and [a["id"] for a in answers] == list(range(N)), raw
    assert all("result" in a for a in answers), raw
    assert len(archive.bodies) > first  # asked again there
    assert in_flight(api) == (0, 0)


async def test_a_batch_naming_a_method_the_proxy_answers_is_handed_over(
    node_api, monkeypatch
) -> None:
    """A batch with `eth_newFilter` (the proxy's own filters) among reads is answered by the
    proxy's handler for such bodies, not sent to the node as it is."""
    api, node = node_api
    calls = sent_now(monkeypatch)
    sent = len(node.bodies)
    body = orjson.dumps([req("eth_newFilter", [{}], 0), *reads()[1:]])
    status, raw = await raw_rpc(api, body)
    answers = orjson.loads(raw)
    assert status == 200 and [a["id"] for a in answers] == list(range(N)), raw
    assert answers[0]["result"].startswith("0x") and "result" in answers[1], raw
    assert calls == [0] and in_flight(api) == (0, 0)
    assert all(b"eth_newFilter" not in b for b in node.bodies[sent:])


async def test_a_lone_node_of_its_kind_keeps_answering_once_raced_at_its_timeout(
    make_api, fake_nodes
) -> None:
    """A state node beside an archive node: once the pool's latency window knows the
    attempt timeout, a first attempt sent now to the state node is raced at it (`Rescue`).
    Single requests and batches keep getting their answers, and a late batch is taken over
    by the archive node."""
    state = await fake_nodes("state-1", "state")
    archive = await fake_nodes("archive-1", "archive")
    settings = fast_settings(cache_pools=[], upstream_timeout=5.0, attempt_timeout_min=0.2)
    api = await make_api(settings)
    await api.add("1337", state)
    await api.add("1337", archive)
    await api.heads_known("1337")
    body = orjson.dumps(reads())
    single = orjson.dumps(req("eth_getBalance", reads()[0]["params"], "s"))
    for _ in range(80):  # (latency samples for `batch` and for the method)
        for sent in (body, single):
            status, raw = await asyncio.wait_for(raw_rpc(api, sent), 5)
            assert status == 200 and b'"result"' in raw, raw
    state.delay = 2.0
    status, raw = await asyncio.wait_for(raw_rpc(api, body), 1.5)
    answers = orjson.loads(raw)
    assert status == 200 and [a["id"] for a in answers] == list(range(N)), raw
    assert {a["result"]["node"] for a in answers} == {"archive-1"}, raw

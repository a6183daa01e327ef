"""The first attempt answered synchronously by state nodes in the proxy's own process (the
in-process transport: proxy/firstattempt.py `_inproc`, proxy/firstbatch.py `_now`).

A real state node (a synthetic chain in LMDB) registered `inproc://` as a state and an
archive node behind the proxy's real data listener, as in `chainstate up`. Every body is
answered twice, once through the data port (the synchronous path when it applies) and once
by the engine's awaited entry (`Engine.handle`, which never takes it): the answers must be
the same bytes, and the synchronous answers must have served exactly the bodies they are
for.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import orjson
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from chainstate.inproc import InprocRegistry
from nodes.state.vendor import parse_vendor_block
from proxy import inprocbooks
from proxy.breaker import OPEN
from proxy.inprocbooks import FOLD_EVERY
from proxy.metrics import client_label
from proxy.model import Pool
from tests.nodes.test_state_chain import random_chain
from tests.nodes.test_state_reads import make_node
from tests.proxy.conftest import client_sees, fast_settings, wait_until
from tests.proxy.test_dataport import raw_rpc

CHAIN = "1337"


async def start_proxied(
    tmp_path: Path, make_api, chain: Any, blocks: int, tracer: Any = None, **settings: Any
):
    """(api, node, calls): the first `blocks` blocks of `chain` in a real state node, entered
    twice (as a state and an archive node); `calls` counts the bodies its synchronous paths
    for parsed items answered ("items"), those of them its paths for items of one method
    answered ("checked"), and of those its path that checks the items itself ("keyed");
    `api.asked[0]` counts every call of those paths, answered or declined."""
    node = await make_node(tmp_path, kind="archive", hot_blocks=4)
    for raw in chain.blocks[:blocks]:
        await node.ingest._apply(parse_vendor_block(raw))
    registry = InprocRegistry()
    calls = {"items": 0, "checked": 0, "keyed": 0}
    asked = [0]  # every call of those paths, answered or declined (`api.asked`)

    def answer_items(items: list[Any], errors: list[int]) -> list[Any] | None:
        asked[0] += 1
        answers = node.answer_items(items, errors)
        calls["items"] += answers is not None
        return answers

    def answer_checked(method: str, items: list[Any], errors: list[int]) -> list[Any] | None:
        asked[0] += 1
        answers = node.answer_checked(method, items, errors)
        calls["items"] += answers is not None
        calls["checked"] += answers is not None
        return answers

    def answer_keyed(
        method: str, size: int, keys: Any, items: list[Any], errors: list[int], found: list[Any]
    ) -> list[Any] | None:
        asked[0] += 1
        answers = node.answer_keyed(method, size, keys, items, errors, found)
        for counter in ("items", "checked", "keyed"):
            calls[counter] += answers is not None
        return answers

    url = registry.register(
        node.key,
        node.handle_body,
        node.answer_now,
        answer_items,
        node.items_answered,
        answer_checked=answer_checked,
        answer_keyed=answer_keyed,
    )
    api = await make_api(fast_settings(**settings), registry=registry, tracer=tracer)
    api.registry = registry  # (for a test that enters the node once more)
    api.asked = asked
    for kind in ("state", "archive"):
        status, answer = await api.post(
            f"/{CHAIN}/addNode", {"key": kind, "url": url, "kind": kind}
        )
        assert status == 201, answer
    await api.heads_known(CHAIN)
    return api, node, calls


@pytest.fixture
async def proxied(tmp_path: Path, make_api):
    """(api, node, addresses, calls), see `start_proxied`."""
    chain, addrs = random_chain(seed=31, blocks=24)
    api, node, calls = await start_proxied(tmp_path, make_api, chain, 24)
    try:
        yield api, node, addrs, calls
    finally:
        await node.close()


def item(rid: Any, method: str, *params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": list(params)}


async def both(api, body: bytes) -> tuple[int, bytes]:
    """The data port's answer, checked equal to the engine's own answer."""
    status, raw = await raw_rpc(api, body)
    engine_status, engine_raw = await api.proxy.engine.handle(CHAIN, body, {})
    assert (status, raw) == (engine_status, engine_raw), body
    return status, raw


async def test_plain_reads_are_answered_in_process_as_the_engine_answers(proxied) -> None:
    api, node, addrs, calls = proxied
    rng = random.Random(5)
    singles = [
        item(i, "eth_getBalance", rng.choice(addrs), hex(rng.randrange(25))) for i in range(20)
    ]
    singles += [
        item("s", "eth_getStorageAt", addrs[0], "0x1", "latest"),
        item(7, "eth_getTransactionCount", addrs[1], "earliest"),
        item(8, "eth_getCode", addrs[2]),  # no block: latest
        item(9, "eth_blockNumber"),
    ]
    for obj in singles:
        status, raw = await both(api, orjson.dumps(obj))
        assert status == 200 and raw == client_sees(
            orjson.dumps(obj), await node.handle_body(orjson.dumps(obj))
        )
    # (the last three read at the head the engine pins per request: `latest` is monotonic)
    assert calls["items"] == len(singles) - 3
    batch = [
        item(i, "eth_getBalance", rng.choice(addrs), hex(rng.randrange(25))) for i in range(50)
    ]
    batch += singles[:20]  # fixed heights only
    status, raw = await both(api, orjson.dumps(batch))
    assert status == 200 and raw == client_sees(
        orjson.dumps(batch), await node.handle_body(orjson.dumps(batch))
    )
    assert calls["items"] >= len(singles) - 3 + 1  # the batch: one call per chosen node
    # With tags on two nodes the engine answers (one pinned head for the whole batch), the same.
    batch += singles[20:]
    status, raw = await both(api, orjson.dumps(batch))
    assert status == 200 and raw == client_sees(
        orjson.dumps(batch), await node.handle_body(orjson.dumps(batch))
    )


@pytest.mark.parametrize(
    "body",
    [
        b'{"jsonrpc":"2.0","id":1e-400,"method":"eth_getBalance","params":["%s","0x3"]}',
        b'{"jsonrpc":"2.0","id":18446744073709551616,"method":"eth_blockNumber","params":[]}',
        b'{"jsonrpc":"2.0","method":"eth_getBalance","params":["%s","0x3"]}',  # notification
        b'{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}',  # not a plain read
        b'{"jsonrpc":"2.0","id":1,"method":"eth_getBalance","params":["%s","0x999"]}',  # -39006
        b'{"jsonrpc":"2.0","id":1,"method":"eth_getBalance","params":["0x12","0x3"]}',  # invalid
        b'{"jsonrpc":"2.0","id":1,"method":"eth_sendRawTransaction","params":["0x00"]}',  # writer
        b'[{"jsonrpc":"2.0","id":1,"method":"eth_getBalance","params":["%s","0x3"]},'
        b'{"jsonrpc":"2.0","id":2,"method":"eth_chainId"}]',  # one item not a plain read
        b'[{"jsonrpc":"2.0","id":1,"method":"eth_getBalance","params":["%s","0x3"]},{"id":2}]',
        b"[]",
        b"[1",
        b'{"jsonrpc":"2.0","id":1,"method":"eth_newBlockFilter","params":[]}',  # the proxy's
        b'[{"jsonrpc":"2.0","id":1,"method":"eth_getBalance","params":["%s","0x3"]},'
        b'{"jsonrpc":"2.0","id":2,"method":"eth_newBlockFilter"}]',  # a filter in a batch
        b'{"jsonrpc":"2.0","id":null,"method":"eth_blockNumber"}',
        b'[{"jsonrpc":"2.0","id":1,"method":"eth_getBalance","params":["%s","0x3"]},'
        b'{"jsonrpc":"2.0","id":2,"method":"eth_call","params":[{"to":"%s"},"0x3"]}]',
    ],
)
async def test_every_other_body_goes_to_the_engine(proxied, body: bytes) -> None:
    api, _, addrs, calls = proxied
    if b"%s" in body:
        body = body.replace(b"%s", addrs[0].encode())
    if b"Filter" in body:  # a new filter per call: no twin answer to compare
        status, raw = await raw_rpc(api, body)
        assert status == 200 and b'"result":"0x' in raw and b"-32601" not in raw, raw
        assert calls["items"] == 0
        return
    status, raw = await both(api, body)
    # -39006: the node was asked, and its answer left to the engine (which retries it)
    assert calls["items"] == (1 if b"0x999" in body else 0), raw
    if b"e-400" in body:  # the id as the client wrote it, from the engine's path
        assert raw.startswith(b'{"jsonrpc":"2.0","id":1e-400,"result":"0x')
    if b"0x999" in body:  # (-39006 from every node: a read at a block none holds)
        assert orjson.loads(raw)["error"]["code"] == -32000
    del status


async def test_a_batch_of_eth_calls_is_not_routed_nor_given_to_the_nodes_plain_paths(
    proxied,
) -> None:
    """eth_calls are never plain reads: a batch of them goes to the engine (which hands them
    to the node's future) without the in-process path routing the items and asking the node's
    synchronous paths, which would decline them; also at block texts seen by plain reads, and
    also the second time (no route is kept for them)."""
    api, _, addrs, _ = proxied
    read = item(1, "eth_getBalance", addrs[0], "0x3")
    status, _ = await both(api, orjson.dumps([read, {**read, "id": 2}]))
    assert status == 200 and api.asked == [1]  # "0x3" is a seen text now
    call = {"jsonrpc": "2.0", "method": "eth_call", "params": [{"to": addrs[0]}, "0x3"]}
    for _ in range(2):
        status, raw = await both(api, orjson.dumps([{**call, "id": 7}, {**call, "id": 8}]))
        assert status == 200 and [a["id"] for a in orjson.loads(raw)] == [7, 8], raw
        assert api.asked == [1], raw


async def test_bodies_at_a_seen_block_text_that_are_not_plain_reads_go_to_the_engine(
    proxied,
) -> None:
    """A single whose last param is a block text seen before takes its kept route without
    the method table's checks (`FirstAttempt.start`): what is not a plain read with an int
    or string id still goes to the engine, answered as the engine answers it."""
    api, _, addrs, calls = proxied
    seen = item(1, "eth_getBalance", addrs[0], "0x3")
    status, _ = await both(api, orjson.dumps(seen))
    assert status == 200 and calls["items"] == 1  # "0x3" is now a seen text
    others = [
        {"jsonrpc": "2.0", "method": "eth_getBalance", "params": [addrs[0], "0x3"]},  # no id
        {"jsonrpc": "2.0", "id": None, "method": "eth_getBalance", "params": [addrs[0], "0x3"]},
        {"jsonrpc": "2.0", "id": 1.5, "method": "eth_getBalance", "params": [addrs[0], "0x3"]},
        {"jsonrpc": "2.0", "id": [1], "method": "eth_getBalance", "params": [addrs[0], "0x3"]},
        {"jsonrpc": "2.0", "id": 2, "method": 5, "params": [addrs[0], "0x3"]},
        {"jsonrpc": "2.0", "id": 2, "method": "eth_getBalance", "params": {"a": "0x3"}},
        {"jsonrpc": "2.0", "id": 2, "method": "eth_getBalance", "params": [addrs[0], ["0x3"]]},
        {"jsonrpc": "2.0", "id": 2, "method": "eth_getBalance", "params": "x3"},
        {"jsonrpc": "2.0", "id": 2, "method": "eth_getBalance"},
    ]
    for obj in others:
        await both(api, orjson.dumps(obj))
        assert calls["items"] == 1, obj  # the node's synchronous path answered none of them
    declined = {"id": 3, "method": "eth_getBalance", "params": [addrs[0], "0x3"]}  # no jsonrpc
    await both(api, orjson.dumps(declined))
    assert calls["items"] == 1
    status, _ = await both(api, orjson.dumps(item(4, "eth_getBalance", addrs[1], "0x3")))
    assert status == 200 and calls["items"] == 2  # and the seen route still serves reads


def scraped(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`, in a /metrics text."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return total


async def metrics_text(api) -> str:
    return await (await api.client.get("/metrics")).text()


async def test_answers_are_counted_as_the_engine_counts_them(proxied) -> None:
    """Every request, attempt and latency of an in-process answer is in /metrics and in the
    nodes' figures when read, though its books are folded in per FOLD_EVERY answers."""
    api, _, addrs, calls = proxied
    pool = api.proxy.state.pools[CHAIN]
    before = await metrics_text(api)

    def grew(after: str, name: str, **labels: str) -> float:
        return scraped(after, name, **labels) - scraped(before, name, **labels)

    for i in range(5):
        await raw_rpc(api, orjson.dumps(item(i, "eth_getBalance", addrs[0], "0x3")))
    batch = [item(i, "eth_getBalance", addrs[1], hex(i)) for i in range(10)]
    await raw_rpc(api, orjson.dumps(batch))
    assert calls["items"] >= 6
    after = await metrics_text(api)
    assert grew(after, "chainstate_proxy_requests_total", method="eth_getBalance") == 15
    assert grew(after, "chainstate_proxy_request_seconds_count", shape="single") == 5
    assert grew(after, "chainstate_proxy_request_seconds_count", shape="batch") == 1
    attempts = grew(after, "chainstate_proxy_upstream_attempts_total", outcome="ok")
    assert attempts == calls["items"]  # one attempt per call of the node's path
    assert grew(after, "chainstate_proxy_upstream_seconds_count") == attempts
    assert pool.inflight == 0  # every admitted place given back
    assert {"eth_getBalance", "batch"} <= set(pool.latency)  # the hedge/timeout windows
    status, nodes = await api.get(f"/{CHAIN}/getAllNodes")
    assert status == 200
    assert any(n["latency_ms"] is not None for n in nodes["nodes"])  # the choice's figures


async def test_folded_books_are_exact_when_read_and_never_counted_twice(
    proxied, monkeypatch
) -> None:
    """More answers than one fold holds, read at any point: /metrics shows each answer once,
    a second scrape adds nothing, and the nodes' latency windows hold every attempt."""
    monkeypatch.setattr(inprocbooks, "FOLD_AFTER_S", 600.0)  # folds by count and by reads
    api, _, addrs, calls = proxied
    pool = api.proxy.state.pools[CHAIN]
    before = await metrics_text(api)
    windows = sum(w.since + w.n for w in pool.latency.values())
    sent = FOLD_EVERY * 2 + 7  # two folds by count, then some pending
    for i in range(sent):
        await raw_rpc(api, orjson.dumps(item(i, "eth_getBalance", addrs[i % 3], hex(i % 20))))
    assert calls["items"] == sent
    for _ in range(2):
        after = await metrics_text(api)
        singles = "chainstate_proxy_request_seconds_count"
        assert (
            scraped(after, singles, shape="single") - scraped(before, singles, shape="single")
            == sent
        )
        ok = "chainstate_proxy_upstream_attempts_total"
        assert scraped(after, ok, outcome="ok") - scraped(before, ok, outcome="ok") == sent
        total = "chainstate_proxy_upstream_seconds_count"
        assert scraped(after, total) - scraped(before, total) == sent
        assert sum(w.since + w.n for w in pool.latency.values()) == windows + sent


async def test_folded_books_reach_the_choice_without_a_read(proxied, monkeypatch) -> None:
    """A few answers and then nothing: within FOLD_AFTER_S the nodes' latency costs and the
    pool's windows have them, with no scrape or admin call to fold them."""
    api, _, addrs, calls = proxied
    monkeypatch.setattr(inprocbooks, "FOLD_AFTER_S", 0.5)  # (3 answers take a few ms)
    pool = api.proxy.state.pools[CHAIN]
    stamps = {node.key: node.cost_at for node in pool.readers}
    for i in range(3):
        await raw_rpc(api, orjson.dumps(item(i, "eth_getBalance", addrs[0], hex(5))))
    assert calls["items"] == 3
    assert sum(w.since + w.n for w in pool.latency.values()) == 0  # pending: not yet folded
    await wait_until(lambda: sum(w.since + w.n for w in pool.latency.values()) == 3)
    assert any(node.cost_at != stamps[node.key] for node in pool.readers)  # a new cost


async def test_a_node_that_failed_lately_or_has_no_weight_is_left_to_the_engine(proxied) -> None:
    api, _, addrs, calls = proxied
    pool = api.proxy.state.pools[CHAIN]
    for node in pool.readers:
        node.fails = 1  # as after a failed attempt: the engine's retries and health apply
    body = orjson.dumps(item(1, "eth_getBalance", addrs[0], "latest"))
    await both(api, body)
    assert calls["items"] == 0
    for node in pool.readers:
        node.fails = 0
        node.breaker.failure(node.key, "a failed attempt")  # counted by the breaker
    await both(api, body)
    assert calls["items"] == 0
    for key in ("state", "archive"):
        status, answer = await api.post(f"/{CHAIN}/setWeight", {"key": key, "weight": 0})
        assert status == 200, answer
    await wait_until(lambda: all(n.weight == 0 for n in pool.readers))
    # (a read not cached yet: the one above is answered from the cache at the same `latest`)
    body = orjson.dumps(item(1, "eth_getBalance", addrs[1], "latest"))
    status, raw = await both(api, body)
    assert calls["items"] == 0 and b'"error"' in raw  # no eligible node


async def test_nodes_over_http_are_not_affected(make_api, fake_nodes) -> None:
    """A proxy started with a registry but nodes over HTTP: everything goes to the engine."""
    registry = InprocRegistry()
    fake = await fake_nodes("state-1", "state")
    api = await make_api(fast_settings(), registry=registry)
    await api.add(CHAIN, fake)
    await api.heads_known(CHAIN)
    status, raw = await both(api, orjson.dumps(item(1, "eth_getBalance", "0x" + "11" * 20)))
    assert status == 200 and b'"result"' in raw


def served_by(api, method: str = "eth_getBalance") -> dict[str, int]:
    """Requests for `method` counted per node key (chainstate_proxy_requests), as a scrape
    reads them (the in-process answers' books folded in first)."""
    api.proxy.metrics.settle()
    out: dict[str, int] = {}
    for (_, m, node, _), n in api.proxy.metrics.hot.requests.items():
        if m == method:
            out[node] = out.get(node, 0) + n
    return out


async def test_cached_routes_follow_weights_heads_and_breakers(tmp_path: Path, make_api) -> None:
    """The in-process path keeps each pool's candidates per (method, block range): a weight
    change (a pool rebuild), a head that moved a height out of the state window, and a
    breaker that opened each change where the same request goes, in process."""
    chain, addrs = random_chain(seed=32, blocks=40)
    api, node, calls = await start_proxied(tmp_path, make_api, chain, 24, state_window=8)
    try:
        pool = api.proxy.state.pools[CHAIN]
        body = orjson.dumps(item(1, "eth_getBalance", addrs[0], hex(20)))  # head 23: in window

        async def ask() -> dict[str, int]:
            before, served = served_by(api), calls["items"]
            status, raw = await raw_rpc(api, body)
            assert status == 200 and b'"result"' in raw, raw
            assert raw == client_sees(body, await node.handle_body(body))
            assert calls["items"] == served + 1  # in process, not the engine
            after = served_by(api)
            return {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}

        assert await ask() == {"state": 1}
        assert await ask() == {"state": 1}  # from the cache
        # A weight change rebuilds the pool's readers: the state node gets nothing.
        status, answer = await api.post(f"/{CHAIN}/setWeight", {"key": "state", "weight": 0})
        assert status == 200, answer
        await wait_until(lambda: pool.find("state").weight == 0)
        assert await ask() == {"archive": 1}
        status, answer = await api.post(f"/{CHAIN}/setWeight", {"key": "state", "weight": 1})
        assert status == 200, answer
        await wait_until(lambda: pool.find("state").weight == 1)
        assert await ask() == {"state": 1}
        # The head moves on: height 20 leaves the state window (33 - 20 >= 8).
        for raw in chain.blocks[24:34]:
            await node.ingest._apply(parse_vendor_block(raw))
        # (both entries polled: one still at 23 would keep height 20 in its window)
        await wait_until(lambda: all(n.head == 33 for n in pool.readers))
        assert await ask() == {"archive": 1}
        # Back in the window for a newer height; then the state node's breaker opens.
        body = orjson.dumps(item(1, "eth_getBalance", addrs[0], hex(30)))
        assert await ask() == {"state": 1}
        breaker = pool.find("state").breaker
        while breaker.state is not OPEN:
            breaker.failure("state", "a failed attempt")
        assert await ask() == {"archive": 1}
    finally:
        await node.close()


async def test_error_answers_in_a_batch_are_counted_as_errors(proxied) -> None:
    """A slot the node rejects (the proxy checks only the address) is answered in process,
    as the engine answers it, and counted as an error of its method; the rest as ok."""
    api, _, addrs, calls = proxied
    before = dict(api.proxy.metrics.hot.requests)
    batch = [item(i, "eth_getBalance", addrs[0], hex(i)) for i in range(3)]
    batch.append(item(3, "eth_getStorageAt", addrs[0], "0xnot-a-slot", "0x2"))
    batch.append(item(4, "eth_getStorageAt", addrs[0], "0x1", "0x2"))
    status, raw = await raw_rpc(api, orjson.dumps(batch))
    assert calls["items"] == 1  # in process
    answers = orjson.loads(raw)
    assert status == 200 and [("error" in a) for a in answers] == [False] * 3 + [True, False]
    assert answers[3]["error"]["code"] == -32602, answers[3]
    engine_status, engine_raw = await api.proxy.engine.handle(CHAIN, orjson.dumps(batch), {})
    assert (engine_status, engine_raw) == (status, raw)
    added: dict[tuple[str, str], int] = {}
    for key, n in api.proxy.metrics.hot.requests.items():
        if n != before.get(key, 0):
            added[(key[1], key[3])] = added.get((key[1], key[3]), 0) + n - before.get(key, 0)
    assert added == {
        ("eth_getBalance", "ok"): 6,  # the data port's answer and the engine's twin
        ("eth_getStorageAt", "ok"): 2,
        ("eth_getStorageAt", "error"): 2,
    }


async def test_params_of_a_seen_block_text_are_still_checked(tmp_path: Path, make_api) -> None:
    """A block text seen before routes an item without the method table's param checks (the
    node checks them): an invalid address at that block is still answered as the engine
    answers it, alone, in a batch, and in a batch across two nodes."""
    chain, addrs = random_chain(seed=33, blocks=24)
    api, node, calls = await start_proxied(tmp_path, make_api, chain, 24, state_window=8)
    try:
        for height in (2, 20):  # archive / state (head 23, window 8): the texts seen
            status, raw = await both(
                api, orjson.dumps(item(1, "eth_getBalance", addrs[0], hex(height)))
            )
            assert status == 200 and b'"result"' in raw, raw
        for bad in (
            item(2, "eth_getBalance", "0x12", hex(2)),
            item(2, "eth_getBalance", None, hex(2)),
        ):
            status, raw = await both(api, orjson.dumps(bad))
            assert status == 200 and orjson.loads(raw)["error"]["code"] == -32602, raw
        good = item(1, "eth_getBalance", addrs[1], hex(20))
        for batch in ([good, bad], [bad, good], [item(3, "eth_getBalance", addrs[1], hex(2)), bad]):
            status, raw = await both(api, orjson.dumps(batch))
            answers = {a["id"]: a for a in orjson.loads(raw)}
            assert answers[2]["error"]["code"] == -32602, raw
            assert all("result" in a for rid, a in answers.items() if rid != 2), raw
        served = calls["items"]
        status, raw = await both(
            api, orjson.dumps([good, item(4, "eth_getBalance", addrs[2], hex(2))])
        )
        # valid: in process, two entries (state, archive) of one node: one call of its path
        assert status == 200 and calls["items"] == served + 1
    finally:
        await node.close()


def books(api, node) -> dict[Any, int]:
    """What the proxy and the node counted so far: requests per (method, outcome), attempts
    per outcome, latency samples and client requests per shape (the proxy's), and bodies
    (the node's request_seconds)."""
    metrics = api.proxy.metrics
    metrics.settle()  # the in-process answers' books folded in
    hot = metrics.hot
    out: dict[Any, int] = {}
    for (_, method, _, outcome), n in hot.requests.items():
        out[("requests", method, outcome)] = out.get(("requests", method, outcome), 0) + n
    for (_, _, outcome), n in hot.attempts.items():
        out[("attempts", outcome)] = out.get(("attempts", outcome), 0) + n
    out["upstream_seconds"] = sum(sum(h.counts) for h in hot.upstream_latency.values())
    for (_, shape), hist in hot.latency.items():  # (single, batch: the client's latency)
        out[("requests", shape)] = out.get(("requests", shape), 0) + sum(hist.counts)
    out["node_bodies"] = sum(node.metrics.request_seconds.counts)
    return out


def grown(before: dict[Any, int], after: dict[Any, int]) -> dict[Any, int]:
    return {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}


async def counted_as_the_engine_counts(api, node, body: bytes) -> tuple[int, bytes]:
    """The data port's answer to `body`; its books (the proxy's and the node's) grew exactly
    as much as the engine's own answer to it makes them grow. The head polls are stopped
    first: a poll of the node between two snapshots counts a body of its own."""
    await api.proxy.tracker.close()
    first = books(api, node)
    status, raw = await raw_rpc(api, body)
    second = books(api, node)
    engine_status, engine_raw = await api.proxy.engine.handle(CHAIN, body, {})
    third = books(api, node)
    assert (status, raw) == (engine_status, engine_raw), body
    assert grown(first, second) == grown(second, third), body
    return status, raw


async def test_an_answer_over_max_answer_bytes_is_counted_once(tmp_path: Path, make_api) -> None:
    """The node answers in process, the answer is over max_answer_bytes: -32603 naming the
    setting for every item, and the node is not asked again (every node would make the
    same answer: `too_large` is final)."""
    chain, addrs = random_chain(seed=35, blocks=24)
    api, node, calls = await start_proxied(tmp_path, make_api, chain, 24, max_answer_bytes=3000)
    try:
        small = item(1, "eth_getBalance", addrs[0], hex(2))
        status, raw = await counted_as_the_engine_counts(api, node, orjson.dumps(small))
        assert status == 200 and b'"result"' in raw and calls["items"] == 1, raw
        batch = [item(i, "eth_getBalance", addrs[i % 3], hex(2 + i % 3)) for i in range(100)]
        status, raw = await raw_rpc(api, orjson.dumps(batch))
        assert calls["items"] == 2  # answered in process once, not asked again
        answers = orjson.loads(raw)
        assert [a["id"] for a in answers] == list(range(100))
        assert all(a["error"]["code"] == -32603 for a in answers), raw
        assert "max_answer_bytes" in answers[0]["error"]["message"], raw
    finally:
        await node.close()


async def test_a_body_left_to_the_engine_after_the_node_answered_is_counted_once(
    tmp_path: Path, make_api
) -> None:
    """An invalid address at a block text seen before: the node answers it in process (the
    method table was skipped), the proxy leaves the body to the engine, which refuses the
    item itself: the node's request_seconds and the proxy's books count it as the engine
    alone does (the node not at all for a single; once for the rest of a batch)."""
    chain, addrs = random_chain(seed=37, blocks=24)
    api, node, calls = await start_proxied(tmp_path, make_api, chain, 24)
    try:
        good = item(1, "eth_getBalance", addrs[0], hex(2))
        status, raw = await counted_as_the_engine_counts(api, node, orjson.dumps(good))
        assert status == 200 and b'"result"' in raw, raw
        bad = item(2, "eth_getBalance", "0x12", hex(2))
        for body in (bad, [good, bad]):
            served = calls["items"]
            status, raw = await counted_as_the_engine_counts(api, node, orjson.dumps(body))
            assert status == 200 and b"-32602" in raw, raw
            assert calls["items"] == served + 1  # the node answered, the engine had the body
    finally:
        await node.close()


async def test_a_node_unregistered_in_process_is_no_longer_called(proxied) -> None:
    """The routes keep each reader's synchronous path until the registry changes."""
    api, node, addrs, calls = proxied
    body = orjson.dumps(item(1, "eth_getBalance", addrs[0], "0x3"))
    status, raw = await both(api, body)
    assert status == 200 and b'"result"' in raw and calls["items"] == 1
    api.proxy.upstream.registry.unregister(node.key)
    status, raw = await raw_rpc(api, body)
    assert calls["items"] == 1 and b'"result"' not in raw, raw  # the engine: no such node


async def test_books_folded_after_a_breaker_opened_leave_it_open(proxied) -> None:
    """An in-process answer's books wait to be folded in; a breaker that opened meanwhile
    stays open when they are (the answer came before the failures that opened it)."""
    api, _, addrs, calls = proxied
    body = orjson.dumps(item(1, "eth_getBalance", addrs[0], "0x3"))
    status, raw = await raw_rpc(api, body)
    assert status == 200 and b'"result"' in raw and calls["items"] == 1, raw
    pool = api.proxy.state.pools[CHAIN]
    for node in pool.readers:  # whichever served it: its books are still pending
        while node.breaker.state is not OPEN:
            node.breaker.failure(node.key, "a failed attempt")
    api.proxy.metrics.settle()  # the pending answer folded in
    assert sum(served_by(api).values()) == 1
    assert all(n.breaker.state is OPEN and n.blocked for n in pool.readers)


async def test_a_pool_at_its_limit_still_answers_plain_reads_in_process(
    tmp_path: Path, make_api
) -> None:
    """An in-process answer never waits, so it is not admitted: with the pool at its
    in-flight limit a plain read is answered in process, while a body for the engine is
    refused (503, -32005) as before; an unknown chain is still a 404."""
    chain, addrs = random_chain(seed=33, blocks=24)
    api, node, calls = await start_proxied(tmp_path, make_api, chain, 24, max_pool_inflight=1)
    try:
        pool = api.proxy.state.pools[CHAIN]
        pool.inflight = 1  # a place held, as by a request waiting for a node over HTTP
        status, raw = await raw_rpc(api, orjson.dumps(item(1, "eth_getBalance", addrs[0], "0x3")))
        assert status == 200 and b'"result"' in raw and calls["items"] == 1, raw
        batch = [item(i, "eth_getBalance", addrs[1], hex(i)) for i in range(5)]
        status, raw = await raw_rpc(api, orjson.dumps(batch))
        assert status == 200 and raw.count(b'"result"') == 5 and calls["items"] == 2, raw
        for engine_body in (
            orjson.dumps(item(2, "eth_getBlockByNumber", "0x3", False)),  # not a plain read
            orjson.dumps({"jsonrpc": "2.0", "method": "eth_getBalance", "params": [addrs[0]]}),
        ):
            status, raw = await raw_rpc(api, engine_body)
            assert status == 503 and b"-32005" in raw, raw
        assert pool.inflight == 1 and calls["items"] == 2
        async with api.client.data.post("/999999", data=b"{}") as resp:
            assert resp.status == 404 and b"unknown chain" in await resp.read()
    finally:
        await node.close()


async def test_a_batch_of_seen_block_texts_is_routed_as_item_by_item(
    tmp_path: Path, make_api
) -> None:
    """Once every block text of a batch was seen, the batch is routed without the per-item
    step: one route for all (one method, one range) is one pick and one call of the node;
    two ranges are two groups in their order, one call when both groups' entries are the
    same node; each answer and book is the engine's. Items
    that are not request objects with an int or string id still go the long way (to the
    engine), with their texts seen."""
    chain, addrs = random_chain(seed=39, blocks=24)
    api, node, calls = await start_proxied(tmp_path, make_api, chain, 24, state_window=8)
    try:
        for height in (2, 3, 20, 21):  # archive only / both nodes (head 23, window 8)
            body = orjson.dumps(item(1, "eth_getBalance", addrs[0], hex(height)))
            status, raw = await counted_as_the_engine_counts(api, node, body)
            assert status == 200 and b'"result"' in raw, raw
        one_route = [item(i, "eth_getBalance", addrs[i % 3], hex(20 + i % 2)) for i in range(30)]
        served = calls["items"]
        status, raw = await counted_as_the_engine_counts(api, node, orjson.dumps(one_route))
        assert status == 200 and raw.count(b'"result"') == 30 and calls["items"] == served + 1
        assert [a["id"] for a in orjson.loads(raw)] == list(range(30))
        two_ranges = [item(i, "eth_getBalance", addrs[1], hex((2, 20)[i % 2])) for i in range(9)]
        before = served_by(api)
        status, raw = await counted_as_the_engine_counts(api, node, orjson.dumps(two_ranges))
        # archive's group and the state entry's, both the same node: one call of its path,
        # booked as the engine books its two (each entry its requests and its attempt)
        assert status == 200 and calls["items"] == served + 2
        assert [a["id"] for a in orjson.loads(raw)] == list(range(9))
        after = served_by(api)
        grew = {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}
        assert grew == {"archive": 2 * 5, "state": 2 * 4}  # the data port's and the engine's
        # the ranges in any order, the groups of unequal sizes: still one call, each entry
        # booked its own items (counted per route, not per position)
        mixed = [
            item(i, "eth_getBalance", addrs[i % 3], hex(h))
            for i, h in enumerate((20, 2, 2, 21, 3, 20, 2, 20, 20, 21, 3))
        ]
        before, served = served_by(api), calls["items"]
        status, raw = await counted_as_the_engine_counts(api, node, orjson.dumps(mixed))
        assert status == 200 and calls["items"] == served + 1
        assert [a["id"] for a in orjson.loads(raw)] == list(range(11))
        after = served_by(api)
        grew = {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}
        assert grew == {"archive": 2 * 5, "state": 2 * 6}
        archive = next(n for n in api.proxy.state.pools[CHAIN].readers if n.key == "archive")
        archive.fails = 1  # one entry failed lately: the engine's retries and health apply
        status, raw = await both(api, orjson.dumps(mixed))
        assert status == 200 and calls["items"] == served + 1  # (the engine's)
        archive.fails = 0
        # a tag on one entry and a height on the other: the engine pins one head for both
        for text in ("latest", "earliest"):
            status, _ = await both(api, orjson.dumps(item(1, "eth_getBalance", addrs[0], text)))
        served = calls["items"]
        for texts in (("0x2", "latest"), ("latest", "0x2", "0x14"), ("earliest", "0x14")):
            tagged = [item(i, "eth_getBalance", addrs[0], t) for i, t in enumerate(texts)]
            status, raw = await counted_as_the_engine_counts(api, node, orjson.dumps(tagged))
            assert status == 200 and calls["items"] == served, texts  # the engine's
        served = calls["items"]
        seen = item(1, "eth_getBalance", addrs[0], "0x2")
        for other in (
            {"jsonrpc": "2.0", "method": "eth_getBalance", "params": [addrs[0], "0x2"]},
            {**seen, "id": True},
            {**seen, "id": None},
            {"jsonrpc": "2.0", "id": 3, "method": "eth_getBalance"},
            {"jsonrpc": "2.0", "id": 3, "method": "eth_getBalance", "params": "0x2"},
            {"jsonrpc": "2.0", "id": 3, "method": "eth_getBalance", "params": [addrs[0], {}]},
            [seen],
        ):
            status, raw = await both(api, orjson.dumps([seen, other]))
            assert calls["items"] == served, (other, raw)  # the engine's
    finally:
        await node.close()


async def test_a_batch_of_one_method_goes_to_the_nodes_path_for_checked_items(
    tmp_path: Path, make_api
) -> None:
    """A batch of one method answered in process (one route, or two routes on two entries of
    the node; balances, storage slots) is given to the node's path for checked items
    (`answer_checked`: the method looked up once, the proxy's checks of the items not made
    again), a batch of several methods to its path for parsed items; an item at a block text
    seen before that the node declines there (`"jsonrpc"` not "2.0" or missing) sends the body
    to the engine. Every answer and book is the engine's."""
    chain, addrs = random_chain(seed=40, blocks=24)
    api, node, calls = await start_proxied(tmp_path, make_api, chain, 24, state_window=8)
    try:
        for height in (2, 3, 20, 21):  # archive only / both entries (head 23, window 8)
            for method in ("eth_getBalance", "eth_getCode"):
                await both(api, orjson.dumps(item(1, method, addrs[0], hex(height))))
        one_route = [item(i, "eth_getBalance", addrs[i % 3], hex(20 + i % 2)) for i in range(6)]
        two_routes = [
            item(i, "eth_getBalance", addrs[i % 3], hex((2, 21)[i % 2])) for i in range(7)
        ]
        mixed = [
            item(i, ("eth_getBalance", "eth_getCode")[i % 2], addrs[1], "0x14") for i in range(4)
        ]
        slots = ("0x0", "0x1", "0x2", "0x" + "00" * 31 + "01")
        storage = [
            item(i, "eth_getStorageAt", addrs[i % 3], slots[i % 4], hex((2, 21)[i % 2]))
            for i in range(9)
        ]
        storage_one = [
            item(i, "eth_getStorageAt", addrs[i % 3], slots[i % 4], hex(20 + i % 2))
            for i in range(5)
        ]
        # (the batch, answered by a path for one method, by the one the node checks the
        # items in: `_keyed`, once its block texts were seen for the method)
        batches = (
            (one_route, 1, 1),
            (two_routes, 1, 1),
            (mixed, 0, 0),
            (storage, 1, 0),
            (storage_one, 1, 0),
            (storage, 1, 1),
            (storage_one, 1, 1),
        )
        for batch, checked, keyed in batches:
            before = dict(calls)
            status, raw = await counted_as_the_engine_counts(api, node, orjson.dumps(batch))
            assert status == 200 and [a["id"] for a in orjson.loads(raw)] == list(range(len(batch)))
            assert calls == {
                "items": before["items"] + 1,
                "checked": before["checked"] + checked,
                "keyed": before["keyed"] + keyed,
            }
        for declined in (
            {**one_route[1], "jsonrpc": "1.0"},
            {k: v for k, v in one_route[1].items() if k != "jsonrpc"},
        ):
            before = dict(calls)
            status, raw = await both(api, orjson.dumps([one_route[0], declined]))
            assert calls == before and b'"result"' in raw and b'"error"' in raw, raw  # the engine's
    finally:
        await node.close()


async def test_a_batch_on_one_nodes_entries_is_checked_by_the_node_as_it_answers(
    tmp_path: Path, make_api
) -> None:
    """When every reader of the pool is one node in process (a state and an archive entry), a
    batch of one method whose block texts were all seen as heights is given to the node's
    path that checks the items itself and gives each one's route (`_keyed`): one route or
    two, each answer and book the engine's. Not given to it (the node not called there): a
    batch with a text not seen yet (the general path learns it, the next one is), several
    methods, a text seen as a tag, a reader that failed lately or has a failure on its
    breaker (whichever entry the items would take: the engine's), a pool with an entry
    whose path is another; an error answer from it leaves the body to the engine."""
    chain, addrs = random_chain(seed=42, blocks=24)
    api, node, calls = await start_proxied(tmp_path, make_api, chain, 24, state_window=8)
    try:
        for height in (2, 3, 20, 21):  # archive only / both entries (head 23, window 8)
            await both(api, orjson.dumps(item(1, "eth_getBalance", addrs[0], hex(height))))
        await both(api, orjson.dumps(item(1, "eth_getBalance", addrs[0], "latest")))

        async def sent(batch: list[Any], keyed: int, items: int | None) -> bytes:
            """The answer to `batch` (the engine's, booked as the engine books it), for which
            the node's keyed path answered `keyed` times and its paths `items` times (None:
            as the picks fall)."""
            before = dict(calls)
            status, raw = await counted_as_the_engine_counts(api, node, orjson.dumps(batch))
            assert status == 200, raw
            assert calls["keyed"] - before["keyed"] == keyed, (batch, calls, before)
            if items is not None:
                assert calls["items"] - before["items"] == items, (batch, calls, before)
            return raw

        def balances(heights: Any, method: str = "eth_getBalance") -> list[Any]:
            return [item(i, method, addrs[i % 3], h) for i, h in enumerate(heights)]

        one_route = balances(["0x14", "0x15"] * 3)
        two_routes = balances(["0x2", "0x15", "0x15", "0x3", "0x14"])
        before = served_by(api)
        raw = await sent(one_route, 1, 1)
        assert raw.count(b'"result"') == 6
        raw = await sent(two_routes, 1, 1)
        assert [a["id"] for a in orjson.loads(raw)] == list(range(5))
        grew = {k: n - before.get(k, 0) for k, n in served_by(api).items()}
        assert grew["archive"] + grew["state"] == 2 * 11 and grew["archive"] >= 2 * 2
        new_text = balances(["0x14", "0x16", "0x2"])
        await sent(new_text, 0, 1)  # (the general path, item by item: "0x16" now seen)
        await sent(new_text, 1, 1)
        mixed = [*balances(["0x14"]), item(1, "eth_getCode", addrs[1], "0x14")]
        await both(api, orjson.dumps(item(1, "eth_getCode", addrs[1], "0x14")))
        await sent(mixed, 0, 1)
        before = dict(calls)  # (`latest`: the engine pins it; its answer then cached)
        await both(api, orjson.dumps(balances(["latest", "latest"])))
        assert calls == before
        await sent(balances(["0x2", "latest"]), 0, 0)  # (a tag on two entries: the engine's)
        bad = [*balances(["0x14"]), item(1, "eth_getBalance", "0x12", "0x14")]
        raw = await sent(bad, 1, 1)  # (answered with an error: the engine's answer)
        assert b'"error"' in raw and b'"result"' in raw
        readers = api.proxy.state.pools[CHAIN].readers
        archive = next(n for n in readers if n.key == "archive")
        state = next(n for n in readers if n.key == "state")
        archive.fails = 1  # (items picked on the state entry: answered by `_batch`'s path)
        await sent(one_route, 0, None)
        archive.fails = 0
        state.breaker.failures = 1
        await sent(two_routes, 0, 0)
        state.breaker.failures = 0
        await sent(two_routes, 1, 1)
        # a third entry of the node through its path for parsed items alone: not one path
        # (its answers counted by the node as the others': whichever entry the picks take,
        # the books are the engine's)
        url = api.registry.register(
            "plain",
            node.handle_body,
            answer_items=node.answer_items,
            items_answered=node.items_answered,
        )
        status, answer = await api.post(
            f"/{CHAIN}/addNode", {"key": "plain", "url": url, "kind": "archive"}
        )
        assert status == 201, answer  # (its head not polled: the tracker is closed)
        for batch in (one_route, two_routes, one_route, two_routes):  # (texts seen afresh)
            await sent(batch, 0, 1)  # (`_batch`'s own path)
    finally:
        await node.close()


async def test_a_single_goes_to_the_nodes_path_for_checked_items(tmp_path: Path, make_api) -> None:
    """A request object answered in process, at a block text new or seen before, is given to
    the node's path for checked items (`answer_checked`) with its method: balances, storage
    slots (`0x1`, a 32-byte slot, `0x0`), nonces, code, vendor reads, an error answer the
    proxy checked the params of. One the node declines there (`"jsonrpc"` not "2.0" or
    missing, params not a list) goes to the engine. Every answer and book is the engine's."""
    chain, addrs = random_chain(seed=41, blocks=24)
    api, node, calls = await start_proxied(tmp_path, make_api, chain, 24, state_window=8)
    try:
        slot32 = "0x" + "00" * 31 + "01"
        singles = []
        for height in (2, 21, 2, 21):  # archive only / both entries; then seen block texts
            singles += [
                item(1, "eth_getBalance", addrs[0], hex(height)),
                item("s", "eth_getStorageAt", addrs[1], "0x1", hex(height)),
                item(3, "eth_getStorageAt", addrs[2], slot32, hex(height)),
                item(4, "eth_getStorageAt", addrs[0], "0x0", hex(height)),
                item(5, "eth_getTransactionCount", addrs[1], hex(height)),
                item(6, "eth_getCode", addrs[2], hex(height)),
            ]
        singles += [
            item(7, "getStorageAt", addrs[1], "0x1", {"block_id": 21}),
            item(8, "eth_getStorageAt", addrs[1], "0x1", "0x999"),  # not held: the engine's
        ]
        for single in singles:
            before = dict(calls)
            status, raw = await counted_as_the_engine_counts(api, node, orjson.dumps(single))
            assert status == 200 and orjson.loads(raw)["id"] == single["id"], raw
            if single["params"][-1] != "0x999":
                assert b'"result"' in raw and calls == {
                    "items": before["items"] + 1,
                    "checked": before["checked"] + 1,
                    "keyed": before["keyed"],
                }, (single, raw)
        seen = item(9, "eth_getStorageAt", addrs[1], "0x1", "0x15")
        for declined in (
            {**seen, "jsonrpc": "1.0"},
            {k: v for k, v in seen.items() if k != "jsonrpc"},
            {**seen, "params": "0x15"},
        ):
            before = dict(calls)
            status, raw = await counted_as_the_engine_counts(api, node, orjson.dumps(declined))
            assert calls == before and b'"error"' in raw, raw  # the engine's
    finally:
        await node.close()


async def test_one_call_on_two_entries_books_each_its_share_of_the_time(
    tmp_path: Path, make_api
) -> None:
    """A batch of one method on two entries of one node, answered by one call: each entry's
    attempt time is the call's time split by its items (5 and 4 of 9), and the node's own
    count of the two adds up to the call's time, as the engine's two calls would count."""
    chain, addrs = random_chain(seed=41, blocks=24)
    api, node, calls = await start_proxied(tmp_path, make_api, chain, 24, state_window=8)
    try:
        for height in (2, 20):  # archive only / the state entry (head 23, window 8)
            await both(api, orjson.dumps(item(1, "eth_getBalance", addrs[0], hex(height))))
        await api.proxy.tracker.close()  # (no head poll of the node in between)

        def seconds() -> dict[str, float]:
            api.proxy.metrics.settle()
            out = {key: h.total for (key,), h in api.proxy.metrics.hot.upstream_latency.items()}
            return {**out, "node": node.metrics.request_seconds.total}

        batch = [item(i, "eth_getBalance", addrs[i % 3], hex((2, 20)[i % 2])) for i in range(9)]
        before, served = seconds(), calls["checked"]
        status, raw = await raw_rpc(api, orjson.dumps(batch))
        assert status == 200 and raw.count(b'"result"') == 9 and calls["checked"] == served + 1
        grew = {key: took - before.get(key, 0.0) for key, took in seconds().items()}
        assert grew["archive"] / grew["state"] == pytest.approx(5 / 4)
        assert grew["archive"] + grew["state"] == pytest.approx(grew["node"])
    finally:
        await node.close()


async def test_the_data_route_decides_once_per_path(proxied) -> None:
    """The data route keeps the chain id of each path it took: a chain id, a versioned
    pool and an unknown chain answer as before on every request, and paths the data
    route never takes (two segments, %-escapes) still go to the admin app."""
    api, _, addrs, calls = proxied
    body = orjson.dumps(item(1, "eth_getBalance", addrs[0], "0x3"))
    for _ in range(3):
        status, raw = await raw_rpc(api, body)
        assert status == 200 and b'"result"' in raw, raw
        async with api.client.data.post("/999999", data=body) as resp:
            assert resp.status == 404 and b"unknown chain" in await resp.read()
        async with api.client.data.post("/0x539", data=body) as resp:  # 1337 in hex
            assert resp.status == 200 and await resp.read() == raw
    assert calls["items"] == 6, calls
    # (a connection handed to the admin app stays with it: these two last)
    async with api.client.data.post("/%31337", data=body) as resp:
        assert resp.status == 200 and await resp.read() == raw  # aiohttp decodes it
    async with api.client.data.post("/1337/getAllNodes", data=b"{}") as resp:
        assert b"jsonrpc" not in await resp.read()  # the admin app's answer


async def test_a_fold_leaves_the_node_costs_one_answer_at_a_time_leaves(
    proxied, monkeypatch
) -> None:
    """`Attempts.answered_ok` (a fold of in-process answers: the samples sorted once, the
    slowest taken for the peak cost, the EWMA from the seconds) leaves a node's latency cost
    and average exactly as its answers booked one at a time at the same instant."""
    import time
    from types import SimpleNamespace

    from proxy import attempts as attempts_module
    from proxy import latency
    from proxy.engine import Admitted

    api, _, _, _ = proxied
    attempts = api.proxy.engine.attempts
    pool = api.proxy.state.pools[CHAIN]
    one, many = pool.readers[:2]
    now = time.monotonic()
    monkeypatch.setattr(attempts_module, "time", SimpleNamespace(monotonic=lambda: now))
    rng = random.Random(5)
    samples = [rng.uniform(2e-6, 4e-5) for _ in range(40)]
    samples[17] = 9e-5  # the slowest in the middle: neither the first nor the last
    for start in (None, 0.001, 5.0):  # no cost yet, below every sample, above them
        for node in (one, many):
            node.cost, node.cost_at, node.latency_ms = start, now - 0.5, start
        attempts.answered_ok(Admitted(CHAIN, pool), many, "eth_getBalance", samples)
        for s in samples:
            latency.observe(one, s * 1000, now, attempts.tau)
            one.observe_latency(s * 1000)
        assert (many.cost, many.cost_at, many.latency_ms) == (
            one.cost,
            one.cost_at,
            one.latency_ms,
        ), start


async def test_config_changes_reach_the_in_process_path_at_once(proxied) -> None:
    """The data route keeps the pool each path names until the routing state changes:
    version mode on, off, and the pool's last node deleted are seen by the next request."""
    api, _, addrs, calls = proxied
    body = orjson.dumps(item(1, "eth_getBalance", addrs[0], "0x3"))
    status, raw = await raw_rpc(api, body)
    assert status == 200 and b'"result"' in raw and calls["items"] == 1
    assert (await api.post(f"/{CHAIN}/setVersion", {"version": "blue"}))[0] == 200
    status, answer = await raw_rpc(api, body)
    assert status == 404 and b"version mode" in answer, answer
    assert (await api.post(f"/{CHAIN}/setVersion", {"version": None}))[0] == 200
    assert await raw_rpc(api, body) == (200, raw) and calls["items"] == 2
    for kind in ("state", "archive"):
        assert (await api.post(f"/{CHAIN}/deleteNode/{kind}"))[0] == 200
    status, answer = await raw_rpc(api, body)
    assert status == 404 and b"unknown chain" in answer, answer
    assert calls["items"] == 2


async def test_client_ids_of_in_process_answers_are_counted(proxied) -> None:
    """Singles and batches alike (each answered in process by one call)."""
    api, _, addrs, calls = proxied
    single = orjson.dumps(item(1, "eth_getBalance", addrs[0], "0x3"))
    batch = orjson.dumps([item(i, "eth_getStorageAt", addrs[0], "0x1", "0x3") for i in range(3)])
    for body in (single, batch):
        for headers in ({"Client-Id": "zed"}, {"client-id": "zed"}, {}):
            async with api.client.data.post(f"/{CHAIN}", data=body, headers=headers) as resp:
                assert resp.status == 200
    assert calls["items"] == 6  # all in process
    text = await metrics_text(api)
    zed = client_label("zed")
    assert scraped(text, "chainstate_proxy_client_requests_total", client_id=zed) == 4


async def test_the_access_log_turned_on_later_takes_the_engine_path(proxied, caplog) -> None:
    """The in-process path reads the access logger's memo of its level: a level set after
    requests were answered in process (the memo emptied) is seen by the next one."""
    api, _, addrs, calls = proxied
    body = orjson.dumps(item(1, "eth_getBalance", addrs[0], "0x3"))
    status, raw = await raw_rpc(api, body)
    assert status == 200 and calls["items"] == 1
    access = logging.getLogger("chainstate.proxy.access")
    level = access.level
    access.setLevel(logging.INFO)  # (as a config would: nothing asks isEnabledFor before)
    try:
        assert await raw_rpc(api, body) == (200, raw)
    finally:
        access.setLevel(level)
    assert calls["items"] == 1  # the engine's, which logs it
    assert [r.name for r in caplog.records] == ["chainstate.proxy.access"]
    assert await raw_rpc(api, body) == (200, raw) and calls["items"] == 2


async def test_a_chain_added_after_its_404_is_served_at_once(proxied) -> None:
    """An unknown chain's 404 is kept per path only until a pool for it is created."""
    api, _, addrs, _ = proxied
    body = orjson.dumps(item(1, "eth_getBalance", addrs[0], "0x3"))
    for _ in range(2):
        async with api.client.data.post("/7", data=body) as resp:
            assert resp.status == 404 and b"unknown chain" in await resp.read()
    _, nodes = await api.get(f"/{CHAIN}/getAllNodes")
    url = nodes["nodes"][0]["url"]
    status, answer = await api.post("/7/addNode", {"key": "s", "url": url, "kind": "state"})
    assert status == 201, answer
    async with api.client.data.post("/7", data=body) as resp:
        raw = await resp.read()
        assert resp.status == 200 and b"unknown chain" not in raw, raw


async def test_single_books_of_one_node_under_two_pool_objects_stay_apart(proxied) -> None:
    """The singles' books are kept per node and method (no key tuple), each entry for one
    pool: a node answering for another pool object (a pool rebuilt, say) is booked to that
    pool, and the node's own count is told every answer once, at the fold."""
    api, _, _, _ = proxied
    engine = api.proxy.engine
    books = inprocbooks.InprocBooks(engine.attempts, engine.metrics)
    pool = api.proxy.state.pools[CHAIN]
    other = Pool(id=pool.id)
    reader = pool.readers[0]
    told: list[float] = []  # (what the node's own count, `ItemsAnswered`, is told)
    before = pool.latency.get("eth_getBalance")
    counted = 0 if before is None else before.since + before.n
    books.single(CHAIN, pool, reader, told.extend, "eth_getBalance", 1e-5, 2e-5)
    books.single(CHAIN, other, reader, told.extend, "eth_getBalance", 3e-5, 4e-5)
    assert told == [1e-5]  # the other pool's entry folded the first one's in
    books.single(CHAIN, pool, reader, told.extend, "eth_getBalance", 5e-5, 6e-5)
    books.fold()
    mine, theirs = pool.latency["eth_getBalance"], other.latency["eth_getBalance"]
    assert mine.since + mine.n == counted + 2
    assert theirs.since + theirs.n == 1
    assert told == [1e-5, 3e-5, 5e-5]  # each answer once


async def test_with_tracing_on_plain_reads_take_the_engine_path(tmp_path: Path, make_api) -> None:
    """Tracing is decided once for the data route (`create_server`): with a tracer every body
    takes the engine's path, which records its spans; the answers are the same bytes."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    chain, addrs = random_chain(seed=41, blocks=24)
    api, node, calls = await start_proxied(
        tmp_path, make_api, chain, 24, tracer=provider.get_tracer("test")
    )
    try:
        body = orjson.dumps(item(1, "eth_getBalance", addrs[0], hex(3)))
        status, raw = await raw_rpc(api, body)
        assert status == 200 and raw == client_sees(body, await node.handle_body(body))
        assert calls["items"] == 0  # not the in-process path: it keeps no spans
        spans = exporter.get_finished_spans()
        assert any(s.name == "jsonrpc.request" for s in spans)
    finally:
        await node.close()


async def test_a_client_sees_null_and_standard_codes_in_process(proxied) -> None:
    """The public face through a real state node in process, singly and in batches, as the
    engine answers (proxy/face.py): a block above the head is `null` (the node's -39006 is
    retried, then shown as not found), a bad block id -32602, a vendor read keeps -39006;
    `eth_blockNumber` and the `latest` block agree."""
    api, node, addrs, _ = proxied
    cases = [
        (item(1, "eth_getBlockByNumber", "0x999", False), ("result", None)),
        (item(2, "eth_getBlockByHash", "0x" + "ab" * 32, False), ("result", None)),
        (item(3, "eth_getBalance", addrs[0], "0x999"), ("error", -32000)),
        (item(4, "eth_getBalance", addrs[0], "0xzz"), ("error", -32602)),
        (item(5, "getAddressBalance", addrs[0], {"block_id": "0x999"}), ("error", -39006)),
    ]

    def sees(answer: dict[str, Any], what: str, value: Any) -> bool:
        if what == "result":
            return "error" not in answer and answer["result"] == value
        return answer["error"]["code"] == value

    for request, (what, value) in cases:
        for _ in range(2):  # (a block text seen before: its kept route the second time)
            _, raw = await both(api, orjson.dumps(request))
            assert sees(orjson.loads(raw), what, value), raw
    _, raw = await both(api, orjson.dumps([request for request, _ in cases]))
    for answer, (_, (what, value)) in zip(orjson.loads(raw), cases, strict=True):
        assert sees(answer, what, value), answer
    direct = orjson.loads(await node.handle_body(orjson.dumps(cases[0][0])))
    assert direct["error"]["code"] == -39006  # the node itself keeps the spec's code
    batch = [item(1, "eth_blockNumber"), item(2, "eth_getBlockByNumber", "latest", False)]
    for _ in range(3):
        _, raw = await both(api, orjson.dumps(batch))
        number, block = orjson.loads(raw)
        assert number["result"] == block["result"]["number"]

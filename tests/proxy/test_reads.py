"""The read path: one head per request, the response cache, coalescing, reorgs (fake nodes)."""

from __future__ import annotations

import asyncio
import logging
import time

import orjson
import pytest
from aiohttp import web

from chainstate.config import ConfigError
from proxy.settings import CheckerSource, ProxySettings
from tests.conftest import free_port
from tests.proxy.conftest import ADDR, balance, fast_settings, req, wait_until
from tests.proxy.fakes import block_hash

NO_CACHE = {"cache_pools": ()}


def account(i: int) -> str:
    return f"0x{i:040x}"


async def chain_known(api, pool: str = "1337", nodes: int | None = None) -> None:
    """Wait until the proxy follows the pool's chain with every node's head on it."""
    await api.heads_known(pool)
    count = nodes if nodes is not None else len(api.proxy.state.pools[pool].readers)

    def ready() -> bool:
        view = api.proxy.reads.heads.views.get(pool)
        return view is not None and sum(view.on_chain(b) for b in view.tips.values()) >= count

    await wait_until(ready)


def view_of(api, pool: str = "1337"):
    return api.proxy.reads.heads.views[pool]


async def figures(api, pool: str = "1337") -> dict:
    status, body = await api.get(f"/{pool}/cache")
    assert status == 200, body
    return body


# ---- one head per request --------------------------------------------------------------


async def test_every_latest_item_of_a_request_gets_one_height(make_api, fake_nodes) -> None:
    """Replicas one block apart, and one of them failing eth_call (retried elsewhere): without
    pinning, the retried item can land on a node at another head; with it, every item (and
    eth_blockNumber) of a request is answered at one height."""
    a1 = await fake_nodes("a1", "state", head=1001)
    a2 = await fake_nodes("a2", "state", head=1001)
    b = await fake_nodes("b", "state", head=1000)
    a1.method_errors["eth_call"] = -39008  # UnsupportedPrecompile: retried on another node
    api = await make_api(fast_settings(**NO_CACHE, coalesce=False))
    for node in (a1, a2, b):
        await api.add("1337", node)
    await chain_known(api)
    batch = [req("eth_getBalance", [account(i), "latest"], i) for i in range(1, 6)]
    batch += [
        req("eth_call", [{"to": ADDR}], 10),  # block param left out: latest
        req("getAddressBalance", [ADDR], 11),  # blockCtx left out
        req("getAddressNonce", [ADDR, {"type": "Contains"}], 12),  # Contains without block_id
        req("eth_getStorageAt", {"address": ADDR, "position": "0x0"}, 13),  # named params
        req("eth_getBlockByNumber", ["latest", False], 14),
        req("getLatestBlock", [], 15),
        req("eth_blockNumber", [], 16),
    ]
    seen = set()

    def a1_failed_a_call() -> bool:
        return any(i["method"] == "eth_call" for i in a1.received)

    rounds = 0
    first = api.proxy.state.pools["1337"].find("a1")
    while rounds < 40 or (rounds < 400 and not a1_failed_a_call()):
        rounds += 1
        # a1 looks the fastest: chosen whenever it is drawn, its eth_calls then retried
        first.cost, first.cost_at = 0.0001, time.monotonic()
        status, answers = await api.rpc("1337", batch)
        assert status == 200
        number = int(answers[-1]["result"], 16)
        heights = {x["result"]["height"] for x in answers[:-1]}
        assert heights == {number}, answers
        seen.add(number)
    for _ in range(20):  # single requests too: pinned to a height their node holds
        answer = await api.call("1337", "eth_call", [{"to": ADDR}])
        assert "result" in answer, answer
        seen.add(answer["result"]["height"])
    # `latest` is the highest head, never lower once answered (b, at 1000, gets no pin)
    assert seen == {1001}
    assert not [i for i in b.received if i["method"] != "eth_blockNumber"]
    assert a1_failed_a_call()
    metrics = await (await api.client.get("/metrics")).text()
    assert 'reason="unsupported_precompile"' in metrics  # a1's eth_calls went elsewhere
    assert 'reason="block_not_found"' not in metrics  # every node held the height it got
    # Sent by the hash of a block the node holds (b: 1000 only).
    for node in (a1, a2, b):
        held = [{"blockHash": block_hash(h)} for h in range(1000, node.head + 1)]
        sent = [i["params"][1] for i in node.received if i["method"] == "eth_getBalance"]
        assert all(block in held for block in sent), (node.name, sent)


async def test_safe_and_finalized_are_the_checkers_confirmed_head(make_api, fake_nodes) -> None:
    node = await fake_nodes("state-1", "state")
    checker_port = free_port()
    app = web.Application()

    async def confirmed(request: web.Request) -> web.Response:
        rid = (await request.json())["id"]
        result = {"id": block_hash(998), "num": 998, "validation_hash": 1, "is_fork": False}
        return web.json_response({"jsonrpc": "2.0", "id": rid, "result": result})

    app.router.add_post("/", confirmed)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", checker_port).start()
    try:
        checker = CheckerSource("1337", f"http://127.0.0.1:{checker_port}")
        api = await make_api(fast_settings(checkers=(checker,)))
        await api.add("1337", node)
        await chain_known(api)
        await wait_until(lambda: view_of(api).confirmed is not None)
        for tag in ("safe", "finalized"):
            answer = await api.call("1337", "eth_getBalance", [ADDR, tag])
            assert answer["result"]["height"] == 998, tag
        assert node.received[-1]["params"][1] == {"blockHash": block_hash(998)}
        assert (await api.call("1337", "eth_getBalance", [ADDR]))["result"]["height"] == 1000
        body = await figures(api)
        assert body["chain"]["confirmed"] == 998 and body["checker"].endswith(str(checker_port))
    finally:
        await runner.cleanup()


async def test_without_a_checker_safe_is_latest(two) -> None:
    api, _, _ = two
    await chain_known(api)
    for tag in ("safe", "finalized", "latest"):
        answer = await api.call("1337", "eth_getBalance", [account(7), tag])
        assert answer["result"]["height"] == 1000, tag


# ---- the cache -------------------------------------------------------------------------


async def test_a_cached_read_skips_the_node_and_keeps_the_clients_id(two) -> None:
    api, state, _ = two
    await chain_known(api)
    first = await api.call("1337", "eth_getBalance", [ADDR, "latest"], rid=1)
    asked = len(state.received)
    again = await api.call("1337", "eth_getBalance", [ADDR, "latest"], rid="x")
    assert again == {**first, "id": "x"} and len(state.received) == asked
    # The head's height names the same block: the same entry (so does the block left out).
    by_height = await api.call("1337", "eth_getBalance", [ADDR, "0x3e8"], rid=2.5)
    assert by_height == {**first, "id": 2.5} and len(state.received) == asked
    assert (await api.call("1337", "eth_getBalance", [ADDR]))["result"] == first["result"]
    # A batch of hits and misses keeps the client's order and ids.
    batch = [balance(rid=7), req("eth_getBalance", [account(9), "latest"], 7), balance(rid=None)]
    _, answers = await api.rpc("1337", batch)
    assert [x["id"] for x in answers] == [7, 7, None]
    assert [x["result"]["height"] for x in answers] == [1000, 1000, 1000]
    assert len(state.received) == asked + 1
    body = await figures(api)
    assert body["cache"]["hits"] == 5 and body["cache"]["stores"] == 3  # and the whole batch
    assert body["cache"]["entries"] == 3 and body["cache"]["bytes"] > 0
    assert body["cache"]["batches"] == 1
    # The same batch again: answered as a whole (its bytes as before), no node asked.
    assert (await api.rpc("1337", batch))[1] == answers and len(state.received) == asked + 1
    assert (await figures(api))["cache"]["hits"] == 8
    metrics = await (await api.client.get("/metrics")).text()
    assert 'chainstate_proxy_cache_lookups_total{outcome="hit",pool="1337"} 8.0' in metrics
    assert 'method="eth_getBalance",node="cache",outcome="ok"' in metrics


async def test_a_partly_cached_batch_sends_the_rest_with_the_clients_ids(
    make_api, fake_nodes
) -> None:
    """A batch with a cache hit: the other items go to a node as one sub-batch with the
    client's ids, and its answers are taken in order when they come in order (no per-item
    matching), by id when they do not; an item whose answer asks for another attempt is
    still retried elsewhere, and metrics count each method and node."""
    a = await fake_nodes("a", "state")
    b = await fake_nodes("b", "state")
    a.method_errors["eth_call"] = -39008  # UnsupportedPrecompile: retried on another node
    b.delay = 0.06  # a is the faster node, by a margin a loaded machine keeps: the
    # sub-batches go to a first
    api = await make_api(fast_settings(coalesce=False))
    await api.add("1337", a)
    await api.add("1337", b)
    await chain_known(api)
    hit = await api.call("1337", "eth_getBalance", [ADDR, "latest"], rid=1)
    methods = ("eth_getBalance", "eth_getTransactionCount", "eth_getCode", "eth_call")
    reversed_from = 1 << 30  # a's sub-batches sent before it answered out of order
    for n in range(40):
        if n == 20:  # answers out of order, nothing to retry: matched by their ids
            a.reverse, a.method_errors = True, {}
        batch = [balance(rid="hit")]
        batch += [req(m, [account(10 * n + i), "latest"], 10 + i) for i, m in enumerate(methods)]
        batch[-1]["params"][0] = {"to": account(n + 1)}
        _, answers = await api.rpc("1337", batch)
        assert [x["id"] for x in answers] == ["hit", 10, 11, 12, 13]
        assert answers[0] == {**hit, "id": "hit"}
        assert [x["result"]["method"] for x in answers[1:]] == list(methods), answers
        if n < 20:
            assert answers[-1]["result"]["node"] == "b"  # a's -39008 was retried on b
        elif len(a.bodies) > reversed_from + 2:
            break
        else:
            reversed_from = min(reversed_from, len(a.bodies))
    assert len(a.data_items("eth_call")) > 4, "a got too few sub-batches"
    assert len(a.bodies) > reversed_from + 2, "a answered too few sub-batches out of order"
    metrics = await (await api.client.get("/metrics")).text()
    for method in methods[:3]:
        assert f'method="{method}",node="' in metrics
    assert 'method="eth_call",node="b",outcome="ok"' in metrics
    assert 'reason="unsupported_precompile"' in metrics  # the retry of a's answers


async def test_what_is_never_cached(make_api, fake_nodes) -> None:
    state = await fake_nodes("state-1", "state")
    writer = await fake_nodes("w1", "state")
    api = await make_api()
    await api.add("1337", state)
    assert (
        await api.post("/1337/writers/addWriter", {"key": "w1", "url": writer.url, "leader": True})
    )[0] == 201
    await chain_known(api)
    tx = "0x" + "ab" * 32
    for _ in range(2):
        await api.call("1337", "eth_sendRawTransaction", [tx])  # the transaction lifecycle
        await api.call("1337", "eth_getBalance", [ADDR, "pending"])  # pending: the Leader
        await api.call("1337", "eth_getBalance", [ADDR, "0x3e0"])  # a block it has no hash of
        await api.call("1337", "eth_chainId", [])  # not a read at a block
    assert len(writer.data_items("eth_sendRawTransaction")) == 2
    assert len(writer.data_items("eth_getBalance")) == 2
    assert len(state.data_items("eth_getBalance")) == 2
    assert len(state.data_items("eth_chainId")) == 2
    state.error_code = -39000  # errors (a revert) are not kept
    for _ in range(2):
        assert "error" in await api.call("1337", "eth_call", [{"to": ADDR}, "latest"])
    assert len(state.data_items("eth_call")) == 2
    assert (await figures(api))["cache"]["stores"] == 0


async def test_cache_off_for_a_pool(make_api, fake_nodes) -> None:
    node = await fake_nodes("state-1", "state")
    other = await fake_nodes("state-2", "state")
    api = await make_api(fast_settings(cache_pools=("1",)))
    await api.add("1337", node)
    await api.add("1", other)
    await chain_known(api, "1337")
    await chain_known(api, "1")
    for _ in range(2):
        await api.call("1337", "eth_getBalance", [ADDR])
        await api.call("1", "eth_getBalance", [ADDR])
    assert len(node.received) == 2 and len(other.received) == 1
    assert (await figures(api, "1337"))["cache"]["enabled"] is False


async def test_admin_flush_and_figures(two) -> None:
    api, state, _ = two
    await chain_known(api)
    await api.call("1337", "eth_getBalance", [ADDR])
    _, nodes = await api.get("/1337/getAllNodes")
    assert nodes["cache"]["entries"] == 1 and nodes["cache"]["enabled"] is True
    status, body = await api.post("/1337/cache/flush")
    assert status == 200 and body["flushed"] == 1 and body["entries"] == 0
    await api.call("1337", "eth_getBalance", [ADDR])
    assert len(state.received) == 2  # asked again after the flush
    assert (await api.post("/1/cache/flush"))[0] == 404
    assert (await api.get("/1/cache"))[0] == 404
    body = await figures(api)
    assert body["cache"]["flushed"] == 1 and body["chain"]["tip"] == 1000
    assert body["chain"]["nodes"]["state-1"]["on_chain"] is True


async def test_the_byte_budget_evicts_least_recently_used(make_api, fake_nodes) -> None:
    node = await fake_nodes("state-1", "state")
    api = await make_api(fast_settings(cache_max_bytes=2000))
    await api.add("1337", node)
    await chain_known(api)
    for i in range(20):
        await api.call("1337", "eth_getBalance", [account(i)])
    body = (await figures(api))["cache"]
    assert body["bytes"] <= 2000 and body["evicted"] > 0
    assert body["entries"] + body["evicted"] == 20
    asked = len(node.received)
    await api.call("1337", "eth_getBalance", [account(19)])  # the newest is still there
    assert len(node.received) == asked
    await api.call("1337", "eth_getBalance", [account(0)])  # the oldest was evicted
    assert len(node.received) == asked + 1


async def test_an_answer_asked_before_a_flush_is_not_kept_or_shared_after_it(
    make_api, fake_nodes
) -> None:
    """A flush (an operator's, or the checker flagging a replica) also covers the reads in
    flight: their answers are not stored, and reads made after it ask a node themselves."""
    node = await fake_nodes("state-1", "state")
    api = await make_api()
    await api.add("1337", node)
    await chain_known(api)
    node.delay = 0.3
    before = asyncio.ensure_future(api.call("1337", "eth_getBalance", [ADDR], rid=1))
    await wait_until(lambda: len(node.data_items("eth_getBalance")) == 1)
    assert (await api.post("/1337/cache/flush"))[0] == 200
    after = asyncio.ensure_future(api.call("1337", "eth_getBalance", [ADDR], rid=2))
    await wait_until(lambda: len(node.data_items("eth_getBalance")) == 2)  # not shared
    assert [x["id"] for x in await asyncio.gather(before, after)] == [1, 2]
    node.delay = 0.0
    assert (await figures(api))["cache"]["entries"] == 1  # the one asked after the flush
    await api.call("1337", "eth_getBalance", [ADDR], rid=3)
    assert len(node.data_items("eth_getBalance")) == 2  # served from it


# ---- coalescing ------------------------------------------------------------------------


async def test_identical_reads_in_flight_share_one_call(make_api, fake_nodes) -> None:
    node = await fake_nodes("state-1", "state")
    api = await make_api(fast_settings(**NO_CACHE))
    await api.add("1337", node)
    await chain_known(api)
    node.delay = 0.3
    singles = [api.call("1337", "eth_getBalance", [ADDR], rid=i) for i in range(12)]
    batches = [
        api.rpc("1337", [balance(rid=f"b{i}"), req("eth_getBalance", [account(5)], i)])
        for i in range(4)
    ]
    answers = await asyncio.gather(*singles, *batches)
    assert [x["id"] for x in answers[:12]] == list(range(12))
    for i, (status, pair) in enumerate(answers[12:]):
        assert status == 200 and [x["id"] for x in pair] == [f"b{i}", i]
    assert all(x["result"]["height"] == 1000 for x in answers[:12])
    assert len(node.data_items("eth_getBalance")) == 2  # one call per distinct read
    assert (await figures(api))["cache"]["coalesced"] == 12 + 4 + 4 - 2


async def test_writes_and_pending_reads_are_never_coalesced(make_api, fake_nodes) -> None:
    state = await fake_nodes("state-1", "state")
    writer = await fake_nodes("w1", "state")
    api = await make_api()
    await api.add("1337", state)
    await api.post("/1337/writers/addWriter", {"key": "w1", "url": writer.url, "leader": True})
    await chain_known(api)
    writer.delay = 0.2
    raw_tx = "0x02f8"
    await asyncio.gather(
        *(api.call("1337", "eth_sendRawTransaction", [raw_tx], rid=i) for i in range(3)),
        *(api.call("1337", "eth_call", [{"to": ADDR}, "pending"], rid=i) for i in range(3)),
    )
    assert len(writer.data_items("eth_sendRawTransaction")) == 3
    assert len(writer.data_items("eth_call")) == 3


async def test_a_cancelled_leader_lets_its_followers_ask_themselves(make_api, fake_nodes) -> None:
    node = await fake_nodes("state-1", "state")
    api = await make_api(fast_settings(**NO_CACHE))
    await api.add("1337", node)
    await chain_known(api)
    node.delay = 0.3
    engine = api.proxy.engine
    body = orjson.dumps(balance())
    leader = asyncio.ensure_future(engine.handle("1337", body, {}))
    await wait_until(lambda: api.proxy.reads.coalescer.flights)
    follower = asyncio.ensure_future(engine.handle("1337", orjson.dumps(balance(rid=2)), {}))
    await asyncio.sleep(0.05)
    leader.cancel()
    status, out = await follower
    assert status == 200 and orjson.loads(out)["result"]["height"] == 1000
    assert orjson.loads(out)["id"] == 2 and not api.proxy.reads.coalescer.flights


# ---- reorgs ----------------------------------------------------------------------------


async def test_a_reorg_drops_the_cached_answers_of_the_dropped_blocks(
    make_api, fake_nodes, caplog
) -> None:
    caplog.set_level(logging.WARNING, logger="proxy.heads")
    node = await fake_nodes("state-1", "state")
    api = await make_api()
    await api.add("1337", node)
    await chain_known(api)
    first = await api.call("1337", "eth_getBalance", [ADDR])
    assert node.received[-1]["params"][1] == {"blockHash": block_hash(1000)}
    node.reorg(999, fork=1)  # blocks 999 and 1000 are replaced
    await wait_until(lambda: view_of(api).reorgs == 1)
    assert view_of(api).hash_at(1000) == block_hash(1000, 1)
    assert (await figures(api))["cache"]["dropped"] == 1
    asked = len(node.received)
    again = await api.call("1337", "eth_getBalance", [ADDR])
    assert again == first and len(node.received) == asked + 1  # asked at the new block
    assert node.received[-1]["params"][1] == {"blockHash": block_hash(1000, 1)}
    assert any("reorg seen on node state-1" in r.getMessage() for r in caplog.records)


async def test_a_batch_is_kept_whole_only_when_its_latest_block_determines_it(
    make_api, fake_nodes
) -> None:
    """A batch answered again as a whole (the same bytes at the same `latest` block) only
    when every item was answered at that block or an ancestor named by hash; after a
    reorg the same bytes are asked again at the new block."""
    node = await fake_nodes("state-1", "state")
    api = await make_api()
    await api.add("1337", node)
    await chain_known(api)
    whole = [balance(rid=1), req("eth_blockNumber", [], 2), req("eth_getCode", [ADDR, "0x3e8"], 3)]
    first = (await api.rpc("1337", whole))[1]
    asked = len(node.received)
    assert (await api.rpc("1337", whole))[1] == first and len(node.received) == asked
    assert (await figures(api))["cache"]["batches"] == 1
    not_whole = [
        [balance(rid=1), balance("safe", 2)],  # the checker's head moves on its own
        [balance(rid=1), balance("pending", 2)],  # the Leader's
        [balance(rid=1), req("eth_chainId", [], 2)],  # not a cached method
        [balance(rid=1), balance("0x3e9", 2)],  # above the head: an error
        [balance(rid=1), req("eth_getBalance", [ADDR, "latest"])],  # ...and a notification
    ]
    not_whole[-1][1].pop("id")
    for batch in not_whole:
        await api.rpc("1337", batch)
    assert (await figures(api))["cache"]["batches"] == 1
    node.reorg(999, fork=1)  # the head (also the fixed height 0x3e8) is replaced
    await wait_until(lambda: view_of(api).reorgs == 1)
    asked = len(node.received)
    again = (await api.rpc("1337", whole))[1]
    assert again == first and len(node.received) == asked + 2  # both asked again
    new_head = {"blockHash": block_hash(1000, 1)}
    assert [i["params"][1] for i in node.received[-2:]] == [new_head, new_head]


async def test_a_flagged_replica_never_sets_the_pinned_head(make_api, fake_nodes) -> None:
    """A replica the checker flags, one block ahead of the others: were its head pinned, the
    good replicas would answer -39006 (they do not hold it) and the client would get an error."""
    liar = await fake_nodes("liar", "state", head=1001)
    good = await fake_nodes("good", "state", head=1000)
    api = await make_api(fast_settings(**NO_CACHE, coalesce=False))
    await api.add("1337", liar)
    await api.add("1337", good)
    await chain_known(api)
    flagged = api.proxy.state.pools["1337"].find("liar")
    flagged.diverged = {"height": 1000, "checker": "http://checker"}
    flagged.update_blocked()
    for i in range(20):
        flagged.cost, flagged.cost_at = 0.0001, time.monotonic()  # it would win every pick
        answer = await api.call("1337", "eth_call", [{"to": ADDR}], rid=i)
        assert answer.get("result", {}).get("height") == 1000, answer
    assert not [i for i in liar.received if i["method"] == "eth_call"]


async def test_a_node_left_on_a_dropped_fork_gets_no_latest_reads(make_api, fake_nodes) -> None:
    a = await fake_nodes("a", "state")
    b = await fake_nodes("b", "state")
    api = await make_api(fast_settings(**NO_CACHE, coalesce=False))
    await api.add("1337", a)
    await api.add("1337", b)
    await chain_known(api)
    a.reorg(999, fork=1)  # a saw the reorg, b has not yet
    await wait_until(lambda: view_of(api).reorgs == 1)
    await asyncio.sleep(0.2)  # b keeps reporting the dropped block: it stays off the chain
    assert view_of(api).hash_at(1000) == block_hash(1000, 1)
    assert not view_of(api).on_chain(view_of(api).tips["b"])
    for i in range(10):
        await api.call("1337", "eth_getBalance", [ADDR], rid=i)
    pinned = [i for i in (*a.received, *b.received) if i["method"] == "eth_getBalance"]
    assert all(i["params"][1] == {"blockHash": block_hash(1000, 1)} for i in pinned)
    b.reorg(999, fork=1)  # b catches up with the reorg
    await wait_until(lambda: view_of(api).on_chain(view_of(api).tips["b"]))
    assert view_of(api).reorgs == 1


async def test_a_chain_that_grows_or_shortens_is_followed(make_api, fake_nodes) -> None:
    node = await fake_nodes("state-1", "state")
    api = await make_api()
    await api.add("1337", node)
    await chain_known(api)
    node.head = 1004  # four blocks at once: the three in between are fetched
    await wait_until(lambda: view_of(api).tip == 1004)
    assert [view_of(api).hash_at(h) for h in range(1000, 1005)] == [
        block_hash(h) for h in range(1000, 1005)
    ]
    node.head = 1002  # rolled back to a shorter chain on another fork
    node.reorg(1001, fork=2)
    await wait_until(lambda: view_of(api).tip == 1002)
    assert view_of(api).hash_at(1002) == block_hash(1002, 2)
    assert view_of(api).hash_at(1003) is None and view_of(api).reorgs == 1


async def test_a_stale_pin_is_asked_again_by_height(make_api, fake_nodes) -> None:
    """A reorg the proxy has not polled yet: the node does not know the pinned hash, the
    item is asked again by height (answered, not cached)."""
    node = await fake_nodes("state-1", "state")
    api = await make_api()
    await api.add("1337", node)
    await chain_known(api)
    api.proxy.tracker.interval = 60.0  # no more polls after the one under way
    await asyncio.sleep(0.2)
    node.reorg(1000, fork=3)
    answer = await api.call("1337", "eth_getBalance", [account(3)])
    assert answer["result"]["height"] == 1000
    sent = [i["params"][1] for i in node.data_items("eth_getBalance")]
    assert sent == [{"blockHash": block_hash(1000)}, "0x3e8"]
    assert (await figures(api))["cache"]["stores"] == 0


async def test_a_stale_pin_in_a_batch_is_asked_again_by_height(make_api, fake_nodes) -> None:
    """The same in a batch sent as one body with its pinned items (cache off): only the
    items whose pinned block the node no longer knows are asked again, by height, and
    every answer keeps its place and id."""
    node = await fake_nodes("state-1", "state")
    api = await make_api(fast_settings(**NO_CACHE))
    await api.add("1337", node)
    await chain_known(api)
    api.proxy.tracker.interval = 60.0  # no more polls after the one under way
    await asyncio.sleep(0.2)
    node.reorg(1000, fork=3)
    batch = [
        req("eth_getBalance", [account(3), "latest"], "a"),
        req("eth_getBalance", [account(4), "0x3e7"], 7),
        req("eth_getBalance", [account(5), "0x3e8"], "c"),
    ]
    status, answers = await api.rpc("1337", batch)
    assert status == 200 and [a["id"] for a in answers] == ["a", 7, "c"]
    assert [a["result"]["height"] for a in answers] == [1000, 999, 1000]
    sent = [i["params"][1] for i in node.data_items("eth_getBalance")]
    pinned = {"blockHash": block_hash(1000)}  # (999: sent as it is, its hash not kept)
    assert sent[:3] == [pinned, "0x3e7", pinned] and sent[3:] == ["0x3e8", "0x3e8"]


async def test_a_node_without_the_pinned_block_is_not_asked_by_height_first(
    make_api, fake_nodes
) -> None:
    """A node that does not know the pinned hash (behind, or on another fork the proxy has
    not polled): another node holding the block answers by hash; asking that node by
    height could answer from a block a reorg dropped."""
    a = await fake_nodes("a", "state")
    b = await fake_nodes("b", "state")
    api = await make_api()
    await api.add("1337", a)
    await api.add("1337", b)
    await chain_known(api)
    api.proxy.tracker.interval = 60.0  # no more polls after the one under way
    await asyncio.sleep(0.2)
    b.reorg(1000, fork=3)  # b's block 1000 is another one now
    first = api.proxy.state.pools["1337"].find("b")
    first.cost, first.cost_at = 0.0001, time.monotonic()  # looks the fastest: asked first
    answer = await api.call("1337", "eth_getBalance", [account(4)])
    assert answer["result"]["node"] == "a"
    pinned = {"blockHash": block_hash(1000)}
    assert [i["params"][1] for i in b.data_items("eth_getBalance")] == [pinned]
    assert [i["params"][1] for i in a.data_items("eth_getBalance")] == [pinned]


# ---- settings --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "proxy",
    [
        {"cache_methods": ["eth_sendRawTransaction"]},  # a write
        {"cache_methods": ["eth_chainId"]},  # no block
        {"cache_methods": "eth_call"},
        {"cache_pools": ["not a pool"]},
        {"cache_max_bytes": -1},
        {"coalesce": "yes"},
        {"head_history": 0},
        {"checkers": [{"chain": "1337", "url": "ftp://x"}]},
        {"checkers": [{"chain": "1337", "url": "http://x", "extra": 1}]},
    ],
)
def test_bad_read_settings_are_refused(proxy: dict) -> None:
    with pytest.raises(ConfigError):
        ProxySettings.from_config({"proxy": proxy})


def test_read_settings_from_config() -> None:
    settings = ProxySettings.from_config(
        {
            "proxy": {
                "cache_methods": ["eth_call"],
                "cache_pools": ["1337", "1-blue"],
                "cache_max_bytes": 0,
                "checkers": [{"chain": "1337", "url": "http://127.0.0.1:8667"}],
            }
        }
    )
    assert settings.cache_methods == ("eth_call",) and settings.cache_pools == ("1337", "1-blue")
    assert settings.checkers[0].url == "http://127.0.0.1:8667"
    assert ProxySettings().cache_pools == ("*",) and ProxySettings().coalesce is True


async def test_odd_ids_come_back_as_written_on_every_read_path(two) -> None:
    """Ids orjson would change, through a pinned miss (re-encoded) and a hit."""
    api, _, _ = two
    await chain_known(api)
    for rid in (b"1e-400", b"18446744073709551616", b"1.50"):
        body = b'{"jsonrpc":"2.0","id":%s,"method":"eth_getBalance","params":["%s"]}' % (
            rid,
            account(int(float(rid)) % 1000 + 1).encode(),
        )
        for _ in range(2):  # a miss sent to the node, then a hit
            async with api.client.data.post("/1337", data=body) as resp:
                raw = await resp.read()
            assert raw.startswith(b'{"jsonrpc":"2.0","id":%s,' % rid), raw
    batch = b'[{"jsonrpc":"2.0","id":1e-400,"method":"eth_getBalance","params":["%s"]}]' % (
        account(77).encode()
    )
    for _ in range(2):
        async with api.client.data.post("/1337", data=batch) as resp:
            raw = await resp.read()
        assert raw.startswith(b'[{"jsonrpc":"2.0","id":1e-400,'), raw

"""The synchronous first attempt (`Engine.start`): a plain single request is written to an
idle node connection from the data listener's callback, with no task, and answered from the
node connection's callback. What must stay as the engine's task path keeps it: retries,
timeouts, a connection the node closed, the books counted once, pipelined order."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson

from chainstate.jsonrpc import BLOCK_NOT_FOUND
from proxy.app import get_proxy
from proxy.metrics import client_label
from tests.proxy.conftest import ADDR, fast_settings, wait_until

# No cache: a read at a height is then always sent to a node (the read path plans nothing).
NO_CACHE = {"cache_pools": ()}
HEAD = b"POST /1337 HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"


def body(rid: int) -> bytes:
    params = b'["%s","0x3e8"]' % ADDR.encode()
    return b'{"jsonrpc":"2.0","id":%d,"method":"eth_getBalance","params":%s}' % (rid, params)


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, Any]:
    async with asyncio.timeout(5):  # an answer that never comes fails the test
        status = int((await reader.readline()).split()[1])
        length = 0
        while (line := await reader.readline()) != b"\r\n":
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        return status, orjson.loads(await reader.readexactly(length))


async def metric(api, name: str, **labels: str) -> float:
    """The value of one sample of /metrics (0 when absent)."""
    text = await (await api.client.get("/metrics")).text()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(name + "{"):
            got = ",".join(sorted(line.split("{", 1)[1].split("}", 1)[0].split(",")))
            if got == want:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


# Coroutines of the proxy's request path that a task may run (their classes' qualnames).
PROXY_TASKS = ("Engine.", "FirstAttempt.", "Pipeline.", "Rounds.", "ReadPath.", "_Connection.")


class TaskNames:
    """Names of the proxy's own tasks created while installed (the loop's task factory)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.loop = asyncio.get_running_loop()
        self.previous = self.loop.get_task_factory()

    def __enter__(self) -> list[str]:
        def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task:
            name = getattr(coro, "__qualname__", "")
            if name.startswith(PROXY_TASKS):
                self.names.append(name)
            return asyncio.Task(coro, loop=loop, **kw)

        self.loop.set_task_factory(factory)
        return self.names

    def __exit__(self, *exc: object) -> None:
        self.loop.set_task_factory(self.previous)


async def test_a_plain_read_is_forwarded_and_answered_without_a_task(make_api, fake_nodes):
    node = await fake_nodes("s", "state")
    api = await make_api(fast_settings(**NO_CACHE))
    await api.add("1337", node)
    reader, writer = await asyncio.open_connection("127.0.0.1", api.client.server.port)
    writer.write(HEAD % len(body(0)) + body(0))  # opens the proxy's connection to the node
    assert (await read_answer(reader))[1]["result"]
    with TaskNames() as tasks:
        for rid in range(1, 6):
            writer.write(HEAD % len(body(rid)) + body(rid))
            status, answer = await read_answer(reader)
            assert status == 200 and answer["id"] == rid and answer["result"], answer
    writer.close()
    assert tasks == [], tasks
    # The books after the answer, once per request: outcome, attempt, latency, in flight.
    assert await metric(
        api, "chainstate_proxy_requests_total",
        chain="1337", method="eth_getBalance", node="s", outcome="ok",
    ) == 6  # fmt: skip
    attempts = await metric(
        api, "chainstate_proxy_upstream_attempts_total", chain="1337", node="s", outcome="ok"
    )
    assert attempts == 6
    seconds = await metric(
        api, "chainstate_proxy_request_seconds_count", chain="1337", shape="single"
    )
    assert seconds == 6
    engine = get_proxy(api.client.app).engine
    pool = engine.state.pool_for_chain("1337")
    assert engine.inflight == 0 and pool.inflight == 0
    assert all(n.inflight == 0 for n in pool.nodes.values())


async def test_pipelined_requests_answered_in_order_from_the_callbacks(make_api, fake_nodes):
    node = await fake_nodes("s", "state")
    api = await make_api(fast_settings(**NO_CACHE))
    await api.add("1337", node)
    reader, writer = await asyncio.open_connection("127.0.0.1", api.client.server.port)
    writer.write(HEAD % len(body(0)) + body(0))
    await read_answer(reader)
    # Ten at once: the first takes the idle connection, the others wait in the engine's
    # task path for a connection of their own; the answers come back in request order.
    writer.write(b"".join(HEAD % len(body(rid)) + body(rid) for rid in range(1, 11)))
    ids = [(await read_answer(reader))[1]["id"] for _ in range(10)]
    writer.close()
    assert ids == list(range(1, 11))


async def test_an_answer_that_asks_for_a_retry_is_retried_on_another_node(make_api, fake_nodes):
    missing, good = await fake_nodes("missing", "state"), await fake_nodes("good", "state")
    missing.method_errors["eth_getBalance"] = BLOCK_NOT_FOUND
    api = await make_api(fast_settings(hedge_budget=0, attempt_timeout_min=1.0, **NO_CACHE))
    await api.add("1337", missing, weight=1000)  # always the cheaper of the two: asked first
    await api.add("1337", good)
    await api.heads_known("1337")
    reader, writer = await asyncio.open_connection("127.0.0.1", api.client.server.port)
    for rid in range(20):  # both nodes' connections open after a few: the fast path's case
        writer.write(HEAD % len(body(rid)) + body(rid))
        status, answer = await read_answer(reader)
        assert status == 200 and answer["id"] == rid, answer
        assert answer["result"]["node"] == "good", answer
    writer.close()
    asked = len(missing.data_items())
    assert asked == 20 and len(good.data_items()) == 20
    retries = await metric(
        api, "chainstate_proxy_retries_total", chain="1337", reason="block_not_found"
    )
    assert retries == asked
    ok = await metric(
        api, "chainstate_proxy_requests_total",
        chain="1337", method="eth_getBalance", node="good", outcome="ok",
    )  # fmt: skip
    assert ok == 20


async def test_a_node_that_hangs_times_out_and_the_retry_answers(make_api, fake_nodes):
    hangs, good = await fake_nodes("hangs", "state"), await fake_nodes("good", "state")
    settings = fast_settings(
        upstream_timeout=0.3, hedge_budget=0, attempt_timeout_min=0.3, **NO_CACHE
    )
    api = await make_api(settings)
    # `hangs` weighs 100× `good`: the pick (cost × in flight / weight) takes it while its cost
    # is not 100× good's, even when its first answer was slow on a busy machine (CI).
    await api.add("1337", hangs, weight=100)
    reader, writer = await asyncio.open_connection("127.0.0.1", api.client.server.port)
    writer.write(HEAD % len(body(0)) + body(0))  # an idle connection to `hangs` to take
    assert (await read_answer(reader))[1]["result"]
    await api.add("1337", good)
    hangs.delay = 5.0
    loop = asyncio.get_running_loop()
    for rid in range(1, 30):
        started = loop.time()
        writer.write(HEAD % len(body(rid)) + body(rid))
        status, answer = await read_answer(reader)
        assert status == 200 and answer["result"]["node"] == "good", answer
        if len(hangs.data_items()) == 2:  # this one went to `hangs` first
            assert loop.time() - started >= 0.3
            break
    else:
        raise AssertionError("`hangs` was never chosen")
    writer.close()
    timeouts = await metric(
        api,
        "chainstate_proxy_upstream_attempts_total",
        chain="1337",
        node="hangs",
        outcome="timeout",
    )
    assert timeouts == 1
    engine = get_proxy(api.client.app).engine
    assert engine.inflight == 0 and engine.upstream.deadlines.__len__() == 0


async def test_an_idle_connection_the_node_closed_is_replaced(make_api) -> None:
    """A node that closes a kept-alive connection as the request arrives (without answering):
    the request goes again on a fresh connection, and it is not a failed attempt."""
    served = {"answered": 0, "dropped": 0}

    async def node(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answered = 0
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                request = orjson.loads(await reader.readexactly(length))
                if request["method"] == "eth_getBalance" and answered:
                    served["dropped"] += 1
                    break  # closes a connection that answered before, leaving this unanswered
                result: Any = "0x7"
                if request["method"] == "blockx_range":
                    result = {"earliest": 0, "latest": 1000}
                elif request["method"] == "eth_blockNumber":
                    result = "0x3e8"
                out = orjson.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result})
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(out), out))
                if request["method"] == "eth_getBalance":
                    answered += 1
                    served["answered"] += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(node, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        api = await make_api(fast_settings(**NO_CACHE))
        await api.post("/1337/addNode", {"key": "n", "url": f"http://127.0.0.1:{port}"})
        reader, writer = await asyncio.open_connection("127.0.0.1", api.client.server.port)
        for rid in range(3):
            writer.write(HEAD % len(body(rid)) + body(rid))
            status, answer = await read_answer(reader)
            assert status == 200 and answer == {"jsonrpc": "2.0", "id": rid, "result": "0x7"}
        writer.close()
        assert served == {"answered": 3, "dropped": 2}
        failed = await metric(
            api,
            "chainstate_proxy_upstream_attempts_total",
            chain="1337",
            node="n",
            outcome="connect",
        )
        assert failed == 0
    finally:
        server.close()


# ---- the first write before the request's objects (`FirstAttempt.kept_route`) -------------


async def test_a_kept_route_still_checks_the_other_params_of_every_request(make_api, fake_nodes):
    """The route of a block text is kept after its first request, not its params: a bad
    address at that block is answered by the proxy as the general path answers it, and
    never reaches the node."""
    node = await fake_nodes("s", "state")
    api = await make_api(fast_settings(**NO_CACHE))
    await api.add("1337", node)
    reader, writer = await asyncio.open_connection("127.0.0.1", api.client.server.port)
    for rid in range(3):  # the first opens the node connection, the others take it
        writer.write(HEAD % len(body(rid)) + body(rid))
        assert (await read_answer(reader))[1]["result"]
    bad = b'{"jsonrpc":"2.0","id":7,"method":"eth_getBalance","params":["0x12","0x3e8"]}'
    writer.write(HEAD % len(bad) + bad)
    status, answer = await read_answer(reader)
    writer.close()
    engine = get_proxy(api.client.app).engine
    general = await engine.handle("1337", bad, {})  # the engine's general path
    assert (status, answer) == (general[0], orjson.loads(general[1]))
    assert answer["error"]["code"] == -32602, answer
    assert len(node.data_items("eth_getBalance")) == 3


async def test_a_lone_plain_http_node_is_written_to_before_any_object(make_api, fake_nodes):
    """A pool of one plain-http node: once its connection is open, each plain read is
    written to it from its kept route (the general steps' first attempt is never asked),
    and answered as the general path answers it."""
    node = await fake_nodes("s", "state")
    api = await make_api(fast_settings(**NO_CACHE))
    await api.add("1337", node)
    engine = get_proxy(api.client.app).engine
    general = engine.first._first
    asked: list[int] = []

    def first_attempt(ctx: Any, item: Any, *args: Any, **kw: Any) -> Any:
        asked.append(item.rid)
        return general(ctx, item, *args, **kw)

    engine.first._first = first_attempt  # type: ignore[method-assign]
    reader, writer = await asyncio.open_connection("127.0.0.1", api.client.server.port)
    for rid in range(4):  # the first opens the node connection, the others take it
        writer.write(HEAD % len(body(rid)) + body(rid))
        status, answer = await read_answer(reader)
        assert status == 200 and answer["id"] == rid and answer["result"], answer
    writer.close()
    assert asked == [0]
    assert len(node.data_items("eth_getBalance")) == 4


async def proxy_knowing_head(make_api, fake_nodes):
    """A proxy (cache on) in front of one fake state node, once it knows the hash of the
    node's head (block 1000): the node, the API client and the proxy's read path."""
    node = await fake_nodes("s", "state")
    api = await make_api(fast_settings())
    await api.add("1337", node)
    await api.heads_known("1337")
    reads = get_proxy(api.client.app).reads
    await wait_until(lambda: 1000 in reads.heads.views["1337"].hashes)
    return node, api, reads


async def test_a_height_whose_hash_the_proxy_knows_is_still_pinned_and_cached(make_api, fake_nodes):
    """A kept route does not keep the read path's decision: a read at a height whose
    hash the proxy knows is sent by that hash and its answer cached, so the node is asked
    once for three identical reads."""
    node, api, reads = await proxy_knowing_head(make_api, fake_nodes)
    reader, writer = await asyncio.open_connection("127.0.0.1", api.client.server.port)
    answers = []
    for rid in range(3):
        writer.write(HEAD % len(body(rid)) + body(rid))
        status, answer = await read_answer(reader)
        assert status == 200 and answer["id"] == rid, answer
        answers.append(answer["result"])
    writer.close()
    asked = node.data_items("eth_getBalance")
    assert len(asked) == 1, asked
    assert asked[0]["params"][1] == {"blockHash": reads.heads.views["1337"].hashes[1000]}
    assert answers[0] == answers[1] == answers[2]


async def test_a_request_written_first_is_logged_with_its_method_node_and_client(
    make_api, fake_nodes, caplog
):
    """The books of a request written before its objects existed are the general path's:
    the access log names its method, node and the client's headers."""
    caplog.set_level(logging.INFO, logger="chainstate.proxy.access")
    node = await fake_nodes("s", "state")
    api = await make_api(fast_settings(**NO_CACHE))
    await api.add("1337", node)
    reader, writer = await asyncio.open_connection("127.0.0.1", api.client.server.port)
    head = b"POST /1337 HTTP/1.1\r\nHost: x\r\nclient-id: alice\r\nx-vendor-biz: shop\r\n"
    for rid in range(3):  # the first opens the node connection, the others take it
        with TaskNames() as tasks:
            writer.write(head + b"Content-Length: %d\r\n\r\n%b" % (len(body(rid)), body(rid)))
            assert (await read_answer(reader))[1]["result"]
    writer.close()
    assert tasks == [], tasks  # (the last went out before any of its objects was built)
    logged = [r for r in caplog.records if r.name == "chainstate.proxy.access"]
    assert len(logged) == 3
    for record in logged:
        assert record.methods == ["eth_getBalance"] and record.nodes == ["s"]
        assert (record.client_id, record.x_vendor_biz, record.status) == ("alice", "shop", 200)


async def test_a_batch_cached_as_a_whole_is_answered_without_a_task(make_api, fake_nodes):
    """The same batch bytes again at the same `latest`: the whole-batch cache answers them
    in the listener's callback (no task, not admitted), booked as the pipeline books a hit
    (its items counted as the cache's, one batch latency, the client's id); a bad
    `x-min-block` on those bytes is still answered with its error by the general steps."""
    node, api, _ = await proxy_knowing_head(make_api, fake_nodes)
    items = [
        {"jsonrpc": "2.0", "id": i, "method": "eth_getBalance", "params": [ADDR, "latest"]}
        for i in range(3)
    ]
    batch = orjson.dumps(items)
    head = b"POST /1337 HTTP/1.1\r\nHost: x\r\nclient-id: bob\r\nContent-Length: %d\r\n\r\n"
    reader, writer = await asyncio.open_connection("127.0.0.1", api.client.server.port)
    writer.write(head % len(batch) + batch)  # a miss: asked of the node, kept whole
    status, first = await read_answer(reader)
    assert status == 200 and [a["id"] for a in first] == [0, 1, 2], first
    asked = len(node.received)
    with TaskNames() as tasks:
        for _ in range(3):
            writer.write(head % len(batch) + batch)
            assert await read_answer(reader) == (200, first)
    assert tasks == [], tasks
    assert len(node.received) == asked
    hits = await metric(
        api, "chainstate_proxy_requests_total",
        chain="1337", method="eth_getBalance", node="cache", outcome="ok",
    )  # fmt: skip
    assert hits == 9
    seconds = "chainstate_proxy_request_seconds_count"
    assert await metric(api, seconds, chain="1337", shape="batch") == 4
    bob = client_label("bob")
    assert await metric(api, "chainstate_proxy_client_requests_total", client_id=bob) == 4
    engine = get_proxy(api.client.app).engine
    assert engine.inflight == 0 and engine.state.pool_for_chain("1337").inflight == 0
    bad = b"POST /1337 HTTP/1.1\r\nHost: x\r\nx-min-block: soon\r\nContent-Length: %d\r\n\r\n"
    writer.write(bad % len(batch) + batch)
    status, answer = await read_answer(reader)
    writer.close()
    assert status == 200 and "x-min-block" in answer["error"]["message"], answer


async def test_a_pool_at_its_limit_still_answers_a_batch_the_cache_holds_whole(
    make_api, fake_nodes
):
    """Nothing waits for a whole-batch cache hit, so it is not admitted: with the pool at
    its in-flight limit, the cached batch is answered while a read for a node gets 503."""
    node = await fake_nodes("s", "state")
    api = await make_api(fast_settings(max_pool_inflight=1))
    await api.add("1337", node)
    await api.heads_known("1337")
    engine = get_proxy(api.client.app).engine
    await wait_until(lambda: 1000 in engine.reads.heads.views["1337"].hashes)
    batch = [
        {"jsonrpc": "2.0", "id": i, "method": "eth_getBalance", "params": [ADDR, "latest"]}
        for i in range(2)
    ]
    first = await api.rpc("1337", batch)
    assert first[0] == 200
    node.delay = 0.5
    other = f"0x{7:040x}"
    slow = asyncio.create_task(api.call("1337", "eth_getBalance", [other, "latest"]))
    pool = engine.state.pool_for_chain("1337")
    await wait_until(lambda: pool.inflight == 1)
    assert await api.rpc("1337", batch) == first
    status, refused = await api.rpc("1337", [*batch, batch[0] | {"id": 9}])
    assert status == 503 and refused["error"]["code"] == -32005, refused
    assert (await slow)["result"]

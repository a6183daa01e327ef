"""The proxy's data listener: `POST /:chainId` on the lean server, admin and /metrics on
aiohttp behind it, and what the fast paths must keep exact (ids, bytes, limits)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from chainstate.inproc import InprocRegistry
from chainstate.jsonrpc import BLOCK_NOT_FOUND, Dispatcher, JsonRpcError
from tests.proxy.conftest import ADDR, balance, fast_settings, req

ODD_IDS = (b"18446744073709551616", b"1e-400", b"1.50", b"-9223372036854775809")


def dispatcher_node(registry: InprocRegistry) -> str:
    """An in-process node answering with the project's own Dispatcher (which echoes ids
    exactly): the single path hands its answer through unchanged."""
    d = Dispatcher("node")

    async def head(_params):
        return "0x3e8"

    async def balance_of(_params):
        return "0x1"

    async def range_(_params):
        return {"earliest": 0, "latest": 1000}

    async def block(_params):
        return None

    d.update(
        {
            "eth_blockNumber": head,
            "eth_getBalance": balance_of,
            "blockx_range": range_,
            "eth_getBlockByNumber": block,
        }
    )
    return registry.register("exact", d.handle_body)


def call(rid: bytes, method: bytes = b"eth_getBalance") -> bytes:
    params = b'["%s","latest"]' % ADDR.encode()
    return b'{"jsonrpc":"2.0","id":%s,"method":"%s","params":%s}' % (rid, method, params)


async def raw_rpc(api, body: bytes) -> tuple[int, bytes]:
    async with api.client.data.post("/1337", data=body) as resp:
        return resp.status, await resp.read()


async def test_ids_come_back_byte_exact(make_api) -> None:
    registry = InprocRegistry()
    url = dispatcher_node(registry)
    api = await make_api(registry=registry)
    await api.post("/1337/addNode", {"key": "exact", "url": url})
    for rid in ODD_IDS:
        status, raw = await raw_rpc(api, call(rid))  # forwarded and answered as bytes
        assert status == 200 and raw.startswith(b'{"jsonrpc":"2.0","id":%s,' % rid), raw
        _, raw = await raw_rpc(api, call(rid, b"no_such_method"))  # answered by the proxy
        assert b'"id":%s,' % rid in raw and b"-32601" in raw
    # A batch: ids rewritten to positions on the way to the node, and back exactly.
    _, raw = await raw_rpc(api, b"[" + b",".join(call(rid) for rid in ODD_IDS) + b"]")
    assert [a["result"] for a in orjson.loads(raw)] == ["0x1"] * len(ODD_IDS)
    for rid in ODD_IDS:
        assert b'"id":%s,' % rid in raw, raw


async def test_a_batch_for_one_node_goes_as_the_client_sent_it(two) -> None:
    api, state, _ = two
    # Heights whose hashes the proxy has not seen: nothing to pin, and no two items alike
    # (identical items would share one read, `latest` would be pinned to the head's hash).
    body = orjson.dumps([balance(hex(990 + i), rid=i) for i in range(5)] + [balance("0x3d0", "s")])
    status, raw = await raw_rpc(api, body)
    assert status == 200 and [a["id"] for a in orjson.loads(raw)] == [0, 1, 2, 3, 4, "s"]
    assert state.bodies[-1] == body  # unchanged: the ids are unique
    repeated = orjson.dumps([balance("0x3c1", rid=1), balance("0x3c2", rid=1)])
    _, raw = await raw_rpc(api, repeated)
    assert [a["id"] for a in orjson.loads(raw)] == [1, 1]
    assert [i["id"] for i in orjson.loads(state.bodies[-1])] == [0, 1]  # positions instead


async def test_data_requests_stay_on_the_lean_path(two) -> None:
    api, _, _ = two
    for _ in range(3):
        status, _ = await raw_rpc(api, orjson.dumps(balance()))
        assert status == 200
    metrics = await (await api.client.get("/metrics")).text()  # aiohttp answers this one
    assert "chainstate_proxy_requests_total" in metrics
    server = api.client.server
    assert len(server.conns) == 1 and not server.shims  # the data connection, still lean


async def test_oversize_and_echoed_input_are_bounded(make_api, fake_nodes) -> None:
    node = await fake_nodes("s", "state")
    api = await make_api(fast_settings(max_body_bytes=2000))
    await api.add("1337", node)

    async def chunked():
        for _ in range(10):
            yield b" " * 300

    async with api.client.data.post("/1337", data=chunked()) as resp:
        answer = orjson.loads(await resp.read())
        assert resp.status == 413 and answer["error"]["code"] == -32600
        assert "max_body_bytes=2000" in answer["error"]["message"]
    status, raw = await raw_rpc(api, call(b"1", b"m" * 1500))
    message = orjson.loads(raw)["error"]["message"]
    assert status == 200 and len(message) < 300


async def test_a_retry_after_a_whole_batch_sends_only_the_retried_items(make_api) -> None:
    registry = InprocRegistry()
    received: dict[str, list[Any]] = {"s": [], "a": []}

    def node(name: str, missing: str | None) -> str:
        d = Dispatcher(name)

        async def head(_params):
            return "0x3e8"

        async def balance_of(params):
            if params[0] == missing:
                raise JsonRpcError(BLOCK_NOT_FOUND, "not here")
            return name

        async def range_(_params):
            return {"earliest": 0, "latest": 1000}

        async def block(_params):
            return None

        methods = {"eth_blockNumber": head, "blockx_range": range_, "eth_getBlockByNumber": block}
        d.update({**methods, "eth_getBalance": balance_of})

        async def handle(body: bytes) -> bytes:
            if b"eth_getBalance" in body:
                received[name].append(orjson.loads(body))
            return await d.handle_body(body)

        return registry.register(name, handle)

    other = "0x" + "22" * 20
    api = await make_api(registry=registry)
    await api.post("/1337/addNode", {"key": "s", "url": node("s", other), "kind": "state"})
    await api.post("/1337/addNode", {"key": "a", "url": node("a", None), "kind": "archive"})
    await api.heads_known("1337")
    batch = [balance(rid=1), req("eth_getBalance", [other, "latest"], 2), balance(rid=3)]
    status, raw = await raw_rpc(api, orjson.dumps(batch))
    assert status == 200
    assert [(a["id"], a["result"]) for a in orjson.loads(raw)] == [(1, "s"), (2, "a"), (3, "s")]
    assert [len(body) for body in received["s"]] == [3]  # the client's batch, whole
    assert [[i["params"][0] for i in body] for body in received["a"]] == [[other]]


async def test_an_in_process_node_answers_plain_reads_at_once(make_api) -> None:
    """A node registered with a synchronous fast path (the state node's `answer_now`) is
    called without awaiting for the bodies it can answer; others go to its handler."""
    registry = InprocRegistry()
    d = Dispatcher("node")
    calls = {"now": 0, "handler": 0}

    async def head(_params):
        return "0x3e8"

    d.update({"eth_blockNumber": head})

    async def handler(body: bytes) -> bytes:
        calls["handler"] += 1
        return await d.handle_body(body)

    def now(body: bytes) -> bytes | None:
        if b"eth_getBalance" not in body:
            return None
        calls["now"] += 1
        rid = orjson.loads(body)["id"]
        return orjson.dumps({"jsonrpc": "2.0", "id": rid, "result": "0x5"})

    url = registry.register("fast", handler, now)
    api = await make_api(registry=registry)
    await api.post("/1337/addNode", {"key": "fast", "url": url})
    status, raw = await raw_rpc(api, call(b"1e-400"))
    assert status == 200 and raw == b'{"jsonrpc":"2.0","id":1e-400,"result":"0x5"}'
    assert calls["now"] == 1
    assert (await api.call("1337", "eth_blockNumber"))["result"] == "0x3e8"
    assert calls["handler"] >= 1


async def test_early_answers_keep_pipelined_order_and_the_books(make_api, fake_nodes) -> None:
    """A node's final answer goes to the client from the node connection's callback, but
    never ahead of an earlier request's answer on the same connection, and the request is
    still counted (attempt, outcome) once the client has it."""
    slow, fast = await fake_nodes("slow", "state"), await fake_nodes("fast", "state")
    slow.delay = 0.3
    api = await make_api()
    await api.add("1337", slow)
    await api.add("1338", fast)
    reader, writer = await asyncio.open_connection("127.0.0.1", api.client.server.port)
    first, second = call(b'"a"'), call(b'"b"')
    head = b"POST /%s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
    writer.write(head % (b"1337", len(first)) + first + head % (b"1338", len(second)) + second)
    answers = []
    for _ in range(2):
        status = await reader.readline()
        length = 0
        while (line := await reader.readline()) != b"\r\n":
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        answers.append((status, orjson.loads(await reader.readexactly(length))))
    writer.close()
    assert [(s.split()[1], a["id"], "result" in a) for s, a in answers] == [
        (b"200", "a", True),
        (b"200", "b", True),
    ], answers
    # An early answer still keeps its books: a plain single read, written from the fast
    # node's connection, counted as an ok attempt and an ok request.
    status, raw = await raw_rpc(api, call(b"7"))
    assert status == 200 and raw.startswith(b'{"jsonrpc":"2.0","id":7,'), raw
    text = await (await api.client.get("/metrics")).text()
    counted = {
        line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("chainstate_proxy_upstream_attempts_total{")
    }
    assert counted.get('chain="1337",node="slow",outcome="ok"') == 2.0, counted
    assert counted.get('chain="1338",node="fast",outcome="ok"') == 1.0, counted


async def test_an_error_written_early_is_counted_as_an_error(make_api, fake_nodes) -> None:
    """A node's final error answer goes to the client as it is from the node connection's
    callback, and its books still say what it was: an `ok` attempt (the node answered) and
    an `error` request, beside a result's `ok` one."""
    node = await fake_nodes("solo", "state")
    node.method_errors["eth_getCode"] = -32000  # final: not retried
    api = await make_api()
    await api.add("1337", node)
    for rid, method in ((b"1", b"eth_getCode"), (b"2", b"eth_getBalance")):
        status, raw = await raw_rpc(api, call(rid, method))
        assert status == 200 and raw.startswith(b'{"jsonrpc":"2.0","id":%s,' % rid), raw
        assert (b'"error"' in raw) == (method == b"eth_getCode"), raw
    text = await (await api.client.get("/metrics")).text()
    counted = {
        line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(("chainstate_proxy_requests_total{", "chainstate_proxy_upstream_"))
    }
    labels = 'chain="1337",method="%s",node="solo",outcome="%s"'
    assert counted.get(labels % ("eth_getCode", "error")) == 1.0, counted
    assert counted.get(labels % ("eth_getBalance", "ok")) == 1.0, counted
    assert counted.get('chain="1337",node="solo",outcome="ok"') == 2.0, counted


async def test_a_path_follows_its_chain_as_pools_come_and_go(make_api, fake_nodes) -> None:
    """The data route keeps what a path resolved to until the routing state changes: a
    chain unknown at first is served once a node is added for it (over HTTP: no node in
    this process), and unknown again once its last node is removed."""
    node = await fake_nodes("s", "state")
    api = await make_api()
    assert api.proxy.upstream.registry is None  # (the route without in-process nodes)
    body = orjson.dumps(balance())
    status, raw = await raw_rpc(api, body)
    assert status == 404 and b"unknown chain" in raw
    await api.add("1337", node)
    status, raw = await raw_rpc(api, body)
    assert status == 200 and b'"result"' in raw, raw
    status, answer = await api.post(f"/1337/deleteNode/{node.name}", {})
    assert status == 200, answer
    status, raw = await raw_rpc(api, body)
    assert status == 404 and b"unknown chain" in raw

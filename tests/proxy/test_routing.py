"""The data path end to end: a proxy app in front of fake state/archive/write nodes."""

from __future__ import annotations

import logging
import time

import orjson
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from proxy.metrics import client_label
from proxy.store_file import FileStore
from tests.proxy.conftest import ADDR, balance, fast_settings, req, wait_until
from tests.proxy.fakes import FakeNode, block_hash
from tests.proxy.test_face import TxNode

OTHER = "0x" + "22" * 20
THIRD = "0x" + "33" * 20


def served_by(answer: dict) -> str:
    return answer["result"]["node"]


async def test_single_requests_route_by_block(two) -> None:
    api, _, _ = two
    cases = {
        "latest": "state-1",
        "safe": "state-1",
        "pending": "state-1",
        "earliest": "archive-1",
        hex(1000 - 127): "state-1",
        hex(1000 - 128): "archive-1",
        block_hash(5): "archive-1",  # a hash the proxy has not seen
        block_hash(1000): "state-1",  # the head's hash, learned by polling
    }
    for block, node in cases.items():
        assert served_by(await api.call("1337", "eth_getBalance", [ADDR, block])) == node, block
    ctx_old = {"block_id": "0x5", "type": "Equals"}
    ctx_contains = {"block_id": "0x5", "type": "Contains"}
    assert served_by(await api.call("1337", "getAddressBalance", [ADDR, ctx_old])) == "archive-1"
    got = await api.call("1337", "getAddressBalance", [ADDR, ctx_contains])
    assert served_by(got) == "state-1"
    assert served_by(await api.call("1337", "getAddressBalance", [ADDR])) == "state-1"
    eip1898 = {"blockNumber": "0x5"}
    assert served_by(await api.call("1337", "eth_call", [{"to": ADDR}, eip1898])) == "archive-1"


async def test_debug_choose_one_node_matches_routing(two) -> None:
    api, _, _ = two
    for block, kind in (("latest", "state"), ("0x5", "archive"), ("earliest", "archive")):
        status, chosen = await api.get(
            "/1337/debug_chooseOneNode", params={"method": "eth_getBalance", "block": block}
        )
        assert status == 200 and chosen["kind"] == kind and chosen["node"]["kind"] == kind
        answer = await api.call("1337", "eth_getBalance", [ADDR, block])
        assert served_by(answer) == chosen["node"]["key"]
        assert "→" in chosen["reason"]
    status, chosen = await api.get(
        "/0x539/debug_chooseOneNode", params={"block": "5", "type": "Contains"}
    )
    assert chosen["kind"] == "state" and chosen["type"] == "Contains"
    status, bad = await api.get("/1337/debug_chooseOneNode", params={"method": "nope"})
    assert status == 400 and "nope" in bad["error"]
    status, bad = await api.get("/1337/debug_chooseOneNode", params={"block": "0xzz"})
    assert status == 400


async def test_batch_across_nodes_keeps_client_order_and_ids(two) -> None:
    api, state, archive = two
    batch = [
        balance("0x5", rid=7),
        balance("latest", rid=7),  # repeated id
        balance("0x6", rid="x"),
        {"jsonrpc": "2.0", "method": "eth_blockNumber", "params": []},  # notification
        balance("latest", rid=None),
        balance("0x3e8", rid="x"),
        req("eth_getBalance", [], rid=3),  # bad params: answered by the proxy
    ]
    status, answers = await api.rpc("1337", batch)
    assert status == 200
    assert [a["id"] for a in answers] == [7, 7, "x", None, "x", 3]
    assert [a.get("result", {}).get("node") for a in answers[:5]] == [
        "archive-1",
        "state-1",
        "archive-1",
        "state-1",
        "state-1",
    ]
    assert [a["result"]["height"] for a in answers[:5]] == [5, 1000, 6, 1000, 1000]
    assert answers[5]["error"]["code"] == -32602
    assert len(archive.bodies) == 1 and len(state.bodies) == 1  # one sub-batch per node
    assert any(i.get("method") == "eth_blockNumber" and "id" not in i for i in state.received)


async def test_a_batch_answered_as_it_is_counts_each_method_and_outcome(
    make_api, fake_nodes
) -> None:
    """A batch the node answers whole, in order (passed through, or taken in order after a
    cache hit): metrics count every item by method and outcome, a node's error included."""
    node = await fake_nodes("solo", "state")
    node.method_errors["eth_getCode"] = -32000  # a final error: not retried
    api = await make_api(fast_settings())
    await api.add("1337", node)
    await api.heads_known("1337")
    await api.call("1337", "eth_getBalance", [ADDR, "latest"], rid=1)  # cached: a hit below
    plain = [
        req("eth_getBalance", [OTHER, "0x3e0"], 1),
        req("eth_getBalance", [THIRD, "0x3e0"], 2),
        req("eth_getCode", [OTHER, "0x3e0"], 3),
        {"jsonrpc": "2.0", "method": "eth_getTransactionCount", "params": [OTHER, "0x3e0"]},
    ]
    for batch in (plain, [balance(rid="hit"), *plain]):
        _, answers = await api.rpc("1337", batch)
        assert [a["id"] for a in answers] == [a["id"] for a in batch if "id" in a]
        assert answers[-1]["error"]["code"] == -32000
    metrics = await (await api.client.get("/metrics")).text()
    counted = {
        line.split("{", 1)[1]
        for line in metrics.splitlines()
        if line.startswith("chainstate_proxy_requests_total{") and 'node="solo"' in line
    }
    assert 'chain="1337",method="eth_getBalance",node="solo",outcome="ok"} 5.0' in counted
    assert 'chain="1337",method="eth_getCode",node="solo",outcome="error"} 2.0' in counted
    assert 'chain="1337",method="eth_getTransactionCount",node="solo",outcome="ok"} 2.0' in counted


async def test_retry_on_block_not_found_prefers_archive(make_api, fake_nodes) -> None:
    stale = await fake_nodes("stale", "state")
    archive = await fake_nodes("archive-1", "archive")
    api = await make_api()
    await api.add("1337", stale)
    await api.add("1337", archive)
    await api.heads_known("1337")
    stale.error_code = -39006  # claims the block is outside its range
    first = api.proxy.state.pools["1337"].find("stale")
    first.cost, first.cost_at = 0.0001, time.monotonic()  # looks the fastest: asked first
    assert served_by(await api.call("1337", "eth_getBalance", [ADDR, "latest"])) == "archive-1"
    other = req("eth_getBalance", [OTHER, "latest"], 2)  # (two alike would share one read)
    first.cost, first.cost_at = 0.0001, time.monotonic()
    _, answers = await api.rpc("1337", [balance("latest", 1), other])
    assert [served_by(a) for a in answers] == ["archive-1", "archive-1"]
    metrics = await (await api.client.get("/metrics")).text()
    # one retry per item the stale node refused (the archive node holds the pinned block)
    refused = len(stale.data_items("eth_getBalance"))
    assert refused == 2
    retried = f'chainstate_proxy_retries_total{{chain="1337",reason="block_not_found"}} {refused}.0'
    assert retried in metrics
    # the stale node answered what it lacks (single, then batch): not its fault
    labels = 'upstream_attempts_total{chain="1337",node="stale",outcome='
    assert f'{labels}"block_not_found"}} 1.0' in metrics
    assert f'{labels}"retryable"}} 1.0' in metrics
    assert api.proxy.state.pools["1337"].find("stale").breaker.failures == 0


async def test_retry_on_unsupported_precompile_and_last_answer_when_all_fail(
    make_api, fake_nodes
) -> None:
    nodes = [await fake_nodes(f"s{i}", "state") for i in range(4)]
    api = await make_api()
    for n in nodes:
        await api.add("1337", n)
    await api.heads_known("1337")
    nodes[0].error_code = nodes[1].error_code = -39008
    nodes[2].error_code = nodes[3].error_code = -39008
    answer = await api.call("1337", "eth_call", [{"to": ADDR}, "latest"])
    # the node's own answer after max_attempts, with geth's code (proxy/face.py)
    assert answer["error"]["code"] == -32000 and "forced error" in answer["error"]["message"]
    assert sum(len(n.received) for n in nodes) == 3  # max_attempts = 3, three different nodes
    # a vendor method keeps the spec's code
    answer = await api.call("1337", "getAddressBalance", [ADDR])
    assert answer["error"]["code"] == -39008
    nodes[0].error_code = nodes[1].error_code = nodes[2].error_code = None
    for _ in range(5):
        assert "result" in await api.call("1337", "eth_call", [{"to": ADDR}, "latest"])


async def test_dead_node_is_retried_then_taken_out_and_brought_back(
    make_api, fake_nodes, caplog
) -> None:
    caplog.set_level(logging.WARNING, logger="proxy")
    a = await fake_nodes("a", "state")
    b = await fake_nodes("b", "state")
    api = await make_api()
    await api.add("1337", a)
    await api.add("1337", b)
    await api.heads_known("1337")
    await b.stop()
    for i in range(6):
        assert served_by(await api.call("1337", "eth_getBalance", [ADDR], rid=i)) == "a"
    pool = api.proxy.state.pools["1337"]
    await wait_until(lambda: not pool.find("b").healthy)
    _, nodes = await api.get("/1337/getAllNodes")
    assert [n["healthy"] for n in nodes["nodes"]] == [True, False]
    out = [r.getMessage() for r in caplog.records if " b " in r.getMessage()]
    assert len(out) == 1 and ("taken out" in out[0] or "unhealthy" in out[0]), out
    await b.start()
    await wait_until(lambda: pool.find("b").healthy)
    back = [r.getMessage() for r in caplog.records if " b " in r.getMessage()][1:]
    assert len(back) == 1 and ("again" in back[0] or "back in rotation" in back[0]), back
    await a.stop()  # all traffic now needs b (a new read: the same one is cached)
    assert served_by(await api.call("1337", "eth_getBalance", [OTHER])) == "b"


async def test_a_node_that_reports_itself_stalled_is_routed_around(
    make_api, fake_nodes, caplog
) -> None:
    """A state node failing the same block again and again says so in `blockx_health`: the
    proxy takes it out of rotation with that reason (getAllNodes, one log line) while it
    still answers polls, and brings it back once it no longer says so."""
    caplog.set_level(logging.WARNING, logger="proxy")
    a = await fake_nodes("a", "state")
    b = await fake_nodes("b", "state")
    api = await make_api()
    await api.add("1337", a)
    await api.add("1337", b)
    await api.heads_known("1337")
    b.stalled = "ingest stalled: block 1001 failed 5 attempts in a row, the last with X"
    pool = api.proxy.state.pools["1337"]
    await wait_until(lambda: not pool.find("b").healthy)
    for i in range(6):
        assert served_by(await api.call("1337", "eth_getBalance", [ADDR], rid=i)) == "a"
    _, nodes = await api.get("/1337/getAllNodes")
    shown = {n["key"]: n for n in nodes["nodes"]}
    assert shown["b"]["healthy"] is False and shown["b"]["routable"] is False
    assert shown["b"]["last_error"] == b.stalled
    assert shown["a"]["routable"] is True and shown["a"]["last_error"] is None
    said = [r.getMessage() for r in caplog.records if " b " in r.getMessage()]
    assert len(said) == 1 and b.stalled in said[0], said
    b.stalled = None
    await wait_until(lambda: pool.find("b").healthy)
    _, nodes = await api.get("/1337/getAllNodes")
    assert all(n["routable"] and n["last_error"] is None for n in nodes["nodes"])


async def test_slow_node_times_out_and_is_retried(make_api, fake_nodes) -> None:
    slow = await fake_nodes("slow", "state")
    fast = await fake_nodes("fast", "archive")
    api = await make_api(fast_settings(upstream_timeout=0.3))
    await api.add("1337", slow)
    await api.add("1337", fast)
    await api.heads_known("1337")
    slow.delay = 1.0
    assert served_by(await api.call("1337", "eth_getBalance", [ADDR])) == "fast"
    metrics = await (await api.client.get("/metrics")).text()
    assert 'chainstate_proxy_upstream_errors_total{kind="timeout",node="slow"} 1.0' in metrics
    assert 'chainstate_proxy_retries_total{chain="1337",reason="timeout"} 1.0' in metrics


async def test_every_node_down_gives_a_clear_error(make_api, fake_nodes) -> None:
    only = await fake_nodes("only", "state")
    api = await make_api()
    await api.add("1337", only)
    await api.heads_known("1337")
    only.http_status = 502
    answer = await api.call("1337", "eth_getBalance", [ADDR])
    assert answer["error"]["code"] == -32603
    assert (
        "no node answered" in answer["error"]["message"]
        and "HTTP 502" in answer["error"]["message"]
    )
    await wait_until(lambda: not api.proxy.state.pools["1337"].find("only").healthy)
    answer = await api.call("1337", "eth_getBalance", [ADDR])
    assert "no eligible node" in answer["error"]["message"]


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", -32700),
        (b"", -32700),
        (b"[]", -32600),
        (b"5", -32600),
        (b'"x"', -32600),
        (b'{"jsonrpc":"1.0","id":1,"method":"eth_blockNumber"}', -32600),
        (b'{"jsonrpc":"2.0","id":1}', -32600),
        (b'{"jsonrpc":"2.0","id":[1],"method":"eth_blockNumber"}', -32600),
        (b'{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":5}', -32600),
        (b'{"jsonrpc":"2.0","id":1,"method":"eth_getUncles","params":[]}', -32601),
        (b'{"jsonrpc":"2.0","id":1,"method":"eth_getBalance","params":[]}', -32602),
        (b'{"jsonrpc":"2.0","id":1,"method":"eth_getBalance","params":["0x1"]}', -32602),
    ],
)
async def test_malformed_bodies(two, body, code) -> None:
    api, state, archive = two
    status, answer = await api.rpc("1337", body)
    assert status == 200
    assert answer["error"]["code"] == code
    assert not state.received and not archive.received


async def test_batch_of_bad_items_answers_each(two) -> None:
    api, _, _ = two
    _, answers = await api.rpc("1337", [1, {"jsonrpc": "2.0"}, req("nope", rid=2)])
    assert [a["error"]["code"] for a in answers] == [-32600, -32600, -32601]
    assert [a["id"] for a in answers] == [None, None, 2]


async def test_limits(make_api, fake_nodes) -> None:
    node = await fake_nodes("s", "state")
    api = await make_api(fast_settings(max_body_bytes=400, max_batch_items=2))
    await api.add("1337", node)
    status, answer = await api.rpc("1337", [balance()] * 3)
    assert status == 200 and "max_batch_items=2" in answer["error"]["message"]
    status, answer = await api.rpc("1337", b" " * 401)
    assert status == 413 and "max_body_bytes=400" in answer["error"]["message"]


async def test_notifications_are_forwarded_without_answer(two) -> None:
    api, state, _ = two
    status, answer = await api.rpc("1337", {"jsonrpc": "2.0", "method": "eth_chainId"})
    assert status == 204 and answer is None
    assert state.data_items("eth_chainId")
    status, answer = await api.rpc("1337", [{"jsonrpc": "2.0", "method": "eth_chainId"}])
    assert status == 204


async def test_chain_ids(two) -> None:
    api, _, _ = two
    assert served_by(await api.call("0x539", "eth_getBalance", [ADDR])) == "state-1"
    for chain in ("1", "0x1", "abc", "0x"):
        status, answer = await api.rpc(chain, balance())
        assert status == 404, chain
        assert answer["error"]["code"] == -32600 and "unknown chain" in answer["error"]["message"]


async def test_method_routes(two) -> None:
    api, _, _ = two
    status, _ = await api.post(
        "/1337/addMethodRoute", {"method": "eth_getBalance", "kind": "archive"}
    )
    assert status == 200
    assert served_by(await api.call("1337", "eth_getBalance", [ADDR])) == "archive-1"
    assert served_by(await api.call("1337", "eth_getCode", [ADDR])) == "state-1"
    await api.post("/1337/deleteMethodRoute/eth_getBalance")
    await api.post("/1337/addMethodRoute", {"method": "eth_getCode", "nodes": ["archive-1"]})
    # other accounts each time: an answer read before is served from the cache
    assert served_by(await api.call("1337", "eth_getCode", [OTHER])) == "archive-1"
    await api.post("/1337/removeMethodRoute", {"method": "eth_getCode", "nodes": ["archive-1"]})
    assert served_by(await api.call("1337", "eth_getCode", [THIRD])) == "state-1"


async def test_writer_methods_go_to_the_leader(make_api, fake_nodes) -> None:
    state = await fake_nodes("state-1", "state")
    w1 = await fake_nodes("w1", "state")
    w2 = await fake_nodes("w2", "state")
    api = await make_api()
    await api.add("1337", state)
    raw_tx = "0x02f8"
    answer = await api.call("1337", "eth_sendRawTransaction", [raw_tx])
    assert "no Leader" in answer["error"]["message"]
    assert (
        await api.post("/1337/writers/addWriter", {"key": "w1", "url": w1.url, "leader": True})
    )[0] == 201
    assert (await api.post("/1337/writers/addWriter", {"key": "w2", "url": w2.url}))[0] == 201
    assert served_by(await api.call("1337", "eth_sendRawTransaction", [raw_tx])) == "w1"
    assert served_by(await api.call("1337", "trace_vendorBlock", ["latest"])) == "w1"
    status, body = await api.post("/1337/writers/switchLeader", {"key": "w2"})
    assert status == 200 and body["previous"] == "w1" and body["leader"]["key"] == "w2"
    assert served_by(await api.call("1337", "eth_sendTransaction", [{"to": ADDR}])) == "w2"
    assert not state.received
    await w2.stop()
    answer = await api.call("1337", "eth_sendRawTransaction", [raw_tx])
    assert answer["error"]["code"] == -32603  # no retry on another writer
    message = answer["error"]["message"]
    assert "Leader write node w2" in message and "/1337/writers/switchLeader" in message
    assert len(w1.data_items("eth_sendRawTransaction")) == 1
    # Once the health poll has taken it out, the Leader is named as unhealthy, at once.
    leader = api.proxy.state.pools["1337"].writers["w2"]
    await wait_until(lambda: not leader.healthy)
    answer = await api.call("1337", "trace_vendorBlock", ["latest"])
    assert "Leader write node w2" in answer["error"]["message"]
    assert "is unhealthy" in answer["error"]["message"]
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "eth_sendRawTransaction", "params": [raw_tx]},
        {"jsonrpc": "2.0", "id": 2, "method": "eth_blockNumber", "params": []},
    ]
    _, answers = await api.rpc("1337", batch)
    assert "Leader write node w2" in answers[0]["error"]["message"] and "result" in answers[1]


TX_HASH = "0x" + "ee" * 32
LIFECYCLE_CALLS = {
    "eth_sendRawTransaction": ["0x02f8"],
    "eth_sendTransaction": [{"to": ADDR}],
    "eth_estimateGas": [{"to": ADDR, "data": "0x"}],
    "eth_gasPrice": [],
    "eth_maxPriorityFeePerGas": [],
    "eth_feeHistory": ["0x4", "latest", [25, 75]],
    "eth_accounts": [],
    # signing, the pool, the execution client's own view and raw encodings
    "eth_sign": [ADDR, "0xdeadbeef"],
    "eth_signTransaction": [{"to": ADDR}],
    "eth_signTypedData_v4": [ADDR, {"types": {}}],
    "eth_fillTransaction": [{"to": ADDR}],
    "eth_coinbase": [],
    "eth_protocolVersion": [],
    "eth_config": [],
    "net_peerCount": [],
    "txpool_status": [],
    "txpool_content": [],
    "txpool_inspect": [],
    "txpool_contentFrom": [ADDR],
    "debug_getRawTransaction": [TX_HASH],
    "debug_getRawHeader": ["0x3e8"],
    "debug_getRawBlock": ["latest"],
    "debug_getRawReceipts": ["0x3e8"],
    "debug_getBadBlocks": [],
    # a state trie, in a pool without full nodes
    "eth_getProof": [ADDR, ["0x0"], "0x3e8"],
}
PENDING_CALLS = {
    "eth_getTransactionCount": [ADDR, "pending"],
    "eth_getBalance": [ADDR, "pending"],
    "eth_getCode": [ADDR, "pending"],
    "eth_getStorageAt": [ADDR, "0x0", "pending"],
    "eth_call": [{"to": ADDR, "data": "0x"}, "pending"],
    "eth_getBlockByNumber": ["pending", False],
    "eth_getBlockTransactionCountByNumber": ["pending"],
    "eth_getTransactionByBlockNumberAndIndex": ["pending", "0x0"],
    "eth_getBlockReceipts": ["pending"],
    "eth_getUncleCountByBlockNumber": ["pending"],
    "eth_getUncleByBlockNumberAndIndex": ["pending", "0x0"],
    "eth_getStorageValues": [{ADDR: ["0x0"]}, "pending"],
    "eth_createAccessList": [{"to": ADDR}, "pending"],
    "eth_simulateV1": [{"blockStateCalls": []}, "pending"],
    "debug_traceCall": [{"to": ADDR}, "pending", {}],
    "eth_getProof": [ADDR, [], "pending"],
}
# Answered by the state nodes at the block they name (state, execution, traces, blocks,
# transactions and receipts)
STATE_CALLS = {
    "eth_getBlockTransactionCountByHash": [block_hash(999)],
    "eth_getTransactionByBlockHashAndIndex": [block_hash(999), "0x0"],
    "eth_getUncleCountByBlockHash": [block_hash(999)],
    "eth_getUncleByBlockHashAndIndex": [block_hash(999), "0x0"],
    "eth_blobBaseFee": [],
    "eth_syncing": [],
    "web3_sha3": ["0x68656c6c6f"],
    "debug_traceTransaction": [TX_HASH, {"tracer": "callTracer"}],
    "debug_traceBlockByNumber": ["0x3e7"],
    "debug_traceBlockByHash": [block_hash(999), {}],
    "trace_block": ["0x3e7"],
    "trace_transaction": [TX_HASH],
    "trace_filter": [{"fromBlock": "0x3e7", "toBlock": "latest", "count": 5}],
    "trace_replayBlockTransactions": ["0x3e7", ["trace"]],
}


async def with_leader(
    make_api, fake_nodes, writer: FakeNode | None = None, state: FakeNode | None = None
):
    """A proxy with one state node and a Leader write node `w1`."""
    state = state or await fake_nodes("state-1", "state")
    w1 = writer or await fake_nodes("w1", "state")
    api = await make_api()
    await api.add("1337", state)
    writer_entry = {"key": "w1", "url": w1.url, "leader": True}
    status, _ = await api.post("/1337/writers/addWriter", writer_entry)
    assert status == 201
    await api.heads_known("1337")
    return api, state, w1


async def test_transaction_lifecycle_and_pending_reads_go_to_the_leader(
    make_api, fake_nodes
) -> None:
    api, state, w1 = await with_leader(make_api, fake_nodes)
    for method, params in {**LIFECYCLE_CALLS, **PENDING_CALLS}.items():
        assert served_by(await api.call("1337", method, params)) == "w1", method
    for method, params in PENDING_CALLS.items():  # any other block: a state node
        latest = [p if p != "pending" else "latest" for p in params]
        # (a trie, no full node here; simulated blocks need state roots: the Leader)
        at = "w1" if method in ("eth_getProof", "eth_simulateV1") else "state-1"
        assert served_by(await api.call("1337", method, latest)) == at, method
    for method in ("web3_clientVersion", "net_version", "net_listening", "eth_chainId"):
        assert served_by(await api.call("1337", method)) == "state-1", method
    for method, params in STATE_CALLS.items():
        assert served_by(await api.call("1337", method, params)) == "state-1", method
    assert not [i for i in state.received if i["method"] in LIFECYCLE_CALLS]
    assert not [i for i in w1.received if i["method"] in STATE_CALLS]
    # A batch is split between the Leader and the state node, answered in order.
    status, answers = await api.rpc(
        "1337",
        [
            req("eth_getTransactionCount", [ADDR, "pending"], "a"),
            req("eth_getTransactionCount", [ADDR, "latest"], "b"),
            req("txpool_status", [], "c"),
            req("eth_getTransactionReceipt", [TX_HASH], "d"),  # found on the state node
        ],
    )
    assert status == 200
    assert [(a["id"], served_by(a)) for a in answers] == [
        ("a", "w1"),
        ("b", "state-1"),
        ("c", "w1"),
        ("d", "state-1"),
    ]
    # Params are checked before anything is sent: a bad hash never reaches the Leader.
    sent = len(w1.received)
    for method in ("eth_getTransactionReceipt", "eth_getTransactionByHash"):
        answer = await api.call("1337", method, ["0x1234"])
        assert answer["error"]["code"] == -32602 and "hash" in answer["error"]["message"]
    assert (await api.call("1337", "eth_estimateGas", ["0x00"]))["error"]["code"] == -32602
    assert len(w1.received) == sent
    # debug_chooseOneNode says so too.
    params = {"method": "eth_getTransactionCount", "block": "pending"}
    status, chosen = await api.get("/1337/debug_chooseOneNode", params=params)
    assert status == 200 and chosen["kind"] == "writer" and chosen["node"]["key"] == "w1"


class MiningWriter(FakeNode):
    """A write node whose execution client has mined transaction TX_HASH in block `mined`
    (None: it is pending) and knows no other."""

    mined: int | None = 1001

    def _result(self, item, polling):
        method = item["method"]
        if method in ("eth_getTransactionReceipt", "eth_getTransactionByHash"):
            if item["params"][0] != TX_HASH:
                return None
            number = None if self.mined is None else hex(self.mined)
            if method == "eth_getTransactionReceipt":
                if number is None:
                    return None
                return {"transactionHash": TX_HASH, "blockNumber": number, "status": "0x1"}
            index = None if number is None else "0x0"
            mined_in = None if number is None else block_hash(self.mined)  # type: ignore[arg-type]
            return {
                "hash": TX_HASH,
                "blockNumber": number,
                "blockHash": mined_in,
                "transactionIndex": index,
                "node": self.name,
            }
        return super()._result(item, polling)


async def test_a_transaction_shows_as_mined_once_state_nodes_hold_its_block(
    make_api, fake_nodes
) -> None:
    writer = await MiningWriter("w1").start()
    state = await TxNode("state-1", "state").start()  # no transaction yet (-39006)
    try:
        api, _, _ = await with_leader(make_api, fake_nodes, writer, state)
        assert state.head == 1000
        # Mined in block 1001, which no state node holds yet: a client polling for the
        # receipt keeps waiting instead of reading state that does not show its transaction.
        assert (await api.call("1337", "eth_getTransactionReceipt", [TX_HASH]))["result"] is None
        tx = (await api.call("1337", "eth_getTransactionByHash", [TX_HASH]))["result"]
        assert tx["hash"] == TX_HASH and tx["blockNumber"] is None and tx["blockHash"] is None
        _, answers = await api.rpc("1337", [req("eth_getTransactionReceipt", [TX_HASH], 7)])
        assert answers == [{"jsonrpc": "2.0", "id": 7, "result": None}]
        state.head = 1001
        pool = api.proxy.state.pools["1337"]
        await wait_until(lambda: pool.readers[0].head == 1001)
        receipt = (await api.call("1337", "eth_getTransactionReceipt", [TX_HASH]))["result"]
        assert receipt["blockNumber"] == hex(1001)
        tx = (await api.call("1337", "eth_getTransactionByHash", [TX_HASH]))["result"]
        assert tx["blockNumber"] == hex(1001) and tx["transactionIndex"] == "0x0"
        answer = await api.call("1337", "eth_getBalance", [ADDR, receipt["blockNumber"]])
        assert served_by(answer) == "state-1"
        # Once the state node holds it, it answers (the Leader is not asked).
        state.txs[TX_HASH] = 1001
        asked = len(writer.data_items("eth_getTransactionByHash"))
        assert served_by(await api.call("1337", "eth_getTransactionByHash", [TX_HASH])) == "state-1"
        assert len(writer.data_items("eth_getTransactionByHash")) == asked
    finally:
        await writer.stop()
        await state.stop()


async def test_transactions_by_hash_from_state_nodes_then_the_leader(make_api, fake_nodes) -> None:
    """A transaction by hash: a state node's window, else the archive, else (null: not
    mined, or not ingested yet) the Leader's execution client; null when no one has it.
    Singles and batches alike."""
    writer = await MiningWriter("w1").start()
    stopping: list[FakeNode] = []
    writer.mined = None  # pending: only the Leader's client knows it
    try:
        state = await TxNode("state-1", "state").start()
        archive = await TxNode("archive-1", "archive").start()
        stopping.extend((state, archive))
        old, recent, unknown = "0x" + "01" * 32, "0x" + "02" * 32, "0x" + "03" * 32
        state.txs = {recent: 990, old: 5}  # (5 is outside its window: -39006)
        archive.txs = {recent: 990, old: 5}
        api = await make_api()
        await api.add("1337", state)
        await api.add("1337", archive)
        await api.heads_known("1337")
        for method in ("eth_getTransactionByHash", "eth_getTransactionReceipt"):
            # no Leader yet: a pending transaction is not found
            assert (await api.call("1337", method, [TX_HASH]))["result"] is None
        entry = {"key": "w1", "url": writer.url, "leader": True}
        assert (await api.post("/1337/writers/addWriter", entry))[0] == 201
        pool = api.proxy.state.pools["1337"]
        await wait_until(lambda: pool.leader_node() is not None and pool.leader_node().healthy)
        cases = [(recent, "state-1"), (old, "archive-1"), (TX_HASH, "w1"), (unknown, None)]
        for tx_hash, node in cases:
            answer = await api.call("1337", "eth_getTransactionByHash", [tx_hash])
            assert "error" not in answer, answer
            if node is None:
                assert answer["result"] is None
            else:
                assert served_by(answer) == node, tx_hash
        pending = (await api.call("1337", "eth_getTransactionByHash", [TX_HASH]))["result"]
        assert pending["blockNumber"] is None and pending["blockHash"] is None
        assert (await api.call("1337", "eth_getTransactionReceipt", [TX_HASH]))["result"] is None
        batch = [req("eth_getTransactionByHash", [h], i) for i, (h, _) in enumerate(cases)]
        batch.append(req("eth_getTransactionReceipt", [unknown], 9))
        status, answers = await api.rpc("1337", batch)
        assert status == 200 and [a["id"] for a in answers] == [0, 1, 2, 3, 9]
        assert [a["result"] and a["result"]["node"] for a in answers] == [
            "state-1",
            "archive-1",
            "w1",
            None,
            None,
        ]
        # A state node that does not serve the lookup (an older one): the Leader answers.
        state.method_errors["eth_getTransactionByHash"] = -32601
        archive.method_errors["eth_getTransactionByHash"] = -32601
        answer = await api.call("1337", "eth_getTransactionByHash", [TX_HASH])
        assert served_by(answer) == "w1"
    finally:
        await writer.stop()
        for node in stopping:
            await node.stop()


async def test_mirrors_get_copies_and_never_affect_clients(two, fake_nodes) -> None:
    api, _, _ = two
    mirror = await fake_nodes("mirror", "archive")
    dead = await fake_nodes("dead-mirror", "archive")
    await dead.stop()
    status, body = await api.post(
        "/1337/addMirror", {"url": mirror.url, "methods": ["eth_getBalance"]}
    )
    assert status == 201 and body["mirror"]["methods"] == ["eth_getBalance"]
    assert (await api.post("/1337/addMirror", {"url": dead.url}))[0] == 201
    mirror.delay = 0.5  # a slow mirror does not slow the client
    answer = await api.call("1337", "eth_getBalance", [ADDR])
    assert served_by(answer) == "state-1"
    await api.call("1337", "eth_getCode", [ADDR])
    await api.rpc("1337", [balance(rid=1), req("eth_getCode", [ADDR], rid=2)])
    await wait_until(lambda: len(mirror.received) == 2)
    assert {i["method"] for i in mirror.received} == {"eth_getBalance"}
    metrics = api.proxy.metrics
    await wait_until(
        lambda: (
            metrics.mirrors.labels("failed")._value.get() == 3
            and metrics.mirrors.labels("sent")._value.get() == 2
        )
    )
    status, listed = await api.get("/1337/getMirrors")
    assert len(listed["mirrors"]) == 2
    assert (await api.post("/1337/deleteMirror", {"url": mirror.url}))[0] == 200
    assert (await api.post("/1337/deleteMirror", {"url": mirror.url}))[0] == 404
    assert (await api.post("/1337/deleteAllMirrors"))[1]["deleted"] == 1


async def test_version_key_routes_chain_to_versioned_pool(make_api, fake_nodes) -> None:
    blue = await fake_nodes("blue-1", "state")
    green = await fake_nodes("green-1", "state")
    store = FileStore(None)
    api = await make_api(store=store)
    await api.add("1337", green)
    await api.add("1337-blue", blue)
    assert served_by(await api.call("1337", "eth_getBalance", [ADDR])) == "green-1"
    await store.put("1337/version", b"blue")  # as an operator would with etcdctl
    await wait_until(lambda: api.proxy.state.versions.get("1337") == "blue")
    assert served_by(await api.call("1337", "eth_getBalance", [ADDR])) == "blue-1"
    assert served_by(await api.call("0x539", "eth_getBalance", [ADDR])) == "blue-1"
    status, chains = await api.get("/getChains")
    assert chains["chains"][0]["active_pool"] == "1337-blue"
    status, body = await api.post("/1337/setVersion", {"version": None})
    assert body["active_pool"] == "1337"
    assert served_by(await api.call("1337", "eth_getBalance", [ADDR])) == "green-1"
    status, body = await api.post("/1337/setVersion", {"version": "bl/ue"})
    assert status == 400


async def test_metrics_client_ids_and_access_log(two, caplog) -> None:
    api, _, _ = two
    api.proxy.metrics.hot.top_n = 2
    headers = {"x-vendor-biz": "biz", "x-vendor-source": "src", "x-vendor-env": "prod"}
    with caplog.at_level(logging.INFO, logger="chainstate.proxy.access"):
        for i, cid in enumerate(("alpha", "beta", "gamma", "delta")):  # 4 reads (none cached)
            read = req("eth_getBalance", [f"0x{i + 1:040x}", "latest"])
            await api.rpc("1337", read, headers={"client-id": cid, **headers})
    text = await (await api.client.get("/metrics")).text()
    alpha = client_label("alpha")
    assert f'chainstate_proxy_client_requests_total{{client_id="{alpha}"}} 1.0' in text
    assert 'chainstate_proxy_client_requests_total{client_id="other"} 2.0' in text
    assert "alpha" not in text and "gamma" not in text  # never the raw id
    assert 'method="eth_getBalance",node="state-1",outcome="ok"' in text
    assert "chainstate_proxy_request_seconds_bucket" in text
    record = caplog.records[-1]
    assert record.name == "chainstate.proxy.access"
    assert record.client_id == "delta" and record.x_vendor_biz == "biz" and record.status == 200
    assert record.nodes == ["state-1"] and record.methods == ["eth_getBalance"]


async def test_spans(make_api, fake_nodes) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    stale = await fake_nodes("stale", "state")
    archive = await fake_nodes("archive-1", "archive")
    api = await make_api(tracer=provider.get_tracer("test"))
    await api.add("1337", stale)
    await api.add("1337", archive)
    await api.heads_known("1337")
    stale.error_code = -39006
    await api.post("/1337/addMirror", {"url": archive.url})
    headers = {"client-id": "c1", "x-vendor-source-host": "h1"}
    await api.rpc("1337", [balance("latest", 1), balance("0x5", 2)], headers=headers)
    await wait_until(lambda: any(s.name == "mirror.copy" for s in exporter.get_finished_spans()))
    spans = exporter.get_finished_spans()
    root = next(s for s in spans if s.name == "jsonrpc.request")
    assert root.attributes["chain"] == "1337" and root.attributes["batch.size"] == 2
    assert root.attributes["rpc.methods"] == ("eth_getBalance",)
    assert root.attributes["client_id"] == "c1" and root.attributes["x_vendor_source_host"] == "h1"
    attempts = [s for s in spans if s.name == "upstream.attempt"]
    assert all(s.parent.span_id == root.context.span_id for s in attempts)
    mirror = next(s for s in spans if s.name == "mirror.copy")
    assert mirror.parent.span_id == root.context.span_id
    assert dict(mirror.attributes) == {"target": archive.url, "outcome": "sent"}
    assert sorted((s.attributes["node"], s.attributes["attempt"]) for s in attempts) == [
        ("archive-1", 1),
        ("archive-1", 2),
        ("stale", 1),
    ]


async def test_in_process_engine_and_inproc_nodes(make_api, fake_nodes) -> None:
    from chainstate.inproc import InprocRegistry
    from proxy.app import get_engine

    registry = InprocRegistry()

    async def node(body: bytes) -> bytes:
        item = orjson.loads(body)
        if isinstance(item, list):
            return orjson.dumps([{"jsonrpc": "2.0", "id": i["id"], "result": "0x1"} for i in item])
        return orjson.dumps({"jsonrpc": "2.0", "id": item["id"], "result": "inproc"})

    url = registry.register("local-state", node)
    api = await make_api(registry=registry)
    await api.post("/1337/addNode", {"key": "local-state", "url": url})
    status, body = await get_engine(api.client.app).handle(
        "0x539", orjson.dumps(balance()), {"client-id": "workspace"}
    )
    assert status == 200 and orjson.loads(body)["result"] == "inproc"


# ---- batches of items the read path does not touch (`Rounds.plain`) ---------------------


def at_heights(n: int, method: str = "eth_getBalance", first_id: int = 0) -> list[dict]:
    """`n` reads at heights the proxy knows no hash of (below the head it polls)."""
    return [req(method, [f"0x{i + 1:040x}", hex(900 + i % 50)], first_id + i) for i in range(n)]


async def test_a_plain_batch_goes_as_the_clients_bytes_or_one_sub_batch(
    make_api, fake_nodes
) -> None:
    """Items at heights the proxy has no hash of: the client's bytes go to the node as they
    are and its answer comes back as it is; with a cached item, an invalid one or a
    notification among them, the others go as one sub-batch with the client's ids (none
    with two alike: positions), and every answer is in its place with its id as written."""
    node = await fake_nodes("solo", "state")
    api = await make_api(fast_settings())
    await api.add("1337", node)
    await api.heads_known("1337")
    hit = await api.call("1337", "eth_getBalance", [ADDR, "latest"], rid=1)
    plain = at_heights(100)
    plain[3]["id"], plain[4]["id"] = "three", "x" * 40  # string ids keep their place too
    body = orjson.dumps(plain).replace(b'"id":7,', b'"id" : 7 ,')  # spacing: bytes kept
    status, answers = await api.rpc("1337", body)
    assert status == 200 and node.bodies[-1] == body  # the client's bytes, as they are
    assert [a["id"] for a in answers] == [i["id"] for i in plain]
    assert [a["result"]["height"] for a in answers] == [900 + i % 50 for i in range(100)]

    bad = req("eth_getBalance", [], "bad")  # missing address: answered by the proxy
    notification = {k: v for k, v in req("eth_getCode", [ADDR, "0x3a0"]).items() if k != "id"}
    cases = {
        "hit": [*plain[:50], balance(rid="hit"), *plain[50:]],
        "bad": [*plain[:10], bad, *plain[10:]],
        "notification": [notification, *plain],
    }
    for name, batch in cases.items():
        _, answers = await api.rpc("1337", batch)
        sent = orjson.loads(node.bodies[-1])
        unsent = ("hit", "bad")  # answered from the cache, and by the proxy
        assert [i.get("id") for i in sent] == [
            i.get("id") for i in batch if i.get("id") not in unsent
        ]
        assert [a["id"] for a in answers] == [i["id"] for i in batch if "id" in i], name
        heights = [a["result"]["height"] for a in answers if a["id"] not in ("hit", "bad")]
        assert heights == [900 + i % 50 for i in range(100)], name
    assert answers[0]["id"] == 0  # (the notification got no answer)
    _, answers = await api.rpc("1337", cases["hit"])
    assert answers[50] == {**hit, "id": "hit"}
    _, answers = await api.rpc("1337", cases["bad"])
    assert answers[10]["id"] == "bad" and answers[10]["error"]["code"] == -32602

    twice = [*plain[:3], {**plain[3], "id": 0}]  # two items with id 0: sent by position
    _, answers = await api.rpc("1337", twice)
    assert [i["id"] for i in orjson.loads(node.bodies[-1])] == [0, 1, 2, 3]
    assert [(a["id"], a["result"]["height"]) for a in answers] == [
        (0, 900),
        (1, 901),
        (2, 902),
        (0, 903),
    ]
    metrics = await (await api.client.get("/metrics")).text()
    ok = 'chainstate_proxy_requests_total{chain="1337",method="eth_getBalance",node="solo"'
    assert f'{ok},outcome="ok"}} {1 + 100 * 6 + 4}.0' in metrics  # each once, none twice


async def test_a_plain_batch_answer_that_asks_for_more_is_taken_item_by_item(
    make_api, fake_nodes
) -> None:
    """100 plain items, a node that refuses two of them (-39008, -39006), answers out of
    order, or fails the whole attempt: the refused or failed items are retried on the
    other node, the rest are taken by their ids, and every answer is in its place."""
    a = await fake_nodes("a", "state")
    b = await fake_nodes("b", "state")
    a.method_errors = {"eth_call": -39008, "eth_getCode": -39006}
    api = await make_api(fast_settings())
    await api.add("1337", a)
    await api.add("1337", b)
    await api.heads_known("1337")
    batch = at_heights(100)
    batch[37] = req("eth_call", [{"to": ADDR}, hex(937)], 37)
    batch[80] = req("eth_getCode", [ADDR, hex(930)], 80)
    pool = api.proxy.state.pools["1337"]
    for case in ("refused", "reversed", "failed"):
        a.reverse, a.fail_every = case == "reversed", 1 if case == "failed" else 0
        before = len(a.bodies)
        for _ in range(40):  # until a was asked first (the choice is by cost, then drawn)
            fast = pool.find("a")
            fast.cost, fast.cost_at = 0.0001, time.monotonic()
            _, answers = await api.rpc("1337", batch)
            assert [x["id"] for x in answers] == list(range(100)), case
            assert [x["result"]["height"] for x in answers] == [900 + i % 50 for i in range(100)]
            assert served_by(answers[37]) == "b" and served_by(answers[80]) == "b", case
            if len(a.bodies) > before:
                break
        assert len(a.bodies) > before, case
        first = a.bodies[before]
        if case == "failed":
            assert {served_by(x) for x in answers} == {"b"}
        else:
            assert first == orjson.dumps(batch) and served_by(answers[0]) == "a", case
    metrics = await (await api.client.get("/metrics")).text()
    assert 'chainstate_proxy_retries_total{chain="1337",reason="unsupported_precompile"}' in metrics
    assert 'chainstate_proxy_retries_total{chain="1337",reason="block_not_found"}' in metrics
    assert 'method="eth_call",node="b",outcome="ok"' in metrics


async def test_items_naming_no_block_are_planned_by_method(two) -> None:
    """The read path is asked once per method and block within a batch: eth_blockNumber
    after another method that names no block is still answered by the proxy itself."""
    api, state, _ = two
    batch = [req("eth_chainId", [], 1), req("eth_blockNumber", [], 2), req("eth_chainId", [], 3)]
    _, answers = await api.rpc("1337", batch)
    assert [a["id"] for a in answers] == [1, 2, 3] and answers[1]["result"] == hex(1000)
    assert [i["method"] for i in state.received] == ["eth_chainId", "eth_chainId"]

"""What a client of the standard Ethereum API sees through the proxy (proxy/face.py, proxy/
heads.py): `null` for a block, transaction or receipt not found, geth's error codes instead of
the spec's -39xxx (vendor methods keep those), `latest` never lower than an answer before.
Every rule on every route: a single request (the first of a block text takes the general
path, the next one the kept route), a batch, over the data port (HTTP) and in process
(`Engine.handle`); answers made in process by a real state node are in test_inprocpath.py."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson

from chainstate.jsonrpc import JsonRpcError
from proxy.app import get_engine
from tests.proxy.conftest import ADDR, fast_settings, req, wait_until
from tests.proxy.fakes import FakeNode, block_hash
from tests.proxy.test_reads import chain_known, view_of

REVERT = "0x08c379a0" + "00" * 31 + "20" + "00" * 31 + "04" + "6e6f7065" + "00" * 28
UNKNOWN_HASH = block_hash(999, fork=9)  # a block of no node's chain


class FailingNode(FakeNode):
    """A fake whose executions fail as a state node's do, with the spec's codes."""

    def _result(self, item: dict[str, Any], polling: bool) -> Any:
        method = item["method"]
        if method == "eth_call":
            raise JsonRpcError(-39000, "execution reverted: nope", REVERT)
        if method == "eth_getStorageAt":
            raise JsonRpcError(-39005, f"{self.name}: database error")
        if method == "eth_createAccessList":
            raise JsonRpcError(-39001, f"{self.name}: gas exhausted")
        if method == "contractMultiCall":
            raise JsonRpcError(-39000, "execution reverted", REVERT)
        return super()._result(item, polling)


TX_LOOKUPS = ("eth_getTransactionByHash", "eth_getTransactionReceipt")


class TxNode(FakeNode):
    """A fake state node holding transactions (`txs`: hash → block height), answering the
    lookups by hash as a state node does: one outside its window is -39006 from a node whose
    window does not start at 0 (an older one may be on an archive), else null."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.txs: dict[str, int] = {}

    def _result(self, item: dict[str, Any], polling: bool) -> Any:
        if item["method"] not in TX_LOOKUPS or item["method"] in self.method_errors:
            return super()._result(item, polling)
        tx_hash = item["params"][0]
        height = self.txs.get(tx_hash)
        if height is None or not self.earliest <= height <= self.head:
            if self.earliest > 0:
                raise JsonRpcError(-39006, f"{self.name}: transaction not in window")
            return None
        return {
            "node": self.name,
            "hash": tx_hash,
            "blockNumber": hex(height),
            "blockHash": self.hash_at(height),
            "transactionIndex": "0x0",
        }


# (request, what the client sees: ("result", value) or ("error", code))
CASES: list[tuple[dict[str, Any], tuple[str, Any]]] = [
    (req("eth_call", [{"to": ADDR}, "0x3e0"]), ("error", 3)),
    (req("eth_getBlockByNumber", ["0x5000", False]), ("result", None)),  # a future block
    (req("eth_getBlockByHash", [UNKNOWN_HASH, True]), ("result", None)),
    (req("eth_getBlockReceipts", ["0x5000"]), ("result", None)),
    (req("eth_getBlockTransactionCountByNumber", ["0x5000"]), ("result", None)),
    (req("eth_getTransactionByBlockHashAndIndex", [UNKNOWN_HASH, "0x0"]), ("result", None)),
    (req("eth_getUncleCountByBlockNumber", ["0x5000"]), ("result", None)),
    (req("eth_getBalance", [ADDR, "0x5000"]), ("error", -32000)),  # a state read: an error
    (req("eth_getStorageAt", [ADDR, "0x0", "0x3e0"]), ("error", -32603)),
    (req("eth_createAccessList", [{"to": ADDR}, "0x3e0"]), ("error", -32000)),
    (req("eth_getBalance", [ADDR, "0xzz"]), ("error", -32602)),  # the proxy's own check
    (req("eth_getBlockByNumber", [{"blockHash": "0x12"}, False]), ("error", -32602)),
    # vendor methods: the spec's codes
    (req("getAddressBalance", [ADDR, {"block_id": "0x5000"}]), ("error", -39006)),
    (req("getAddressBalance", [ADDR, {"block_id": "0xzz"}]), ("error", -39007)),
    (req("contractMultiCall", [[], {"block_id": "0x3e0"}]), ("error", -39000)),
    (req("getBlockByHeight", ["0x5000"]), ("error", -39006)),
]


def check(answer: dict[str, Any], request: dict[str, Any], expected: tuple[str, Any]) -> None:
    what, value = expected
    assert answer["id"] == request["id"], (request, answer)
    if what == "result":
        assert "error" not in answer and answer["result"] == value, (request, answer)
        return
    error = answer["error"]
    assert error["code"] == value, (request, answer)
    if value == 3:  # a revert keeps the node's message and data
        assert error["message"] == "execution reverted: nope" and error["data"] == REVERT


async def failing_pool(make_api, fake_nodes):
    state = FailingNode("state-1", "state")
    archive = FailingNode("archive-1", "archive")
    for node in (state, archive):
        await node.start()
    api = await make_api(fast_settings(cache_pools=[]))
    await api.add("1337", state)
    await api.add("1337", archive)
    await chain_known(api)
    return api, (state, archive)


async def test_standard_codes_and_null_on_every_route(make_api, fake_nodes) -> None:
    api, nodes = await failing_pool(make_api, fake_nodes)
    engine = get_engine(api.client.app)
    try:
        for i, (request, expected) in enumerate(CASES):
            one = {**request, "id": i}
            for _ in range(2):  # the general path, then the route kept for the block text
                check((await api.rpc("1337", one))[1], one, expected)
                status, raw = await engine.handle("1337", orjson.dumps(one), {})
                assert status == 200
                check(orjson.loads(raw), one, expected)
        batch = [{**request, "id": i} for i, (request, _) in enumerate(CASES)]
        for _ in range(2):
            status, answers = await api.rpc("1337", batch)
            assert status == 200 and len(answers) == len(CASES)
            for answer, request, (_, expected) in zip(answers, batch, CASES, strict=True):
                check(answer, request, expected)
            status, raw = await engine.handle("1337", orjson.dumps(batch), {})
            for answer, request, (_, expected) in zip(orjson.loads(raw), batch, CASES, strict=True):
                check(answer, request, expected)
        # Ids orjson would change come back as written, also when the answer is rewritten.
        for rid in (b"1e-400", b"18446744073709551616", b"1.50"):
            body = b'{"jsonrpc":"2.0","id":%s,"method":"eth_call","params":[{"to":"%s"},"0x3e0"]}'
            body = body % (rid, ADDR.encode())
            for _ in range(2):
                async with api.client.data.post("/1337", data=body) as resp:
                    raw = await resp.read()
                assert raw.startswith(b'{"jsonrpc":"2.0","id":%s,' % rid), raw
                assert orjson.loads(raw)["error"]["code"] == 3, raw
        # Called directly, the nodes keep the spec's codes.
        async with aiohttp.ClientSession() as session:
            body = orjson.dumps(req("eth_getBlockByNumber", ["0x5000", False]))
            async with session.post(nodes[0].url, data=body) as resp:
                assert orjson.loads(await resp.read())["error"]["code"] == -39006
    finally:
        for node in nodes:
            await node.stop()


async def test_a_block_that_exists_but_no_node_holds_is_an_error_not_null(
    make_api, fake_nodes
) -> None:
    """Block 10 of a chain at 1000, in a pool whose only node keeps 128 blocks: it exists,
    so the client is told no node holds it (-32000), not that there is no such block."""
    state = await fake_nodes("state-1", "state")
    api = await make_api()
    await api.add("1337", state)
    await chain_known(api)
    for params in (["0xa", False], ["0x5000", False]):
        single = await api.call("1337", "eth_getBlockByNumber", params)
        _, batch = await api.rpc("1337", [req("eth_getBlockByNumber", params, 5)])
        for answer in (single, batch[0]):
            if params[0] == "0xa":
                assert answer["error"]["code"] == -32000, answer
            else:
                assert answer["result"] is None, answer


async def test_latest_never_goes_backwards(make_api, fake_nodes) -> None:
    """Two replicas leapfrogging each other (one a block ahead, then the other), and a
    client alternating eth_blockNumber and eth_getBlockByNumber("latest") singly, in
    batches, over HTTP and in process: no answer is ever lower than one before it. When the
    leading replica leaves, `latest` stays at its head."""
    a = await fake_nodes("a", "state", head=1000)
    b = await fake_nodes("b", "state", head=1000)
    api = await make_api(fast_settings(cache_pools=[], head_poll_interval=0.01))
    await api.add("1337", a)
    await api.add("1337", b)
    await chain_known(api)
    engine = get_engine(api.client.app)
    stop = asyncio.Event()

    async def grow() -> None:
        while not stop.is_set():
            leader, other = (a, b) if a.head <= b.head else (b, a)
            leader.head = other.head + 1  # one replica a block ahead of the other
            await asyncio.sleep(0.015)

    seen: list[int] = []

    def saw(answer: dict[str, Any]) -> None:
        result = answer["result"]
        height = int(result if isinstance(result, str) else result["number"], 16)
        assert not seen or height >= seen[-1], (seen[-5:], answer)
        seen.append(height)

    grower = asyncio.create_task(grow())
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    try:
        i = 0
        # at least 150 rounds, and on until the heads moved (a loaded machine polls late)
        while i < 150 or (seen[-1] - seen[0] <= 5 and loop.time() < deadline):
            i += 1
            number = req("eth_blockNumber", [], i)
            block = req("eth_getBlockByNumber", ["latest", False], i)
            saw((await api.rpc("1337", number))[1])
            saw((await api.rpc("1337", block))[1])
            _, both = await api.rpc("1337", [number, block])
            saw(both[0])
            saw(both[1])
            assert int(both[0]["result"], 16) == int(both[1]["result"]["number"], 16)
            saw(orjson.loads((await engine.handle("1337", orjson.dumps(number), {}))[1]))
            saw(orjson.loads((await engine.handle("1337", orjson.dumps(block), {}))[1]))
    finally:
        stop.set()
        await grower
    assert seen[-1] - seen[0] > 5, "the heads did not move"
    # The leading replica leaves: the other one is behind, `latest` does not follow it down.
    top = max(a.head, b.head)
    leading, behind = (a, b) if a.head == top else (b, a)
    behind.head = top - 1
    pool = api.proxy.state.pools["1337"]
    await wait_until(lambda: pool.find(behind.name).head == top - 1)
    await wait_until(lambda: pool.find(leading.name).head == top)
    answered = int((await api.call("1337", "eth_blockNumber"))["result"], 16)
    assert answered == top
    await leading.stop()
    await wait_until(lambda: not pool.find(leading.name).healthy)
    assert int((await api.call("1337", "eth_blockNumber"))["result"], 16) == top


async def test_only_a_reorg_to_a_shorter_chain_lowers_latest(make_api, fake_nodes) -> None:
    """geth answers its new head after a reorg, lower when the new chain is shorter; the
    proxy follows once the known chain no longer has the block it answered."""
    node = await fake_nodes("state-1", "state")
    api = await make_api(fast_settings(cache_pools=[]))
    await api.add("1337", node)
    await chain_known(api)
    node.head = 1004
    await wait_until(lambda: view_of(api).tip == 1004)
    assert (await api.call("1337", "eth_blockNumber"))["result"] == hex(1004)
    node.head = 1002  # rolled back to a shorter chain on another fork
    node.reorg(1001, fork=2)
    await wait_until(lambda: view_of(api).tip == 1002)
    assert (await api.call("1337", "eth_blockNumber"))["result"] == hex(1002)
    block = (await api.call("1337", "eth_getBlockByNumber", ["latest", False]))["result"]
    assert block["hash"] == block_hash(1002, fork=2)


async def test_a_client_names_the_lowest_block_it_accepts(make_api, fake_nodes) -> None:
    """`x-min-block`: a client that saw block N through another proxy is never answered
    from below it; a value that is not a height is refused."""
    slow = await fake_nodes("slow", "state", head=1000)
    fast = await fake_nodes("fast", "state", head=1003)
    api = await make_api(fast_settings(cache_pools=[]))
    await api.add("1337", slow)
    await chain_known(api)
    engine = get_engine(api.client.app)
    header = {"x-min-block": "0x3e9"}  # 1001: above what this proxy's node holds
    number = req("eth_blockNumber")
    assert (await api.rpc("1337", number, header))[1]["result"] == hex(1001)
    _, raw = await engine.handle("1337", orjson.dumps([number]), {"x-min-block": "1001"})
    assert orjson.loads(raw)[0]["result"] == hex(1001)
    # A read at `latest` is asked at that block (here no node has it: an error, not an
    # answer from block 1000).
    answer = (await api.rpc("1337", req("eth_getBalance", [ADDR, "latest"]), header))[1]
    assert "error" in answer, answer
    await api.add("1337", fast)
    await chain_known(api)
    answer = (await api.rpc("1337", req("eth_getBalance", [ADDR, "latest"]), header))[1]
    assert answer["result"]["height"] == 1003  # the pool's latest is higher: that one
    for bad in ("latest", "-1", "0x", "1e3", "1_000", "0X10", "0x" + "f" * 17):
        status, answer = await api.rpc("1337", number, {"x-min-block": bad})
        assert status == 200 and answer["error"]["code"] == -32600, (bad, answer)
        assert "x-min-block" in answer["error"]["message"]


async def test_full_nodes_answer_what_needs_a_trie(make_api, fake_nodes) -> None:
    """`eth_getProof` goes to the pool's full nodes, by block; nothing else does (unless a
    method route sends it there); without full nodes it goes to the Leader."""
    state = await fake_nodes("state-1", "state")
    full = await fake_nodes("geth-1", "state", head=1002)  # (answers as any fake node)
    api = await make_api()
    await api.add("1337", state)
    status, answer = await api.post("/1337/addNode", {**full.entry(), "kind": "full"})
    assert status == 201, answer
    pool = api.proxy.state.pools["1337"]
    await wait_until(lambda: pool.fulls and pool.fulls[0].head == 1002)
    assert [n.key for n in pool.readers] == ["state-1"]
    proof = ["0x" + "11" * 20, ["0x0"], "0x3e9"]
    answer = await api.call("1337", "eth_getProof", proof)
    assert answer["result"]["node"] == "geth-1", answer
    params = {"method": "eth_getProof", "block": "0x3e9"}
    status, chosen = await api.get("/1337/debug_chooseOneNode", params=params)
    assert status == 200 and chosen["kind"] == "full" and chosen["node"]["key"] == "geth-1"
    _, answers = await api.rpc("1337", [req("eth_getProof", proof, 1), req("eth_chainId", [], 2)])
    assert [a["result"]["node"] for a in answers] == ["geth-1", "state-1"]
    for method, params in (("eth_getBalance", [ADDR, "latest"]), ("eth_blockNumber", [])):
        answer = await api.call("1337", method, params)
        assert "geth" not in orjson.dumps(answer).decode(), (method, answer)
    status, nodes = await api.get("/1337/getAllNodes")
    assert {n["key"]: n["kind"] for n in nodes["nodes"]} == {"state-1": "state", "geth-1": "full"}
    metrics = await (await api.client.get("/metrics")).text()
    assert 'node="geth-1"' in metrics
    # A method route may send more there.
    route = {"method": "eth_getCode", "kind": "full"}
    assert (await api.post("/1337/addMethodRoute", route))[0] == 200
    assert (await api.call("1337", "eth_getCode", [ADDR, "0x3e8"]))["result"]["node"] == "geth-1"
    # No full node left: the Leader's execution client.
    await api.post("/1337/deleteMethodRoute/eth_getCode")
    assert (await api.post("/1337/deleteNode/geth-1"))[0] == 200
    answer = await api.call("1337", "eth_getProof", proof)
    assert "no Leader" in answer["error"]["message"]
    writer = await fake_nodes("w1", "state")
    assert (
        await api.post("/1337/writers/addWriter", {"key": "w1", "url": writer.url, "leader": True})
    )[0] == 201
    answer = await api.call("1337", "eth_getProof", [*proof[:2], "0x3e8"])
    assert answer["result"]["node"] == "w1", answer


async def test_latest_is_sent_by_hash_only_where_the_method_takes_one(two) -> None:
    """A pinned `latest` goes to the node by hash where the block param takes an EIP-1898
    object (state reads, the block getters), and as the pinned height to the traces "by
    number", whose param is a number, tag or bare hash."""
    api, state, _ = two
    await chain_known(api)
    head = api.proxy.state.pools["1337"].head()
    by_hash = {"blockHash": block_hash(head)}
    for method, params, expected in (
        ("eth_getBalance", [ADDR, "latest"], by_hash),
        ("eth_getBlockReceipts", ["latest"], by_hash),
        ("eth_getTransactionByBlockNumberAndIndex", ["latest", "0x0"], by_hash),
        ("trace_block", ["latest"], hex(head)),
        ("debug_traceBlockByNumber", ["latest", {}], hex(head)),
        ("trace_replayBlockTransactions", ["latest", ["trace"]], hex(head)),
    ):
        answer = await api.call("1337", method, params)
        assert answer["result"]["height"] == head, (method, answer)
        sent = state.data_items(method)[-1]["params"][1 if method == "eth_getBalance" else 0]
        assert sent == expected, (method, sent)

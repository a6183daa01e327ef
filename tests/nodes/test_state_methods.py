"""Every read method of the state node: happy paths against the model, and bad inputs.

One `state` node (window 64) follows an in-process synthetic source of 100 blocks, so the
blocks 36..99 are in range and older ones are not.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from chainstate.inproc import InprocRegistry
from chainstate.jsonrpc import JsonRpcError
from nodes.state.service import StateNode
from tests.nodes.test_state_chain import CHAIN_ID, Account, ChainSource, random_chain

pytestmark = pytest.mark.asyncio(loop_scope="module")

CHAIN, ADDRS = random_chain(seed=31, blocks=100)
# Give one account code and a few slots at a known height, to read them back.
CONTRACT = ADDRS[5]
_ids = itertools.count(1)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def node(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[StateNode]:
    registry = InprocRegistry()
    source = ChainSource(CHAIN)
    registry.register("writer", source.handle_body)
    data_dir: Path = tmp_path_factory.mktemp("state-methods")
    node = StateNode.from_config(
        {"key": "s1", "kind": "state", "window": 64, "source": "inproc://writer"},
        data_dir=data_dir,
        registry=registry,
    )
    await node.start()
    await node.ingest.wait_for_height(CHAIN.head, within=30)
    yield node
    await node.close()


async def call(node: StateNode, method: str, params: Any = None) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": next(_ids), "method": method}
    if params is not None:
        body["params"] = params
    return orjson.loads(await node.handle_body(orjson.dumps(body)))


async def result(node: StateNode, method: str, params: Any = None) -> Any:
    answer = await call(node, method, params)
    assert "error" not in answer, answer
    return answer["result"]


async def error_code(node: StateNode, method: str, params: Any = None) -> int:
    answer = await call(node, method, params)
    assert "error" in answer, answer
    return answer["error"]["code"]


def acct(height: int, addr: str) -> Account:
    return CHAIN.state(height).get(addr, Account())


def header(height: int) -> dict[str, Any]:
    return CHAIN.blocks[height]["Header"]


async def test_block_number_chain_id_and_range(node: StateNode) -> None:
    assert await result(node, "eth_blockNumber") == hex(99)
    assert await result(node, "eth_chainId") == hex(CHAIN_ID)
    assert await result(node, "blockx_range") == {"earliest": 36, "latest": 99}
    assert await error_code(node, "eth_blockNumber", ["extra"]) == -32602


async def test_eth_account_reads_at_any_block_in_range(node: StateNode) -> None:
    for height in (36, 50, 77, 99):
        tag = hex(height)
        for addr in ADDRS:
            a = acct(height, addr)
            assert await result(node, "eth_getBalance", [addr, tag]) == hex(a.balance)
            assert await result(node, "eth_getTransactionCount", [addr, tag]) == hex(a.nonce)
            assert await result(node, "eth_getCode", [addr, tag]) == "0x" + a.code.hex()
            for slot in range(6):
                got = await result(node, "eth_getStorageAt", [addr, hex(slot), tag])
                assert got == "0x" + a.storage.get(slot, 0).to_bytes(32, "big").hex()


async def test_eth_block_params_tags_hashes_and_eip1898(node: StateNode) -> None:
    addr = ADDRS[0]
    latest = hex(acct(99, addr).balance)
    assert await result(node, "eth_getBalance", [addr]) == latest
    assert await result(node, "eth_getBalance", [addr, "latest"]) == latest
    assert (
        await result(node, "eth_getBalance", [addr.upper().replace("0X", "0x"), "safe"]) == latest
    )
    h60 = header(60)["hash"]
    want = hex(acct(60, addr).balance)
    assert await result(node, "eth_getBalance", [addr, h60]) == want
    assert await result(node, "eth_getBalance", [addr, {"blockHash": h60}]) == want
    assert await result(node, "eth_getBalance", [addr, {"blockNumber": "0x3c"}]) == want
    assert await result(node, "eth_getBalance", {"address": addr, "blockNumber": "0x3c"}) == want
    # a padded position is accepted, as geth does
    got = await result(node, "eth_getStorageAt", [addr, "0x" + "00" * 31 + "01", "0x3c"])
    assert got == "0x" + acct(60, addr).storage.get(1, 0).to_bytes(32, "big").hex()


async def test_blocks_outside_the_range_are_block_not_found(node: StateNode) -> None:
    addr = ADDRS[0]
    assert await error_code(node, "eth_getBalance", [addr, "0x23"]) == -39006  # 35 < 36
    assert await error_code(node, "eth_getBalance", [addr, "0x64"]) == -39006  # 100 > head
    assert await error_code(node, "eth_getBalance", [addr, "earliest"]) == -39006
    assert await error_code(node, "eth_getBalance", [addr, "0x" + "12" * 32]) == -39006
    assert await error_code(node, "eth_getBlockByNumber", ["0x5", False]) == -39006
    assert await error_code(node, "eth_getBlockByHash", [header(5)["hash"], False]) == -39006
    assert await error_code(node, "getBlockByHeight", [1000]) == -39006
    assert await error_code(node, "getBlockById", ["0x" + "ab" * 32]) == -39006
    ctx = {"block_id": "0x10", "type": "Equals"}
    assert await error_code(node, "getAddressBalance", [addr, ctx]) == -39006
    ahead = {"block_id": 500, "type": "Contains"}
    assert await error_code(node, "getAddressBalance", [addr, ahead]) == -39006


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("eth_getBalance", [ADDRS[0], "0xzz"]),
        ("eth_getBalance", [ADDRS[0], "0x01"]),
        ("eth_getBalance", [ADDRS[0], 12]),
        ("eth_getBalance", [ADDRS[0], {"blockHash": "0x12"}]),
        ("eth_getBalance", [ADDRS[0], {"blockHash": "0x" + "1" * 64, "blockNumber": "0x1"}]),
        ("eth_getBlockByNumber", ["newest", False]),
        ("eth_getBlockByHash", ["0x1234", False]),
        ("getBlockById", ["0x1234"]),
        ("getBlockById", [12]),
        ("getBlockByHeight", ["twelve"]),
        ("getBlockByHeight", [-1]),
        ("getBlockByHeight", ["0x" + "ab" * 32]),
        ("blockIsValid", ["latest"]),
        ("getAddressBalance", [ADDRS[0], {"block_id": "0xnope", "type": "Equals"}]),
        ("getAddressBalance", [ADDRS[0], {"block_id": "latest", "type": "Near"}]),
        ("getAddressBalance", [ADDRS[0], "latest"]),
    ],
)
async def test_malformed_block_ids_are_invalid_block_id(
    node: StateNode, method: str, params: list[Any]
) -> None:
    assert await error_code(node, method, params) == -39007


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("eth_getBalance", []),
        ("eth_getBalance", ["0x1234", "latest"]),
        ("eth_getBalance", [ADDRS[0], "latest", "extra"]),
        ("eth_getTransactionCount", [12, "latest"]),
        ("eth_getCode", [None, "latest"]),
        ("eth_getStorageAt", [ADDRS[0], "1", "latest"]),
        ("eth_getStorageAt", [ADDRS[0], "0x" + "1" * 65, "latest"]),
        ("eth_getStorageAt", [ADDRS[0]]),
        ("eth_getBlockByNumber", ["latest", "yes"]),
        ("eth_getBlockByNumber", []),
        ("eth_getBlockByHash", []),
        ("eth_baseFee", ["latest", 1]),
        ("getAddressBalance", ["nope"]),
        ("getAddressNonce", []),
        ("getAddressCode", [ADDRS[0], None, 3]),
        ("getStorageAt", [ADDRS[0], "0xq"]),
        ("getBlockByHeight", []),
        ("blockIsValid", []),
        ("blockx_getValidation", [0]),
        ("blockx_getValidation", [0, 1001]),
        ("blockx_getValidation", [0, 0]),
        ("blockx_getValidation", [-1, 10]),
        ("blockx_getValidation", ["0x1", 10]),
        ("blockx_getValidation", [True, 10]),
        ("blockx_range", [1]),
        ("version", [1]),
    ],
)
async def test_bad_params_are_invalid_params(
    node: StateNode, method: str, params: list[Any]
) -> None:
    assert await error_code(node, method, params) == -32602


async def test_eth_get_block_is_the_block_as_ingested(node: StateNode) -> None:
    for full in (False, True):
        got = await result(node, "eth_getBlockByNumber", ["0x40", full])
        assert got == CHAIN.blocks[64]["BlockFile"]["block"]
        for name, value in header(64).items():
            assert got[name] == value, name
    by_hash = await result(node, "eth_getBlockByHash", [header(64)["hash"], True])
    assert by_hash == got
    latest = await result(node, "eth_getBlockByNumber", ["latest", False])
    assert latest["number"] == hex(99)


async def test_eth_base_fee_is_a_hex_quantity(node: StateNode) -> None:
    assert await result(node, "eth_baseFee") == header(99)["baseFeePerGas"]
    assert await result(node, "eth_baseFee", ["0x30"]) == header(48)["baseFeePerGas"]


async def test_vendor_account_reads_with_block_ctx(node: StateNode) -> None:
    addr = ADDRS[1]
    a99, a50 = acct(99, addr), acct(50, addr)
    assert await result(node, "getAddressBalance", [addr]) == hex(a99.balance)
    assert await result(node, "getAddressNonce", [addr]) == a99.nonce
    assert await result(node, "getAddressCode", [addr]) == "0x" + a99.code.hex()
    slot = "0x2"
    want = "0x" + a99.storage.get(2, 0).to_bytes(32, "big").hex()
    assert await result(node, "getStorageAt", [addr, slot]) == want
    eq50 = {"block_id": header(50)["hash"], "type": "Equals"}
    assert await result(node, "getAddressBalance", [addr, eq50]) == hex(a50.balance)
    assert await result(node, "getAddressNonce", [addr, {"block_id": 50}]) == a50.nonce
    assert await result(node, "getAddressBalance", {"address": addr, "blockCtx": eq50}) == hex(
        a50.balance
    )
    # Contains: any block holding that state, so the node answers at its head.
    contains = {"block_id": "0x32", "type": "Contains"}
    assert await result(node, "getAddressBalance", [addr, contains]) == hex(a99.balance)
    # ... even for a block below the window, whose hash the node still knows.
    old = {"block_id": header(3)["hash"], "type": "Contains"}
    assert await result(node, "getAddressNonce", [addr, old]) == a99.nonce


async def test_vendor_blocks(node: StateNode) -> None:
    h = header(99)
    want = {
        "id": h["hash"],
        "height": 99,
        "timestamp": int(h["timestamp"], 16),
        "parent_id": h["parentHash"],
        "base_fee_per_gas": int(h["baseFeePerGas"], 16),
        "miner": h["miner"],
        "gas_limit": int(h["gasLimit"], 16),
        "gas_used": int(h["gasUsed"], 16),
    }
    assert await result(node, "getLatestBlock") == want
    assert await result(node, "getBlockByHeight", [99]) == want
    assert await result(node, "getBlockByHeight", ["0x63"]) == want
    assert await result(node, "getBlockById", [h["hash"]]) == want
    assert await result(node, "getBlockById", {"id": h["hash"].upper().replace("0X", "0x")}) == want


async def test_block_is_valid(node: StateNode) -> None:
    assert await result(node, "blockIsValid", [header(99)["hash"]]) is True
    assert await result(node, "blockIsValid", [header(2)["hash"]]) is True  # below the window
    assert await result(node, "blockIsValid", ["0x" + "ab" * 32]) is False


async def test_checker_validation_records(node: StateNode) -> None:
    got = await result(node, "blockx_getValidation", [90, 20])
    assert [r["height"] for r in got] == list(range(90, 100))
    assert got[0] == {
        "height": 90,
        "id": header(90)["hash"],
        "parent_id": header(89)["hash"],
        "validation_hash": CHAIN.blocks[90]["ValidationHash"],
    }
    assert await result(node, "blockx_getValidation", {"fromHeight": 0, "count": 40}) == (
        await result(node, "blockx_getValidation", [36, 4])
    )


async def test_version(node: StateNode) -> None:
    assert await result(node, "version") == {
        "name": "chainstate-state-node",
        "version": "0.1.0",
        "key": "s1",
        "kind": "state",
        "window": 64,
        "chain_id": CHAIN_ID,
        "range": {"earliest": 36, "latest": 99},
    }


async def test_client_version_and_net(node: StateNode) -> None:
    """What web3.py's is_connected() and net.version ask: real answers from this node."""
    version = await result(node, "web3_clientVersion")
    name, key, release, _os_arch, runtime = version.split("/")
    assert (name, key, release) == ("chainstate-state-node", "s1", "v0.1.0")
    assert runtime.startswith("python3.")
    assert await result(node, "net_version") == str(CHAIN_ID)
    assert await result(node, "net_listening") is True
    assert await error_code(node, "net_version", [1]) == -32602


async def test_unknown_and_evm_methods_without_the_evm_are_method_not_found(
    node: StateNode,
) -> None:
    assert await error_code(node, "eth_sendRawTransaction", ["0x00"]) == -32601
    # The spec: a state node has no eth_estimateGas (nor transactions); the error says
    # where to go instead.
    answer = await call(node, "eth_estimateGas", [{"to": ADDRS[0]}])
    assert answer["error"]["code"] == -32601
    assert "estimateGas" in answer["error"]["message"] and "proxy" in answer["error"]["message"]
    answer = await call(node, "eth_gasPrice", [])
    assert answer["error"]["code"] == -32601 and "Leader" in answer["error"]["message"]
    assert await error_code(node, "eth_newFilter", [{}]) == -32601  # filters live in the proxy
    if "eth_call" not in node.dispatcher.methods:
        assert await error_code(node, "eth_call", [{"to": ADDRS[0]}, "latest"]) == -32601


async def test_batches_and_http(node: StateNode) -> None:
    server = TestServer(node.make_app())
    async with TestClient(server) as client:
        batch = [
            {"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber"},
            {"jsonrpc": "2.0", "id": 2, "method": "eth_getBalance", "params": [ADDRS[0], "0x1"]},
            {"jsonrpc": "2.0", "method": "eth_chainId"},
        ]
        resp = await client.post("/", data=orjson.dumps(batch))
        answers = await resp.json()
        assert [a["id"] for a in answers] == [1, 2]
        assert answers[0]["result"] == hex(99)
        assert answers[1]["error"]["code"] == -39006
        health = await client.get("/health")
        doc = await health.json()
        assert health.status == 200 and doc["head"] == 99 and doc["earliest"] == 36
        metrics = await (await client.get("/metrics")).text()
        assert 'chainstate_state_head{node="s1"} 99.0' in metrics
        resp = await client.post("/", data=b"{not json")
        assert (await resp.json())["error"]["code"] == -32700


class StuckSource(ChainSource):
    """Tells its whole chain's head but serves blocks only up to `serve_to`."""

    serve_to = 10

    async def _vendor_block(self, params: Any) -> dict[str, Any]:
        (ref,) = params
        if int(ref, 16) > self.serve_to:
            raise JsonRpcError(-32603, "not yet")
        return await super()._vendor_block(params)


async def test_eth_syncing_tells_how_far_the_node_is_behind_its_source(tmp_path: Path) -> None:
    chain, _ = random_chain(seed=32, blocks=21)
    source = StuckSource(chain)
    registry = InprocRegistry()
    registry.register("writer", source.handle_body)
    section = {"key": "sync", "kind": "archive", "source": "inproc://writer",
               "poll_interval": 0.02, "backoff_initial": 0.02, "backoff_max": 0.05,
               "fetch_concurrency": 1}  # fmt: skip
    node = StateNode.from_config(section, data_dir=tmp_path, registry=registry)
    await node.start()
    try:
        await node.ingest.wait_for_height(10, within=10)
        assert await result(node, "eth_syncing") == {
            "startingBlock": "0x0", "currentBlock": "0xa", "highestBlock": "0x14"
        }  # fmt: skip
        source.serve_to = 20
        await node.ingest.wait_for_height(20, within=10)
        assert await result(node, "eth_syncing") is False
    finally:
        await node.close()

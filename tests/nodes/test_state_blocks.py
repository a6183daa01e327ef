"""Blocks, transactions and receipts from the state node, compared with anvil's answers.

anvil mines a chain with transfers of every transaction type, a contract deployment, calls
that log, a transaction that reverts, a block with several transactions and empty blocks; a
write node follows it and an archive node (all blocks) and a `state` node (a window of 6)
ingest from it. Every block/transaction/receipt method, at every height, full or not, is
asked of anvil and of the archive node over its HTTP data port and in process, and the
answers must be the same JSON (key order included). Then what anvil cannot show: not
found (-39006 on the node, for the proxy to retry; `null` for an unknown transaction only
where the node holds the whole chain), bad params, and the `state` node's window.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio

from chainstate.inproc import InprocRegistry
from chainstate.rpcserver import serve_rpc
from nodes.devnet.anvil import AnvilProcess
from nodes.devnet.rpc import EthClient
from nodes.devnet.workload import STORAGE_RUNTIME, init_code, storage_call_data
from nodes.state.service import StateNode
from nodes.writer.service import WriterNode
from tests.conftest import free_port

pytestmark = pytest.mark.asyncio(loop_scope="module")

FAST = {"poll_interval": 0.01, "backoff_initial": 0.02, "backoff_max": 0.2}
WINDOW = 6
# LOG1(memory[0:32] = calldata[0:32], topic0 = CALLER), then STOP.
LOGGER_RUNTIME = bytes.fromhex("6000356000523360206000a100")
REVERTER_RUNTIME = bytes.fromhex("60006000fd")  # REVERT(0, 0)
_ids = itertools.count(1)


@dataclass
class Chain:
    """What the scenario made on anvil."""

    tx_hashes: list[str] = field(default_factory=list)
    reverted: str = ""
    storage: str = ""  # a contract with slots 1 and 2 set
    multi_tx_block: int = 0
    empty_blocks: list[int] = field(default_factory=list)


async def mined(eth: EthClient, tx_hash: str) -> dict[str, Any]:
    for _ in range(200):
        receipt = await eth.call("eth_getTransactionReceipt", [tx_hash])
        if receipt is not None:
            return receipt
        await asyncio.sleep(0.02)
    raise AssertionError(f"{tx_hash} was not mined")


async def make_chain(eth: EthClient) -> Chain:
    chain = Chain()
    a0, a1, a2 = (await eth.call("eth_accounts"))[:3]

    async def send(tx: dict[str, Any]) -> dict[str, Any]:
        tx_hash = await eth.call("eth_sendTransaction", [tx])
        chain.tx_hashes.append(tx_hash)
        return await mined(eth, tx_hash)

    await send({"from": a0, "to": a1, "value": hex(10**18)})  # EIP-1559
    await send({"from": a1, "to": a2, "value": "0x7", "gasPrice": hex(3 * 10**9)})  # legacy
    await send(
        {"from": a0, "to": a2, "value": "0x9", "gasPrice": hex(3 * 10**9),
         "accessList": [{"address": a1, "storageKeys": ["0x" + "00" * 32]}]}
    )  # EIP-2930  # fmt: skip
    logger = (await send({"from": a0, "data": "0x" + init_code(LOGGER_RUNTIME).hex()}))[
        "contractAddress"
    ]
    reverter = (await send({"from": a2, "data": "0x" + init_code(REVERTER_RUNTIME).hex()}))[
        "contractAddress"
    ]
    await send({"from": a1, "to": logger, "data": "0x" + "ab" * 32})
    receipt = await send({"from": a1, "data": "0x" + init_code(STORAGE_RUNTIME).hex()})
    chain.storage = receipt["contractAddress"]
    for slot in (1, 2):
        await send({"from": a1, "to": chain.storage, "data": storage_call_data(slot, 40 + slot)})
    receipt = await send({"from": a0, "to": reverter, "gas": hex(60_000)})
    assert receipt["status"] == "0x0"
    chain.reverted = receipt["transactionHash"]
    await eth.call("evm_mine")
    chain.empty_blocks.append(int(await eth.call("eth_blockNumber"), 16))
    # several transactions in one block, one of them reverting, two logging
    await eth.call("evm_setAutomine", [False])
    for tx in (
        {"from": a2, "to": logger, "data": "0x" + "01" * 32},
        {"from": a0, "to": a1, "value": "0x1"},
        {"from": a1, "to": reverter, "gas": hex(60_000)},
        {"from": a2, "to": logger, "data": "0x" + "02" * 32},
    ):
        chain.tx_hashes.append(await eth.call("eth_sendTransaction", [tx]))
    await eth.call("evm_mine")
    await eth.call("evm_setAutomine", [True])
    chain.multi_tx_block = int((await mined(eth, chain.tx_hashes[-1]))["blockNumber"], 16)
    for _ in range(2):
        await eth.call("evm_mine")
        chain.empty_blocks.append(int(await eth.call("eth_blockNumber"), 16))
    # more blocks, so the `state` node's window has moved past the first ones
    for i in range(WINDOW):
        await send({"from": a2, "to": a0, "value": hex(i + 1)})
    return chain


@dataclass
class Stack:
    anvil_url: str
    archive: StateNode
    state: StateNode
    archive_url: str  # the archive node's HTTP data port
    registry: InprocRegistry
    chain: Chain
    head: int
    session: aiohttp.ClientSession

    async def answer(self, url: str, method: str, params: list[Any]) -> dict[str, Any]:
        """The whole answer object (result or error) of one request."""
        body = orjson.dumps({"jsonrpc": "2.0", "id": next(_ids), "method": method,
                             "params": params})  # fmt: skip
        if url.startswith("inproc://"):
            node = self.archive if url == "inproc://archive" else self.state
            raw = await node.handle_body(body)
        else:
            async with self.session.post(url, data=body, headers=JSON) as resp:
                raw = await resp.read()
        answer = orjson.loads(raw)
        answer.pop("id")
        return answer

    async def same_as_anvil(self, method: str, params: list[Any]) -> Any:
        """The result of `method` on anvil, after checking the archive node answers the
        same JSON, key order included, over HTTP and in process."""
        want = await self.answer(self.anvil_url, method, params)
        assert "result" in want, (method, params, want)
        for url in (self.archive_url, "inproc://archive"):
            got = await self.answer(url, method, params)
            assert orjson.dumps(got) == orjson.dumps(want), (url, method, params, got, want)
        return want["result"]

    async def error(self, url: str, method: str, params: list[Any]) -> tuple[int, str]:
        answer = await self.answer(url, method, params)
        assert "error" in answer, (method, params, answer)
        return answer["error"]["code"], answer["error"]["message"]

    async def result(self, url: str, method: str, params: list[Any]) -> Any:
        answer = await self.answer(url, method, params)
        assert "result" in answer, (method, params, answer)
        return answer["result"]


JSON = {"content-type": "application/json"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(
    anvil: AnvilProcess, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp("blocks")
    registry = InprocRegistry()
    eth = EthClient(anvil.url)
    async with AsyncExitStack() as stack:
        stack.push_async_callback(eth.close)
        chain = await make_chain(eth)
        head = int(await eth.call("eth_blockNumber"), 16)
        writer = WriterNode.from_config(
            {"execution_url": anvil.url, "poll_interval": 0.01, "key": "w"},
            data_dir=tmp / "writer", registry=registry,
        )  # fmt: skip
        await writer.start()
        stack.push_async_callback(writer.close)
        nodes = []
        for key, kind in (("archive", "archive"), ("state", "state")):
            node = StateNode.from_config(
                {"key": key, "kind": kind, "window": WINDOW, "source": "inproc://w", **FAST},
                data_dir=tmp / key, registry=registry,
            )  # fmt: skip
            await node.start()
            stack.push_async_callback(node.close)
            await node.ingest.wait_for_height(head, within=60)
            nodes.append(node)
        port = free_port()
        await serve_rpc(
            stack, nodes[0].handle_body, nodes[0].make_app(), "127.0.0.1", port,
            name="archive", answer_now=nodes[0].answer_now,
        )  # fmt: skip
        session = aiohttp.ClientSession()
        stack.push_async_callback(session.close)
        yield Stack(
            anvil.url, nodes[0], nodes[1], f"http://127.0.0.1:{port}/", registry, chain,
            head, session,
        )  # fmt: skip


async def test_the_scenario_made_what_the_tests_need(stack: Stack) -> None:
    block = await stack.same_as_anvil("eth_getBlockByNumber", [hex(stack.chain.multi_tx_block),
                                                                True])  # fmt: skip
    assert len(block["transactions"]) == 4
    assert {tx["type"] for h in range(stack.head + 1) for tx in (
        await stack.same_as_anvil("eth_getBlockByNumber", [hex(h), True]))["transactions"]
    } == {"0x0", "0x1", "0x2"}  # fmt: skip
    receipts = await stack.same_as_anvil("eth_getBlockReceipts", [hex(stack.chain.multi_tx_block)])
    assert [r["status"] for r in receipts] == ["0x1", "0x1", "0x0", "0x1"]
    assert [len(r["logs"]) for r in receipts] == [1, 0, 0, 1]


async def test_blocks_equal_anvils_at_every_height(stack: Stack) -> None:
    for height in range(stack.head + 1):
        for full in (False, True):
            block = await stack.same_as_anvil("eth_getBlockByNumber", [hex(height), full])
            assert await stack.same_as_anvil("eth_getBlockByHash", [block["hash"], full]) == block
            assert "withdrawals" in block and "size" in block
        count = await stack.same_as_anvil("eth_getBlockTransactionCountByNumber", [hex(height)])
        assert int(count, 16) == len(block["transactions"])
        await stack.same_as_anvil("eth_getBlockTransactionCountByHash", [block["hash"]])
        await stack.same_as_anvil("eth_getUncleCountByBlockNumber", [hex(height)])
        await stack.same_as_anvil("eth_getUncleCountByBlockHash", [block["hash"]])
        assert (
            await stack.same_as_anvil("eth_getUncleByBlockNumberAndIndex", [hex(height), "0x0"])
            is None
        )
        assert (
            await stack.same_as_anvil("eth_getUncleByBlockHashAndIndex", [block["hash"], "0x0"])
            is None
        )
    for tag in ("latest", "earliest"):
        for full in (False, True):
            await stack.same_as_anvil("eth_getBlockByNumber", [tag, full])
        await stack.same_as_anvil("eth_getBlockTransactionCountByNumber", [tag])
        await stack.same_as_anvil("eth_getBlockReceipts", [tag])


async def test_transactions_and_receipts_equal_anvils(stack: Stack) -> None:
    seen = []
    for height in range(stack.head + 1):
        block = await stack.same_as_anvil("eth_getBlockByNumber", [hex(height), True])
        receipts = await stack.same_as_anvil("eth_getBlockReceipts", [hex(height)])
        assert await stack.same_as_anvil("eth_getBlockReceipts", [block["hash"]]) == receipts
        assert (
            await stack.same_as_anvil("eth_getBlockReceipts", [{"blockHash": block["hash"]}])
            == receipts
        )
        txs = block["transactions"]
        assert len(receipts) == len(txs)
        for index in range(len(txs) + 1):  # one past the end: null
            tx = await stack.same_as_anvil(
                "eth_getTransactionByBlockNumberAndIndex", [hex(height), hex(index)]
            )
            assert tx == (txs[index] if index < len(txs) else None)
            await stack.same_as_anvil(
                "eth_getTransactionByBlockHashAndIndex", [block["hash"], hex(index)]
            )
        for tx, receipt in zip(txs, receipts, strict=True):
            await stack.same_as_anvil("eth_getTransactionByHash", [tx["hash"]])
            assert await stack.same_as_anvil("eth_getTransactionReceipt", [tx["hash"]]) == receipt
            seen.append(tx["hash"])
    assert sorted(seen) == sorted(stack.chain.tx_hashes)
    reverted = await stack.same_as_anvil("eth_getTransactionReceipt", [stack.chain.reverted])
    assert reverted["status"] == "0x0"
    # a hash no block has: null on anvil and on a node that holds the whole chain
    for method in ("eth_getTransactionByHash", "eth_getTransactionReceipt"):
        assert await stack.same_as_anvil(method, ["0x" + "12" * 32]) is None


async def test_fees_hashing_storage_and_syncing_equal_anvils(stack: Stack) -> None:
    assert await stack.same_as_anvil("eth_blobBaseFee", []) == "0x1"
    await stack.same_as_anvil("web3_sha3", ["0x68656c6c6f"])
    await stack.same_as_anvil("web3_sha3", ["0x"])
    assert await stack.same_as_anvil("eth_syncing", []) is False
    latest = await stack.result(stack.archive_url, "eth_getBlockByNumber", ["latest", False])
    assert await stack.result(stack.archive_url, "eth_baseFee", []) == latest["baseFeePerGas"]
    contract, other = stack.chain.storage, "0x" + "77" * 20
    slots = ["0x" + f"{slot:064x}" for slot in (0, 1, 2)]
    for height in (hex(stack.head), "latest", "0x3", {"blockNumber": "0x3"}):
        want = {
            address: [await stack.same_as_anvil("eth_getStorageAt", [address, slot, height])
                      for slot in slots]
            for address in (contract, other)
        }  # fmt: skip
        # anvil lists the accounts in no fixed order; the node in address order, as geth
        params = [{contract: slots, other: slots}, height]
        assert await stack.result(stack.anvil_url, "eth_getStorageValues", params) == want
        for url in (stack.archive_url, "inproc://archive"):
            got = await stack.result(url, "eth_getStorageValues", params)
            assert got == want and list(got) == sorted(want)
    # the block is optional (latest), as the spec says (anvil wants it)
    got = await stack.result(stack.archive_url, "eth_getStorageValues", [{contract: slots}])
    assert got == {contract: ["0x" + f"{value:064x}" for value in (0, 41, 42)]}
    # addresses come back in lowercase (as geth's); short slots are read as quantities
    mixed = "0x" + contract[2:].upper()
    got = await stack.result(stack.archive_url, "eth_getStorageValues", [{mixed: ["0x2"]}])
    assert got == {contract: ["0x" + f"{42:064x}"]}


async def test_not_found_is_block_not_found_for_the_proxy_to_retry(stack: Stack) -> None:
    above, unknown = hex(stack.head + 1), "0x" + "ab" * 32
    by_number = [
        ("eth_getBlockByNumber", [above, False]),
        ("eth_getBlockTransactionCountByNumber", [above]),
        ("eth_getTransactionByBlockNumberAndIndex", [above, "0x0"]),
        ("eth_getBlockReceipts", [above]),
        ("eth_getUncleCountByBlockNumber", [above]),
        ("eth_getUncleByBlockNumberAndIndex", [above, "0x0"]),
    ]
    by_hash = [
        ("eth_getBlockByHash", [unknown, True]),
        ("eth_getBlockTransactionCountByHash", [unknown]),
        ("eth_getTransactionByBlockHashAndIndex", [unknown, "0x0"]),
        ("eth_getBlockReceipts", [unknown]),
        ("eth_getUncleCountByBlockHash", [unknown]),
        ("eth_getUncleByBlockHashAndIndex", [unknown, "0x0"]),
    ]
    for url in (stack.archive_url, "inproc://archive", "inproc://state"):
        for method, params in by_number + by_hash:
            code, _ = await stack.error(url, method, params)
            assert code == -39006, (url, method)


async def test_a_state_node_answers_its_window_and_sends_older_on(stack: Stack) -> None:
    state, earliest = "inproc://state", stack.head - WINDOW + 1
    assert stack.state.store.range() == (earliest, stack.head)
    for height in range(earliest, stack.head + 1):
        for full in (False, True):
            want = await stack.result(stack.anvil_url, "eth_getBlockByNumber", [hex(height), full])
            assert await stack.result(state, "eth_getBlockByNumber", [hex(height), full]) == want
        want = await stack.result(stack.anvil_url, "eth_getBlockReceipts", [hex(height)])
        assert await stack.result(state, "eth_getBlockReceipts", [hex(height)]) == want
    old = await stack.result(stack.anvil_url, "eth_getBlockByNumber", [hex(earliest - 1), True])
    assert (await stack.error(state, "eth_getBlockByNumber", [hex(earliest - 1), True]))[
        0
    ] == -39006
    assert (await stack.error(state, "eth_getBlockByHash", [old["hash"], False]))[0] == -39006
    assert (await stack.error(state, "eth_getBlockByNumber", ["earliest", False]))[0] == -39006
    # a transaction of a block below the window, or of no block: it cannot tell, so -39006
    for tx_hash in (stack.chain.tx_hashes[0], "0x" + "12" * 32):
        for method in ("eth_getTransactionByHash", "eth_getTransactionReceipt"):
            code, message = await stack.error(state, method, [tx_hash])
            assert code == -39006 and "older block" in message
    newest = stack.chain.tx_hashes[-1]
    want = await stack.result(stack.anvil_url, "eth_getTransactionReceipt", [newest])
    assert await stack.result(state, "eth_getTransactionReceipt", [newest]) == want


BAD_PARAMS = [
    ("eth_getBlockByNumber", ["0x1", "yes"], -32602),
    ("eth_getBlockByNumber", ["0x1", True, 1], -32602),
    ("eth_getBlockByNumber", [], -32602),
    ("eth_getBlockByNumber", ["0xzz", False], -39007),
    ("eth_getBlockByNumber", ["0x01", False], -39007),
    ("eth_getBlockByHash", ["0x1234", False], -39007),
    ("eth_getBlockByHash", [None, False], -32602),
    ("eth_getBlockTransactionCountByNumber", ["one"], -39007),
    ("eth_getTransactionByBlockNumberAndIndex", ["0x1", "zero"], -32602),
    ("eth_getTransactionByBlockNumberAndIndex", ["0x1"], -32602),
    ("eth_getTransactionByBlockHashAndIndex", ["0x1", "0x0"], -39007),
    ("eth_getUncleByBlockNumberAndIndex", ["0x1", 0], -32602),
    ("eth_getBlockReceipts", [{"blockHash": "0x12"}], -39007),
    ("eth_getTransactionByHash", ["0x12"], -32602),
    ("eth_getTransactionByHash", [], -32602),
    ("eth_getTransactionReceipt", [12], -32602),
    ("eth_getTransactionReceipt", ["0x" + "12" * 32, 1], -32602),
    ("web3_sha3", ["0x1"], -32602),
    ("web3_sha3", ["hello"], -32602),
    ("eth_syncing", [1], -32602),
    ("eth_blobBaseFee", ["latest"], -32602),
    ("eth_getStorageValues", [{}, "latest"], -32602),
    ("eth_getStorageValues", [[], "latest"], -32602),
    ("eth_getStorageValues", [{"0x12": ["0x0"]}, "latest"], -32602),
    ("eth_getStorageValues", [{"0x" + "12" * 20: "0x0"}, "latest"], -32602),
    ("eth_getStorageValues", [{"0x" + "12" * 20: ["0x" + "1" * 65]}, "latest"], -32602),
    ("eth_getStorageValues", [{"0x" + "12" * 20: ["0x0"]}, "0xzz"], -39007),
    ("eth_getStorageValues", [{"0x" + "12" * 20: ["0x0"] * 1025}, "latest"], -32005),
]


@pytest.mark.parametrize(("method", "params", "code"), BAD_PARAMS, ids=lambda v: str(v)[:40])
async def test_bad_params(stack: Stack, method: str, params: list[Any], code: int) -> None:
    for url in (stack.archive_url, "inproc://archive"):
        assert (await stack.error(url, method, params))[0] == code, url

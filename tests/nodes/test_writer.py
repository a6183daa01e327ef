"""The write node over a real anvil that ran the devnet workload.

Every emitted block is checked against what anvil itself reports at that block and at its
parent, for every account and slot the workload touched: `post` must hold exactly the
values that changed with their new values, `pre` the old ones, nothing else.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import pytest_asyncio
from aiohttp import ClientSession, web
from Crypto.Hash import keccak

from chainstate.inproc import InprocRegistry
from chainstate.jsonrpc import BLOCK_NOT_FOUND, INVALID_BLOCK_ID, INVALID_PARAMS, JsonRpcError
from chainstate.rpcclient import RpcClient
from nodes.devnet.anvil import GENESIS
from nodes.devnet.rpc import EthClient
from nodes.devnet.workload import WorkloadRecord, fresh_address, run_workload, slot_hex
from nodes.writer.service import WriterNode
from tests.conftest import free_port

pytestmark = pytest.mark.asyncio(loop_scope="module")

ZERO = {"balance": "0x0", "nonce": "0x0", "code": "0x"}
ZERO_WORD = "0x" + "00" * 32


@pytest.fixture(scope="module")
def record(anvil_url: str) -> WorkloadRecord:
    return asyncio.run(run_workload(anvil_url))


def make_writer(url: str, data_dir: Path, **extra: Any) -> WriterNode:
    section = {"execution_url": url, "poll_interval": 0.02, "key": "writer-t"} | extra
    return WriterNode.from_config(section, data_dir=data_dir, registry=InprocRegistry())


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["auto", "prestate"])
async def writer(
    request: pytest.FixtureRequest,
    anvil_url: str,
    record: WorkloadRecord,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[WriterNode]:
    """A writer over the workload's chain, once with each tracer (auto = Parity stateDiff
    replays on anvil, prestate = prestateTracer diffMode): both must give the same output."""
    node = make_writer(anvil_url, tmp_path_factory.mktemp("writer"), tracer=request.param)
    await node.start()
    await node.wait_for_head(record.last_block)
    assert node.follower is not None
    assert node.follower.stats.tracer == ("parity" if request.param == "auto" else "prestate")
    yield node
    await node.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def eth(anvil_url: str) -> AsyncIterator[EthClient]:
    client = EthClient(anvil_url)
    yield client
    await client.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def rpc(writer: WriterNode) -> RpcClient:
    """The writer's JSON-RPC in process, as state nodes reach it (`inproc://writer-t`)."""
    assert writer.registry is not None
    return RpcClient("inproc://writer-t", registry=writer.registry)


async def values_at(
    eth: EthClient, accounts: list[str], slots: list[tuple[str, str]], height: int
) -> dict[tuple[str, str], str]:
    """Balance, nonce, code of each account and each slot at `height`, canonical."""
    at = hex(height)
    calls: list[tuple[str, list[Any]]] = []
    keys: list[tuple[str, str]] = []
    for a in accounts:
        calls += [("eth_getBalance", [a, at]), ("eth_getTransactionCount", [a, at])]
        calls.append(("eth_getCode", [a, at]))
        keys += [(a, "balance"), (a, "nonce"), (a, "code")]
    for a, s in slots:
        calls.append(("eth_getStorageAt", [a, s, at]))
        keys.append((a, s))
    out = {}
    for key, value in zip(keys, await eth.batch(calls), strict=True):
        if key[1] in ("balance", "nonce"):
            value = hex(int(value, 16))
        elif key[1].startswith("0x"):
            value = "0x" + int(value, 16).to_bytes(32, "big").hex()
        out[key] = value
    return out


async def receipt_of(eth: EthClient, tx_hash: str) -> dict[str, Any]:
    """The receipt once mined (anvil may answer eth_sendTransaction before mining)."""
    async with asyncio.timeout(10):
        while (receipt := await eth.call("eth_getTransactionReceipt", [tx_hash])) is None:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    return receipt


async def send(eth: EthClient, tx: dict[str, Any]) -> dict[str, Any]:
    """Send from an unlocked account and wait for the receipt."""
    return await receipt_of(eth, await eth.call("eth_sendTransaction", [tx]))


def received(out: dict[str, Any], addr: str) -> int:
    """How much `addr`'s balance grew in the block (these tests run once per tracer, on one
    chain: the same recipient may already hold something)."""
    diff = out["StateDiff"]
    return int(diff["post"][addr]["balance"], 16) - int(diff["pre"][addr]["balance"], 16)


def diff_entry(diff: dict[str, Any], part: str, addr: str, key: str) -> str | None:
    acct = diff[part].get(addr, {})
    if key.startswith("0x"):
        return acct.get("storage", {}).get(key)
    return acct.get(key)


async def check_block(eth: EthClient, out: dict[str, Any], record: WorkloadRecord) -> int:
    """Compare one emitted block with the client at its height and its parent's, for every
    touched account and slot; returns how many changed values were compared."""
    n = int(out["Header"]["number"], 16)
    block = await eth.call("eth_getBlockByNumber", [hex(n), True])
    assert out["BlockFile"]["block"] == block
    assert out["Header"]["hash"] == block["hash"]
    assert len(out["BlockFile"]["receipts"]) == len(block["transactions"])
    diff = out["StateDiff"]
    accounts = sorted(record.accounts | set(diff["post"]) | set(diff["pre"]))
    slots = set(record.storage_targets())
    for addr, acct in diff["post"].items():
        slots |= {(addr, s) for s in acct.get("storage", {})}
    before = await values_at(eth, accounts, sorted(slots), n - 1)
    after = await values_at(eth, accounts, sorted(slots), n)
    changed = 0
    for key, old in before.items():
        new = after[key]
        pre, post = diff_entry(diff, "pre", *key), diff_entry(diff, "post", *key)
        if old == new:
            assert pre is None and post is None, (n, key)
        else:
            assert (pre, post) == (old, new), (n, key)
            changed += 1
    assert set(diff["pre"]) == set(diff["post"])
    return changed


async def test_every_block_matches_the_execution_client(
    writer: WriterNode, rpc: RpcClient, eth: EthClient, record: WorkloadRecord
) -> None:
    checked = 0
    for n in range(1, record.last_block + 1):
        checked += await check_block(eth, await rpc.call("trace_vendorBlock", [hex(n)]), record)
    assert checked > 100  # the workload changed many values; the loop really compared them


async def test_both_tracers_give_the_same_bytes(
    writer: WriterNode, anvil_url: str, record: WorkloadRecord, tmp_path: Path
) -> None:
    other_tracer = "prestate" if writer.settings.tracer == "auto" else "parity"
    other = make_writer(anvil_url, tmp_path, tracer=other_tracer)
    await other.start()
    try:
        await other.wait_for_head(record.last_block)
        for n in range(record.last_block + 1):
            assert other.block_output(hex(n)) == writer.block_output(hex(n))
    finally:
        await other.close()


async def test_validation_hash_recomputes(rpc: RpcClient, record: WorkloadRecord) -> None:
    for n in range(record.last_block + 1):
        out = await rpc.call("trace_vendorBlock", [hex(n)])
        canonical = orjson.dumps(
            {"Header": out["Header"], "StateDiff": out["StateDiff"]}, option=orjson.OPT_SORT_KEYS
        )
        assert (
            out["ValidationHash"] == "0x" + keccak.new(digest_bits=256, data=canonical).hexdigest()
        )


async def test_height_zero_is_the_genesis_allocation(rpc: RpcClient, eth: EthClient) -> None:
    out = await rpc.call("trace_vendorBlock", ["earliest"])
    assert out == await rpc.call("trace_vendorBlock", ["0x0"])
    block0 = await eth.call("eth_getBlockByNumber", ["0x0", False])
    assert out["Header"]["hash"] == block0["hash"]
    alloc = json.loads(GENESIS.read_text())["alloc"]
    txs = out["BlockFile"]["block"]["transactions"]
    assert [t["to"] for t in txs] == sorted("0x" + a for a in alloc)
    for tx in txs:
        want = keccak.new(digest_bits=256, data=f"genesis:{tx['to']}".encode()).hexdigest()
        assert tx["hash"] == "0x" + want
        assert tx["from"] == "0x" + "00" * 20 and tx["synthetic"] is True
        assert tx["value"] == alloc[tx["to"][2:]]["balance"] and tx["input"] == "0x"
    expected_post: dict[str, dict[str, str]] = {}
    expected_pre: dict[str, dict[str, str]] = {}
    for addr, entry in alloc.items():
        fields = {k: v for k, v in entry.items() if v not in ("0x0", "0x")}
        expected_post["0x" + addr] = fields
        expected_pre["0x" + addr] = {k: "0x0" if k == "balance" else "0x" for k in fields}
    assert expected_post["0x4e59b44847b379578588920ca78fbf26c0b4956c"]["code"].startswith("0x7f")
    assert out["StateDiff"] == {"pre": expected_pre, "post": expected_post}


async def test_slot_changed_and_restored_in_one_block_is_not_listed(
    rpc: RpcClient, record: WorkloadRecord
) -> None:
    storage = record.contracts["storage"]
    for n in range(1, record.last_block + 1):
        out = await rpc.call("trace_vendorBlock", [hex(n)])
        if len(out["BlockFile"]["block"]["transactions"]) == 3:
            break
    else:
        pytest.fail("the workload's three-transaction block is missing")
    assert storage not in out["StateDiff"]["post"]
    a0 = out["BlockFile"]["block"]["transactions"][0]["from"]
    pre, post = out["StateDiff"]["pre"][a0]["nonce"], out["StateDiff"]["post"][a0]["nonce"]
    assert int(post, 16) == int(pre, 16) + 2
    assert out["StateDiff"]["post"][fresh_address(3)] == {"balance": hex(777)}


async def test_created_and_destroyed_account_is_not_listed(
    rpc: RpcClient, record: WorkloadRecord
) -> None:
    ephemeral = record.contracts["ephemeral"]
    victim = record.contracts["selfdestruct"]
    seen_victim_drained = False
    for n in range(1, record.last_block + 1):
        diff = (await rpc.call("trace_vendorBlock", [hex(n)]))["StateDiff"]
        assert ephemeral not in diff["post"]
        if diff["post"].get(victim, {}).get("balance") == "0x0":
            assert diff["pre"][victim]["balance"] == hex(10**18)
            assert "code" not in diff["post"][victim]  # Cancun: the code stays
            seen_victim_drained = True
    assert seen_victim_drained


async def test_contract_creation_has_zero_pre(rpc: RpcClient, record: WorkloadRecord) -> None:
    token = record.erc20
    for n in range(1, record.last_block + 1):
        diff = (await rpc.call("trace_vendorBlock", [hex(n)]))["StateDiff"]
        if "code" in diff["post"].get(token, {}):
            assert diff["pre"][token]["code"] == "0x" and diff["pre"][token]["nonce"] == "0x0"
            assert all(v == ZERO_WORD for v in diff["pre"][token]["storage"].values())
            assert diff["post"][token]["storage"][slot_hex(2)] == slot_hex(10**24)
            return
    pytest.fail("ERC20 creation block not found")


async def test_block_by_hash_and_tags(writer: WriterNode, rpc: RpcClient, eth: EthClient) -> None:
    head = writer.head
    assert head is not None
    assert await rpc.call("eth_blockNumber") == hex(head)
    assert await rpc.call("eth_chainId") == "0x539"
    latest = await rpc.call("trace_vendorBlock", ["latest"])
    assert int(latest["Header"]["number"], 16) == head
    by_hash = await rpc.call("trace_vendorBlock", [latest["Header"]["hash"]])
    assert by_hash == latest
    by_object = await rpc.call("trace_vendorBlock", {"block": hex(head)})
    assert by_object == latest


@pytest.mark.parametrize(
    "params",
    [
        ["0xzz"],
        ["0x01"],
        ["-1"],
        ["12"],
        [12],
        [{"number": 1}],
        [None],
        [],
        [True],
        ["0x" + "a" * 63],
        ["LATEST"],
    ],
)
async def test_malformed_block_id_is_39007(rpc: RpcClient, params: list[Any]) -> None:
    with pytest.raises(JsonRpcError) as err:
        await rpc.call("trace_vendorBlock", params)
    assert err.value.code == INVALID_BLOCK_ID


async def test_unknown_block_is_39006(writer: WriterNode, rpc: RpcClient) -> None:
    head = writer.head
    assert head is not None
    for block_id in [hex(head + 1000), "0x" + "ab" * 32]:
        with pytest.raises(JsonRpcError) as err:
            await rpc.call("trace_vendorBlock", [block_id])
        assert err.value.code == BLOCK_NOT_FOUND


async def test_too_many_params_is_invalid_params(rpc: RpcClient) -> None:
    with pytest.raises(JsonRpcError) as err:
        await rpc.call("trace_vendorBlock", ["latest", True])
    assert err.value.code == INVALID_PARAMS


async def test_passed_through_params_nested_too_deep_are_invalid_params(writer: WriterNode) -> None:
    """Params the write node passes on to its execution client are written again: nested
    deeper than orjson writes, they are -32602 (not an internal error)."""
    nested: Any = {"from": "0x" + "11" * 20}
    for _ in range(260):
        nested = {"a": nested}
    body = {"jsonrpc": "2.0", "id": 3, "method": "eth_estimateGas", "params": [nested]}
    handler = writer.registry.resolve("inproc://writer-t")  # type: ignore[union-attr]
    answer = orjson.loads(await handler(json.dumps(body).encode()))
    assert answer["id"] == 3 and answer["error"]["code"] == INVALID_PARAMS, answer


async def test_send_passes_through_and_the_block_is_emitted(
    writer: WriterNode, rpc: RpcClient, eth: EthClient
) -> None:
    accounts = await eth.call("eth_accounts")
    tx = {"from": accounts[4], "to": fresh_address(90), "value": "0x2a"}
    receipt = await receipt_of(eth, await rpc.call("eth_sendTransaction", [tx]))
    height = int(receipt["blockNumber"], 16)
    await writer.wait_for_head(height, within=10)
    out = await rpc.call("trace_vendorBlock", [hex(height)])
    assert received(out, fresh_address(90)) == 0x2A
    # A transaction signed elsewhere goes through eth_sendRawTransaction.
    signed = {"from": accounts[4], "to": fresh_address(89), "value": "0x2b", "gas": "0x5208"}
    signed |= {"nonce": await eth.call("eth_getTransactionCount", [accounts[4], "latest"])}
    signed |= {"maxFeePerGas": hex(10**10), "maxPriorityFeePerGas": "0x1", "chainId": "0x539"}
    raw = await eth.call("eth_signTransaction", [signed])
    receipt = await receipt_of(eth, await rpc.call("eth_sendRawTransaction", [raw]))
    await writer.wait_for_head(int(receipt["blockNumber"], 16), within=10)
    out = await rpc.call("trace_vendorBlock", [receipt["blockNumber"]])
    assert received(out, fresh_address(89)) == 0x2B
    # The execution client's own error comes back unchanged.
    with pytest.raises(JsonRpcError) as direct:
        await eth.call("eth_sendRawTransaction", ["0x1234"])
    with pytest.raises(JsonRpcError) as err:
        await rpc.call("eth_sendRawTransaction", ["0x1234"])
    assert (err.value.code, err.value.message) == (direct.value.code, direct.value.message)


async def test_lifecycle_and_pending_reads_pass_through(rpc: RpcClient, eth: EthClient) -> None:
    """What a wallet asks around a send comes from the execution client, mempool included."""
    accounts = await eth.call("eth_accounts")
    assert await rpc.call("eth_accounts") == accounts
    sender = accounts[6]
    await eth.call("evm_setAutomine", [False])  # keep the transaction in the mempool
    try:
        tx_hash = await rpc.call("eth_sendTransaction", [{"from": sender, "to": fresh_address(88)}])
        latest = int(await eth.call("eth_getTransactionCount", [sender, "latest"]), 16)
        pending = await rpc.call("eth_getTransactionCount", [sender, "pending"])
        assert int(pending, 16) == latest + 1
        named = {"address": sender, "blockNumber": "pending"}  # object params work too
        assert await rpc.call("eth_getTransactionCount", named) == pending
        assert await rpc.call("eth_getTransactionReceipt", [tx_hash]) is None
        assert (await rpc.call("eth_getTransactionByHash", [tx_hash]))["blockNumber"] is None
        block = await rpc.call("eth_getBlockByNumber", ["pending", False])
        assert tx_hash in block["transactions"]
        for method, params in [
            ("eth_gasPrice", []),
            ("eth_maxPriorityFeePerGas", []),
            ("eth_feeHistory", ["0x2", "latest", [50]]),
            ("eth_estimateGas", [{"from": sender, "to": fresh_address(87), "value": "0x1"}]),
            ("eth_getBalance", [sender, "pending"]),
            ("eth_call", [{"to": fresh_address(87)}, "pending"]),
        ]:
            assert await rpc.call(method, params) == await eth.call(method, params), method
        # Other blocks are a state node's job; the write node says so.
        for method, params in [
            ("eth_getTransactionCount", [sender, "latest"]),
            ("eth_getBalance", [sender]),
            ("eth_getStorageAt", [sender, "0x0", "0x1"]),
        ]:
            with pytest.raises(JsonRpcError) as err:
                await rpc.call(method, params)
            assert err.value.code == INVALID_PARAMS and "pending" in err.value.message
        await eth.call("evm_mine")
        receipt = await rpc.call("eth_getTransactionReceipt", [tx_hash])
        assert receipt == await eth.call("eth_getTransactionReceipt", [tx_hash])
        assert receipt["status"] == "0x1"
    finally:
        await eth.call("evm_setAutomine", [True])
    # A revert in a gas estimate keeps the execution client's code, message and data.
    with pytest.raises(JsonRpcError) as direct:
        await eth.call("eth_estimateGas", [{"from": sender, "data": "0xfe"}])
    with pytest.raises(JsonRpcError) as err:
        await rpc.call("eth_estimateGas", [{"from": sender, "data": "0xfe"}])
    assert (err.value.code, err.value.message, err.value.data) == (
        direct.value.code,
        direct.value.message,
        direct.value.data,
    )


async def test_http_app_health_and_metrics(writer: WriterNode) -> None:
    runner = web.AppRunner(writer.make_app())
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        url = f"http://127.0.0.1:{port}"
        http = RpcClient(url)
        assert await http.call("trace_vendorBlock", ["0x1"]) == await RpcClient(
            "inproc://writer-t", registry=writer.registry
        ).call("trace_vendorBlock", ["0x1"])
        await http.close()
        async with ClientSession() as session:
            async with session.get(url + "/health") as resp:
                assert resp.status == 200
                health = await resp.json()
            assert health["status"] == "ok" and health["head"] <= (writer.head or 0)
            async with session.get(url + "/metrics") as resp:
                text = await resp.text()
            # the chain keeps moving: the gauge lies between the head /health saw and now's
            (line,) = [ln for ln in text.splitlines() if ln.startswith("chainstate_writer_head ")]
            assert health["head"] <= float(line.split()[1]) <= (writer.head or 0)
            assert "chainstate_writer_trace_calls" in text
            async with session.post(url + "/", data=b"{not json") as resp:
                assert (await resp.json())["error"]["code"] == -32700
    finally:
        await runner.cleanup()


async def wait_hash(writer: WriterNode, height: int, block_hash: str) -> None:
    async with asyncio.timeout(10):
        while writer.store is None or writer.store.hash_at(height) != block_hash:  # noqa: ASYNC110
            await asyncio.sleep(0.02)


async def test_reorg_by_revert_is_rewound_and_reemitted(
    writer: WriterNode, rpc: RpcClient, eth: EthClient
) -> None:
    accounts = await eth.call("eth_accounts")
    assert writer.follower is not None
    reorgs = writer.follower.stats.reorgs
    snap = await eth.call("evm_snapshot")
    old = await send(eth, {"from": accounts[3], "to": fresh_address(91), "value": "0x5"})
    height = int(old["blockNumber"], 16)
    await wait_hash(writer, height, old["blockHash"])
    await eth.call("evm_revert", [snap])
    await send(eth, {"from": accounts[3], "to": fresh_address(92), "value": "0x6"})
    await eth.call("evm_mine")  # the new chain is longer than the old one
    new = await eth.call("eth_getBlockByNumber", [hex(height), False])
    await wait_hash(writer, height, new["hash"])
    await writer.wait_for_head(height + 1, within=10)
    assert writer.follower.stats.reorgs > reorgs
    with pytest.raises(JsonRpcError) as err:
        await rpc.call("trace_vendorBlock", [old["blockHash"]])
    assert err.value.code == BLOCK_NOT_FOUND
    out = await rpc.call("trace_vendorBlock", [hex(height)])
    assert fresh_address(92) in out["StateDiff"]["post"]
    assert fresh_address(91) not in out["StateDiff"]["post"]
    parent = await rpc.call("trace_vendorBlock", [hex(height - 1)])
    assert out["Header"]["parentHash"] == parent["Header"]["hash"]


async def test_anvil_reorg_two_blocks_deep(
    writer: WriterNode, rpc: RpcClient, eth: EthClient
) -> None:
    accounts = await eth.call("eth_accounts")
    for i in range(2):
        await send(eth, {"from": accounts[6], "to": fresh_address(93 + i), "value": "0x1"})
    head = int(await eth.call("eth_blockNumber"), 16)
    old = await eth.call("eth_getBlockByNumber", [hex(head - 1), False])
    await wait_hash(writer, head - 1, old["hash"])
    replacement = {"from": accounts[6], "to": fresh_address(95), "value": "0x7"}
    await eth.call("anvil_reorg", [2, [[replacement, 1]]])
    new_top = await eth.call("eth_getBlockByNumber", [hex(head), False])
    await wait_hash(writer, head, new_top["hash"])
    new = await rpc.call("trace_vendorBlock", [hex(head - 1)])
    assert new["Header"]["hash"] != old["hash"]
    assert received(await rpc.call("trace_vendorBlock", [hex(head)]), fresh_address(95)) == 7


async def test_restart_resumes_without_retracing(anvil_url: str, tmp_path: Path) -> None:
    first = make_writer(anvil_url, tmp_path)
    await first.start()
    client = EthClient(anvil_url)
    chain_head = int(await client.call("eth_blockNumber"), 16)
    await client.close()
    await first.wait_for_head(chain_head)
    assert first.follower is not None and first.follower.stats.traces > 0
    head = first.head
    assert head is not None
    outputs = [first.block_output(hex(n)) for n in range(head + 1)]
    await first.close()

    second = make_writer(anvil_url, tmp_path)
    await second.start()
    try:
        assert second.head is not None and second.head >= head  # nothing to wait for
        await second.wait_for_head(head)
        await asyncio.sleep(0.1)  # a few polls: nothing to rebuild
        assert second.follower is not None
        assert second.follower.stats.traces == 0
        assert second.follower.stats.blocks_built == 0
        assert [second.block_output(hex(n)) for n in range(head + 1)] == outputs
    finally:
        await second.close()


async def test_start_returns_with_block_0_emitted(anvil_url: str, tmp_path: Path) -> None:
    """In-process nodes started right after the writer find a chain to ingest."""
    node = make_writer(anvil_url, tmp_path, poll_interval=60)
    await node.start()
    try:
        assert node.head == 0
        out = await RpcClient("inproc://writer-t", registry=node.registry).call(
            "trace_vendorBlock", ["latest"]
        )
        assert out["Header"]["number"] == "0x0"
    finally:
        await node.close()


async def test_genesis_file_mismatch_stops_with_a_clear_error(
    anvil_url: str, tmp_path: Path
) -> None:
    genesis = json.loads(GENESIS.read_text())
    first = next(iter(genesis["alloc"]))
    genesis["alloc"][first]["balance"] = "0x1"
    path = tmp_path / "genesis.json"
    path.write_text(json.dumps(genesis))
    node = make_writer(anvil_url, tmp_path / "data", genesis=str(path))
    await node.start()
    try:
        with pytest.raises(RuntimeError, match="does not match"):
            await node.wait_for_head(0, within=10)
        assert node.health()["status"] == "error"
        assert node.head is None
    finally:
        await node.close()


async def test_unreachable_execution_client_is_retried(tmp_path: Path) -> None:
    node = make_writer(f"http://127.0.0.1:{free_port()}", tmp_path, max_backoff=0.05)
    async with asyncio.timeout(2):  # start does not wait for an unreachable client
        await node.start()
    try:
        await asyncio.sleep(0.2)
        health = node.health()
        assert health["state"] in {"retrying", "stalled"} and health["head"] is None
        assert "RpcUnavailable" in health["last_error"]
        with pytest.raises(JsonRpcError) as err:
            await RpcClient("inproc://writer-t", registry=node.registry).call("eth_blockNumber")
        assert err.value.code == BLOCK_NOT_FOUND
    finally:
        await node.close()


async def test_malformed_client_answers_do_not_stop_following(tmp_path: Path) -> None:
    """A client answering blocks of an unexpected shape: errors are reported, not fatal."""

    async def fake_client(request: web.Request) -> web.Response:
        body = await request.json()
        results = {"eth_chainId": "0x539", "eth_blockNumber": "0x0"}
        result = results.get(body["method"], {"number": "0x0"})  # a block without a hash
        return web.json_response({"jsonrpc": "2.0", "id": body["id"], "result": result})

    app = web.Application()
    app.router.add_post("/", fake_client)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    node = make_writer(f"http://127.0.0.1:{port}", tmp_path, max_backoff=0.05)
    await node.start()
    try:
        await asyncio.sleep(0.3)
        health = node.health()
        assert health["state"] in {"retrying", "stalled"} and health["head"] is None
        assert "KeyError" in health["last_error"]
        assert node.follower is not None and node.follower.stats.errors >= 2
    finally:
        await node.close()
        await runner.cleanup()

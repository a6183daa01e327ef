"""The write node following a chain while it changes: the workload (with its reorgs) runs
while the node follows, and the execution client restarts from its state file."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from chainstate.inproc import InprocRegistry
from chainstate.rpcclient import RpcClient
from nodes.devnet.anvil import GENESIS, AnvilProcess
from nodes.devnet.rpc import EthClient
from nodes.devnet.workload import fresh_address, run_workload
from nodes.writer.service import WriterNode
from tests.conftest import free_port
from tests.nodes.test_writer import check_block


def make_writer(url: str, data_dir: Path) -> WriterNode:
    section = {"execution_url": url, "poll_interval": 0.01, "key": "writer-live"}
    return WriterNode.from_config(section, data_dir=data_dir, registry=InprocRegistry())


async def assert_store_is_the_canonical_chain(writer: WriterNode, eth: EthClient) -> None:
    """Stored hashes equal the client's from block 1 up. Block 0 is left out: anvil 1.7.1
    restarted from a state file sometimes reports a fresh genesis hash for block 0 while
    block 1's parentHash still names the loaded one (the store keeps the loaded one)."""
    head = int(await eth.call("eth_blockNumber"), 16)
    await writer.wait_for_head(head, within=20)
    async with asyncio.timeout(20):  # the head height may be reached on an orphan first
        while True:
            calls = [("eth_getBlockByNumber", [hex(n), False]) for n in range(1, head + 1)]
            canonical = [b["hash"] for b in await eth.batch(calls)]
            assert writer.store is not None
            if [writer.store.hash_at(n) for n in range(1, head + 1)] == canonical:
                return
            await asyncio.sleep(0.02)


async def test_following_while_the_workload_reorgs(tmp_path: Path) -> None:
    async with AnvilProcess(port=free_port(), genesis=GENESIS) as anvil:
        writer = make_writer(anvil.url, tmp_path)
        await writer.start()
        eth = EthClient(anvil.url)
        try:
            record = await run_workload(anvil.url)
            await assert_store_is_the_canonical_chain(writer, eth)
            rpc = RpcClient("inproc://writer-live", registry=writer.registry)
            # Orphaned transfers left no trace in what the node serves now.
            for n in range(record.last_block + 1):
                out = await rpc.call("trace_vendorBlock", [hex(n)])
                if n:
                    await check_block(eth, out, record)
                assert fresh_address(4) not in out["StateDiff"]["post"]
                assert fresh_address(6) not in out["StateDiff"]["post"]
                if n:
                    parent = await rpc.call("trace_vendorBlock", [hex(n - 1)])
                    assert out["Header"]["parentHash"] == parent["Header"]["hash"]
        finally:
            await eth.close()
            await writer.close()


async def test_follows_the_execution_client_across_its_restart(tmp_path: Path) -> None:
    port = free_port()
    state = tmp_path / "anvil-state.json"
    writer = make_writer(f"http://127.0.0.1:{port}", tmp_path / "writer")
    eth = EthClient(f"http://127.0.0.1:{port}")
    try:
        async with AnvilProcess(port=port, genesis=GENESIS, state_path=state):
            await writer.start()
            accounts = await eth.call("eth_accounts")
            for i in range(3):
                tx = {"from": accounts[1], "to": fresh_address(200 + i), "value": "0x9"}
                await eth.call("eth_sendTransaction", [tx])
            await eth.call("evm_mine")
            await assert_store_is_the_canonical_chain(writer, eth)
        before = writer.head
        assert before is not None and before >= 3
        async with AnvilProcess(port=port, genesis=GENESIS, state_path=state):
            tx = {"from": accounts[1], "to": fresh_address(210), "value": "0x8"}
            await eth.call("eth_sendTransaction", [tx])
            await eth.call("evm_mine")
            await assert_store_is_the_canonical_chain(writer, eth)
            assert writer.follower is not None
            assert writer.follower.stats.reorgs == 0
            assert writer.head is not None and writer.head > before
            out = writer.block_output(hex(before + 1))
            assert fresh_address(210).encode() in out
    finally:
        await eth.close()
        await writer.close()


@pytest.mark.parametrize("block_time", [0.2])
async def test_following_interval_mining(tmp_path: Path, block_time: float) -> None:
    """As `chainstate up` runs it: a block every interval, transactions batched into them."""
    async with AnvilProcess(port=free_port(), genesis=GENESIS, block_time=block_time) as anvil:
        writer = make_writer(anvil.url, tmp_path)
        await writer.start()
        eth = EthClient(anvil.url)
        try:
            accounts = await eth.call("eth_accounts")
            hashes = [
                await eth.call(
                    "eth_sendTransaction",
                    [{"from": accounts[i], "to": fresh_address(300), "value": hex(i + 1)}],
                )
                for i in range(4)
            ]
            await asyncio.sleep(block_time * 3)
            receipts = await eth.batch([("eth_getTransactionReceipt", [h]) for h in hashes])
            assert all(r is not None for r in receipts)
            await assert_store_is_the_canonical_chain(writer, eth)
            final = int(receipts[-1]["blockNumber"], 16)
            total = 0
            for n in range(1, final + 1):
                diff = orjson.loads(writer.block_output(hex(n)))["StateDiff"]
                if fresh_address(300) in diff["post"]:
                    new = int(diff["post"][fresh_address(300)]["balance"], 16)
                    total += new - int(diff["pre"][fresh_address(300)]["balance"], 16)
            assert total == 1 + 2 + 3 + 4
        finally:
            await eth.close()
            await writer.close()


async def test_fresh_node_on_a_reloaded_client_keeps_the_parent_links(tmp_path: Path) -> None:
    """Block 0 is taken as block 1's parent even when anvil (reloaded from its state file)
    answers block 0 by number with a fresh genesis."""
    port = free_port()
    state = tmp_path / "anvil-state.json"
    eth = EthClient(f"http://127.0.0.1:{port}")
    try:
        async with AnvilProcess(port=port, genesis=GENESIS, state_path=state):
            genesis = await eth.call("eth_getBlockByNumber", ["0x0", False])
            for _ in range(3):
                await eth.call("evm_mine")
        async with AnvilProcess(port=port, genesis=GENESIS, state_path=state):
            writer = make_writer(f"http://127.0.0.1:{port}", tmp_path / "writer")
            await writer.start()
            try:
                await writer.wait_for_head(3, within=20)
                assert writer.store is not None
                assert writer.store.hash_at(0) == genesis["hash"]
                block1 = orjson.loads(writer.block_output("0x1"))
                assert block1["Header"]["parentHash"] == genesis["hash"]
            finally:
                await writer.close()
    finally:
        await eth.close()


async def test_a_block_with_hundreds_of_transactions(tmp_path: Path) -> None:
    """300 transfers in one block are emitted quickly and exactly (anvil's prestateTracer
    alone would need ~20 s for this block; the Parity replay path takes well under 1 s)."""
    async with AnvilProcess(port=free_port(), genesis=GENESIS) as anvil:
        eth = EthClient(anvil.url)
        writer = make_writer(anvil.url, tmp_path)
        try:
            accounts = await eth.call("eth_accounts")
            await eth.call("evm_setAutomine", [False])
            calls = [
                (
                    "eth_sendTransaction",
                    [
                        {
                            "from": accounts[i % 10],
                            "nonce": hex(i // 10),
                            "to": fresh_address(1000 + i),
                            "value": hex(i + 1),
                        }
                    ],
                )
                for i in range(300)
            ]
            await eth.batch(calls)
            await eth.call("evm_mine")
            await writer.start()
            await writer.wait_for_head(1, within=15)
            diff = orjson.loads(writer.block_output("0x1"))["StateDiff"]
            for i in range(300):
                assert diff["post"][fresh_address(1000 + i)] == {"balance": hex(i + 1)}
            for account in accounts:
                assert diff["post"][account]["nonce"] == hex(30)
            assert writer.follower is not None
            assert writer.follower.stats.last_build_seconds < 5
        finally:
            await eth.close()
            await writer.close()


async def test_a_block_executed_on_state_no_block_left_is_not_emitted(tmp_path: Path) -> None:
    """anvil's state changed outside its blocks (here anvil_setBalance; after a crash, a
    torn state file) so the next block's pre-state is not what the stored blocks left: the
    write node does not emit it (every state node would reject it for good), it says why in
    its health, and the blocks before it stay served."""
    async with AnvilProcess(port=free_port(), genesis=GENESIS) as anvil:
        eth = EthClient(anvil.url)
        section = {"execution_url": anvil.url, "poll_interval": 0.01, "key": "writer-live"}
        writer = WriterNode.from_config(
            section | {"max_retries": 2}, data_dir=tmp_path, registry=InprocRegistry()
        )
        try:
            accounts = await eth.call("eth_accounts")
            await writer.start()
            await writer.wait_for_head(0, within=15)
            await eth.call("anvil_setBalance", [accounts[4], hex(5 * 10**18)])
            tx = {"from": accounts[4], "to": fresh_address(900), "value": "0x1"}
            await eth.call("eth_sendTransaction", [tx])
            async with asyncio.timeout(15):  # max_retries failed builds: stalled
                while True:
                    health = writer.health()
                    if not health["healthy"]:
                        break
                    await asyncio.sleep(0.02)
            assert health["head"] == 0 and health["execution_head"] == 1, health
            assert f"{accounts[4].lower()}:balance" in health["last_error"], health
            assert "not emitted" in health["last_error"], health
            assert writer.store is not None and writer.store.hash_at(1) is None
        finally:
            await eth.close()
            await writer.close()

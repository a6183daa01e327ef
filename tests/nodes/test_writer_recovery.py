"""Crash recovery around the write node, on real anvils.

- anvil restored from a write node's store (`nodes/devnet/recovery.py`) serves the same chain
  as the anvil that made it: every block, transaction and receipt, every touched value.
- The write node places its stored head against whatever the client shows after a restart:
  the same chain (continue), a shorter one (wait, drop nothing), another block (reorg).
- A client that cannot replay a block it has (anvil reloaded without its recent history) is
  reported, retried a bounded number of times, and the writer shows up unhealthy with the
  reason — also in the proxy's writers list — once the client is `stall_blocks` ahead.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import shutil
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from chainstate.inproc import InprocRegistry
from nodes.devnet.anvil import GENESIS, AnvilProcess
from nodes.devnet.genesis import header_hash
from nodes.devnet.recovery import (
    _historical_state,
    accounts_past_head,
    catch_up_writers,
    read_state,
    restore_chain,
)
from nodes.devnet.rpc import EthClient
from nodes.devnet.workload import WorkloadRecord, fresh_address, run_workload
from nodes.writer import blockdiff as bd
from nodes.writer.service import STORE_FILE, WriterNode
from nodes.writer.store import BlockStore
from proxy.app import create_app
from proxy.settings import ProxySettings
from proxy.store_file import FileStore
from tests.conftest import free_port
from tests.nodes.test_writer import receipt_of

pytestmark = pytest.mark.asyncio(loop_scope="module")

IMPERSONATED = "0x000000000000000000000000000000000000dead"


def make_writer(url: str, data_dir: Path, **extra: Any) -> WriterNode:
    section = {"execution_url": url, "poll_interval": 0.02, "key": "writer-r"} | extra
    return WriterNode.from_config(section, data_dir=data_dir, registry=InprocRegistry())


async def send(eth: EthClient, tx: dict[str, Any]) -> dict[str, Any]:
    receipt = await receipt_of(eth, await eth.call("eth_sendTransaction", [tx]))
    assert receipt["status"] == "0x1", receipt
    return receipt


async def dump_state(eth: EthClient, path: Path) -> None:
    """anvil's own dump (no historical states), as its state file would hold it."""
    raw = await eth.call("anvil_dumpState")
    await asyncio.to_thread(path.write_bytes, gzip.decompress(bytes.fromhex(raw[2:])))


@contextlib.asynccontextmanager
async def followed(
    tmp_path: Path, port: int | None = None
) -> AsyncIterator[tuple[EthClient, WriterNode, list[str]]]:
    """A fresh automine anvil, a client of it and its dev accounts, and a write node (store
    in `tmp_path/writer`) following it. The caller closes the write node: some tests keep
    it running across a restart of anvil."""
    async with AnvilProcess(port=port or free_port(), genesis=GENESIS) as anvil:
        eth = EthClient(anvil.url)
        writer = make_writer(anvil.url, tmp_path / "writer")
        await writer.start()
        try:
            yield eth, writer, await eth.call("eth_accounts")
        finally:
            await eth.close()


@dataclass
class Chain:
    """The workload's chain on its original anvil, and a write node's store of it."""

    anvil: AnvilProcess
    eth: EthClient
    record: WorkloadRecord
    store_dir: Path
    head: int


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def chain(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Chain]:
    """The workload (contracts, ERC20 logs, self-destructs, reorgs) plus a legacy and an
    impersonated transaction, followed by a write node to the head."""
    anvil = AnvilProcess(port=free_port(), genesis=GENESIS)
    await anvil.start()
    eth = EthClient(anvil.url)
    record = await run_workload(anvil.url)
    accounts = await eth.call("eth_accounts")
    await send(
        eth,
        {"from": accounts[2], "to": fresh_address(700), "value": "0x7"}
        | {"gasPrice": hex(3 * 10**9)},
    )
    # funded by a transaction: a balance set outside blocks (anvil_setBalance) is in no
    # StateDiff, and the write node refuses the next block that starts from it
    await send(eth, {"from": accounts[3], "to": IMPERSONATED, "value": hex(10**18)})
    await eth.call("anvil_impersonateAccount", [IMPERSONATED])
    await send(eth, {"from": IMPERSONATED, "to": fresh_address(701), "value": "0x9"})
    head = int(await eth.call("eth_blockNumber"), 16)
    store_dir = tmp_path_factory.mktemp("writer")
    writer = make_writer(anvil.url, store_dir)
    await writer.start()
    await writer.wait_for_head(head, within=60)
    await writer.close()
    yield Chain(anvil, eth, record, store_dir, head)
    await eth.close()
    await anvil.stop()


async def assert_same_chain(original: EthClient, restored: EthClient, chain: Chain) -> None:
    """Every block (full transactions), receipt and touched value at the head is the same.
    Block 0 is compared through block 1's parent (anvil 1.7.1 reloaded from a state file may
    answer a fresh genesis by number)."""
    head = chain.head
    assert int(await restored.call("eth_blockNumber"), 16) == head
    for n in range(1, head + 1):
        block = await original.call("eth_getBlockByNumber", [hex(n), True])
        assert await restored.call("eth_getBlockByNumber", [hex(n), True]) == block, n
        receipts = await original.call("eth_getBlockReceipts", [hex(n)])
        assert await restored.call("eth_getBlockReceipts", [hex(n)]) == receipts, n
        for tx in block["transactions"]:
            assert await restored.call("eth_getTransactionByHash", [tx["hash"]]) == tx
    reads = []
    for account in sorted(chain.record.accounts | {IMPERSONATED, fresh_address(700)}):
        for method in ("eth_getBalance", "eth_getTransactionCount", "eth_getCode"):
            reads.append((method, [account, "latest"]))
    for account, slot in chain.record.storage_targets():
        reads.append(("eth_getStorageAt", [account, slot, "latest"]))
    assert await restored.batch(reads) == await original.batch(reads)


async def test_a_missing_state_file_is_rebuilt_from_the_write_nodes_store(
    chain: Chain, tmp_path: Path
) -> None:
    state = tmp_path / "anvil-state.json"
    said = restore_chain(state, [("writer-r", chain.store_dir / STORE_FILE)])
    assert said is not None
    assert f"restored to the write nodes' head {chain.head}" in said and "missing" in said
    async with AnvilProcess(port=free_port(), genesis=GENESIS, state_path=state) as restored:
        eth = EthClient(restored.url)
        try:
            await assert_same_chain(chain.eth, eth, chain)
            # The chain goes on: nonces continue, and a writer on that store just continues.
            accounts = await eth.call("eth_accounts")
            await send(eth, {"from": accounts[2], "to": fresh_address(702), "value": "0x1"})
            own = tmp_path / "writer"  # a copy: other tests read the module's store
            await asyncio.to_thread(shutil.copytree, chain.store_dir, own)
            writer = make_writer(restored.url, own)
            await writer.start()
            try:
                await writer.wait_for_head(chain.head + 1, within=20)
                assert writer.follower is not None and writer.follower.stats.reorgs == 0
            finally:
                await writer.close()
        finally:
            await eth.close()


async def test_a_state_file_behind_the_store_gets_the_missing_blocks(tmp_path: Path) -> None:
    """anvil killed with SIGKILL: its file ends before the write node's head; the blocks after
    it come back with their hashes, the file's own part is kept as it was."""
    state = tmp_path / "anvil-state.json"
    async with followed(tmp_path) as (eth, writer, accounts):
        try:
            await send(eth, {"from": accounts[1], "to": fresh_address(710), "value": "0x1"})
            await dump_state(eth, state)
            kept = read_state(state)
            for i in range(3):
                await send(eth, {"from": accounts[1], "to": fresh_address(711 + i), "value": "0x2"})
            head = int(await eth.call("eth_blockNumber"), 16)
            await writer.wait_for_head(head)
            blocks = [
                await eth.call("eth_getBlockByNumber", [hex(n), True]) for n in range(head + 1)
            ]
        finally:
            await writer.close()
    said = restore_chain(state, [("writer-r", tmp_path / "writer" / STORE_FILE)])
    assert said is not None and f"ended at block {head - 3}" in said and "3 blocks" in said
    restored_file = read_state(state)
    assert restored_file is not None and kept is not None
    assert restored_file["blocks"][: len(kept["blocks"])] == kept["blocks"]
    async with AnvilProcess(port=free_port(), genesis=GENESIS, state_path=state) as again:
        eth = EthClient(again.url)
        try:
            for n in range(1, head + 1):
                assert await eth.call("eth_getBlockByNumber", [hex(n), True]) == blocks[n]
            assert await eth.call("eth_getBalance", [fresh_address(713), "latest"]) == "0x2"
        finally:
            await eth.close()


async def test_a_state_file_holding_the_head_is_kept_and_a_damaged_one_set_aside(
    chain: Chain, tmp_path: Path
) -> None:
    state = tmp_path / "anvil-state.json"
    stores = [("writer-r", chain.store_dir / STORE_FILE)]
    restore_chain(state, stores)
    before = state.read_bytes()
    said = restore_chain(state, stores)
    assert said == f"anvil: its state file holds the write nodes' head {chain.head}: kept"
    assert state.read_bytes() == before
    state.write_bytes(before[: len(before) // 2])  # a dump cut short by SIGKILL
    said = restore_chain(state, stores)
    assert said is not None and "damaged (kept as anvil-state.damaged.json)" in said
    assert (tmp_path / "anvil-state.damaged.json").exists()
    assert read_state(state) is not None
    assert restore_chain(tmp_path / "none.json", []) is None  # no store: nothing to restore


async def test_blocks_anvil_cannot_replay_above_the_store_are_dropped(tmp_path: Path) -> None:
    """anvil's file holds blocks the write node never built, without the state to replay
    them (no kept history): building them would stall the writer, so the file is cut back
    to the writer's head (those transactions are lost, as on a crashed node)."""
    state = tmp_path / "anvil-state.json"
    async with followed(tmp_path) as (eth, writer, accounts):
        try:
            await send(eth, {"from": accounts[1], "to": fresh_address(720), "value": "0x1"})
            head = int(await eth.call("eth_blockNumber"), 16)
            await writer.wait_for_head(head)
        finally:
            await writer.close()
        for i in range(2):
            await send(eth, {"from": accounts[1], "to": fresh_address(721 + i), "value": "0x1"})
        await dump_state(eth, state)
    said = restore_chain(state, [("writer-r", tmp_path / "writer" / STORE_FILE)])
    assert said is not None and "can no longer replay (from block" in said
    async with AnvilProcess(port=free_port(), genesis=GENESIS, state_path=state) as again:
        writer = make_writer(again.url, tmp_path / "writer")
        await writer.start()
        eth = EthClient(again.url)
        try:
            assert int(await eth.call("eth_blockNumber"), 16) == head
            await send(eth, {"from": accounts[1], "to": fresh_address(723), "value": "0x1"})
            await writer.wait_for_head(head + 1, within=20)
            assert writer.health()["healthy"] is True
        finally:
            await writer.close()
            await eth.close()


async def test_a_new_chain_starts_quietly_and_a_restart_says_where_it_continues(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="nodes.writer.follower")
    async with followed(tmp_path) as (eth, writer, accounts):
        await asyncio.sleep(0.2)  # several polls of an empty chain
        assert [r.getMessage() for r in caplog.records] == []
        await send(eth, {"from": accounts[3], "to": fresh_address(720), "value": "0x1"})
        await writer.wait_for_head(1)
        await writer.close()
        again = make_writer(eth.url, tmp_path / "writer")
        await again.start()
        try:
            async with asyncio.timeout(10):
                while not caplog.records:  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
            lines = [r.getMessage() for r in caplog.records]
            assert len(lines) == 1 and "stored head 1, execution client head 1" in lines[0]
        finally:
            await again.close()


async def test_a_client_behind_on_the_same_chain_is_waited_for_then_a_fork_is_a_reorg(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="nodes.writer.follower")
    state = tmp_path / "anvil-state.json"
    port = free_port()
    async with followed(tmp_path, port) as (eth, writer, accounts):
        await send(eth, {"from": accounts[3], "to": fresh_address(730), "value": "0x1"})
        await dump_state(eth, state)  # the client will come back at this height
        behind = int(await eth.call("eth_blockNumber"), 16)
        for i in range(2):
            await send(eth, {"from": accounts[3], "to": fresh_address(731 + i), "value": "0x1"})
        await writer.wait_for_head(behind + 2)
        assert writer.store is not None
        lost = writer.store.hash_at(behind + 1)
    assert writer.follower is not None
    async with AnvilProcess(port=port, genesis=GENESIS, state_path=state):
        eth = EthClient(f"http://127.0.0.1:{port}")
        try:
            async with asyncio.timeout(10):
                while writer.follower.stats.state != "waiting":  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
            assert writer.head == behind + 2  # nothing dropped while it waits
            health = writer.health()
            assert health["healthy"] is True and health["execution_head"] == behind
            assert any("is behind the stored head" in r.getMessage() for r in caplog.records)
            # The client mines another block at a stored height: a reorg, in one line.
            mined = await send(eth, {"from": accounts[3], "to": fresh_address(739), "value": "0x5"})
            assert mined["blockHash"] != lost
            async with asyncio.timeout(10):
                while writer.store.hash_at(behind + 1) != mined["blockHash"]:  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
            assert writer.head == behind + 1 and writer.follower.stats.reorgs == 1
            reorg = [r.getMessage() for r in caplog.records if "reorg" in r.getMessage()]
            assert len(reorg) == 1 and f"to the common ancestor {behind}" in reorg[0]
        finally:
            await eth.close()
            await writer.close()


async def test_a_client_that_cannot_replay_makes_the_writer_unhealthy_with_the_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's stall: anvil reloaded from a state file without its recent history has
    blocks it cannot replay. The writer says why, stops retrying fast after max_retries, and
    is unhealthy once the client is more than stall_blocks ahead without a block stored — in
    /health, writer_health, its metrics and the proxy's writers list."""
    caplog.set_level(logging.WARNING)
    state = tmp_path / "anvil-state.json"
    port = free_port()
    async with AnvilProcess(port=port, genesis=GENESIS) as anvil:
        eth = EthClient(anvil.url)
        accounts = await eth.call("eth_accounts")
        for i in range(2):
            await send(eth, {"from": accounts[4], "to": fresh_address(740 + i), "value": "0x1"})
        await dump_state(eth, state)
        await eth.close()
    async with AnvilProcess(port=port, genesis=GENESIS, state_path=state) as anvil:
        eth = EthClient(anvil.url)
        writer = make_writer(anvil.url, tmp_path / "writer", stall_blocks=3, max_backoff=0.1)
        registry = writer.registry
        assert registry is not None
        await writer.start()
        settings = ProxySettings(head_poll_interval=0.05, poll_timeout=1.0, unhealthy_after=2)
        app = create_app(settings, store=FileStore(tmp_path / "proxy.json"), registry=registry)
        proxy = TestClient(TestServer(app))
        await proxy.start_server()
        try:
            added = await proxy.post(
                "/1337/writers/addWriter",
                data=orjson.dumps({"key": "writer-r", "url": "inproc://writer-r", "leader": True}),
                headers={"Content-Type": "application/json"},  # (admin POSTs: JSON only)
            )
            assert added.status == 201, await added.text()
            async with asyncio.timeout(10):
                while writer.follower is None or writer.follower.stats.failures < 1:  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
            health = writer.health()
            assert health["healthy"] is True and health["state"] == "retrying"  # not yet
            assert "cannot replay block 1" in health["last_error"]
            for _ in range(4):  # the client moves on: stall_blocks (3) exceeded
                await eth.call("evm_mine")
            async with asyncio.timeout(10):
                while writer.health()["healthy"]:  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
            health = writer.health()
            assert health["head"] == 0 and health["execution_head"] == 6 and health["lag"] == 6
            assert "execution client advanced" in health["last_error"]
            assert "cannot replay block 1" in health["last_error"]
            assert health["status"] == "error"
            metrics = writer.metrics.get_sample_value
            assert metrics("chainstate_writer_healthy") == 0
            assert metrics("chainstate_writer_lag_blocks") == 6

            async def listed() -> dict[str, Any]:
                resp = await proxy.get("/1337/writers")
                return (await resp.json())["writers"][0]

            async with asyncio.timeout(10):
                while (entry := await listed())["healthy"]:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            assert entry["execution_head"] == 6 and entry["lag"] == 6 and entry["head"] == 0
            assert "cannot replay block 1" in entry["last_error"]
            messages = [r.getMessage() for r in caplog.records]
            assert any("cannot replay block 1" in m and "attempt 1 of" in m for m in messages)
            assert any("write node writer-r unhealthy" in m for m in messages)  # proxy log
        finally:
            await proxy.close()
            await writer.close()
            await eth.close()


async def test_retries_end_in_a_stall_and_recover_when_the_client_is_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="nodes.writer.follower")
    port = free_port()
    writer = make_writer(f"http://127.0.0.1:{port}", tmp_path, max_retries=3, max_backoff=0.05)
    await writer.start()
    try:
        assert writer.follower is not None
        async with asyncio.timeout(10):
            while writer.follower.stats.state != "stalled":  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        health = writer.health()
        assert health["healthy"] is False and "stalled after 3 failed attempts" in (
            health["last_error"] or ""
        )
        stalled = [r for r in caplog.records if "stalled" in r.getMessage()]
        assert len(stalled) == 1 and stalled[0].levelno == logging.ERROR
        async with AnvilProcess(port=port, genesis=GENESIS):
            await writer.wait_for_head(0, within=10)
            async with asyncio.timeout(10):
                while not writer.health()["healthy"]:  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
        assert any("answers again after" in r.getMessage() for r in caplog.records)
    finally:
        await writer.close()


async def test_restored_state_files_are_anvils_format(chain: Chain, tmp_path: Path) -> None:
    """The parts anvil reads are there with anvil's own encodings (a quick structural check
    next to the load-and-compare tests above)."""
    state = tmp_path / "anvil-state.json"
    restore_chain(state, [("writer-r", chain.store_dir / STORE_FILE)])
    doc = json.loads(state.read_text())
    assert doc["best_block_number"] == chain.head
    assert int(doc["block"]["number"], 16) == chain.head
    assert isinstance(doc["block"]["gas_limit"], int) and isinstance(doc["block"]["basefee"], int)
    some = next(iter(doc["accounts"].values()))
    assert isinstance(some["nonce"], int) and some["balance"].startswith("0x")
    impersonated = [t for b in doc["blocks"] for t in b["transactions"] if t["impersonated_sender"]]
    assert [t["impersonated_sender"] for t in impersonated] == [IMPERSONATED]


async def test_a_write_node_behind_takes_the_blocks_anvil_cannot_replay(
    chain: Chain, tmp_path: Path
) -> None:
    """After a restore anvil keeps no state of old blocks: a write node that was behind the
    others (or is new) takes the missing blocks from the highest store instead of stalling."""
    behind, fresh = tmp_path / "behind", tmp_path / "fresh"
    await asyncio.to_thread(shutil.copytree, chain.store_dir, behind)
    lagging = BlockStore(behind / STORE_FILE)
    lagging.rewind(chain.head - 3)
    lagging.close()
    stores = [
        ("writer-r", chain.store_dir / STORE_FILE),
        ("writer-b", behind / STORE_FILE),
        ("writer-f", fresh / STORE_FILE),
    ]
    state = tmp_path / "anvil-state.json"
    restore_chain(state, stores)
    lines = catch_up_writers(state, stores)
    assert lines == [
        f"write node writer-b: anvil cannot replay them any more, took blocks "
        f"{chain.head - 2}-{chain.head} from writer-r's store",
        f"write node writer-f: new on an existing chain, took blocks 0-{chain.head} from "
        "writer-r's store",
    ]
    original = BlockStore(chain.store_dir / STORE_FILE)
    copies = [BlockStore(behind / STORE_FILE), BlockStore(fresh / STORE_FILE)]
    try:
        for n in range(chain.head + 1):
            want = original.output_by_number(n)
            assert [c.output_by_number(n) for c in copies] == [want, want]
    finally:
        for store in [original, *copies]:
            store.close()
    assert catch_up_writers(state, stores) == []  # nothing left to take


def tear(state: dict[str, Any], head: int) -> dict[str, Any]:
    """The file anvil 1.7.1 sometimes dumps while it mines (4 of about 155 periodic dumps at
    100 tx/s here): blocks, block env and best block `head`, historical states up to and including
    `head`'s, but the accounts already of the block after it. Made from a complete dump
    whose head is `head + 1` (its history holds `head`'s state, not its own live one)."""
    torn = dict(state)
    torn["blocks"] = [b for b in state["blocks"] if int(b["header"]["number"], 16) <= head]
    torn["transactions"] = [t for t in state["transactions"] if t["block_number"] <= head]
    torn["best_block_number"] = head
    torn["block"] = dict(state["block"], number=hex(head))
    return torn


def stored_state(store: BlockStore, head: int) -> dict[tuple[str, str], str]:
    """Every value the write node's StateDiffs set up to `head` (what a state node holds)."""
    values: dict[tuple[str, str], str] = {}
    for n in range(head + 1):
        raw = store.output_by_number(n)
        assert raw is not None
        for addr, change in orjson.loads(raw)["StateDiff"]["post"].items():
            for kind in ("balance", "nonce", "code"):
                if kind in change:
                    values[(addr, kind)] = change[kind]
            for slot, value in (change.get("storage") or {}).items():
                values[(addr, slot)] = value
    return values


async def test_a_dump_whose_accounts_moved_past_its_head_is_not_loaded(tmp_path: Path) -> None:
    """anvil's dump can hold the accounts of a block that its block list does not have yet
    (written while that block was mined). Loaded as it is, anvil mines the next block on
    those accounts and the write node's StateDiff of that block starts from values no block
    produced: the state nodes reject it for good (PreStateMismatch, CI seed 694308062). Such
    a file is set aside and anvil restored from the write nodes' blocks instead."""
    state = tmp_path / "anvil-state.json"
    store_path = tmp_path / "writer" / STORE_FILE
    anvil = AnvilProcess(port=free_port(), genesis=GENESIS, state_path=state)
    await anvil.start()
    eth = EthClient(anvil.url)
    writer = make_writer(anvil.url, tmp_path / "writer")
    await writer.start()
    try:
        accounts = await eth.call("eth_accounts")
        await send(eth, {"from": accounts[1], "to": fresh_address(730), "value": "0x1"})
        head = int(await eth.call("eth_blockNumber"), 16)
        await writer.wait_for_head(head)
        await writer.close()
        # The next block is mined but not stored: the kill comes before the writer polls.
        await send(eth, {"from": accounts[1], "to": fresh_address(731), "value": "0x2"})
    finally:
        await eth.close()
        await anvil.stop()  # SIGTERM: anvil dumps its state (with its recent history)
    anvil.settle_previous()
    complete = read_state(state)
    assert complete is not None and complete["best_block_number"] == head + 1
    await asyncio.to_thread(state.write_bytes, orjson.dumps(tear(complete, head)))

    said = restore_chain(state, [("writer-r", store_path)])
    assert said is not None and f"restored to the write nodes' head {head}" in said, said
    assert f"accounts are not the state of its head block {head}" in said, said
    assert (tmp_path / "anvil-state.damaged.json").exists()

    async with AnvilProcess(port=free_port(), genesis=GENESIS, state_path=state) as again:
        eth = EthClient(again.url)
        writer = make_writer(again.url, tmp_path / "writer")
        await writer.start()
        try:
            await send(eth, {"from": accounts[1], "to": fresh_address(732), "value": "0x3"})
            await writer.wait_for_head(head + 1, within=20)
        finally:
            await writer.close()
            await eth.close()
    store = BlockStore(store_path)
    try:
        before = stored_state(store, head)
        raw = store.output_by_number(head + 1)
        assert raw is not None
        pre = orjson.loads(raw)["StateDiff"]["pre"]
    finally:
        store.close()
    # Each value the new block changed starts from the stored state: what verify_pre checks.
    for addr, change in pre.items():
        for key, value in change.items():
            items = value.items() if key == "storage" else [(key, value)]
            for name, old in items:
                zero = bd.zero_of("storage" if key == "storage" else key)
                assert before.get((addr, name), zero) == old, (addr, name)


async def test_a_file_without_its_heads_historical_state_is_taken_as_it_is() -> None:
    """anvil keeps the state of its head only in the accounts until the next block is mined,
    so a complete dump has no historical state of its head: nothing to compare, nothing said;
    malformed history entries are skipped, not a crash of `chainstate up`."""
    accounts = {"0x" + "11" * 20: {"nonce": 1, "balance": "0x5", "code": "0x", "storage": {}}}
    other = {"accounts": {"0x" + "11" * 20: {"balance": "0x4", "nonce": 1}}, "storage": {}}
    state: dict[str, Any] = {"best_block_number": 3, "accounts": accounts}
    for history in (
        None,
        [],
        [["0xaa", None], "junk", ["0xbb", {"block_hashes": {"0x2": "0xbb"}}]],
    ):
        assert accounts_past_head(state | {"historical_states": history}) is None
    named = other | {"block_hashes": {"0x3": "0xcc"}}
    assert accounts_past_head(state | {"historical_states": [["0xcc", named]]}) == 3
    same = {"accounts": {"0x" + "11" * 20: {"balance": "0x5", "nonce": 1}}, "storage": {}}
    same["block_hashes"] = {"0x3": "0xcc"}
    assert accounts_past_head(state | {"historical_states": [["0xCC", same]]}) is None


async def test_a_torn_dump_without_the_history_to_show_it_is_not_loaded(
    tmp_path: Path,
) -> None:
    """The same tear, in a dump that keeps no state of its head block (anvil serialised its
    history before it began the next block, its accounts after): the file cannot show it,
    the write node's store can. The file's accounts are not what the stored blocks left at
    that block, so it is set aside and anvil restored from the store, and the writer goes
    on from there instead of refusing the next block."""
    state = tmp_path / "anvil-state.json"
    store_path = tmp_path / "writer" / STORE_FILE
    anvil = AnvilProcess(port=free_port(), genesis=GENESIS, state_path=state)
    await anvil.start()
    eth = EthClient(anvil.url)
    writer = make_writer(anvil.url, tmp_path / "writer")
    await writer.start()
    try:
        accounts = await eth.call("eth_accounts")
        await send(eth, {"from": accounts[1], "to": fresh_address(740), "value": "0x1"})
        head = int(await eth.call("eth_blockNumber"), 16)
        await writer.wait_for_head(head)
        await writer.close()
        await send(eth, {"from": accounts[1], "to": fresh_address(741), "value": "0x2"})
    finally:
        await eth.close()
        await anvil.stop()
    anvil.settle_previous()
    complete = read_state(state)
    assert complete is not None
    torn = tear(complete, head)
    own = _historical_state(torn, head)
    torn["historical_states"] = [e for e in torn["historical_states"] if e[1] is not own]
    assert accounts_past_head(torn) is None  # the file alone does not show the tear
    await asyncio.to_thread(state.write_bytes, orjson.dumps(torn))

    said = restore_chain(state, [("writer-r", store_path)])
    assert said is not None and f"restored to the write nodes' head {head}" in said, said
    assert f"state at block {head} is not the one the write nodes' blocks left" in said, said
    assert (tmp_path / "anvil-state.damaged.json").exists()
    async with AnvilProcess(port=free_port(), genesis=GENESIS, state_path=state) as again:
        eth = EthClient(again.url)
        writer = make_writer(again.url, tmp_path / "writer")
        await writer.start()
        try:
            await send(eth, {"from": accounts[1], "to": fresh_address(742), "value": "0x3"})
            await writer.wait_for_head(head + 1, within=20)
            assert writer.health()["healthy"] is True
        finally:
            await writer.close()
            await eth.close()


async def test_a_store_holding_only_block_zero_restores_a_file_on_another_block_zero(
    tmp_path: Path,
) -> None:
    """A devnet killed in its first seconds, by an anvil that mined on a genesis of its own
    (before block 0 was pinned): the write nodes hold only block 0, the state file a chain
    on another block 0. A normal case of recovery: anvil is restored to the stored block 0
    (nothing the write nodes emitted is lost), not "another chain" for good."""
    state = tmp_path / "anvil-state.json"
    async with followed(tmp_path) as (eth, writer, _):
        try:
            await writer.wait_for_head(0)
            await dump_state(eth, state)
        finally:
            await writer.close()
    dumped = read_state(state)
    assert dumped is not None
    (ours,) = [b for b in dumped["blocks"] if b["header"]["number"] == "0x0"]
    fresh = dict(ours, header=dict(ours["header"], timestamp=hex(int(time.time()))))
    child = dict(
        ours, header=dict(ours["header"], number="0x1", parentHash=header_hash(fresh["header"]))
    )
    dumped["blocks"] += [fresh, child]
    dumped["best_block_number"] = 1
    await asyncio.to_thread(state.write_bytes, orjson.dumps(dumped))
    said = restore_chain(state, [("writer-r", tmp_path / "writer" / STORE_FILE)])
    assert said is not None and "restored to the write nodes' head 0" in said, said
    assert "another chain" in said, said
    restored = read_state(state)
    assert restored is not None
    assert [b["header"] for b in restored["blocks"]] == [
        {k: v for k, v in ours["header"].items() if k != "hash"}
    ]
    async with AnvilProcess(port=free_port(), genesis=GENESIS, state_path=state) as again:
        eth = EthClient(again.url)
        writer = make_writer(again.url, tmp_path / "writer")
        await writer.start()
        try:
            accounts = await eth.call("eth_accounts")
            await send(eth, {"from": accounts[1], "to": fresh_address(750), "value": "0x1"})
            await writer.wait_for_head(1, within=20)
            assert writer.health()["healthy"] is True
        finally:
            await writer.close()
            await eth.close()

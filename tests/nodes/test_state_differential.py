"""Differential: the devnet workload (transfers, ERC20, storage writes and zeroing,
selfdestruct, reorgs) runs on anvil while a real write node follows it; an archive node
(in process) and a state node (over HTTP) ingest from the write node. For every block and
every touched account and slot, their answers equal anvil's at the same block.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from chainstate.inproc import InprocRegistry
from chainstate.jsonrpc import JsonRpcError
from nodes.checker.service import CheckerNode
from nodes.devnet.anvil import GENESIS, AnvilProcess
from nodes.devnet.rpc import EthClient
from nodes.devnet.workload import WorkloadRecord, run_workload
from nodes.state.service import StateNode
from nodes.writer.service import WriterNode
from tests.conftest import free_port

FAST = {"poll_interval": 0.01, "backoff_initial": 0.02, "backoff_max": 0.2}


async def converged(node: StateNode, eth: EthClient, within: float = 30.0) -> list[str]:
    """Wait until the node holds exactly anvil's canonical chain; returns its hashes."""
    async with asyncio.timeout(within):
        while True:
            head = int(await eth.call("eth_blockNumber"), 16)
            calls = [("eth_getBlockByNumber", [hex(n), False]) for n in range(head + 1)]
            canonical = [b["hash"] for b in await eth.batch(calls)]
            bounds = node.store.bounds()
            if bounds and bounds[1] == head:
                ours = [node.store.hash_at(n) for n in range(bounds[0], head + 1)]
                if ours == canonical[bounds[0] :]:
                    return canonical
            await asyncio.sleep(0.05)


def reads(record: WorkloadRecord, heights: range) -> list[tuple[str, list[Any]]]:
    calls: list[tuple[str, list[Any]]] = []
    for n in heights:
        tag = hex(n)
        for addr in sorted(record.accounts):
            calls.append(("eth_getBalance", [addr, tag]))
            calls.append(("eth_getTransactionCount", [addr, tag]))
            calls.append(("eth_getCode", [addr, tag]))
        for addr, slot in record.storage_targets():
            calls.append(("eth_getStorageAt", [addr, slot, tag]))
    return calls


async def assert_same_answers(
    ours: EthClient, anvil: EthClient, record: WorkloadRecord, heights: range
) -> None:
    calls = reads(record, heights)
    want = await anvil.batch(calls)
    got = await ours.batch(calls)
    diffs = [(c, w, g) for c, w, g in zip(calls, want, got, strict=True) if w != g]
    assert not diffs, f"{len(diffs)} of {len(calls)} answers differ, e.g. {diffs[:5]}"
    blocks = [("eth_getBlockByNumber", [hex(n), full]) for n in heights for full in (False, True)]
    blocks += [("eth_getBlockReceipts", [hex(n)]) for n in heights]
    for theirs, mine in zip(await anvil.batch(blocks), await ours.batch(blocks), strict=True):
        assert mine == theirs  # the bodies too, through the workload's reorgs


async def checker_confirms(registry: InprocRegistry, tmp_path: Path, canonical: list[str]) -> None:
    """The consistency checker, polling both nodes' blockx_* methods, confirms the head."""
    checker = CheckerNode.from_config(
        {"replicas": ["inproc://archive", "inproc://state"], "poll_interval": 0.02},
        data_dir=tmp_path / "checker",
        registry=registry,
    )
    await checker.start()
    head = len(canonical) - 1
    latest: dict[str, Any] = {}
    try:
        async with asyncio.timeout(20):
            while latest.get("num") != head:
                await asyncio.sleep(0.02)
                with contextlib.suppress(JsonRpcError):  # nothing confirmed yet
                    latest = await checker.dispatcher.call("getLatestBlock", [])
        assert latest["id"] == canonical[head] and latest["is_fork"] is False
    finally:
        await checker.close()


@pytest.mark.timeout(180)
async def test_state_nodes_answer_as_anvil_does(tmp_path: Path) -> None:
    registry = InprocRegistry()
    async with AnvilProcess(port=free_port(), genesis=GENESIS) as anvil:
        writer = WriterNode.from_config(
            {"execution_url": anvil.url, "poll_interval": 0.01, "key": "w"},
            data_dir=tmp_path / "writer",
            registry=registry,
        )
        await writer.start()
        writer_http = TestServer(writer.make_app(), host="127.0.0.1")
        await writer_http.start_server()
        archive = StateNode.from_config(
            {"key": "archive", "kind": "archive", "source": "inproc://w", **FAST},
            data_dir=tmp_path / "archive",
            registry=registry,
        )
        state = StateNode.from_config(
            {"key": "state", "kind": "state", "window": 16, **FAST,
             "source": str(writer_http.make_url("/"))},
            data_dir=tmp_path / "state",
            registry=registry,
        )  # fmt: skip
        eth = EthClient(anvil.url)
        mine = EthClient("inproc://archive", registry=registry)
        windowed = EthClient("inproc://state", registry=registry)
        try:
            await archive.start()
            await state.start()
            record = await run_workload(anvil.url)  # nodes follow while it runs and reorgs
            canonical = await converged(archive, eth)
            await converged(state, eth)
            head = len(canonical) - 1
            assert head >= record.last_block and record.reorgs
            assert archive.reader.range() == (0, head)
            assert state.reader.range() == (head - 15, head)
            await assert_same_answers(mine, eth, record, range(head + 1))
            await assert_same_answers(windowed, eth, record, range(head - 15, head + 1))
            assert await mine.call("eth_chainId") == await eth.call("eth_chainId")
            # the state node sends older blocks on (-39006), it never answers them wrongly
            old = ("eth_getBalance", [sorted(record.accounts)[0], hex(head - 16)])
            with pytest.raises(Exception, match="outside this node's range"):
                await windowed.call(*old)
            await checker_confirms(registry, tmp_path, canonical)
        finally:
            await mine.close()
            await windowed.close()
            await eth.close()
            await state.close()
            await archive.close()
            await writer_http.close()
            await writer.close()

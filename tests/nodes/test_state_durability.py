"""Durability: a state node process ingesting over HTTP is killed with SIGKILL mid-ingest,
twice; each restart resumes from its own head with no block lost, duplicated or half-applied
(state, headers, and bodies with their transaction index).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from chainstate.rpcserver import rpc_handler
from nodes.state.store import StateStore
from nodes.state.vendor import keccak256
from tests.conftest import free_port
from tests.nodes.test_state_chain import Account, ChainSource, random_chain

REPO = Path(__file__).resolve().parents[2]
BLOCKS = 2000
KILL_AT = (400, 1200)  # kill once the node's head has passed each of these


@pytest.fixture
async def source_url() -> AsyncIterator[tuple[str, Any]]:
    chain, addrs = random_chain(seed=77, blocks=BLOCKS)
    for height in range(1, BLOCKS, 3):  # every third block has two transactions
        hashes = ["0x" + keccak256(f"tx:{height}:{i}".encode()).hex() for i in range(2)]
        chain.set_receipts(
            chain.blocks[height], [{"transactionHash": h, "logs": []} for h in hashes]
        )
    app = web.Application()
    app.router.add_post("/", rpc_handler(ChainSource(chain).handle_body))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield str(server.make_url("/")), (chain, addrs)
    await server.close()


def start_node(source: str, port: int, data_dir: Path) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "stack.cli", "state-node", "--source", source,
        "--kind", "archive", "--port", str(port), "--data-dir", str(data_dir), "--key", "d1",
    ]  # fmt: skip
    with (data_dir.parent / "node.log").open("ab") as log:
        return subprocess.Popen(
            cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True
        )


async def head_of(session: aiohttp.ClientSession, url: str) -> int | None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber", "params": []}
    try:
        async with session.post(url, json=body) as resp:
            answer = await resp.json()
    except (aiohttp.ClientError, OSError):
        return None
    return int(answer["result"], 16) if "result" in answer else None


async def wait_head(
    session: aiohttp.ClientSession, url: str, at_least: int, proc: subprocess.Popen[bytes]
) -> int:
    deadline = asyncio.get_running_loop().time() + 60
    while asyncio.get_running_loop().time() < deadline:
        assert proc.poll() is None, f"state node exited with {proc.returncode}"
        head = await head_of(session, url)
        if head is not None and head >= at_least:
            return head
        await asyncio.sleep(0.005)
    raise AssertionError(f"node did not reach block {at_least} in 60 s")


def kill(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


async def test_sigkill_mid_ingest_loses_and_duplicates_nothing(
    source_url: tuple[str, Any], tmp_path: Path
) -> None:
    source, (chain, addrs) = source_url
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    data_dir = tmp_path / "node"
    seen = -1
    async with aiohttp.ClientSession() as session:
        for target in KILL_AT:
            proc = start_node(source, port, data_dir)
            try:
                # The first answer after a restart is never below what was seen before.
                restarted = await wait_head(session, url, 0, proc)
                assert restarted >= seen
                seen = await wait_head(session, url, target, proc)
            finally:
                kill(proc)
            assert seen < chain.head, "the kill must land mid-ingest"
        proc = start_node(source, port, data_dir)
        try:
            assert await wait_head(session, url, 0, proc) >= seen
            await wait_head(session, url, chain.head, proc)
            # one spot check over HTTP; the full comparison reads the store below
            body = {"jsonrpc": "2.0", "id": 1, "method": "blockx_range"}
            async with session.post(url, json=body) as resp:
                assert (await resp.json())["result"] == {"earliest": 0, "latest": chain.head}
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                kill(proc)
    store = StateStore(data_dir / "lmdb", kind="archive")
    store.open()
    try:
        assert store.range() == (0, chain.head)
        records = store.validations(0, chain.head + 1)
        assert [r["height"] for r in records] == list(range(chain.head + 1))
        for height, record in enumerate(records):
            assert record["id"] == chain.blocks[height]["Header"]["hash"]
            assert record["validation_hash"] == chain.blocks[height]["ValidationHash"]
            model = chain.state(height)
            with store.view(height) as view:
                for addr in addrs:
                    acct = model.get(addr, Account())
                    assert view.balance(addr) == acct.balance, (height, addr)
                    assert view.nonce(addr) == acct.nonce, (height, addr)
                    assert view.code(addr) == acct.code, (height, addr)
                    for slot in range(6):
                        assert view.storage(addr, slot) == acct.storage.get(slot, 0)
            block_file = chain.blocks[height]["BlockFile"]
            body = store.block_body(height)
            assert body is not None and body["receipts"] == block_file["receipts"], height
            assert body["block"] == block_file["block"], height
            for index, tx in enumerate(block_file["block"]["transactions"]):
                assert store.transaction_location(tx["hash"]) == (height, index)
    finally:
        store.close()

"""The log index survives SIGKILL mid-ingest: a state node process following a chain with logs
is killed twice; after the restarts every log is there once, matching the model, and the
index holds exactly one key per address and topic of each log (nothing half-written)."""

from __future__ import annotations

import random
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import lmdb
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from chainstate.rpcserver import rpc_handler
from tests.conftest import free_port
from tests.nodes.test_state_chain import ChainSource
from tests.nodes.test_state_durability import kill, start_node, wait_head
from tests.nodes.test_state_logs import log_chain

BLOCKS = 800
KILL_AT = (150, 450)


@pytest.fixture
async def source() -> AsyncIterator[tuple[str, Any]]:
    chain, accounts = log_chain(seed=11, blocks=BLOCKS)
    rng = random.Random(3)
    while len(chain.logs()) < 1000:  # enough logs that a kill lands between two of them
        chain.add_logs_block(rng, accounts)
    app = web.Application()
    app.router.add_post("/", rpc_handler(ChainSource(chain).handle_body))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield str(server.make_url("/")), chain
    await server.close()


@pytest.mark.timeout(180)
async def test_sigkill_mid_ingest_keeps_the_log_index_whole(
    source: tuple[str, Any], tmp_path: Path
) -> None:
    url_source, chain = source
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    data_dir = tmp_path / "node"
    async with aiohttp.ClientSession() as session:
        for target in KILL_AT:
            proc = start_node(url_source, port, data_dir)
            try:
                seen = await wait_head(session, url, target, proc)
            finally:
                kill(proc)
            assert seen < chain.head, "the kill must land mid-ingest"
        proc = start_node(url_source, port, data_dir)
        try:
            await wait_head(session, url, chain.head, proc)
            body = {"jsonrpc": "2.0", "id": 1, "method": "eth_getLogs",
                    "params": [{"fromBlock": "0x0", "toBlock": hex(chain.head)}]}  # fmt: skip
            async with session.post(url, json=body) as resp:
                answer = await resp.json()
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                kill(proc)
    logs = [log for _, log in chain.logs()]
    assert answer["result"] == logs
    env = lmdb.open(str(data_dir / "lmdb"), max_dbs=16, readonly=True)
    with env, env.begin() as txn:
        stored = txn.stat(env.open_db(b"logs", txn=txn, create=False))["entries"]
        keys = txn.stat(env.open_db(b"logkeys", txn=txn, create=False))["entries"]
    assert stored == len(logs)
    assert keys == sum(1 + len(log["topics"]) for log in logs)

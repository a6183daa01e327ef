"""When a state node's EVM workers start: with the node, in the background, so a fresh
node's first EVM requests do not wait for a worker to spawn and import pyrevm and py-evm
(1.3-2 s each on a loaded machine), and closing a node that is still starting them leaves
no worker behind."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from typing import Any

import orjson

from bench.nodecalls import CALLER
from nodes.state.service import StateNode
from tests.evm.test_wire import TARGET, chain, started

FIRST_ANSWER = 0.5  # seconds: far below a worker's start, well above a call under CI load
WORKERS_UP = 60.0  # seconds a loaded machine may take to start two workers


async def answered(node: StateNode, method: str, params: list[Any]) -> float:
    """Seconds `method` took to answer (a result, not an error)."""
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    began = time.perf_counter()
    answer = orjson.loads(await node.handle_body(orjson.dumps(body)))
    took = time.perf_counter() - began
    assert "result" in answer, answer
    return took


async def workers_up(node: StateNode, count: int) -> None:
    """Wait, without sending the node any EVM request, until it runs `count` workers."""
    deadline = time.monotonic() + WORKERS_UP
    while len(node.evm.executor.pool.workers()) < count:
        assert time.monotonic() < deadline, "the node did not start its EVM workers"
        await asyncio.sleep(0.05)


async def test_a_fresh_nodes_first_calls_answer_without_waiting_for_workers() -> None:
    """Once the node has had time to start its workers, its first eth_call, and a first
    eth_createAccessList on each worker (py-evm), answer in well under a worker's start."""
    async with started(workers=2) as node:
        built = chain(4)
        for block in built:
            await node.ingest._apply(block)
        await workers_up(node, 2)
        request = {"from": CALLER, "to": TARGET, "data": "0x" + (1).to_bytes(32, "big").hex()}
        height = hex(built[-1].number)
        assert await answered(node, "eth_call", [request, height]) < FIRST_ANSWER
        # at once: one on each worker, both its first py-evm run
        lists = [answered(node, "eth_createAccessList", [request, height]) for _ in range(2)]
        assert max(await asyncio.gather(*lists)) < FIRST_ANSWER


async def test_closing_a_node_while_its_workers_start_leaves_none_running() -> None:
    """A node closed right after it started (its workers still spawning) stops them all."""
    before = {p.pid for p in multiprocessing.active_children()}
    async with started(workers=2):
        await asyncio.sleep(0.3)  # the workers and the feed process are spawning
    left = [p for p in multiprocessing.active_children() if p.pid not in before]
    assert left == []

"""eth_call through the proxy to a state node in its own process (`chainstate up`).

The engine's first attempt gives such a node the parsed request object
(`InprocRegistry.resolve_later`, the node's `answer_later`: the future of its answers) instead
of a body through its `handle_body`, and finishes the request from the future's callback: no
task, no bytes in between. A real state node (a synthetic chain in LMDB, its real EVM workers)
is entered as a state and an archive node behind the proxy's real data listener. Every answer
is compared with the engine's usual path (`Engine.handle`, which sends the body) and with the
node's own answer.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from chainstate.inproc import InprocRegistry
from nodes.state.vendor import parse_vendor_block
from tests.nodes.test_state_chain import random_chain
from tests.nodes.test_state_reads import make_node
from tests.proxy.conftest import client_sees, fast_settings
from tests.proxy.test_dataport import raw_rpc
from tests.proxy.test_inprocpath import metrics_text, scraped

CHAIN = "1337"
BLOCKS = 24


def eth_call(rid: Any, to: str, block: Any, data: str = "0x") -> bytes:
    params = [{"to": to, "data": data}, block]
    return orjson.dumps({"jsonrpc": "2.0", "id": rid, "method": "eth_call", "params": params})


class Counted:
    """The node's entries as the proxy's registry holds them, eth_call bodies and calls of
    `answer_later` counted; `hang`
    makes `answer_later` give a future that never completes (an EVM call that hangs)."""

    def __init__(self, node: Any) -> None:
        self.node = node
        self.bodies = 0
        self.later = 0
        self.offered = 0  # eth_call items given to the synchronous path for parsed items
        self.hang = False
        self.hanging: list[asyncio.Future[Any]] = []

    async def handle_body(self, body: bytes) -> bytes:
        self.bodies += b'"eth_call"' in body  # (not the proxy's own polls)
        return await self.node.handle_body(body)

    def answer_items(self, items: list[Any], errors: list[int]) -> list[Any] | None:
        self.offered += sum(type(i) is dict and i.get("method") == "eth_call" for i in items)
        return self.node.answer_items(items, errors)

    def answer_later(self, items: list[Any]) -> asyncio.Future[list[Any]] | None:
        if self.hang:
            future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
            self.hanging.append(future)
            return future
        answers = self.node.answer_later(items)
        self.later += answers is not None
        return answers


async def start(tmp_path: Path, make_api, **settings: Any):
    """(api, node, addresses, counted), the node's EVM workers started."""
    chain, addrs = random_chain(seed=7, blocks=BLOCKS)
    node = await make_node(tmp_path, kind="archive", hot_blocks=4)
    for raw in chain.blocks:
        await node.ingest._apply(parse_vendor_block(raw))
    await node.handle_body(eth_call(0, addrs[0], "latest"))  # starts the EVM workers
    counted = Counted(node)
    registry = InprocRegistry()
    url = registry.register(
        node.key,
        counted.handle_body,
        node.answer_now,
        counted.answer_items,
        node.items_answered,
        counted.answer_later,
    )
    api = await make_api(fast_settings(**{"upstream_timeout": 10.0, **settings}), registry=registry)
    for kind in ("state", "archive"):
        entry = {"key": kind, "url": url, "kind": kind}
        status, answer = await api.post(f"/{CHAIN}/addNode", entry)
        assert status == 201, answer
    await api.heads_known(CHAIN)
    return api, node, addrs, counted


@pytest.fixture
async def stack(tmp_path: Path, make_api):
    """`start(**settings)`, the nodes closed at the end."""
    nodes: list[Any] = []

    async def make(**settings: Any):
        found = await start(tmp_path / f"stack{len(nodes)}", make_api, **settings)
        nodes.append(found[1])
        return found

    yield make
    for node in nodes:
        await node.close()


NO_CACHE = {"cache_pools": ()}  # coalescing on: reads the proxy knows still pinned by hash


async def test_calls_are_answered_from_the_nodes_future_as_the_engine_answers(stack) -> None:
    api, node, addrs, counted = await stack(**NO_CACHE)
    bodies = [eth_call(i, addrs[i % len(addrs)], hex(i)) for i in range(1, BLOCKS)]
    bodies += [eth_call("latest", addrs[0], "latest"), eth_call(99, addrs[1], "0x3", "0x1234")]
    for body in bodies:
        status, raw = await raw_rpc(api, body)
        assert status == 200 and raw == client_sees(body, await node.handle_body(body)), body
    assert counted.later == len(bodies) and counted.bodies == 0
    assert counted.offered == 0  # a single eth_call is not parsed by the read path first
    # The engine's usual path (a task, the body through handle_body) answers the same bytes.
    for body in bodies:
        assert await api.proxy.engine.handle(CHAIN, body, {}) == await raw_rpc(api, body)
    assert counted.bodies == len(bodies)
    status, raw = await raw_rpc(api, eth_call(5, addrs[0], "latest"))
    assert status == 200 and raw.startswith(b'{"jsonrpc":"2.0","id":5,"result":"0x')


async def test_the_read_path_still_caches_and_counts_them(stack) -> None:
    api, _, addrs, counted = await stack()
    before = await metrics_text(api)
    body = eth_call(1, addrs[2], "latest")  # pinned to the head's hash, then kept
    first = await raw_rpc(api, body)
    again = await raw_rpc(api, body)  # from the response cache
    assert first == again and counted.later == 1
    after = await metrics_text(api)

    def grew(name: str, **labels: str) -> float:
        return scraped(after, name, **labels) - scraped(before, name, **labels)

    assert grew("chainstate_proxy_requests_total", method="eth_call") == 2
    assert grew("chainstate_proxy_requests_total", method="eth_call", node="cache") == 1
    assert grew("chainstate_proxy_upstream_attempts_total", outcome="ok") == 1
    assert api.proxy.state.pools[CHAIN].inflight == 0


async def test_a_block_the_node_lacks_is_retried_and_answered_as_before(stack) -> None:
    api, _, addrs, counted = await stack(**NO_CACHE)
    unknown = {"blockHash": "0x" + "ab" * 32}  # no node knows it: -39006, retried
    body = eth_call(3, addrs[0], unknown)
    status, raw = await raw_rpc(api, body)
    assert status == 200 and orjson.loads(raw)["error"]["code"] == -32000  # (-39006)
    assert counted.later == 1 and counted.bodies >= 1  # the retries: the usual way
    assert (status, raw) == await api.proxy.engine.handle(CHAIN, body, {})
    bad = eth_call(4, "0x12", "0x3")  # an invalid address: -32602 from the node
    status, raw = await raw_rpc(api, bad)
    assert (status, raw) == await api.proxy.engine.handle(CHAIN, bad, {})
    assert orjson.loads(raw)["error"]["code"] == -32602


async def test_a_call_that_hangs_times_out_and_is_retried(stack) -> None:
    api, node, addrs, counted = await stack(**NO_CACHE, upstream_timeout=0.5)
    counted.hang = True
    before = await metrics_text(api)
    body = eth_call(8, addrs[0], "0x4")
    status, raw = await raw_rpc(api, body)
    # The first attempt (the node's future) timed out; the retry went the usual way.
    assert status == 200 and raw == client_sees(body, await node.handle_body(body))
    assert len(counted.hanging) == 1 and counted.hanging[0].cancelled()
    assert counted.bodies == 1
    after = await metrics_text(api)

    def grew(name: str, **labels: str) -> float:
        return scraped(after, name, **labels) - scraped(before, name, **labels)

    assert grew("chainstate_proxy_upstream_attempts_total", outcome="timeout") == 1
    assert grew("chainstate_proxy_upstream_attempts_total", outcome="ok") == 1
    assert api.proxy.state.pools[CHAIN].inflight == 0


LARGE = "0x" + "ab" * (1024 * 1024)  # 1 MiB of calldata: a body over LARGE_BODY (engine.py)


async def test_large_calls_are_parsed_once_and_given_to_the_node_as_objects(stack) -> None:
    """Bodies of LARGE_BODY bytes or more are parsed in a turn of their own (one per
    turn), then go the same way: as objects to the node, not written again (no bytes to
    the node), neither cached nor coalesced (MAX_KEYED_BYTES). Several at once are each
    answered with their own id, as the node answers them."""
    api, _, addrs, counted = await stack()
    bodies = [eth_call(i, addrs[i % len(addrs)], "latest", LARGE) for i in range(4)]
    # (the engine's usual path: the body through the node's handle_body)
    expected = [await api.proxy.engine.handle(CHAIN, body, {}) for body in bodies]
    counted.bodies = 0
    answers = await asyncio.gather(*(raw_rpc(api, body) for body in bodies))
    assert answers == expected
    assert counted.later == 4 and counted.bodies == 0
    assert await raw_rpc(api, bodies[0]) == expected[0]  # asked again: not kept
    assert counted.later == 5
    status, raw = await raw_rpc(api, b'{"jsonrpc": "2.0", "id": 1, "params": [' + LARGE.encode())
    assert status == 200 and orjson.loads(raw)["error"]["code"] == -32700
    assert api.proxy.state.pools[CHAIN].inflight == 0


async def test_a_large_call_that_hangs_is_retried_as_a_sub_batch(stack) -> None:
    """The first attempt of a large call gave the node objects and no bytes were written
    for it: its retry writes the item then (a sub-batch of one), and is answered."""
    api, _, addrs, counted = await stack(**NO_CACHE, upstream_timeout=0.5)
    counted.hang = True
    body = eth_call(8, addrs[0], "latest", LARGE)
    status, raw = await raw_rpc(api, body)
    assert len(counted.hanging) == 1 and counted.bodies == 1
    assert (status, raw) == await api.proxy.engine.handle(CHAIN, body, {})
    assert api.proxy.state.pools[CHAIN].inflight == 0


async def test_calls_the_proxy_stops_waiting_for_leave_the_nodes_queue(stack) -> None:
    """The proxy cancels the node's future when its attempt times out (and asks another
    node): calls of it that have not started are taken off the EVM queue, not run."""
    _, node, addrs, _ = await stack()
    pool = node.evm.executor.pool
    run_on, jobs = pool.run_on, []

    async def counted(worker: Any, job: Any, limit: float) -> Any:
        jobs.append(job)
        return await run_on(worker, job, limit)

    busy = asyncio.Event()  # every worker busy until set: the calls wait in the queue
    acquire = pool.acquire

    async def when_free(prefer: Any = None) -> Any:
        await busy.wait()
        return await acquire(prefer)

    pool.run_on, pool.acquire = counted, when_free
    items = [orjson.loads(eth_call(i, addrs[i], "0x3", f"0x{i:02x}")) for i in range(3)]
    future = node.answer_later(items)
    assert future is not None
    await asyncio.sleep(0.05)
    future.cancel()
    await asyncio.sleep(0.05)
    busy.set()
    await asyncio.sleep(0.3)
    assert jobs == []
    kept = node.answer_later(items[:1])  # (and a call nobody cancels runs)
    assert (await kept)[0]["id"] == 0 and len(jobs) == 1

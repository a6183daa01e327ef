"""Ingest: following a source, reorgs, outages, bad blocks, switching sources (incl. HTTP)."""

from __future__ import annotations

import asyncio
import copy
import logging
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from chainstate.config import ConfigError
from chainstate.inproc import InprocRegistry
from chainstate.rpcclient import RpcClient
from chainstate.rpcserver import rpc_handler
from nodes.state.service import StateNode
from nodes.writer.blockdiff import validation_hash
from proxy.app import create_app
from proxy.settings import ProxySettings
from proxy.store_file import FileStore
from tests.nodes.test_state_chain import (
    CHAIN_ID,
    Account,
    ChainSource,
    SyntheticChain,
    random_chain,
)

FAST = {"poll_interval": 0.02, "backoff_initial": 0.02, "backoff_max": 0.1}


@pytest.fixture
async def make_node(
    tmp_path: Path,
) -> AsyncIterator[Callable[..., Any]]:
    nodes: list[StateNode] = []

    async def make(source: str, registry: InprocRegistry, **settings: Any) -> StateNode:
        section = {"key": f"n{len(nodes)}", "source": source, **FAST, **settings}
        node = StateNode.from_config(section, data_dir=tmp_path / section["key"], registry=registry)
        await node.start()
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        await node.close()


def assert_matches(node: StateNode, chain: SyntheticChain, addrs: list[str]) -> None:
    earliest, head = node.reader.range()
    assert head == chain.head
    for height in range(earliest, head + 1):
        assert node.reader.header(height).hash == chain.blocks[height]["Header"]["hash"]
        model = chain.state(height)
        for addr in addrs:
            acct = model.get(addr, Account())
            assert node.reader.balance(addr, height) == acct.balance
            assert node.reader.nonce(addr, height) == acct.nonce
            for slot in range(6):
                assert node.reader.storage(addr, slot, height) == acct.storage.get(slot, 0)


async def wait_until(predicate: Callable[[], bool], within: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def extend(chain: SyntheticChain, addrs: list[str], blocks: int, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(blocks):
        chain.add_random_block(rng, addrs)


async def test_follows_new_blocks_and_learns_the_chain_id(make_node: Any) -> None:
    chain, addrs = random_chain(seed=41, blocks=20)
    registry = InprocRegistry()
    source = ChainSource(chain)
    registry.register("w", source.handle_body)
    node = await make_node("inproc://w", registry, kind="archive")
    await node.ingest.wait_for_height(19, within=10)
    assert node.chain_id() == CHAIN_ID
    extend(chain, addrs, 15, seed=1)
    await node.ingest.wait_for_height(34, within=10)
    assert_matches(node, chain, addrs)
    assert registry.resolve("inproc://n0") is not None  # the node registered itself


async def test_reorg_to_a_longer_fork_rolls_back_and_follows(make_node: Any) -> None:
    chain, addrs = random_chain(seed=42, blocks=30)
    registry = InprocRegistry()
    source = ChainSource(chain)
    registry.register("w", source.handle_body)
    node = await make_node("inproc://w", registry, kind="state", window=20)
    await node.ingest.wait_for_height(29, within=10)
    orphan = chain.blocks[27]["Header"]["hash"]
    fork = chain.fork(24, "fork")
    extend(fork, addrs, 12, seed=2)
    source.chain = fork
    await wait_until(lambda: node.store.hash_at(36) == fork.blocks[36]["Header"]["hash"])
    assert_matches(node, fork, addrs)
    assert node.store.height_of(orphan) is None
    assert node.metrics.rollbacks._value.get() == 5


async def test_reorg_at_the_same_height_is_noticed_when_idle(make_node: Any) -> None:
    chain, addrs = random_chain(seed=43, blocks=30)
    registry = InprocRegistry()
    source = ChainSource(chain)
    registry.register("w", source.handle_body)
    node = await make_node("inproc://w", registry, kind="archive")
    await node.ingest.wait_for_height(29, within=10)
    fork = chain.fork(26, "same-height")
    extend(fork, addrs, 3, seed=3)
    assert fork.head == chain.head
    source.chain = fork
    await wait_until(lambda: node.store.hash_at(29) == fork.blocks[29]["Header"]["hash"])
    assert_matches(node, fork, addrs)


async def test_a_reorg_is_one_step_for_readers(make_node: Any) -> None:
    """The source replaces its last 3 blocks by 3 others (anvil_reorg 3): a reader of the
    node sees head 29 of the old chain, then head 29 of the new one, never a lower head
    between (a proxy that answered `latest` at 29 keeps finding the height held)."""
    chain, addrs = random_chain(seed=48, blocks=30)
    registry = InprocRegistry()
    source = ChainSource(chain)
    registry.register("w", source.handle_body)
    node = await make_node("inproc://w", registry, kind="state", window=20)
    await node.ingest.wait_for_height(29, within=10)
    fork = chain.fork(26, "same-length")
    extend(fork, addrs, 3, seed=8)
    assert fork.head == chain.head
    heads: list[int] = []
    stop = asyncio.Event()

    async def read() -> None:
        while not stop.is_set():
            heads.append(node.reader.range()[1])
            await asyncio.sleep(0)

    reader = asyncio.create_task(read())
    source.chain = fork
    try:
        await wait_until(lambda: node.store.hash_at(29) == fork.blocks[29]["Header"]["hash"])
    finally:
        stop.set()
        await reader
    assert len(heads) > 10 and min(heads) == 29, sorted(set(heads))
    assert_matches(node, fork, addrs)
    assert node.metrics.rollbacks._value.get() == 3


async def test_a_source_outage_backs_off_and_recovers(make_node: Any) -> None:
    chain, addrs = random_chain(seed=44, blocks=10)
    registry = InprocRegistry()
    source = ChainSource(chain)
    registry.register("w", source.handle_body)
    node = await make_node("inproc://w", registry, kind="archive")
    await node.ingest.wait_for_height(9, within=10)
    source.fail = True
    extend(chain, addrs, 5, seed=4)
    await wait_until(lambda: node.ingest.last_error is not None)
    calls = source.calls
    await asyncio.sleep(0.3)
    # backing off: at most a handful of attempts in 0.3 s (max backoff 0.1 s)
    assert source.calls - calls <= 8
    assert "source is down" in (node.ingest.last_error or "")
    source.fail = False
    await node.ingest.wait_for_height(14, within=10)
    await wait_until(lambda: node.ingest.last_error is None)
    assert_matches(node, chain, addrs)


async def test_a_tampered_block_is_never_applied(make_node: Any) -> None:
    chain, addrs = random_chain(seed=45, blocks=12)
    registry = InprocRegistry()
    real = chain.blocks[8]
    bad = copy.deepcopy(real)
    bad["StateDiff"]["post"][addrs[0]] = {"balance": hex(1)}  # content changed, hash kept
    chain.blocks[8] = bad
    source = ChainSource(chain)
    registry.register("w", source.handle_body)
    node = await make_node("inproc://w", registry, kind="archive")
    await node.ingest.wait_for_height(7, within=10)
    await wait_until(lambda: "ValidationHash" in (node.ingest.last_error or ""))
    assert node.reader.range() == (0, 7)
    chain.blocks[8] = real
    await node.ingest.wait_for_height(11, within=10)
    assert_matches(node, chain, addrs)


async def test_a_reorg_deeper_than_the_window_keeps_the_old_answers(make_node: Any) -> None:
    chain, addrs = random_chain(seed=46, blocks=30)
    registry = InprocRegistry()
    source = ChainSource(chain)
    registry.register("w", source.handle_body)
    node = await make_node("inproc://w", registry, kind="state", window=5)
    await node.ingest.wait_for_height(29, within=10)
    fork = chain.fork(10, "deep")
    extend(fork, addrs, 25, seed=5)
    source.chain = fork
    await wait_until(lambda: "ReorgTooDeep" in (node.ingest.last_error or ""))
    assert node.reader.range() == (25, 29)  # nothing rolled back: the reorg is one step
    for height in (25, 29):
        assert node.reader.header(height).hash == chain.blocks[height]["Header"]["hash"]


async def test_switching_sources_continues_from_the_own_head(make_node: Any) -> None:
    chain, addrs = random_chain(seed=47, blocks=40)
    registry = InprocRegistry()
    leader = ChainSource(chain, visible=20)
    registry.register("leader", leader.handle_body)
    # The new Leader runs apart: served over HTTP, ahead of the old one.
    follower = ChainSource(chain)
    app = web.Application()
    app.router.add_post("/", rpc_handler(follower.handle_body))
    server = TestServer(app)
    await server.start_server()
    try:
        node = await make_node("inproc://leader", registry, kind="archive")
        await node.ingest.wait_for_height(20, within=10)
        node.set_source(str(server.make_url("/")))
        await node.ingest.wait_for_height(39, within=10)
        assert_matches(node, chain, addrs)
        assert leader.calls > 0 and follower.calls > 0
        # A Leader on another fork: parent hashes tell, and the node follows it.
        fork = chain.fork(35, "leader-2")
        extend(fork, addrs, 10, seed=6)
        other = ChainSource(fork)
        registry.register("leader-2", other.handle_body)
        node.set_source("inproc://leader-2")
        await wait_until(lambda: node.store.hash_at(45) == fork.blocks[45]["Header"]["hash"])
        assert_matches(node, fork, addrs)
        with pytest.raises(ValueError):
            node.set_source("ftp://nowhere")
    finally:
        await server.close()


async def test_follows_the_leader_named_by_the_proxy_admin(make_node: Any) -> None:
    """With `leader_from`, the proxy's switchLeader moves ingest to the new Leader."""
    chain, addrs = random_chain(seed=48, blocks=30)
    registry = InprocRegistry()
    old, new = ChainSource(chain, visible=10), ChainSource(chain)
    registry.register("leader-a", old.handle_body)
    registry.register("leader-b", new.handle_body)
    proxy = TestServer(create_app(ProxySettings(), store=FileStore(None), registry=registry))
    await proxy.start_server()
    try:
        async with aiohttp.ClientSession() as admin:

            async def post(path: str, body: dict[str, Any]) -> None:
                async with admin.post(proxy.make_url(path), json=body) as resp:
                    assert resp.status in (200, 201), await resp.text()

            node = await make_node(
                "inproc://leader-a",
                registry,
                kind="archive",
                leader_from=str(proxy.make_url("/1337/writers/leader")),
                leader_poll_interval=0.02,
            )
            await node.ingest.wait_for_height(10, within=10)
            # no Leader known yet (404): the node keeps its source
            await wait_until(lambda: node.leader is not None and node.leader.last_error)
            assert node.ingest.source == "inproc://leader-a"
            writer_a = {"key": "leader-a", "url": "inproc://leader-a", "leader": True}
            await post("/1337/writers/addWriter", writer_a)
            await post("/1337/writers/addWriter", {"key": "leader-b", "url": "inproc://leader-b"})
            await wait_until(lambda: node.leader is not None and node.leader.last_error is None)
            assert node.ingest.source == "inproc://leader-a"
            await post("/1337/writers/switchLeader", {"key": "leader-b"})
            await node.ingest.wait_for_height(29, within=10)
            assert node.ingest.source == "inproc://leader-b"
            assert node.health()[1]["leader_error"] is None
            assert_matches(node, chain, addrs)
    finally:
        await proxy.close()


async def test_a_leader_inside_another_process_is_reported_not_followed(make_node: Any) -> None:
    """A node in its own process (HTTP mode) cannot reach a Leader the proxy knows by an
    in-process name: it keeps its source and says why; an http:// Leader is followed."""
    chain, addrs = random_chain(seed=49, blocks=30)
    theirs = InprocRegistry()  # the proxy's process: its writers are in-process there
    theirs.register("writer-1", ChainSource(chain, visible=20).handle_body)
    proxy = TestServer(create_app(ProxySettings(), store=FileStore(None), registry=theirs))
    await proxy.start_server()
    http_writer = ChainSource(chain)
    app = web.Application()
    app.router.add_post("/", rpc_handler(http_writer.handle_body))
    writer_2 = TestServer(app)
    await writer_2.start_server()
    try:
        ours = InprocRegistry()
        ours.register("direct", ChainSource(chain, visible=15).handle_body)
        node = await make_node(
            "inproc://direct",
            ours,
            kind="archive",
            leader_from=str(proxy.make_url("/1337/writers/leader")),
            leader_poll_interval=0.02,
        )
        async with aiohttp.ClientSession() as admin:
            one = {"key": "writer-1", "url": "inproc://writer-1", "leader": True}
            async with admin.post(proxy.make_url("/1337/writers/addWriter"), json=one) as resp:
                assert resp.status == 201, await resp.text()

            def leader_error() -> str:
                return node.health()[1]["leader_error"] or ""

            await wait_until(lambda: "inproc://writer-1" in leader_error())
            assert "http:// URLs" in leader_error()
            assert node.ingest.source == "inproc://direct"
            await node.ingest.wait_for_height(15, within=10)  # still ingesting

            two = {"key": "writer-2", "url": str(writer_2.make_url("/"))}
            async with admin.post(proxy.make_url("/1337/writers/addWriter"), json=two) as resp:
                assert resp.status == 201, await resp.text()
            switch = {"key": "writer-2"}
            url = proxy.make_url("/1337/writers/switchLeader")
            async with admin.post(url, json=switch) as resp:
                assert resp.status == 200, await resp.text()
        await node.ingest.wait_for_height(29, within=10)
        assert node.ingest.source == str(writer_2.make_url("/"))
        assert node.health()[1]["leader_error"] is None
        assert_matches(node, chain, addrs)
    finally:
        await writer_2.close()
        await proxy.close()


async def test_a_stalled_ingest_shows_in_health_and_is_logged_once(
    make_node: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A block whose `pre` disagrees with the stored state (the CI case of issue 24) is
    retried; after `stall_failures` failed rounds /health answers 503 "stalled" with the
    reason, the stall is logged once however often it is retried, and so is the recovery."""
    caplog.set_level(logging.DEBUG, logger="nodes.state.ingest")
    chain, addrs = random_chain(seed=48, blocks=12)
    real = chain.blocks[8]
    bad = copy.deepcopy(real)
    addr = next(a for a, acct in bad["StateDiff"]["pre"].items() if "balance" in acct)
    bad["StateDiff"]["pre"][addr]["balance"] = hex(
        int(real["StateDiff"]["pre"][addr]["balance"], 16) + 1
    )
    bad["ValidationHash"] = validation_hash(bad["Header"], bad["StateDiff"])  # well-formed
    chain.blocks[8] = bad
    registry = InprocRegistry()
    source = ChainSource(chain)
    registry.register("w", source.handle_body)
    node = await make_node("inproc://w", registry, kind="archive", stall_failures=3)
    server = TestServer(node.make_app())
    await server.start_server()
    try:
        await wait_until(lambda: node.ingest.failures >= 6)
        async with (
            aiohttp.ClientSession() as session,
            session.get(server.make_url("/health")) as resp,
        ):
            assert resp.status == 503
            health = await resp.json()
        assert health["status"] == "stalled" and health["head"] == 7
        assert "block 8 failed" in health["reason"] and "attempts in a row" in health["reason"]
        assert "PreStateMismatch: block 8" in health["reason"]
        assert node.reader.range() == (0, 7)  # nothing of the bad block applied
        # the same document over JSON-RPC, as the proxy's health poll reads it
        polled = await RpcClient(f"inproc://{node.key}", registry=registry).call("blockx_health")
        assert polled["status"] == "stalled" and polled["reason"] == health["reason"]
        stalls = [r for r in caplog.records if "stalled" in r.getMessage()]
        assert len(stalls) == 1 and stalls[0].levelno == logging.ERROR
        loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(loud) == 2, [r.getMessage() for r in loud]  # the first failure, the stall

        chain.blocks[8] = real  # the source serves the right block again
        await node.ingest.wait_for_height(11, within=10)
        ok, doc = node.health()
        assert ok and doc["status"] == "ok" and "reason" not in doc
        recovered = [r for r in caplog.records if "recovered" in r.getMessage()]
        assert len(recovered) == 1
        assert_matches(node, chain, addrs)
    finally:
        await server.close()


async def test_an_unreachable_source_is_not_a_stall(make_node: Any) -> None:
    """A source that does not answer leaves the node with every block it holds: /health
    stays "ok" (with the source's error shown) and the proxy keeps routing to it."""
    chain, _ = random_chain(seed=49, blocks=6)
    registry = InprocRegistry()
    source = ChainSource(chain)
    registry.register("w", source.handle_body)
    node = await make_node("inproc://w", registry, kind="archive", stall_failures=2)
    await node.ingest.wait_for_height(5, within=10)
    registry.unregister("w")
    await wait_until(lambda: node.ingest.failures >= 5)
    ok, doc = node.health()
    assert ok and doc["status"] == "ok" and "reason" not in doc, doc
    assert doc["last_error"] and node.ingest.stalled is None


async def test_stall_failures_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="stall_failures must be at least 1"):
        StateNode.from_config({"stall_failures": 0}, data_dir=tmp_path)

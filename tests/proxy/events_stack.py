"""A small chain behind a real proxy, for the filter and WebSocket tests.

A synthetic chain with logs (tests/nodes/test_state_logs.py) is served as a write node
would serve it; a real state node ingests it in process; the proxy routes to that node and
is served as `chainstate proxy` serves it: the lean data server on a loopback port, which
answers `POST /1337` and hands WebSocket upgrades to the aiohttp app on the same port. Tests
grow the chain (`add_blocks`) or reorganise it (`reorg`) and wait for the proxy's feed.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from chainstate.httpserver import HttpServer
from chainstate.inproc import InprocRegistry
from nodes.state.service import StateNode
from proxy.app import create_app, create_server, get_proxy
from proxy.engine import Engine
from proxy.events import Events
from proxy.eventsettings import EventSettings
from proxy.settings import ProxySettings, SeedNode
from proxy.store_file import FileStore
from tests.nodes.test_state_chain import ChainSource
from tests.nodes.test_state_logs import EMITTERS, TOPIC_POOL, LogChain, log_chain

FAST_NODE = {"poll_interval": 0.01, "backoff_initial": 0.02, "backoff_max": 0.1}
FAST_EVENTS = {"poll_interval": 0.01, "feed_timeout": 5.0}


@dataclass
class EventsStack:
    chain: LogChain
    accounts: list[str]
    source: ChainSource
    node: StateNode
    server: HttpServer
    events: Events
    events_engine: Engine  # the proxy's engine (in-process callers use it)
    rng: random.Random

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}/1337"

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://")

    async def rpc(self, method: str, *params: Any) -> Any:
        answer = await self.post(
            {"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)}
        )
        assert "error" not in answer, answer
        return answer["result"]

    async def post(self, body: Any) -> Any:
        async with aiohttp.ClientSession() as http, http.post(self.url, json=body) as resp:
            return orjson.loads(await resp.read()) if resp.status != 204 else None

    async def add_blocks(self, count: int) -> None:
        for _ in range(count):
            self.chain.add_logs_block(self.rng, self.accounts)
        await self.readable(self.chain.head)

    async def reorg(self, keep: int, count: int, tag: str) -> list[dict[str, Any]]:
        """Replace the blocks above `keep` with `count` new ones; the dropped blocks."""
        dropped = self.chain.blocks[keep + 1 :]
        fork = self.chain.fork(keep, tag)
        for _ in range(count):
            fork.add_logs_block(self.rng, self.accounts)
        self.chain = fork
        self.source.chain = fork
        await self.readable(fork.head, fork.blocks[-1]["Header"]["hash"])
        return dropped

    async def readable(self, height: int, block_hash: str | None = None) -> None:
        """Wait until block `height` (that hash) is readable: announced by the proxy's chain
        feed while it runs, else held by the state node."""
        want = block_hash or self.chain.blocks[height]["Header"]["hash"]
        async with asyncio.timeout(20):
            while True:
                if not self._pinned(height, want):  # the read path's `latest` (docs/proxy.md)
                    await asyncio.sleep(0.01)
                    continue
                feed = self.events.feeds.get("1337")
                if feed is not None and feed.listeners:
                    if any(b.number == height and b.hash == want for b in feed.blocks):
                        return
                elif self.node.store.hash_at(height) == want:
                    return
                await asyncio.sleep(0.01)

    def _pinned(self, height: int, want: str) -> bool:
        """Whether the proxy's read path resolves `latest` to that block or a newer one (with
        the read path on, `latest` and eth_blockNumber answer at the head it knows)."""
        reads = self.events_engine.reads
        if reads is None:
            return True
        _, pool = self.events_engine.resolve("1337")  # type: ignore[misc]
        latest = reads.request(pool).latest()
        return (
            latest is not None
            and latest[0] >= height
            and reads.heads.view(pool.id).hash_at(height) in (want, None)
        )

    def logs(self, start: int = 0) -> list[dict[str, Any]]:
        return [log for h, log in self.chain.logs() if h >= start]


async def start_stack(
    tmp_path: Path,
    blocks: int = 10,
    seed: int = 1,
    proxy: dict[str, Any] | None = None,
    node: dict[str, Any] | None = None,
    **events: Any,
) -> EventsStack:
    """The stack with these [proxy.events] settings (`proxy`: ProxySettings fields, `node`:
    the state node's settings)."""
    chain, accounts = log_chain(seed=seed, blocks=blocks)
    registry = InprocRegistry()
    source = ChainSource(chain)
    registry.register("writer", source.handle_body)
    node = StateNode.from_config(
        {
            "key": "state-1",
            "kind": "archive",
            "source": "inproc://writer",
            **FAST_NODE,
            **(node or {}),
        },
        data_dir=tmp_path / "state-1",
        registry=registry,
    )
    await node.start()
    await node.ingest.wait_for_height(chain.head, within=20)
    settings = ProxySettings(
        head_poll_interval=0.05,
        nodes=(SeedNode("1337", "state-1", "inproc://state-1", "state"),),
        **(proxy or {}),
    )
    app = create_app(
        settings,
        store=FileStore(None),
        registry=registry,
        events=EventSettings.from_table({**FAST_EVENTS, **events}),
    )
    server = create_server(app)
    await server.start("127.0.0.1", 0)
    proxy_parts = get_proxy(app)
    return EventsStack(
        chain,
        accounts,
        source,
        node,
        server,
        proxy_parts.events,
        proxy_parts.engine,
        random.Random(seed),
    )


async def stop_stack(stack: EventsStack) -> None:
    await stack.server.close()
    await stack.node.close()


__all__ = ["EMITTERS", "TOPIC_POOL", "EventsStack", "start_stack", "stop_stack"]

"""Head tracking and health: every node and write node is polled each `head_poll_interval` s.

One batch per node: `eth_blockNumber` (the head), `blockx_range` (earliest held height, when
the node has it) and the latest block header (its hash, so a later request naming that hash
is routed by height). Write nodes get `eth_blockNumber` alone: their head is the last block
they emitted. `unhealthy_after` consecutive failures (here or on the data path) mark a node
unhealthy (readers leave rotation; the admin API shows it and refuses to make an unhealthy
writer the Leader); the next successful poll brings it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson

from proxy.model import Node, Pool
from proxy.select import Selector
from proxy.upstream import Upstream, UpstreamError

log = logging.getLogger(__name__)

POLL_BODY = orjson.dumps(
    [
        {"jsonrpc": "2.0", "id": 0, "method": "eth_blockNumber", "params": []},
        {"jsonrpc": "2.0", "id": 1, "method": "blockx_range", "params": []},
        {"jsonrpc": "2.0", "id": 2, "method": "eth_getBlockByNumber", "params": ["latest", False]},
    ]
)
WRITER_POLL_BODY = orjson.dumps(
    [{"jsonrpc": "2.0", "id": 0, "method": "eth_blockNumber", "params": []}]
)


class PollError(Exception):
    pass


class HeadTracker:
    def __init__(
        self,
        pools: Callable[[], dict[str, Pool]],
        upstream: Upstream,
        selector: Selector,
        interval: float,
        timeout: float,
        unhealthy_after: int,
    ) -> None:
        self._pools = pools
        self.upstream = upstream
        self.selector = selector
        self.interval = interval
        self.timeout = timeout
        self.unhealthy_after = unhealthy_after
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.poll_all()
            except Exception:
                log.exception("head poll round failed")
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    async def poll_all(self) -> None:
        pools = list(self._pools().values())
        readers = [self.poll(n) for pool in pools for n in pool.readers]
        writers = [self.poll_writer(n) for pool in pools for n in pool.writers.values()]
        if readers or writers:
            await asyncio.gather(*readers, *writers)

    async def poll(self, node: Node) -> None:
        answers = await self._probe(node, POLL_BODY)
        if answers is None:
            return
        rng = answers.get(1, {}).get("result")
        if isinstance(rng, dict) and isinstance(rng.get("earliest"), int):
            node.earliest = rng["earliest"]
        block = answers.get(2, {}).get("result")
        if isinstance(block, dict) and isinstance(block.get("hash"), str):
            with contextlib.suppress(TypeError, ValueError):
                self.selector.remember_hash(block["hash"], int(block["number"], 16))

    async def poll_writer(self, node: Node) -> str | None:
        """Poll one write node now; the reason it failed, or None when it answered."""
        answers = await self._probe(node, WRITER_POLL_BODY)
        return node.last_error if answers is None else None

    async def _probe(self, node: Node, body: bytes) -> dict[Any, dict[str, Any]] | None:
        """Send one poll batch and do the health bookkeeping; the answers by id, or None."""
        started = time.perf_counter()
        try:
            raw = await self.upstream.send(node.entry.url, body, self.timeout)
            answers = _by_id(raw)
            head = _quantity(answers.get(0))
        except (UpstreamError, PollError) as exc:
            node.last_error = str(exc)[:300]
            if node.failed(self.unhealthy_after):
                log.warning("%s %s marked unhealthy: %s", _what(node), node.key, exc)
            return None
        if node.succeeded():
            log.warning("%s %s healthy again (head %s)", _what(node), node.key, head)
        node.last_error = None
        node.observe_latency((time.perf_counter() - started) * 1000)
        node.head = head
        return answers


def _what(node: Node) -> str:
    return "write node" if node.entry.kind == "writer" else "node"


def _by_id(raw: bytes) -> dict[Any, dict[str, Any]]:
    try:
        answers = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise PollError("answer is not JSON") from None
    if isinstance(answers, dict):  # a node that rejects batches answers one error object
        answers = [answers]
    if not isinstance(answers, list):
        raise PollError("answer is not a JSON-RPC batch")
    return {a.get("id"): a for a in answers if isinstance(a, dict)}


def _quantity(answer: dict[str, Any] | None) -> int:
    result = (answer or {}).get("result")
    if isinstance(result, str) and result.startswith("0x"):
        try:
            return int(result, 16)
        except ValueError:
            pass
    raise PollError(f"eth_blockNumber gave no head: {answer!r}"[:200])

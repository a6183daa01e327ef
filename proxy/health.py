"""Head tracking and health: every node and write node is polled each `head_poll_interval` s.

One batch per node: `eth_blockNumber` (the head), `blockx_range` (earliest held height, when
the node has it), the latest block header (its hash, so a later request naming that hash
is routed by height) and `blockx_health` (a state node's own report: one that says "stalled",
failing the same block again and again, is taken out of rotation with its reason). Write
nodes get `eth_blockNumber` (their head is the last block they emitted) and
`writer_health`: their execution client's head, their lag behind it, and whether they are
healthy by their own account (a writer stalled on errors, or left behind by its client, says
so with the reason). `unhealthy_after` consecutive failures (here or on the data path) mark
a node unhealthy, and so does a writer that reports itself unhealthy (readers leave
rotation; the admin API shows it and refuses to make an unhealthy writer the Leader); the
next successful poll brings it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson

from chainstate.tasks import stop_task
from proxy import latency
from proxy.model import Node, Pool
from proxy.select import Selector
from proxy.upstream import Upstream, UpstreamError

log = logging.getLogger(__name__)

POLL_BODY = orjson.dumps(
    [
        {"jsonrpc": "2.0", "id": 0, "method": "eth_blockNumber", "params": []},
        {"jsonrpc": "2.0", "id": 1, "method": "blockx_range", "params": []},
        {"jsonrpc": "2.0", "id": 2, "method": "eth_getBlockByNumber", "params": ["latest", False]},
        {"jsonrpc": "2.0", "id": 3, "method": "blockx_health", "params": []},
    ]
)
WRITER_POLL_BODY = orjson.dumps(
    [
        {"jsonrpc": "2.0", "id": 0, "method": "eth_blockNumber", "params": []},
        {"jsonrpc": "2.0", "id": 1, "method": "writer_health", "params": []},
    ]
)
WRITER_REPORT = ("execution_head", "lag", "state")  # what the writers list shows of the report


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
        on_block: Callable[[Pool, Node, Any], None] | None = None,
    ) -> None:
        self._pools = pools
        self.on_block = on_block  # each polled latest block (proxy/heads.py follows the chain)
        self.upstream = upstream
        self.selector = selector
        self.interval = interval
        self.timeout = timeout
        self.unhealthy_after = unhealthy_after
        self._task: asyncio.Task[None] | None = None
        self._writer_reports: dict[str, dict[str, Any]] = {}  # by writer URL
        self._polling: dict[int, asyncio.Task[Any]] = {}  # id(node) → its poll in flight

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        await stop_task(self._task)
        self._task = None
        polls = list(self._polling.values())
        for task in polls:
            task.cancel()
        if polls:
            await asyncio.gather(*polls, return_exceptions=True)
        self._polling.clear()

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                self.start_round()
            except Exception:
                log.exception("head poll round failed")
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    def start_round(self) -> None:
        """Start a poll of every node whose previous poll has ended (a node that takes long
        to answer is polled again once it has)."""
        for pool in list(self._pools().values()):
            for node in pool.readers:
                self._start(node, self.poll(node, pool))
            for node in pool.fulls:  # (not followed for `latest`: no pool given)
                self._start(node, self.poll(node))
            for node in pool.writers.values():
                self._start(node, self.poll_writer(node))

    def _start(self, node: Node, coro: Any) -> None:
        key = id(node)
        if key in self._polling:
            coro.close()
            return
        task = asyncio.create_task(coro)
        self._polling[key] = task

        def done(task: asyncio.Task[Any]) -> None:
            self._polling.pop(key, None)
            if not task.cancelled() and task.exception() is not None:
                log.error("poll of %s failed", node.key, exc_info=task.exception())

        task.add_done_callback(done)

    async def poll_all(self) -> None:
        pools = list(self._pools().values())
        readers = [self.poll(n, pool) for pool in pools for n in pool.readers]
        readers += [self.poll(n) for pool in pools for n in pool.fulls]
        writers = [self.poll_writer(n) for pool in pools for n in pool.writers.values()]
        if readers or writers:
            await asyncio.gather(*readers, *writers)

    async def poll(self, node: Node, pool: Pool | None = None) -> None:
        answers = await self._probe(node, POLL_BODY, _judge_reader)
        if answers is None:
            return
        rng = answers.get(1, {}).get("result")
        if isinstance(rng, dict) and isinstance(rng.get("earliest"), int):
            node.earliest = rng["earliest"]
        block = answers.get(2, {}).get("result")
        if isinstance(block, dict) and isinstance(block.get("hash"), str):
            with contextlib.suppress(TypeError, ValueError):
                self.selector.remember_hash(block["hash"], int(block["number"], 16))
            if self.on_block is not None and pool is not None:
                self.on_block(pool, node, block)

    async def poll_writer(self, node: Node) -> str | None:
        """Poll one write node now; why it is unhealthy, or None when it is healthy."""
        answers = await self._probe(node, WRITER_POLL_BODY, self._judge_writer)
        return node.last_error if answers is None or not node.healthy else None

    def writer_report(self, node: Node) -> dict[str, Any]:
        """The writer's last own report: its execution client's head, lag and state."""
        report = self._writer_reports.get(node.entry.url) or {}
        return {name: report.get(name) for name in WRITER_REPORT}

    def _judge_writer(self, node: Node, answers: dict[Any, dict[str, Any]]) -> str | None:
        """Keep the writer's own report; its reason when it says it is unhealthy. A writer
        without `writer_health` (-32601) is judged by its answers alone."""
        report = answers.get(1, {}).get("result")
        if not isinstance(report, dict):
            self._writer_reports.pop(node.entry.url, None)
            return None
        self._writer_reports[node.entry.url] = report
        if report.get("healthy") is False:
            return str(report.get("last_error") or "the write node reports itself unhealthy")
        return None

    async def _probe(
        self,
        node: Node,
        body: bytes,
        judge: Callable[[Node, dict[Any, dict[str, Any]]], str | None] | None = None,
    ) -> dict[Any, dict[str, Any]] | None:
        """Send one poll batch and do the health bookkeeping; the answers by id, or None.
        `judge` may find a node that answers unhealthy all the same (a stalled writer)."""
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
        ms = (time.perf_counter() - started) * 1000
        node.observe_latency(ms)
        # A poll is a sample of the node's speed too: a node that gets no requests (slow, or
        # just back) still has a current cost for the choice.
        latency.observe(node, ms, time.monotonic(), self.selector.tau)
        node.head = head
        problem = judge(node, answers) if judge is not None else None
        if problem is not None:
            if node.healthy or problem != node.last_error:
                log.warning("%s %s unhealthy: %s", _what(node), node.key, problem)
            node.healthy, node.last_error = False, problem[:300]
            return answers
        if node.succeeded():
            log.warning("%s %s healthy again (head %s)", _what(node), node.key, head)
        node.last_error = None
        return answers


def _judge_reader(node: Node, answers: dict[Any, dict[str, Any]]) -> str | None:
    """A node's own report of a stall (a state node failing the same block); a node without
    `blockx_health` is judged by its answers alone."""
    report = answers.get(3, {}).get("result")
    if isinstance(report, dict) and report.get("status") == "stalled":
        return str(report.get("reason") or "the node reports itself stalled")
    return None


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

"""The chain as it becomes readable through the proxy: new blocks, their logs, and reorgs.

One `ChainFeed` per pool, running only while something listens (log and block filters,
WebSocket subscriptions). It follows ONE node of the pool (the usable `state` node with the
highest polled head, kept while it stays usable, so replicas at different heights never make
the chain seem to go back and forth) and asks it every `poll_interval` for its latest block.
A block is announced once that node holds it, so a subscriber never hears of a head no node
of the pool can answer for. Every round:

1. `eth_getBlockByNumber("latest")`: unchanged → nothing to do; lower (the node was switched
   and is behind) → wait;
2. the headers from the last announced block up to it, checked to link by parent hash; when
   they do not link to what was announced, the fork point is found walking back over the
   announced blocks (at most `history_blocks`), and the blocks above it are *removed*;
3. when a listener wants logs: one `eth_getLogs` over the new blocks (each log must name its
   block's hash, else the node moved under us and the round is retried);
4. listeners get `(removed, added)`: removed newest first, as geth delivers a reorg
   (`removed: true` logs, then the new chain's heads and logs).

Reads go over `chainstate.rpcclient` (the control-path client, as the checker and the state
nodes use it), not the client data path, so they neither count as client traffic nor retry
across nodes (one node's consistent view per round).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from chainstate.jsonrpc import SERVER_BUSY, JsonRpcError
from chainstate.logfilter import LogFilter
from chainstate.rpcclient import RpcClient, RpcUnavailable
from chainstate.tasks import stop_task
from proxy.listeners import LogIndex, LogListener
from proxy.model import Node, Pool

log = logging.getLogger(__name__)

# Fields a block object has that a header notification does not (geth's newHeads).
NOT_IN_HEADS = ("transactions", "uncles", "size", "totalDifficulty", "withdrawals")


class FeedError(Exception):
    """A round saw an inconsistent chain (the node moved under it); it is tried again."""


@dataclass(slots=True)
class FeedBlock:
    """One announced block: its header (serialized once for every subscriber) and logs."""

    number: int
    hash: str
    parent_hash: str
    head: bytes  # the newHeads notification result, JSON
    logs: list[dict[str, Any]] | None = None  # None: fetched while no listener wanted logs
    removed_logs: list[dict[str, Any]] = field(default_factory=list)  # set when removed
    announced_at: float = 0.0  # unix time it was handed to the listeners


def feed_block(block: dict[str, Any]) -> FeedBlock:
    """A FeedBlock from an eth_getBlockByNumber answer (raises FeedError when malformed)."""
    try:
        number = int(block["number"], 16)
        block_hash, parent = block["hash"], block["parentHash"]
    except (KeyError, TypeError, ValueError):
        raise FeedError(f"not a block: {str(block)[:120]}") from None
    head = {k: v for k, v in block.items() if k not in NOT_IN_HEADS}
    return FeedBlock(number, block_hash, parent, orjson.dumps(head))


class Listener(Protocol):
    """A consumer of a feed (a filter, a subscription). `since` is the announced head when
    it joined: blocks at or below it were never delivered to it, so their removal is not
    either. One that `wants_logs` has a `flt` and gets its matching logs through
    `on_logs(entries)` (proxy/listeners.py); the others get every step through
    `on_blocks`. Called in the event loop; must not block."""

    wants_logs: bool
    since: int

    def on_blocks(self, removed: list[FeedBlock], added: list[FeedBlock]) -> None: ...


@dataclass(frozen=True, slots=True)
class FeedSettings:
    poll_interval: float = 0.05  # seconds between checks of the followed node's head
    history_blocks: int = 128  # announced blocks kept: the deepest reorg delivered as such
    max_blocks_per_round: int = 64  # new blocks fetched per round (a node far ahead catches up)


class ChainFeed:
    """The announced chain of one pool and the listeners of it."""

    def __init__(
        self,
        pool_id: str,
        pool: Callable[[], Pool | None],
        client: Callable[[str], RpcClient],
        settings: FeedSettings,
    ) -> None:
        self.pool_id = pool_id
        self._pool = pool
        self._client = client
        self.settings = settings
        self.blocks: deque[FeedBlock] = deque(maxlen=settings.history_blocks)
        self.listeners: set[Listener] = set()
        self.index = LogIndex()  # the listeners that want logs, by address and topic
        self._encoded: dict[int, bytes] = {}  # id(log) → its JSON, for one announcement
        self.node_url: str | None = None  # the node followed
        self.last_error: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    @property
    def tip(self) -> FeedBlock | None:
        return self.blocks[-1] if self.blocks else None

    @property
    def wants_logs(self) -> bool:
        return len(self.index) > 0

    def encode(self, entry: dict[str, Any]) -> bytes:
        """A log's JSON, made once per announcement however many listeners send it."""
        key = id(entry)
        out = self._encoded.get(key)
        if out is None:
            out = self._encoded[key] = orjson.dumps(entry)
        return out

    # listeners -------------------------------------------------------------------------

    async def add(self, listener: Listener, within: float = 10.0) -> int:
        """Deliver to `listener` from the next announced block on; returns the announced
        head it starts after. Raises FeedError when no node answered in time."""
        tip = self.tip
        if tip is not None and self._ready.is_set():
            listener.since = tip.number
            self._join(listener)
            return tip.number
        listener.since = -1  # set when the first round sees the head
        self._join(listener)
        if self._task is None or self._task.done():
            self._ready.clear()
            self.blocks.clear()
            self._task = asyncio.create_task(self._run(), name=f"chainfeed:{self.pool_id}")
        try:
            await asyncio.wait_for(self._ready.wait(), within)
        except TimeoutError:
            self.remove(listener)
            why = self.last_error or "no usable node"
            raise FeedError(f"pool {self.pool_id} has no readable head yet ({why})") from None
        return listener.since

    def _join(self, listener: Listener) -> None:
        self.listeners.add(listener)
        if listener.wants_logs:
            self.index.add(listener)  # type: ignore[arg-type]

    def remove(self, listener: Listener) -> None:
        self.listeners.discard(listener)
        if listener.wants_logs:
            self.index.remove(listener)  # type: ignore[arg-type]

    async def close(self) -> None:
        self.listeners.clear()
        self.index = LogIndex()
        await stop_task(self._task)
        self._task = None

    # the loop --------------------------------------------------------------------------

    async def _run(self) -> None:
        failing = False
        while self.listeners:
            try:
                await self.round()
                if failing:
                    log.info("chain feed %s: following %s again", self.pool_id, self.node_url)
                failing = False
                self.last_error = None
            except (RpcUnavailable, JsonRpcError, FeedError) as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"[:300]
                if not failing:
                    log.warning("chain feed %s: %s", self.pool_id, self.last_error)
                failing = True
                self.node_url = None  # choose again
            except Exception:  # the loop must outlive any one failure
                log.exception("chain feed %s: unexpected failure", self.pool_id)
                self.node_url = None
            await asyncio.sleep(self.settings.poll_interval)
        self._task = None
        self._ready.clear()

    def _follow(self) -> RpcClient:
        pool = self._pool()
        usable = [
            n
            for n in (pool.readers if pool is not None else [])
            if n.entry.enabled and n.healthy and n.weight > 0
        ]
        nodes = [n for n in usable if n.entry.kind == "state"] or usable
        if not nodes:
            raise FeedError(f"pool {self.pool_id} has no usable node")
        if self.node_url not in {n.entry.url for n in nodes}:
            self.node_url = max(nodes, key=_head).entry.url
        return self._client(self.node_url)

    async def round(self) -> None:
        """One check of the followed node; announces what it found."""
        client = self._follow()
        latest = feed_block(await client.call("eth_getBlockByNumber", ["latest", False]))
        tip = self.tip
        if tip is None:  # the first round: the head listeners start after
            self.blocks.append(latest)
            for listener in self.listeners:
                listener.since = latest.number
            self._ready.set()
            return
        if latest.hash == tip.hash:
            return
        if latest.number <= tip.number:
            ours = self._announced(latest.number)
            if ours is None or ours.hash == latest.hash:
                return  # the node is behind what was announced (it was switched): wait
            fork, added = await self._fork_point(client, latest.number)  # a reorg
        else:
            end = min(latest.number, tip.number + self.settings.max_blocks_per_round)
            added = await self._headers(client, tip.number + 1, end)
            fork = tip.number
            if added[0].parent_hash != tip.hash:
                fork, replaced = await self._fork_point(client, tip.number)
                added = replaced + added
        _check_links(added, self._hash_at(fork))
        if self.wants_logs and added:
            await self._fill_logs(client, added)
        removed = []
        while self.blocks and self.blocks[-1].number > fork:
            removed.append(self.blocks.pop())
        self.blocks.extend(added)
        self._announce(removed, added)

    def _announce(self, removed: list[FeedBlock], added: list[FeedBlock]) -> None:
        now = time.time()
        for block in added:
            block.announced_at = now
        for block in removed:
            block.removed_logs = [{**lg, "removed": True} for lg in reversed(block.logs or [])]
        for listener in list(self.listeners):
            if listener.wants_logs:
                continue  # (below: only where its logs are)
            try:
                listener.on_blocks(removed, added)
            except Exception:
                log.exception("chain feed %s: a listener failed", self.pool_id)
        self._encoded = {}
        try:
            for listener, entries in self._matches(removed, added).items():
                try:
                    listener.on_logs(entries)
                except Exception:
                    log.exception("chain feed %s: a listener failed", self.pool_id)
        finally:
            self._encoded = {}

    def _matches(
        self, removed: list[FeedBlock], added: list[FeedBlock]
    ) -> dict[LogListener, list[dict[str, Any]]]:
        """Each log listener's logs of one step, in geth's order: the removed ones first (of
        blocks delivered after its `since`, newest first), then the new chain's. Only the
        listeners the index finds for a log look at it."""
        out: dict[LogListener, list[dict[str, Any]]] = {}
        if not len(self.index):
            return out
        candidates = self.index.candidates
        for block, entries, old in (
            *((b, b.removed_logs, True) for b in removed),
            *((b, b.logs or (), False) for b in added),
        ):
            for entry in entries:
                for listener in candidates(entry):
                    flt = listener.flt
                    if old and block.number <= listener.since:
                        continue
                    if wanted(flt, block) and flt.matches(entry):
                        found = out.get(listener)
                        if found is None:
                            out[listener] = [entry]
                        else:
                            found.append(entry)
        return out

    async def _headers(self, client: RpcClient, start: int, end: int) -> list[FeedBlock]:
        if end < start:
            return []
        calls = [("eth_getBlockByNumber", [hex(n), False]) for n in range(start, end + 1)]
        return [feed_block(b) for b in await _batch(client, calls)]

    async def _fork_point(self, client: RpcClient, top: int) -> tuple[int, list[FeedBlock]]:
        """The highest announced block at or below `top` the node still has, and the node's
        blocks above it up to `top`."""
        announced = [b for b in self.blocks if b.number <= top]
        theirs: list[FeedBlock] = []
        for i in range(len(announced) - 1, -1, -8):
            chunk = announced[max(0, i - 7) : i + 1]
            got = await self._headers(client, chunk[0].number, chunk[-1].number)
            for ours, block in zip(reversed(chunk), reversed(got), strict=True):
                if ours.hash == block.hash:
                    return ours.number, theirs
                theirs.insert(0, block)
        raise FeedError(
            f"reorg deeper than the {len(self.blocks)} announced blocks kept (history_blocks)"
        )

    def _announced(self, number: int) -> FeedBlock | None:
        for block in reversed(self.blocks):
            if block.number == number:
                return block
        return None

    def _hash_at(self, number: int) -> str:
        block = self._announced(number)
        if block is None:
            raise FeedError(f"block {number} is no longer among the announced blocks")
        return block.hash

    async def _fill_logs(self, client: RpcClient, blocks: list[FeedBlock]) -> None:
        by_number = {b.number: b for b in blocks}
        for block in blocks:
            block.logs = []
        for entry in await self._logs(client, blocks[0].number, blocks[-1].number):
            block = by_number.get(int(entry["blockNumber"], 16))
            if block is None or entry.get("blockHash") != block.hash:
                raise FeedError("logs of another chain than the headers (the node reorged)")
            assert block.logs is not None
            block.logs.append(entry)

    async def _logs(self, client: RpcClient, start: int, end: int) -> list[dict[str, Any]]:
        """Every log of blocks [start, end]; a range over the node's limits (-32005) is
        asked for in halves."""
        flt = {"fromBlock": hex(start), "toBlock": hex(end)}
        try:
            return await client.call("eth_getLogs", [flt])
        except JsonRpcError as exc:
            if exc.code != SERVER_BUSY or start == end:
                raise
        middle = (start + end) // 2
        return await self._logs(client, start, middle) + await self._logs(client, middle + 1, end)


async def follow(feed: ChainFeed, listener: Listener) -> int:
    """`feed.add(listener)` for a JSON-RPC method: no readable head is -32005."""
    try:
        return await feed.add(listener)
    except FeedError as exc:
        raise JsonRpcError(SERVER_BUSY, f"cannot follow the chain: {exc}") from None


def wanted(flt: LogFilter, block: FeedBlock) -> bool:
    """Whether a live filter looks at `block` at all (its blockHash, or its range)."""
    if flt.block_hash is not None:
        return block.hash == flt.block_hash
    return flt.in_range(block.number)


def _head(node: Node) -> int:
    return -1 if node.head is None else node.head


def _check_links(blocks: list[FeedBlock], parent: str) -> None:
    for block in blocks:
        if block.parent_hash != parent:
            raise FeedError(f"block {block.number} does not link to its parent (the node moved)")
        parent = block.hash


async def _batch(client: RpcClient, calls: list[tuple[str, list[Any]]]) -> list[Any]:
    """Results of a batch of reads on one node (the first error raised)."""
    if len(calls) == 1:
        return [await client.call(*calls[0])]
    return list(await asyncio.gather(*(client.call(m, p) for m, p in calls)))

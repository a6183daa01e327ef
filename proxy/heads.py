"""The chain as the proxy knows it, per pool: one head per client request, and reorgs.

`ChainView` keeps the recent canonical blocks of one pool (height → hash) and the head block
each node reported. It is fed by the head tracker's polls (`Heads.observe`: every node's
latest block, every `head_poll_interval`) and, when a checker is configured for the pool, by
the checker's confirmed head (`Heads` polls `getLatestBlock`).

A reported head that extends the known chain is added at once. One that does not link (a gap
of more than one block, or another block at a known height) is reconciled in the background:
the node's blocks are fetched downwards until one is found on the known chain (the fork
point). The node's chain then replaces the known blocks above that point (a **reorg**) when
the node itself moved off the known chain (it saw the reorg: its previous head was replaced)
or its chain is longer, and none of its blocks is one a reorg dropped before; otherwise the
node is lagging on a dropped fork, and it gets no `latest` traffic until it reports a head on
the known chain. Every dropped block hash is handed to `on_dropped` (the response cache
forgets its answers).

`RequestHeads` resolves the tags of one client request, each once: `latest` to the highest
head reported by a usable node on the known chain (state nodes first), `safe`/`finalized` to
the checker's confirmed head (without a checker, as `latest`, which is what the state nodes
do).

`latest` never goes backwards for a pool: each view keeps the highest head it resolved
(`ChainView.floor`), and a request whose nodes all report lower heads (the leading replica
went out of rotation) is still answered at that block, by a node that holds it. Only a reorg
lowers it: when the known chain no longer has a block at that height (it was replaced by a
shorter chain), `latest` is the new chain's head, as geth answers after such a reorg. A client
may also name the lowest block it accepts (`x-min-block`, `RequestHeads.least`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.model import Node, Pool
from proxy.select import Selector
from proxy.upstream import Upstream, UpstreamError

log = logging.getLogger(__name__)

FETCH_CHUNK = 32  # blocks asked for in one batch while looking for a fork point
DROPPED_KEPT = 4096  # hashes of blocks dropped by reorgs, remembered to refuse their fork
RECENT_SHOWN = 8  # newest known blocks the admin API shows


@dataclass(frozen=True, slots=True)
class Block:
    """What the view needs of a block header."""

    number: int
    hash: str
    parent: str


def parse_block(obj: Any) -> Block | None:
    """A Block from an eth_getBlockByNumber result (None when it is not one)."""
    if not isinstance(obj, dict):
        return None
    number, block_hash, parent = obj.get("number"), obj.get("hash"), obj.get("parentHash")
    if not (isinstance(number, str) and isinstance(block_hash, str) and isinstance(parent, str)):
        return None
    try:
        return Block(int(number, 16), block_hash.lower(), parent.lower())
    except ValueError:
        return None


def _header_request(height: int) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": height,
        "method": "eth_getBlockByNumber",
        "params": [hex(height), False],
    }


class FetchError(Exception):
    """A node did not give the blocks asked for (or they did not link)."""


class ChainView:
    """Recent canonical blocks of one pool and each node's reported head."""

    def __init__(self, pool_id: str, history: int) -> None:
        self.pool_id = pool_id
        self.history = history
        self.hashes: dict[int, str] = {}  # height → hash
        self.heights: dict[str, int] = {}  # hash → height
        self.parents: dict[int, str] = {}  # height → parent hash (links below the lowest)
        self.tip: int | None = None
        self.tips: dict[str, Block] = {}  # node key → the head it last reported
        self.dropped: OrderedDict[str, None] = OrderedDict()  # hashes reorgs removed
        self.confirmed: tuple[int, str] | None = None  # the checker's (height, hash)
        self.reorgs = 0  # reorgs seen (the known chain replaced above a fork point)
        self.dropped_blocks = 0
        self.busy = False  # a reconcile is running
        self.floor: int | None = None  # the highest `latest` resolved: never answered lower
        self.queued: dict[str, tuple[Node, Block]] = {}  # reports waiting for it

    # ---- lookups -------------------------------------------------------------------------

    def on_chain(self, block: Block) -> bool:
        return self.hashes.get(block.number) == block.hash

    def hash_at(self, height: int) -> str | None:
        return self.hashes.get(height)

    def to_obj(self) -> dict[str, Any]:
        low = self.low
        return {
            "tip": self.tip,
            "tip_hash": None if self.tip is None else self.hashes.get(self.tip),
            "known_blocks": len(self.hashes),
            "lowest_known": low,
            "recent": [[h, self.hashes[h]] for h in sorted(self.hashes)[-RECENT_SHOWN:]],
            "confirmed": None if self.confirmed is None else self.confirmed[0],
            "confirmed_hash": None if self.confirmed is None else self.confirmed[1],
            "reorgs": self.reorgs,
            "dropped_blocks": self.dropped_blocks,
            "nodes": {
                key: {"head": b.number, "hash": b.hash, "on_chain": self.on_chain(b)}
                for key, b in sorted(self.tips.items())
            },
        }

    # ---- changes -------------------------------------------------------------------------

    @property
    def low(self) -> int | None:
        """The lowest known height."""
        return min(self.hashes) if self.hashes else None

    def links(self, block: Block) -> bool:
        """Whether `block` is known, extends the known tip by one, or is the parent of the
        lowest known block."""
        if self.tip is None:
            return True
        if self.hashes.get(block.number) == block.hash:
            return True
        if block.number == self.tip + 1 and self.hashes.get(self.tip) == block.parent:
            return True
        return self.parents.get(block.number + 1) == block.hash and block.number + 1 == self.low

    def extend(self, blocks: list[Block]) -> None:
        """Add blocks that link (lowest first)."""
        for block in blocks:
            old = self.hashes.get(block.number)
            if old is not None and old != block.hash:
                self.heights.pop(old, None)
            self.hashes[block.number] = block.hash
            self.heights[block.hash] = block.number
            self.parents[block.number] = block.parent
            self.dropped.pop(block.hash, None)
            if self.tip is None or block.number > self.tip:
                self.tip = block.number
        self._trim()

    def replace_above(self, fork: int, blocks: list[Block]) -> list[str]:
        """A reorg: the known blocks above `fork` give way to `blocks`; the dropped hashes."""
        dropped = []
        for height in [h for h in self.hashes if h > fork]:
            old = self.hashes.pop(height)
            self.heights.pop(old, None)
            self.parents.pop(height, None)
            dropped.append(old)
        self.tip = max(self.hashes) if self.hashes else None
        self.extend(blocks)
        for old in dropped:
            if old not in self.heights:
                self.dropped[old] = None
        while len(self.dropped) > DROPPED_KEPT:
            self.dropped.popitem(last=False)
        gone = [h for h in dropped if h not in self.heights]
        if gone:
            self.reorgs += 1
            self.dropped_blocks += len(gone)
        return gone

    def reset(self) -> list[str]:
        """Forget every known block (a fork deeper than the history); their hashes."""
        gone = list(self.hashes.values())
        self.hashes.clear()
        self.heights.clear()
        self.parents.clear()
        self.tip = None
        return gone

    def _trim(self) -> None:
        if self.tip is None:
            return
        floor = self.tip - self.history
        if len(self.hashes) > self.history:
            for height in [h for h in self.hashes if h <= floor]:
                self.heights.pop(self.hashes.pop(height), None)
                self.parents.pop(height, None)


class RequestHeads:
    """The tags of one client request, each resolved once: (height, hash) or None."""

    __slots__ = ("_avoid", "_latest", "_safe", "heads", "least", "mixed", "pool", "view")

    def __init__(
        self, heads: Heads, pool: Pool, view: ChainView | None, least: int | None = None
    ) -> None:
        self.heads = heads
        self.pool = pool
        self.view = view
        self.least = least  # the client's lowest acceptable `latest` (`x-min-block`), if any
        self._latest: tuple[int, str] | bool | None = False  # False: not resolved yet
        self._safe: tuple[int, str] | bool | None = False
        self._avoid: tuple[Node, ...] | None = None
        # Whether an item of the request is answered at a block its `latest` does not
        # determine (None: not tracked; proxy/reads.py `batch_key`)
        self.mixed: bool | None = None

    def latest(self) -> tuple[int, str | None] | None:
        """(height, hash) of `latest` for this request; the hash is None only for a block the
        client named (`least`) that the proxy has not seen yet (then asked by height)."""
        if self._latest is False:
            self._latest = self.heads.latest(self.pool, self.view, self.least)
        return self._latest  # type: ignore[return-value]

    def safe(self) -> tuple[int, str] | None:
        """`safe` and `finalized`: the checker's confirmed head, else `latest`."""
        if self._safe is False:
            confirmed = None if self.view is None else self.view.confirmed
            self._safe = confirmed if confirmed is not None else self.latest()
        return self._safe  # type: ignore[return-value]

    def hash_at(self, height: int) -> str | None:
        return None if self.view is None else self.view.hashes.get(height)

    def avoid(self) -> tuple[Node, ...]:
        """Nodes whose head is off the known chain (behind on a fork a reorg dropped): no
        item pinned to a block of the known chain goes to them while another node is on it.
        """
        if self._avoid is None:
            off: list[Node] = []
            on = False
            view = self.view
            readers = self.pool.readers
            # (a lone reader is never avoided: no other node may be on the chain)
            if view is not None and len(readers) > 1:
                for node in readers:
                    tip = view.tips.get(node.entry.key)
                    if tip is None:
                        continue
                    if view.hashes.get(tip.number) == tip.hash:
                        on = True
                    else:
                        off.append(node)
            self._avoid = tuple(off) if on else ()
        return self._avoid

    def height_of(self, block_hash: str) -> int | None:
        """The height of a block on the known chain (None: unknown, or dropped)."""
        return None if self.view is None else self.view.heights.get(block_hash)


class Heads:
    """Every pool's ChainView, fed by the head tracker and the checkers."""

    def __init__(
        self,
        upstream: Upstream,
        selector: Selector,
        *,
        history: int = 256,
        timeout: float = 2.0,
        interval: float = 1.0,
        checkers: dict[str, str] | None = None,
        on_dropped: Callable[[str, list[str]], None] | None = None,
        backfill: bool = False,
    ) -> None:
        self.upstream = upstream
        self.selector = selector
        self.history = history
        self.timeout = timeout
        self.interval = interval
        self.checkers = dict(checkers or {})  # pool id → checker URL
        self.on_dropped = on_dropped
        # Read the `history` blocks below a pool's first head (with a shared cache tier: a
        # proxy that starts cold then finds the fleet's answers at those heights at once).
        self.backfill = backfill
        self.views: dict[str, ChainView] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._checker_task: asyncio.Task[None] | None = None
        self.checker_errors: dict[str, str | None] = {}

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        if self.checkers:
            self._checker_task = asyncio.create_task(self._poll_checkers())

    async def close(self) -> None:
        tasks = [*self._tasks, *([self._checker_task] if self._checker_task else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        self._checker_task = None

    # ---- per request ---------------------------------------------------------------------

    def request(self, pool: Pool, least: int | None = None) -> RequestHeads:
        return RequestHeads(self, pool, self.views.get(pool.id), least)

    def latest(
        self, pool: Pool, view: ChainView | None, least: int | None = None
    ) -> tuple[int, str | None] | None:
        """The block every `latest` item of a request is answered at: the highest head among
        the usable readers (state nodes first) whose head is on the known chain, never below
        one resolved before (`ChainView.floor`) nor below `least` (the client's)."""
        if view is None:
            return None
        height = self._highest(pool, view)
        floor = view.floor
        if floor is not None and view.hashes.get(floor) is None:
            floor = None  # a reorg replaced that block by a shorter chain: its head is lower
        if floor is not None and (height is None or height < floor):
            height = floor
        view.floor = height
        if least is not None and (height is None or height < least):
            return least, view.hashes.get(least)
        return None if height is None else (height, view.hashes[height])

    def _highest(self, pool: Pool, view: ChainView) -> int | None:
        """The highest head a usable reader on the known chain reported (state nodes first;
        nodes out by their breaker alone only when no other is left)."""
        tips = view.tips
        hashes = view.hashes
        # The highest of each class in one pass (heights are >= 0; -1: none in the class),
        # no list of nodes nor generator per request.
        states = others = ejected = -1  # ejected: breaker open, only when no other is left
        for node in pool.readers:
            entry = node.entry
            if not (entry.enabled and node.healthy and node.weight > 0) or node.distrusted:
                continue  # a replica the checker flags must not set the head others answer at
            tip = tips.get(entry.key)
            if tip is None:
                continue
            number = tip.number
            if hashes.get(number) != tip.hash:
                continue
            if node.blocked:
                if number > ejected:
                    ejected = number
            elif entry.kind == "state":
                if number > states:
                    states = number
            elif number > others:
                others = number
        highest = states if states >= 0 else others if others >= 0 else ejected
        return None if highest < 0 else highest

    # ---- feeding -------------------------------------------------------------------------

    def view(self, pool_id: str) -> ChainView:
        view = self.views.get(pool_id)
        if view is None:
            view = self.views[pool_id] = ChainView(pool_id, self.history)
        return view

    def forget(self, live: set[str]) -> None:
        """Drop the views of pools that no longer exist."""
        for pool_id in [p for p in self.views if p not in live]:
            del self.views[pool_id]

    def observe(self, pool: Pool, node: Node, raw: Any) -> None:
        """A node's latest block, as the head tracker polled it."""
        block = parse_block(raw)
        if block is not None:
            self._take(pool, node, block)

    def _take(self, pool: Pool, node: Node, block: Block) -> None:
        view = self.view(pool.id)
        first = view.tip is None
        if self._quick(view, node, block):
            if first and self.backfill:
                view.busy = True  # (reports that do not link wait for it)
                self._spawn(self._backfill(pool, view, node, block))
            return
        if view.busy:
            view.queued[node.key] = (node, block)
            return
        view.busy = True
        self._spawn(self._reconcile(pool, view, node, block))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _backfill(self, pool: Pool, view: ChainView, node: Node, block: Block) -> None:
        """The blocks below a pool's first head, down to `history`, read from the node that
        reported it (FETCH_CHUNK a round trip): reads at those heights are then keyed
        (cached, coalesced, looked up in the shared tier) from the proxy's start."""
        target = max(0, block.number - self.history + 1)
        try:
            while (low := view.low) is not None and low > target:
                start = max(target, low - FETCH_CHUNK)
                fetched = await self._fetch(node, start, low - 1)
                if fetched[-1].hash != view.parents.get(low):
                    break  # the known chain changed meanwhile
                view.extend(fetched)
                if fetched[0].number != start:
                    break  # the node holds nothing lower
        except (FetchError, UpstreamError) as exc:
            log.info("pool %s: blocks below the first head not read: %s", view.pool_id, exc)
        finally:
            view.busy = False
        while view.queued and not view.busy:
            _, (queued_node, queued) = view.queued.popitem()
            self._take(pool, queued_node, queued)

    async def _reconcile(self, pool: Pool, view: ChainView, node: Node, block: Block) -> None:
        """Settle one report, then the reports that came in meanwhile (one task per view)."""
        try:
            while True:
                try:
                    await self._settle(pool, view, node, block)
                except (FetchError, UpstreamError) as exc:
                    why = f"pool {view.pool_id}: blocks of {node.key} not linked yet: {exc}"
                    log.debug(why)
                while view.queued:
                    _, (node, block) = view.queued.popitem()
                    if not self._quick(view, node, block):
                        break
                else:
                    return
        finally:
            view.busy = False

    @staticmethod
    def _quick(view: ChainView, node: Node, block: Block) -> bool:
        """Take a report that links to the known chain at once; False when it needs
        reconciling."""
        if not view.links(block) or (view.tip is not None and block.hash in view.dropped):
            return False
        view.tips[node.key] = block
        view.extend([block])
        return True

    async def _extend_down(self, pool: Pool, view: ChainView, block: Block) -> bool:
        """Known blocks below the lowest, down to `block`'s height, read from a node on the
        known chain; whether they were added."""
        low = view.low
        tips = view.tips
        source = next(
            (n for n in pool.readers if n.healthy and n.key in tips and view.on_chain(tips[n.key])),
            None,
        )
        if low is None or source is None or low - block.number > self.history:
            return False
        fetched = await self._fetch(source, block.number, low - 1)
        if fetched[0].number != block.number or fetched[-1].hash != view.parents.get(low):
            return False
        view.extend(fetched)
        return True

    async def _walk(
        self, view: ChainView, node: Node, block: Block
    ) -> tuple[list[Block], int | None]:
        """The node's blocks from `block` down to the known chain (highest first) and the
        height where they meet it (None: nothing in common within the history)."""
        chain = [block]
        while True:
            low = chain[-1]
            below = low.number - 1
            if view.hashes.get(below) == low.parent:
                return chain, below
            if below < 0 or block.number - below > self.history:
                return chain, None
            if view.tip is not None and below < view.tip - self.history:
                return chain, None
            start = max(0, below - FETCH_CHUNK + 1)
            fetched = await self._fetch(node, start, below)
            for got in reversed(fetched):
                if got.hash != chain[-1].parent:
                    raise FetchError(f"{node.key}'s blocks changed while being read")
                chain.append(got)
                if view.hashes.get(got.number - 1) == got.parent:
                    break
            else:
                if fetched[0].number > start:
                    return chain, None  # the node holds nothing lower

    async def _settle(self, pool: Pool, view: ChainView, node: Node, block: Block) -> None:
        """Link a node's head to the known chain (fetching its blocks below it), then adopt
        its chain or leave the node off it."""
        low = view.low
        if low is not None and block.number < low and await self._extend_down(pool, view, block):
            view.tips[node.key] = block
            if view.on_chain(block):
                return  # a node behind the first head seen: on the known chain
        chain, fork = await self._walk(view, node, block)
        previous = view.tips.get(node.key)
        view.tips[node.key] = block
        blocks = list(reversed(chain))
        if view.tip is None or fork == view.tip:
            view.extend(blocks)  # a gap filled (or the first blocks)
            return
        if any(b.hash in view.dropped for b in blocks):
            return  # the node is behind, on a fork a reorg already dropped
        moved = (
            previous is not None
            and view.hashes.get(previous.number) == previous.hash
            and (fork is None or previous.number > fork)
            and not any(b.hash == previous.hash for b in blocks)
        )
        if not (moved or block.number > view.tip):
            return  # lagging on another fork: no latest traffic until it links
        # Nothing in common within what is known: the node's blocks replace all of it.
        gone = view.replace_above(-1 if fork is None else fork, blocks)
        if gone:
            log.warning(
                "pool %s: reorg seen on node %s: %d known block(s) %s replaced, new head %d",
                view.pool_id,
                node.key,
                len(gone),
                "" if fork is None else f"above {fork}",
                block.number,
            )
            if self.on_dropped is not None:
                self.on_dropped(view.pool_id, gone)

    async def _fetch(self, node: Node, start: int, end: int) -> list[Block]:
        """The node's blocks from `end` down to `start` or to the lowest it holds (lowest
        first), linked by parent hash."""
        body = orjson.dumps(
            [
                {
                    "jsonrpc": "2.0",
                    "id": n,
                    "method": "eth_getBlockByNumber",
                    "params": [hex(n), False],
                }
                for n in range(start, end + 1)
            ]
        )
        raw = await self.upstream.send(node.entry.url, body, self.timeout)
        try:
            answers = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise FetchError(f"{node.key} answered headers with non-JSON") from None
        if not isinstance(answers, list):
            raise FetchError(f"{node.key} did not answer the header batch")
        by_id = {a.get("id"): a for a in answers if isinstance(a, dict)}
        blocks: list[Block] = []  # highest first
        for n in range(end, start - 1, -1):
            block = parse_block((by_id.get(n) or {}).get("result"))
            if block is None or block.number != n:
                break  # the node holds no lower block
            if blocks and blocks[-1].parent != block.hash:
                raise FetchError(f"{node.key}'s headers {n} and {n + 1} do not link")
            blocks.append(block)
        if not blocks:
            raise FetchError(f"{node.key} gave no header for block {end}")
        return blocks[::-1]

    # ---- the checker's confirmed head ----------------------------------------------------

    async def _poll_checkers(self) -> None:
        while True:
            await asyncio.gather(*(self.poll_checker(p, u) for p, u in self.checkers.items()))
            await asyncio.sleep(self.interval)

    async def poll_checker(self, pool_id: str, url: str) -> None:
        """Ask a checker for its confirmed head (`getLatestBlock`)."""
        body = b'{"jsonrpc":"2.0","id":1,"method":"getLatestBlock","params":[]}'
        try:
            answer = orjson.loads(await self.upstream.send(url, body, self.timeout))
            result = answer.get("result") if isinstance(answer, dict) else None
            if not isinstance(result, dict):
                why = answer.get("error") if isinstance(answer, dict) else answer
                raise FetchError(f"no confirmed block: {str(why)[:200]}")
            confirmed = (int(result["num"]), str(result["id"]).lower())
        except (UpstreamError, FetchError, orjson.JSONDecodeError, KeyError, ValueError) as exc:
            if self.checker_errors.get(pool_id) != str(exc):
                log.info("pool %s: checker %s: %s", pool_id, url, exc)
            self.checker_errors[pool_id] = str(exc)
            return
        self.checker_errors[pool_id] = None
        self.confirm(pool_id, *confirmed)

    def confirm(self, pool_id: str, height: int, block_hash: str) -> None:
        """The checker confirmed `block_hash` at `height` (`safe`/`finalized` resolve to it).
        The nodes' reports stay what the known chain follows: the checker trails them, so
        after a reorg it may still confirm a block the nodes have dropped until it notices."""
        view = self.view(pool_id)
        if view.confirmed != (height, block_hash):
            known = view.hashes.get(height)
            if known is not None and known != block_hash:
                log.info(
                    "pool %s: the checker confirms %s at %d; the nodes hold %s",
                    pool_id,
                    block_hash,
                    height,
                    known,
                )
        view.confirmed = (height, block_hash)

"""Follow a write node: poll its head, fetch missing `trace_vendorBlock`s in order, check
parent hashes, apply each block atomically, roll back on reorgs, back off on errors.

The source URL (`inproc://name` or `http://…`) can change at run time (the write pipeline
switched Leaders): ingest continues from the store's own head and the parent-hash check
tells whether the new source is on the same chain.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from chainstate.hexcodec import parse_quantity
from chainstate.inproc import InprocRegistry
from chainstate.jsonrpc import METHOD_NOT_FOUND, JsonRpcError
from chainstate.rpcclient import RpcClient, RpcUnavailable
from nodes.state.hot import HotState
from nodes.state.metrics import StateMetrics
from nodes.state.settings import StateSettings
from nodes.state.store import (
    ParentMismatch,
    ReorgTooDeep,
    StateStore,
    StoreError,
    block_writes,
)
from nodes.state.vendor import VendorBlock, VendorBlockError, parse_vendor_block

log = logging.getLogger(__name__)


class Ingest:
    """One ingest loop per state node; `run()` is its task."""

    def __init__(
        self,
        store: StateStore,
        settings: StateSettings,
        metrics: StateMetrics,
        *,
        registry: InprocRegistry | None = None,
        hot: HotState | None = None,
    ) -> None:
        self.store = store
        self.hot = hot
        self.settings = settings
        self.metrics = metrics
        self.registry = registry
        self.source: str | None = settings.source
        self.last_error: str | None = None
        self.failures = 0  # failed rounds in a row (0 after a round succeeds)
        # the next block to apply while it keeps failing (not the source's errors), and how
        # many rounds in a row it failed: the node is stalled on it at `stall_failures`
        self.stuck_at: int | None = None
        self.block_failures = 0
        self._failing_since = 0.0
        self.source_head: int | None = None
        self._client: RpcClient | None = None
        self._stale: list[RpcClient] = []
        self._wake = asyncio.Event()
        self._progress = asyncio.Event()
        self._chain_id_unsupported = False

    # control ---------------------------------------------------------------------------

    def set_source(self, url: str) -> None:
        """Follow another write node from now on (checked by parent hashes as usual)."""
        if not url.startswith(("inproc://", "http://", "https://")):
            raise ValueError(f"source must be an inproc://, http:// or https:// URL: {url!r}")
        if url == self.source:
            return
        log.info("state ingest: source %s → %s", self.source, url)
        self.source = url
        if self._client is not None:
            self._stale.append(self._client)
            self._client = None
        self._chain_id_unsupported = False
        self._wake.set()

    async def close(self) -> None:
        for client in [*self._stale, *([self._client] if self._client else [])]:
            await client.close()
        self._stale.clear()
        self._client = None

    async def wait_for_height(self, height: int, within: float) -> None:
        """Wait until the store's head reaches `height` (tests, start-up scripts)."""
        deadline = time.monotonic() + within
        while True:
            bounds = self.store.bounds()
            if bounds is not None and bounds[1] >= height:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"state node did not reach block {height} in {within}s")
            self._progress.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._progress.wait(), remaining)

    # loop ------------------------------------------------------------------------------

    async def run(self) -> None:
        backoff = self.settings.backoff_initial
        while True:
            try:
                progressed = await self.step()
            except Exception as exc:  # the loop must outlive any one failure
                self._failed(exc)
                await self._sleep(backoff)
                backoff = min(backoff * 2, self.settings.backoff_max)
                continue
            backoff = self.settings.backoff_initial
            self._recovered()
            if not progressed:
                await self._sleep(self.settings.poll_interval)

    @property
    def stalled(self) -> str | None:
        """Why the node cannot follow its source: the same block failed `stall_failures`
        rounds in a row (its source being unreachable is not a stall: the node still holds
        every block it had). Else None. `/health` then answers 503 with this reason, and the
        proxy takes the node out of rotation."""
        if self.block_failures < self.settings.stall_failures:
            return None
        return (
            f"ingest stalled: block {self.stuck_at} failed {self.block_failures} attempts in "
            f"a row, the last with {self.last_error}"
        )

    def _failed(self, exc: Exception) -> None:
        """Count a failed round; log it when it says something new, and once when the
        failures make the node stalled (not on every retry)."""
        if not isinstance(exc, RpcUnavailable | JsonRpcError | VendorBlockError | StoreError):
            log.exception("state ingest %s: unexpected failure", self.settings.key)
        kind = type(exc).__name__
        self.metrics.error(kind)
        error = f"{kind}: {exc}"
        self.failures += 1
        if self.failures == 1:
            self._failing_since = time.monotonic()
        on_block = isinstance(exc, VendorBlockError | StoreError)  # not its source's error
        if on_block:
            bounds = self.store.bounds()
            at = bounds[1] + 1 if bounds is not None else 0
            self.block_failures = self.block_failures + 1 if at == self.stuck_at else 1
            self.stuck_at = at
        level = logging.ERROR if isinstance(exc, ReorgTooDeep) else logging.WARNING
        if error == self.last_error:  # the same failure again: once is enough
            level = logging.DEBUG
        self.last_error = error
        log.log(level, "state ingest %s from %s failed: %s", self.settings.key, self.source, error)
        if on_block and self.block_failures == self.settings.stall_failures:
            log.error(
                "state node %s stalled: block %s failed %d ingest attempts in a row over "
                "%.0f s, the last with %s; /health answers 503 until ingest recovers",
                self.settings.key, self.stuck_at, self.block_failures,
                time.monotonic() - self._failing_since, error,
            )  # fmt: skip

    def _recovered(self) -> None:
        if self.stalled:
            log.warning(
                "state node %s: ingest recovered after %d failed attempts (the last: %s)",
                self.settings.key, self.failures, self.last_error,
            )  # fmt: skip
        self.failures, self.last_error = 0, None
        self.stuck_at, self.block_failures = None, 0

    async def _sleep(self, seconds: float) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    def _rpc(self) -> RpcClient | None:
        if self.source is None:
            return None
        if self._client is None:
            self._client = RpcClient(
                self.source, registry=self.registry, timeout=self.settings.request_timeout
            )
        return self._client

    async def step(self) -> bool:
        """One round: returns True when blocks were applied or rolled back."""
        for client in self._stale:
            await client.close()
        self._stale.clear()
        rpc = self._rpc()
        if rpc is None:
            return False
        await self._learn_chain_id(rpc)
        src_head = parse_quantity(await rpc.call("eth_blockNumber"), "source block number")
        self.source_head = src_head
        self.metrics.source_head.set(src_head)
        mine = self.store.head_hash()
        if mine is not None and src_head <= mine[0]:
            return await self._check_same_chain(rpc, src_head)
        start = 0 if mine is None else mine[0] + 1
        count = min(self.settings.fetch_concurrency, src_head - start + 1)
        blocks = await asyncio.gather(*(self._fetch(rpc, h) for h in range(start, start + count)))
        for block in blocks:
            try:
                await self._apply(block)
            except ParentMismatch as exc:
                log.info("state ingest: reorg at block %d: %s", block.number, exc)
                await self._reorg(rpc, src_head)
                return True
        return True

    async def _check_same_chain(self, rpc: RpcClient, src_head: int) -> bool:
        """Caught up (or the source is behind): make sure the source still has our block at
        its head height; if not, it reorganised, so roll back below that height."""
        ours = self.store.hash_at(src_head)
        if ours is None:
            return False  # below our window: nothing to compare
        raw = await rpc.call("trace_vendorBlock", [hex(src_head)])
        if _header_hash(raw) == ours:
            return False  # the common idle round: no parse, no hash check, no thread
        theirs = await self._parsed(raw, src_head)  # (a bad block still raises here)
        if theirs.hash == ours:
            return False
        log.info("state ingest: source replaced block %d (reorg)", src_head)
        await self._reorg(rpc, src_head)
        return True

    async def _reorg(self, rpc: RpcClient, src_head: int) -> None:
        """The source replaced blocks this node holds: find the fork point (the highest
        height whose block the source still has), fetch the source's blocks above it (up to
        this node's head at least, where the source has them) and replace this node's blocks
        with them in one store transaction. Readers see the old chain or the new one, never
        the fork point between: a reorg to a chain as long does not lower the node's head,
        so a proxy that answered `latest` at that height finds it held while the node
        reorganises. Nothing changes when a step fails (the next round tries again)."""
        mine = self.store.head_hash()
        bounds = self.store.bounds()
        if mine is None or bounds is None:
            return
        head = mine[0]
        fork = min(head, src_head)
        while True:
            ours = self.store.hash_at(fork) if fork >= bounds[0] else None
            if ours is None:
                raise ReorgTooDeep(
                    f"the source replaced block {bounds[0]}, this node's earliest block (a "
                    f"`{self.store.kind}` node keeps "
                    f"{self.store.window if self.store.kind == 'state' else 'all'} blocks)"
                )
            if _header_hash(await rpc.call("trace_vendorBlock", [hex(fork)])) == ours:
                break
            fork -= 1
        top = min(src_head, max(head, fork + self.settings.fetch_concurrency))
        blocks = await asyncio.gather(*(self._fetch(rpc, h) for h in range(fork + 1, top + 1)))
        if self.hot is not None:  # (above the fork point, reads go to the store meanwhile)
            for height in range(head, fork, -1):
                self.hot.rolled_back(height)
        verify_pre = self.settings.verify_pre
        await asyncio.to_thread(self.store.replace, head - fork, blocks, verify_pre=verify_pre)
        if self.hot is not None:
            earliest = self.store.bounds()
            for block in blocks:
                self.hot.applied(block.number, block_writes(block), earliest[0] if earliest else 0)
        self.metrics.rollbacks.inc(head - fork)
        self.metrics.applied.inc(len(blocks))
        self.publish_metrics()

    async def _fetch(self, rpc: RpcClient, height: int) -> VendorBlock:
        return await self._parsed(await rpc.call("trace_vendorBlock", [hex(height)]), height)

    async def _parsed(self, raw: Any, height: int) -> VendorBlock:
        """`raw` (a `trace_vendorBlock` result for `height`) decoded and checked."""
        block = await asyncio.to_thread(
            parse_vendor_block, raw, verify_hash=self.settings.verify_hash
        )
        if block.number != height:
            raise VendorBlockError(f"asked for block {height}, the source sent {block.number}")
        return block

    async def _apply(self, block: VendorBlock) -> None:
        started = time.perf_counter()
        await asyncio.to_thread(self.store.apply, block, verify_pre=self.settings.verify_pre)
        if self.hot is not None:  # after the commit, in the loop: reads see whole blocks
            bounds = self.store.bounds()
            self.hot.applied(block.number, block_writes(block), bounds[0] if bounds else 0)
        self.metrics.apply_seconds.observe(time.perf_counter() - started)
        self.metrics.applied.inc()
        self.publish_metrics()

    async def _rollback(self) -> None:
        """Remove the head block (a rollback by hand; ingest replaces reorganised blocks in
        one step, `_reorg`)."""
        new_head = await asyncio.to_thread(self.store.rollback)
        if self.hot is not None:
            self.hot.rolled_back(new_head + 1)
        self.metrics.rollbacks.inc()
        self.publish_metrics()

    async def fill_hot(self) -> None:
        """Fill the hot view from the store's newest blocks (a restarted node starts with
        them in memory, as if it had ingested them)."""
        hot, bounds = self.hot, self.store.bounds()
        if hot is None or bounds is None or hot.blocks == 0:
            return
        earliest, head = bounds
        for height in range(max(earliest + 1, head - hot.blocks + 1), head + 1):
            writes = await asyncio.to_thread(self.store.written_at, height)
            if self.store.bounds() != bounds:  # ingest moved meanwhile: it fills the view
                return
            hot.applied(height, writes, earliest)

    def publish_metrics(self) -> None:
        """Update the head/earliest gauges and wake `wait_for_height` callers."""
        bounds = self.store.bounds()
        if bounds is not None:
            self.metrics.earliest.set(bounds[0])
            self.metrics.head.set(bounds[1])
        self._progress.set()

    async def _learn_chain_id(self, rpc: RpcClient) -> None:
        """Ask the source for the chain id once, when neither config nor store has it."""
        if self._chain_id_unsupported or self.store.chain_id() is not None:
            return
        try:
            answer: Any = await rpc.call("eth_chainId")
        except JsonRpcError as exc:
            if exc.code != METHOD_NOT_FOUND:
                raise
            self._chain_id_unsupported = True
            log.warning("state ingest: source %s has no eth_chainId; set chain_id", self.source)
            return
        await asyncio.to_thread(self.store.set_chain_id, parse_quantity(answer, "chain id"))


def _header_hash(raw: Any) -> Any:
    """The `Header.hash` a `trace_vendorBlock` result claims, or None: enough to see that the
    source still has our block (a different or missing one is parsed and checked in full)."""
    header = raw.get("Header") if type(raw) is dict else None
    return header.get("hash") if type(header) is dict else None

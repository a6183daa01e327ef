"""Filling in, newest first, what a store did not keep for the blocks it held before a version
that keeps it (the log index, block bodies): each block is fetched again from the node's
source and must have the stored block's hash, then written in a transaction of the store
that checks it is still the block just below what is filled.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import lmdb

from chainstate.jsonrpc import JsonRpcError
from chainstate.rpcclient import RpcClient, RpcUnavailable
from nodes.state.store import StoreError
from nodes.state.vendor import VendorBlock, VendorBlockError, parse_vendor_block

log = logging.getLogger(__name__)

PROGRESS_EVERY = 10.0  # seconds between progress lines


class Backfill:
    """The loop; a subclass says what is left (`_todo`) and writes one block (`_fill`)."""

    what = "backfill"

    def __init__(self, node: Any) -> None:
        self.node = node
        self.done = False
        self._client: RpcClient | None = None
        self._source: str | None = None
        self._old: list[RpcClient] = []  # clients of earlier sources, closed at the end

    def _todo(self) -> tuple[int, int] | None:
        """(lowest height left, height to fill next), or None when complete."""
        raise NotImplementedError

    def needed(self) -> bool:
        return self._todo() is not None

    def _fill(self, txn: lmdb.Transaction, block: VendorBlock) -> bool:
        """Write `block` in `txn`; False (nothing written) when it is no longer next."""
        raise NotImplementedError

    async def run(self) -> None:
        settings = self.node.settings
        backoff = settings.backoff_initial
        shown = time.monotonic()
        while (todo := self._todo()) is not None:
            earliest, height = todo
            try:
                count = min(settings.fetch_concurrency, height - earliest + 1)
                heights = range(height, height - count, -1)
                blocks = await asyncio.gather(*(self._fetch(h) for h in heights))
                for block in blocks:
                    await asyncio.to_thread(self._write, block)
            except (RpcUnavailable, JsonRpcError, VendorBlockError, StoreError) as exc:
                log.warning("%s at block %d: %s", self.what, height, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, settings.backoff_max)
                continue
            backoff = settings.backoff_initial
            if time.monotonic() - shown > PROGRESS_EVERY:
                shown = time.monotonic()
                log.info("%s: %d blocks left", self.what, height - count - earliest + 1)
        self.done = True
        log.info("%s: complete", self.what)

    async def _fetch(self, height: int) -> VendorBlock:
        client = self._rpc()
        raw = await client.call("trace_vendorBlock", [hex(height)])
        block = await asyncio.to_thread(parse_vendor_block, raw)
        stored = self.node.store.hash_at(height)
        if block.number != height or block.hash != stored:
            raise VendorBlockError(
                f"the source's block {height} is {block.hash}, this node holds {stored}"
            )
        return block

    def _write(self, block: VendorBlock) -> None:
        def write(txn: lmdb.Transaction) -> None:
            if not self._fill(txn, block):
                raise StoreError(f"block {block.number} is no longer next to fill (reorg)")

        self.node.store.write(write)

    def _rpc(self) -> RpcClient:
        source = self.node.ingest.source
        if source is None:
            raise RpcUnavailable("the node has no source to fetch old blocks from")
        if self._client is None or source != self._source:
            if self._client is not None:
                self._old.append(self._client)
            self._client = RpcClient(
                source, registry=self.node.registry, timeout=self.node.settings.request_timeout
            )
            self._source = source
        return self._client

    async def close(self) -> None:
        for client in [*self._old, *([self._client] if self._client else [])]:
            await client.close()
        self._old.clear()
        self._client = None


class BodyBackfill(Backfill):
    """The bodies of the blocks a store held before it kept bodies (below `bodies_from`)."""

    what = "block body backfill"

    def _todo(self) -> tuple[int, int] | None:
        with self.node.store.bodies() as bodies:
            bounds, start = bodies.bounds, bodies.bodies_from
        if bounds is None or start <= bounds[0]:
            return None
        return bounds[0], start - 1

    def _fill(self, txn: lmdb.Transaction, block: VendorBlock) -> bool:
        return self.node.store.backfilled_body(txn, block)

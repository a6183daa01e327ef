"""The worker pool of Function runs: bounds concurrent runs, hands each one a sandbox uid of
its own, and measures how long each waited for a slot."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from workspace.compute.sandbox.uids import UidPool


class QueueFull(Exception):
    """More runs are waiting than the pool's queue allows."""


class WorkerPool:
    """`workers` runs at once, at most `max_queue` waiting; each run gets its own uid."""

    def __init__(self, workers: int, max_queue: int, uids: UidPool) -> None:
        self.workers = workers
        self.max_queue = max_queue
        self._sem = asyncio.Semaphore(workers)
        self._uids = uids
        self.waiting = 0
        self.running = 0

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[tuple[int, int]]:
        """Yield (uid, queue_wait_ms); raise QueueFull when too many are waiting."""
        if self._sem.locked() and self.waiting >= self.max_queue:
            raise QueueFull(f"{self.waiting} runs already waiting for a worker")
        t0 = time.monotonic()
        self.waiting += 1
        try:
            await self._sem.acquire()
        finally:
            self.waiting -= 1
        wait_ms = int((time.monotonic() - t0) * 1000)
        uid = self._uids.acquire()
        self.running += 1
        try:
            yield uid, wait_ms
        finally:
            self.running -= 1
            self._uids.release(uid)
            self._sem.release()

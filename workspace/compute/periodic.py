"""A background step repeated on an interval (the scheduler's tick, retention's sweep), with an
explicit start/close and a loop that survives a failing step (logged, tried again next time)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from chainstate.tasks import stop_task

log = logging.getLogger("workspace.compute")


class Periodic:
    """Runs `step()` every `interval` seconds between `start()` and `close()`; `first`: run it
    once at start too, before the first wait."""

    def __init__(
        self, step: Callable[[], Awaitable[Any]], interval: float, what: str, first: bool = False
    ) -> None:
        self.step = step
        self.interval = interval
        self.what = what
        self.first = first
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def close(self) -> None:
        await stop_task(self._task)
        self._task = None

    async def _loop(self) -> None:
        if not self.first:
            await asyncio.sleep(self.interval)
        while True:
            try:
                await self.step()
            except Exception:  # the loop must survive a store hiccup
                log.exception(f"{self.what} failed")
            await asyncio.sleep(self.interval)

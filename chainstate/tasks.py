"""Background tasks' lifecycle: one way to stop one."""

from __future__ import annotations

import asyncio
import contextlib


async def stop_task(task: asyncio.Task[None] | None) -> None:
    """Cancel `task` (None: nothing to do) and wait until it has finished, so that a close()
    returns only once the task no longer touches what is being closed."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task

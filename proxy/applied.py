"""The config store revision a follower of the store has applied, and who waits for one.

An admin call writes to the store and answers once its change has come back through the
store's watch and been applied (`wait_applied`), so every follower of the same store — this
proxy's and the others' — goes through one path. Both followers (the routing state and the
tenancy registry) keep their applied revision here.
"""

from __future__ import annotations

import asyncio


class AppliedRevision:
    """The highest revision applied so far, and futures waiting for a revision."""

    def __init__(self) -> None:
        self.revision = 0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    def advance(self, revision: int) -> None:
        """`revision` applied: wake whoever waits for it or an older one."""
        self.revision = max(self.revision, revision)
        still = []
        for wanted, fut in self._waiters:
            if wanted <= self.revision:
                if not fut.done():
                    fut.set_result(None)
            else:
                still.append((wanted, fut))
        self._waiters = still

    async def wait(self, revision: int, within: float) -> bool:
        """True once the change at `revision` has been applied (False after `within` s)."""
        if self.revision >= revision:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((revision, fut))
        try:
            await asyncio.wait_for(fut, within)
        except TimeoutError:
            return False
        return True

"""Follow the write pipeline's Leader: poll the proxy's admin `GET /{chain}/writers/leader`
and point ingest at the Leader's URL whenever it changes (`switchLeader`).

Optional (`leader_from`); without it the node follows its configured `source`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import aiohttp

from nodes.state.ingest import Ingest

log = logging.getLogger(__name__)


class LeaderWatch:
    def __init__(
        self,
        url: str,
        ingest: Ingest,
        *,
        interval: float,
        timeout: float,
        token_env: str | None = None,
    ) -> None:
        self.url = url
        self.ingest = ingest
        self.interval = interval
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self.token_env = token_env
        self.last_error: str | None = None

    def _headers(self) -> dict[str, str]:
        token = os.environ.get(self.token_env) if self.token_env else None
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def run(self) -> None:
        async with aiohttp.ClientSession(timeout=self.timeout) as session:
            while True:
                await self.check(session)
                await asyncio.sleep(self.interval)

    async def check(self, session: aiohttp.ClientSession) -> None:
        """One poll: switch the ingest source when the Leader's URL changed."""
        try:
            async with session.get(self.url, headers=self._headers()) as resp:
                doc: Any = await resp.json(content_type=None)
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}: {doc}")
            url = doc["leader"]["url"]
            if not isinstance(url, str):
                raise TypeError("leader.url is not a string")
            if url != self.ingest.source:
                self.ingest.set_source(url)
                log.warning("state node: following the new Leader write node at %s", url)
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            if self.last_error is None:  # at start-up the proxy may not listen yet
                log.info("state node: leader lookup at %s failed: %s", self.url, exc)
            self.last_error = f"{type(exc).__name__}: {exc}"
            return
        self.last_error = None

"""Follow the write pipeline's Leader: poll the proxy's admin `GET /{chain}/writers/leader`
and point ingest at the Leader's URL whenever it changes (`switchLeader`).

Optional (`leader_from`); without it the node follows its configured `source`. A Leader
registered as `inproc://name` can only be followed from inside the proxy's process: a node
elsewhere keeps its source and reports why in `leader_error`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import aiohttp

from chainstate.inproc import is_inproc
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
            self._check_reachable(doc["leader"].get("key"), url)
            if url != self.ingest.source:
                self.ingest.set_source(url)
                log.warning("state node: following the new Leader write node at %s", url)
        except LeaderUnreachable as exc:
            if self.last_error != str(exc):
                log.warning("state node: %s", exc)
            self.last_error = str(exc)
            return
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            if self.last_error is None:  # at start-up the proxy may not listen yet
                log.info("state node: leader lookup at %s failed: %s", self.url, exc)
            self.last_error = f"{type(exc).__name__}: {exc}"
            return
        self.last_error = None

    def _check_reachable(self, key: Any, url: str) -> None:
        """An in-process name is only reachable when it lives in this process."""
        if not is_inproc(url):
            return
        registry = self.ingest.registry
        if registry is not None and registry.resolve(url) is not None:
            return
        raise LeaderUnreachable(
            f"the Leader write node {key} is registered as {url}, a name inside the "
            f"proxy's process; this node keeps ingesting from {self.ingest.source}. Register "
            "the writers with http:// URLs (addWriter) to follow Leader switches from here"
        )


class LeaderUnreachable(Exception):
    """The proxy names a Leader this node cannot reach."""

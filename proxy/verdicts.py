"""Lying replicas: the consistency checker's verdicts take diverged nodes out of rotation.

A state replica that applied a wrong block (a corrupted StateDiff carrying a ValidationHash
computed over it) answers wrong values from that block on, and no health poll can tell. The
consistency checker can: it compares the replicas' validation hashes and, at every height a
quorum confirms, flags a replica that held another block or hash there, until it holds the
confirmed block at that height again (nodes/checker, `checker_status`).

For each `[[proxy.checkers]]` entry (a pool id and the checker's URL) the proxy reads
`checker_status` every `checker_poll_interval` seconds and marks the pool's nodes whose URL is
a flagged replica as diverged: they get no traffic (proxy/select.py) until the checker clears
them, unless the node's entry sets `ignore_checker` (the operator's override, through
`updateNode`). One log line per change. While a checker does not answer, its last verdicts
stand (a liar stays out; one warning per outage). Without a quorum the checker flags nobody
(it cannot tell who is wrong): the dispute is shown in `getAllNodes` for the operator.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson

from chainstate.tasks import stop_task
from proxy.model import Node, Pool
from proxy.settings import CheckerSource
from proxy.upstream import Upstream, UpstreamError

log = logging.getLogger(__name__)
STATUS_BODY = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "checker_status", "params": []})


def same_url(url: str) -> str:
    """A URL as compared between the checker's replica list and the pool's nodes."""
    return url.rstrip("/").lower()


class CheckerVerdicts:
    def __init__(
        self,
        sources: tuple[CheckerSource, ...],
        pools: Callable[[], dict[str, Pool]],
        upstream: Upstream,
        interval: float,
        timeout: float,
        on_flagged: Callable[[str], Any] | None = None,
    ) -> None:
        self.sources = sources
        # Called with the pool id when a node of it is newly flagged: the response cache
        # forgets the pool's answers, which may be the flagged node's (proxy/reads.py).
        self.on_flagged = on_flagged
        self._pools = pools
        self.upstream = upstream
        self.interval = interval
        self.timeout = timeout
        self.reports: dict[str, dict[str, Any]] = {}  # pool id → what the checker said last
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.sources:
            self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        await stop_task(self._task)
        self._task = None

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.poll_once()
            except Exception:
                log.exception("checker verdicts: poll failed")
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    async def poll_once(self) -> None:
        await asyncio.gather(*(self._poll(source) for source in self.sources))

    async def _poll(self, source: CheckerSource) -> None:
        report = self.reports.setdefault(source.chain, {"checker": source.url, "error": None})
        try:
            status = await self._status(source)
        except (UpstreamError, ValueError) as exc:
            if report.get("error") is None:
                log.warning(
                    "checker %s for pool %s does not answer (%s): its last verdicts stand",
                    source.url,
                    source.chain,
                    exc,
                )
            report["error"] = str(exc)[:300]
            return
        if report.get("error") is not None:
            log.warning("checker %s for pool %s answers again", source.url, source.chain)
        report.update(
            error=None,
            confirmed=status.get("confirmed"),
            disputed=status.get("disputed"),
            at=round(time.time(), 3),
        )
        pool = self._pools().get(source.chain)
        if pool is not None:
            pool.verdicts = report
            self.apply(pool, source.url, status.get("replicas") or [])

    async def _status(self, source: CheckerSource) -> dict[str, Any]:
        raw = await self.upstream.send(source.url, STATUS_BODY, self.timeout)
        answer = orjson.loads(raw)
        result = answer.get("result") if isinstance(answer, dict) else None
        if not isinstance(result, dict):
            error = answer.get("error") if isinstance(answer, dict) else None
            raise ValueError(f"checker_status gave no status: {error or answer!r}"[:300])
        return result

    def apply(self, pool: Pool, checker: str, replicas: list[Any]) -> None:
        """Mark the pool's nodes the checker flags, clear the others it reports on."""
        flagged: dict[str, int | None] = {}
        for replica in replicas:
            if isinstance(replica, dict) and isinstance(replica.get("replica"), str):
                height = replica.get("diverged_at")
                flagged[same_url(replica["replica"])] = height if isinstance(height, int) else None
        for node in pool.readers:
            url = same_url(node.entry.url)
            if url in flagged:
                before = node.diverged
                self._judge(node, flagged[url], checker)
                if node.diverged is not None and node.diverged is not before and self.on_flagged:
                    self.on_flagged(pool.id)

    @staticmethod
    def _judge(node: Node, height: int | None, checker: str) -> None:
        before = node.diverged
        if height is None:
            if before is not None:
                node.diverged = None
                node.update_blocked()
                log.warning(
                    "node %s: the checker no longer flags it as diverged: back in rotation",
                    node.key,
                )
            return
        if before is not None and before.get("height") == height:
            return
        node.diverged = {"height": height, "checker": checker}
        node.update_blocked()
        if node.entry.ignore_checker:
            what = "still routed: its entry sets ignore_checker"
        else:
            what = (
                "no traffic until it holds the confirmed block there again "
                "(override: updateNode with ignore_checker)"
            )
        log.warning(
            "node %s: the checker %s flags it as diverged at height %d; %s",
            node.key,
            checker,
            height,
            what,
        )

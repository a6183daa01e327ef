"""Polls the state replicas and confirms each height that a quorum of them agree on."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from chainstate.jsonrpc import JsonRpcError
from chainstate.rpcclient import RpcClient, RpcUnavailable
from nodes.checker.confirm import Vote, decide, disagreement
from nodes.checker.ledger import BlockRecord, Ledger
from nodes.checker.settings import CheckerSettings

log = logging.getLogger("chainstate.checker")


class CheckerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.replica_height = Gauge(
            "checker_replica_height",
            "Latest height a replica reports",
            ["replica"],
            registry=registry,
        )
        self.replica_up = Gauge(
            "checker_replica_up",
            "1 when the replica answered the last poll",
            ["replica"],
            registry=registry,
        )
        self.replica_diverged = Gauge(
            "checker_replica_diverged",
            "1 when the replica held another block or validation hash than the quorum at a "
            "height confirmed in the latest round that confirmed any",
            ["replica"],
            registry=registry,
        )
        self.replica_disagreements = Counter(
            "checker_replica_disagreements",
            "Confirmed heights at which the replica held another block or validation hash",
            ["replica"],
            registry=registry,
        )
        self.disputed_height = Gauge(
            "checker_disputed_height",
            "Height where replicas disagree and no quorum agrees (-1: none); confirmation "
            "waits there",
            registry=registry,
        )
        self.disputed_height.set(-1)
        self.confirmed_height = Gauge(
            "checker_confirmed_height", "Latest confirmed height", registry=registry
        )
        self.lag = Gauge(
            "checker_confirmation_lag_blocks",
            "Highest replica height minus the confirmed height",
            registry=registry,
        )
        self.disagreements = Counter(
            "checker_disagreements",
            "Heights where replicas held different blocks or hashes",
            registry=registry,
        )
        self.reorgs = Counter(
            "checker_reorgs", "Confirmed blocks later demoted to forks", registry=registry
        )
        self.replica_diverged_at = Gauge(
            "checker_replica_diverged_at",
            "The lowest confirmed height at which the replica held another block or "
            "validation hash, until it holds the confirmed one there again (-1: none)",
            ["replica"],
            registry=registry,
        )


class Poller:
    def __init__(
        self,
        settings: CheckerSettings,
        ledger: Ledger,
        clients: dict[str, RpcClient],
        metrics: CheckerMetrics,
    ) -> None:
        self.settings = settings
        self.ledger = ledger
        self.clients = clients
        self.metrics = metrics
        self._counted: dict[int, set[str]] = {}
        # The height confirmation waits at because replicas disagree, and what each holds:
        # shown by GET /health and the checker_disputed_height gauge.
        self.dispute: dict[str, Any] | None = None
        # What each replica reported last round: up, latest height (checker_status).
        self.replicas: dict[str, dict[str, Any]] = {
            r: {"up": None, "latest": None} for r in clients
        }
        self._round = asyncio.Lock()  # one round at a time (the loop, and callers of poll_once)
        for replica in clients:
            metrics.replica_diverged_at.labels(replica).set(-1)
        for replica, height in ledger.diverged().items():
            metrics.replica_diverged_at.labels(replica).set(height)

    async def run(self) -> None:
        while True:
            try:
                await self.poll_once()
            except Exception:
                log.exception("checker: polling round failed")
            await asyncio.sleep(self.settings.poll_interval)

    async def poll_once(self) -> int:
        """One round; returns how many heights were confirmed."""
        async with self._round:
            return await self._round_once()

    async def _round_once(self) -> int:
        ranges = await self._ranges()
        quorum = self.settings.effective_quorum
        if len(ranges) < quorum:
            return 0
        top = sorted((latest for _, latest in ranges.values()), reverse=True)[quorum - 1]
        await self._unwind(ranges, top, quorum)
        await self._recheck_diverged(ranges)
        start = self._next_height(ranges, quorum)
        confirmed = 0
        if start <= top:
            count = min(self.settings.batch, top - start + 1)
            views = await asyncio.gather(*(self._votes(r, start, count) for r in ranges))
            confirmed = self._confirm_range(start, count, views, quorum)
        self._update_lag(ranges)
        return confirmed

    async def _unwind(self, ranges: dict[str, tuple[int, int]], top: int, quorum: int) -> None:
        """A reorg below the confirmed head (a write node rolled back and the replicas with
        it): when a quorum holds another block at the highest confirmed height they have,
        walk down to the block they still share and mark every confirmed block above it
        `is_fork` in one go. Replicas that are only behind hold the same blocks: no change."""
        latest = self.ledger.latest()
        if latest is None:
            return
        height = min(latest.num, top)
        while height >= 0:
            record = self.ledger.at_height(height)
            if record is None:
                break
            views = await asyncio.gather(*(self._votes(r, height, 1) for r in ranges))
            votes = [view[height] for view in views if height in view]
            winner = decide(votes, quorum, len(self.clients)).winner
            if winner is None or winner.id == record.id:
                break
            height -= 1
        if height >= min(latest.num, top):
            return
        demoted = self.ledger.demote_above(height)
        self.metrics.reorgs.inc(demoted)
        log.warning(
            "checker: reorg: the replicas no longer hold the confirmed blocks above %d; "
            "%d blocks marked is_fork",
            height,
            demoted,
        )

    def _confirm_range(
        self, start: int, count: int, views: list[dict[int, Vote]], quorum: int
    ) -> int:
        odd: set[str] = set()  # replicas that disagreed with a height confirmed this round
        done = count
        for height in range(start, start + count):
            votes = [view[height] for view in views if height in view]
            decision = decide(votes, quorum, len(self.clients))
            self._report_disagreement(height, votes)
            if decision.winner is None:
                self._set_dispute(height, votes if disagreement(votes) else None)
                done = height - start
                break
            prev = self.ledger.at_height(height - 1)
            if prev is not None and decision.winner.parent_id != prev.id:
                log.warning("checker: reorg below %d, demoting confirmed block %s", height, prev.id)
                self.ledger.demote(height - 1)
                self.metrics.reorgs.inc()
                done = height - start
                break
            forks = [self._record(v, fork=True) for v in decision.losers]
            self.ledger.confirm(self._record(decision.winner, fork=False), forks)
            self.metrics.confirmed_height.set(height)
            self._set_dispute(height, None)
            against = {*decision.diverged, *(v.replica for v in decision.losers)}
            for replica in against:
                self.metrics.replica_disagreements.labels(replica).inc()
                self._mark_diverged(replica, height)
            odd |= against
        if done:
            for replica in self.clients:
                self.metrics.replica_diverged.labels(replica).set(1 if replica in odd else 0)
        return done

    def _mark_diverged(self, replica: str, height: int) -> None:
        if self.ledger.mark_diverged(replica, height):
            log.warning(
                "checker: replica %s diverged at confirmed height %d: it holds another block "
                "or validation hash than the quorum (flagged until it holds the confirmed one)",
                replica,
                height,
            )
        self.metrics.replica_diverged_at.labels(replica).set(self.ledger.diverged()[replica])

    async def _recheck_diverged(self, ranges: dict[str, tuple[int, int]]) -> None:
        """A flagged replica that holds the confirmed block at the height it diverged at
        again (it was resynced, or it reorganised onto the canonical chain) is cleared."""
        for replica, height in self.ledger.diverged().items():
            held = ranges.get(replica)
            if held is None or not held[0] <= height <= held[1]:
                continue
            record = self.ledger.at_height(height)
            vote = (await self._votes(replica, height, 1)).get(height)
            if record is None or vote is None:
                continue
            if vote.id == record.id and vote.validation_hash == record.validation_hash:
                self.ledger.clear_diverged(replica)
                self.metrics.replica_diverged_at.labels(replica).set(-1)
                log.warning(
                    "checker: replica %s holds the confirmed block at height %d again: "
                    "no longer flagged as diverged",
                    replica,
                    height,
                )

    def status(self) -> dict[str, Any]:
        """What the proxy reads (`checker_status`): the confirmed height, the dispute
        confirmation waits at, and per replica whether it answers and where it diverged."""
        latest = self.ledger.latest()
        diverged = self.ledger.diverged()
        return {
            "confirmed": latest.num if latest else None,
            "disputed": self.dispute,
            "replicas": [
                {"replica": r, **self.replicas[r], "diverged_at": diverged.get(r)}
                for r in self.clients
            ],
        }

    def _set_dispute(self, height: int, votes: list[Vote] | None) -> None:
        """Record (or clear, with None) the disagreement confirmation waits at."""
        if votes is None:
            if self.dispute is not None and self.dispute["height"] <= height:
                self.dispute = None
                self.metrics.disputed_height.set(-1)
            return
        held = [
            {"replica": v.replica, "id": v.id, "validation_hash": v.validation_hash} for v in votes
        ]
        self.dispute = {"height": height, "votes": held}
        self.metrics.disputed_height.set(height)

    @staticmethod
    def _record(vote: Vote, fork: bool) -> BlockRecord:
        return BlockRecord(vote.id, vote.height, vote.validation_hash, fork)

    def _report_disagreement(self, height: int, votes: list[Vote]) -> None:
        if not disagreement(votes):
            return
        seen = self._counted.setdefault(height, set())
        key = {f"{v.replica}={v.id}/{v.validation_hash}" for v in votes}
        if key <= seen:
            return
        seen |= key
        if len(self._counted) > 1000:
            self._counted.pop(min(self._counted))
        self.metrics.disagreements.inc()
        log.warning(
            "checker: replicas disagree at height %d",
            height,
            extra={"votes": [[v.replica, v.id, v.validation_hash] for v in votes]},
        )

    def _next_height(self, ranges: dict[str, tuple[int, int]], quorum: int) -> int:
        latest = self.ledger.latest()
        if latest is not None:
            return latest.num + 1
        if self.settings.start_height is not None:
            return self.settings.start_height
        return sorted(earliest for earliest, _ in ranges.values())[quorum - 1]

    def _update_lag(self, ranges: dict[str, tuple[int, int]]) -> None:
        latest = self.ledger.latest()
        head = max(latest for _, latest in ranges.values())
        self.metrics.lag.set(head - (latest.num if latest else -1))

    async def _ranges(self) -> dict[str, tuple[int, int]]:
        results = await asyncio.gather(*(self._range(r) for r in self.clients))
        return {r: rg for r, rg in zip(self.clients, results, strict=True) if rg is not None}

    async def _range(self, replica: str) -> tuple[int, int] | None:
        try:
            got: Any = await self.clients[replica].call("blockx_range")
            earliest, latest = int(got["earliest"]), int(got["latest"])
        except (RpcUnavailable, JsonRpcError, KeyError, TypeError, ValueError) as exc:
            self.metrics.replica_up.labels(replica).set(0)
            self.replicas[replica]["up"] = False
            log.info("checker: replica %s unavailable: %s", replica, exc)
            return None
        self.metrics.replica_up.labels(replica).set(1)
        self.metrics.replica_height.labels(replica).set(latest)
        self.replicas[replica].update(up=True, latest=latest)
        return earliest, latest

    async def _votes(self, replica: str, start: int, count: int) -> dict[int, Vote]:
        try:
            items = await self.clients[replica].call("blockx_getValidation", [start, count])
            return {
                int(it["height"]): Vote(
                    replica, int(it["height"]), it["id"], it["parent_id"], it["validation_hash"]
                )
                for it in items
            }
        except (RpcUnavailable, JsonRpcError, KeyError, TypeError, ValueError) as exc:
            log.info("checker: replica %s: blockx_getValidation failed: %s", replica, exc)
            return {}

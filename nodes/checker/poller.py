"""Polls the state replicas and confirms each height that a quorum of them agree on."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from chainstate.jsonrpc import JsonRpcError
from chainstate.rpcclient import RpcClient, RpcUnavailable
from nodes.checker.confirm import Decision, Vote, decide, disagreement
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
        self.bridged = Counter(
            "checker_bridged_heights",
            "Heights confirmed by descent: fewer than a quorum of replicas still held them; "
            "those that did agreed, and their blocks link a quorum-confirmed block down to "
            "the confirmed head",
            registry=registry,
        )
        self.skipped = Counter(
            "checker_skipped_heights",
            "Heights skipped: no replica held them any more when the checker reached them",
            registry=registry,
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
        if start <= top and self._stranded(ranges, start, quorum):
            confirmed = await self._bridge(ranges, start, quorum)
            start = self._next_height(ranges, quorum) if confirmed else top + 1
        if start <= top:
            count = min(self.settings.batch, top - start + 1)
            views = await asyncio.gather(*(self._votes(r, start, count) for r in ranges))
            confirmed += self._confirm_range(start, count, views, quorum)
        self._update_lag(ranges)
        return confirmed

    def _stranded(self, ranges: dict[str, tuple[int, int]], height: int, quorum: int) -> bool:
        """Fewer than a quorum of the replicas can ever vote at `height` again: the others
        answer and hold only later heights (a `state` replica's window moved past it; a
        replica never gets a pruned height back)."""
        pruned = sum(1 for earliest, _ in ranges.values() if earliest > height)
        return len(self.clients) - pruned < quorum

    async def _bridge(self, ranges: dict[str, tuple[int, int]], start: int, quorum: int) -> int:
        """Confirmation past heights a quorum no longer holds (docs/checker.md, "Heights a
        quorum no longer holds"): the lowest height a quorum holds (the anchor) is confirmed
        by a quorum as any height; each height below it down to `start` is confirmed by
        descent when the replicas that still hold it agree on the block the height above
        names as its parent; heights no replica holds any more are skipped (recorded, never
        confirmed). All or nothing, in one round: nothing is confirmed while a replica that
        may hold a height lags or does not answer, or while the holders disagree (a dispute,
        as at any height). Returns how many heights were confirmed."""
        anchor = sorted(earliest for earliest, _ in ranges.values())[quorum - 1]
        views = await asyncio.gather(*(self._votes(r, anchor, 1) for r in ranges))
        votes = [view[anchor] for view in views if anchor in view]
        self._report_disagreement(anchor, votes)
        top = decide(votes, quorum, len(self.clients))
        if top.winner is None:
            self._set_dispute(anchor, votes if disagreement(votes) else None)
            return 0
        lowest = min(earliest for earliest, _ in ranges.values())
        if lowest > start and len(ranges) < len(self.clients):
            return 0  # a replica that does not answer now may hold the heights below `lowest`
        floor = max(start, lowest)  # start..floor-1: no replica holds them any more
        held = await self._held(ranges, floor, anchor)
        if held is None:
            return 0  # a holder did not answer: next round
        accepted = [(anchor, top)]
        expected = top.winner.parent_id
        for height in range(anchor - 1, floor - 1, -1):
            decision = self._by_descent(height, held.get(height, []), expected)
            if decision is None:
                return 0
            accepted.append((height, decision))
            expected = decision.winner.parent_id  # type: ignore[union-attr]
        below = self.ledger.at_height(floor - 1) if floor == start else None
        if below is not None and below.id != expected:
            log.warning("checker: reorg below %d, demoting confirmed block %s", floor, below.id)
            self.ledger.demote(floor - 1)
            self.metrics.reorgs.inc()
            return 0
        self._commit_bridge(start, floor, accepted)
        return len(accepted)

    def _commit_bridge(self, start: int, floor: int, accepted: list[tuple[int, Decision]]) -> None:
        """Record `_bridge`'s outcome: heights `start`..`floor`-1 skipped, the accepted ones
        (the anchor first in `accepted`, then downwards) confirmed from the lowest up, so a
        checker stopped halfway continues from the highest one it recorded."""
        anchor = accepted[0][0]
        if floor > start:
            self.ledger.skip(start, floor - 1)
            self.metrics.skipped.inc(floor - start)
            log.warning(
                "checker: heights %d..%d skipped: no replica holds them any more (every "
                "replica's earliest height is above them); they stay unconfirmed",
                start,
                floor - 1,
            )
        if anchor > floor:
            self.metrics.bridged.inc(anchor - floor)
            log.warning(
                "checker: heights %d..%d confirmed by descent from %d: fewer than a quorum "
                "of replicas still hold them",
                floor,
                anchor - 1,
                anchor,
            )
        odd: set[str] = set()
        for height, decision in reversed(accepted):
            odd |= self._accept(height, decision)
        self._flag_odd(odd)

    def _by_descent(self, height: int, votes: list[Vote], expected: str) -> Decision | None:
        """The decision at a height fewer than a quorum hold: the block must be `expected`
        (the parent the confirmed height above names), and a majority of the replicas
        holding it must agree on its validation hash; replicas holding another block lost.
        None (nothing is confirmed this round) while no replica has it yet (one lags) or
        when the holders disagree (reported as the dispute)."""
        if not votes:
            return None
        self._report_disagreement(height, votes)
        linked = [v for v in votes if v.id == expected]
        decision = decide(linked, len(linked) // 2 + 1, len(linked))
        if decision.winner is None:
            self._set_dispute(height, votes)
            return None
        losers = [v for v in votes if v.id != expected]
        return Decision(decision.winner, losers, decision.diverged, decision.final)

    async def _held(
        self, ranges: dict[str, tuple[int, int]], low: int, high: int
    ) -> dict[int, list[Vote]] | None:
        """Every replica's votes at heights `low`..`high`-1 it holds (fetched `batch` heights
        at a time), per height; None when a replica did not answer."""
        calls = []
        for replica, (earliest, latest) in ranges.items():
            first, last = max(low, earliest), min(high - 1, latest)
            for at in range(first, last + 1, self.settings.batch):
                count = min(self.settings.batch, last - at + 1)
                calls.append(self._fetch(replica, at, count))
        held: dict[int, list[Vote]] = {}
        for view in await asyncio.gather(*calls):
            if view is None:
                return None
            for height, vote in view.items():
                held.setdefault(height, []).append(vote)
        return held

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
            odd |= self._accept(height, decision)
        if done:
            self._flag_odd(odd)
        return done

    def _accept(self, height: int, decision: Decision) -> set[str]:
        """Confirm the winner at `height` (the losers recorded as forks); returns the
        replicas that held another block or validation hash there (flagged)."""
        assert decision.winner is not None
        forks = [self._record(v, fork=True) for v in decision.losers]
        self.ledger.confirm(self._record(decision.winner, fork=False), forks)
        self.metrics.confirmed_height.set(height)
        self._set_dispute(height, None)
        against = {*decision.diverged, *(v.replica for v in decision.losers)}
        for replica in against:
            self.metrics.replica_disagreements.labels(replica).inc()
            self._mark_diverged(replica, height)
        return against

    def _flag_odd(self, odd: set[str]) -> None:
        """checker_replica_diverged after a round that confirmed heights: 1 for the
        replicas that disagreed with one of them."""
        for replica in self.clients:
            self.metrics.replica_diverged.labels(replica).set(1 if replica in odd else 0)

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
        """What `replica` holds at `start`..+count ({} when it did not answer)."""
        return await self._fetch(replica, start, count) or {}

    async def _fetch(self, replica: str, start: int, count: int) -> dict[int, Vote] | None:
        """What `replica` holds at `start`..+count, or None when it did not answer."""
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
            return None

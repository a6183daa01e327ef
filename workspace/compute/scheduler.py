"""Schedules: cron (UTC, croniter) launches of notebook instances.

Each due time is recorded once in `ws_nb_schedule_runs`: `started` with the instance id,
`skipped` when mode `skip` finds the previous instance still running (or the time was missed
while the server was down), `failed` when the launch was refused. Nothing due is lost silently.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from croniter import croniter

from workspace.compute.periodic import Periodic
from workspace.compute.store import ComputeStore

log = logging.getLogger("workspace.compute.scheduler")

MODES = ("skip", "parallel")
Launch = Callable[[dict[str, Any]], Awaitable[str]]  # schedule -> instance id (raises on refusal)


def valid_cron(expr: str) -> bool:
    return isinstance(expr, str) and len(expr.split()) == 5 and croniter.is_valid(expr)


def next_due(expr: str, after: float) -> float:
    """The first due time strictly after `after` (Unix seconds, evaluated in UTC)."""
    return float(croniter(expr, datetime.fromtimestamp(after, UTC)).get_next(float))


class Scheduler:
    """Fires due schedules; `tick(now)` is the whole algorithm, the loop only calls it."""

    def __init__(
        self,
        store: ComputeStore,
        launch: Launch,
        is_running: Callable[[str], bool],
        clock: Callable[[], float] = time.time,
        tick_seconds: float = 1.0,
        max_missed_recorded: int = 100,
    ) -> None:
        self.store = store
        self.launch = launch
        self.is_running = is_running
        self.clock = clock
        self.tick_seconds = tick_seconds
        self.max_missed_recorded = max_missed_recorded
        self._lock = asyncio.Lock()
        self._loop = Periodic(self.tick, tick_seconds, "scheduler tick")

    async def start(self) -> None:
        self._loop.start()

    async def close(self) -> None:
        await self._loop.close()

    async def tick(self, now: float | None = None) -> list[dict[str, Any]]:
        """Handle every due time up to `now`; returns the run entries recorded."""
        now = self.clock() if now is None else now
        recorded: list[dict[str, Any]] = []
        async with self._lock:
            for sched in await self.store.active_schedules():
                recorded += await self._handle(sched, now)
        return recorded

    async def _handle(self, sched: dict[str, Any], now: float) -> list[dict[str, Any]]:
        base = sched.get("last_due_at") or sched["created_at"]
        dues: list[float] = []
        due = next_due(sched["cron"], base)
        missed_total = 0
        while due <= now:
            dues.append(due)
            if len(dues) > self.max_missed_recorded + 1:
                dues.pop(0)
                missed_total += 1
            due = next_due(sched["cron"], due)
        if not dues:
            return []
        out: list[dict[str, Any]] = []
        for missed in dues[:-1]:
            why = "missed: the server was not running at the due time"
            out.append(self._run(sched, missed, "skipped", None, why))
        if missed_total:
            log.warning("schedule missed runs", extra={"schedule": sched["id"], "n": missed_total})
        last = dues[-1]
        previous = sched.get("last_instance_id")
        if sched.get("mode", "skip") == "skip" and previous and self.is_running(previous):
            why = f"previous instance {previous} was still running"
            out.append(self._run(sched, last, "skipped", None, why))
        else:
            try:
                instance_id = await self.launch(sched)
            except Exception as exc:
                out.append(self._run(sched, last, "failed", None, str(exc)))
            else:
                sched["last_instance_id"] = instance_id
                out.append(self._run(sched, last, "started", instance_id, None))
        sched["last_due_at"] = last
        await self.store.put_schedule(sched)
        for run in out:
            await self.store.add_schedule_run(run)
        return out

    def _run(
        self,
        sched: dict[str, Any],
        due: float,
        status: str,
        instance_id: str | None,
        reason: str | None,
    ) -> dict[str, Any]:
        return {
            "id": uuid.uuid4().hex,
            "schedule_id": sched["id"],
            "due_at": due,
            "status": status,
            "instance_id": instance_id,
            "reason": reason,
            "created_at": self.clock(),
        }

"""Retention: what compute keeps is bounded in time and per account.

- An ended instance's log is replaced by a one-line notice `log_retention_seconds` after it
  ended, and earlier when its account keeps more than `account_max_log_bytes` of logs (the
  oldest ended instances' logs go first; running instances' logs are never cut here, each is
  capped by `instance_log_max_bytes`).
- Records older than `record_retention_seconds` are deleted: ended instances (with their log
  file), schedule runs, deleted schedules, and table-access records (which feed `deps`).

A sweep runs at start and every `retention_interval_seconds`; the log quota of one account is
also checked each time one of its instances ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workspace.compute import store as cs
from workspace.compute.periodic import Periodic
from workspace.db import Conn, Database

log = logging.getLogger("workspace.compute.retention")

DAY = 86400.0


@dataclass(frozen=True)
class RetentionSettings:
    """How long compute keeps logs and records; defaults documented in docs/compute.md."""

    log_retention_seconds: float = 7 * DAY  # an ended instance's log, after it ended
    record_retention_seconds: float = 30 * DAY  # ended instances, schedule runs, access records
    retention_interval_seconds: float = 3600.0  # how often the sweep runs


def notice_line(reason: str) -> str:
    """The one log line left where a log was removed (its cursor still works)."""
    ts = int(time.time() * 1_000_000)
    return json.dumps({"timestamp": ts, "type": "event", "message": f"log removed: {reason}"})


class Retention:
    """Applies the retention rules to one server's database and instance logs."""

    def __init__(
        self,
        db: Database,
        log_dir: Path,
        settings: RetentionSettings,
        max_log_bytes: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.db = db
        self.log_dir = log_dir
        self.settings = settings
        self.max_log_bytes = max_log_bytes
        self.clock = clock
        self._lock = asyncio.Lock()
        interval = settings.retention_interval_seconds
        self._loop = Periodic(self.sweep, interval, "retention sweep", first=True)

    async def start(self) -> None:
        self._loop.start()

    async def close(self) -> None:
        await self._loop.close()

    async def sweep(self) -> dict[str, int]:
        """One pass over every rule; returns how many items each rule removed."""
        async with self._lock:
            now = self.clock()
            record_cutoff = now - self.settings.record_retention_seconds
            deleted = await self.db.run(_delete_records, record_cutoff)
            for instance_id in deleted.pop("instance_ids"):
                with contextlib.suppress(FileNotFoundError):
                    await asyncio.to_thread(self._log_path(instance_id).unlink)
            old = await self.db.read(
                cs.ended_instance_ids, now - self.settings.log_retention_seconds
            )
            days = self.settings.log_retention_seconds / DAY
            cut = 0
            for instance_id in old:
                cut += await asyncio.to_thread(self._cut, instance_id, f"older than {days:g} days")
            accounts = await self.db.read(cs.accounts_with_instances)
            quota_cut = 0
            for account_id in accounts:
                quota_cut += await self._enforce(account_id)
        out = {**deleted, "logs_expired": cut, "logs_over_quota": quota_cut}
        if any(out.values()):
            log.info("retention sweep", extra=out)
        return out

    async def enforce_account(self, account_id: str) -> int:
        """Cut the oldest ended logs of one account until it keeps at most max_log_bytes."""
        async with self._lock:
            return await self._enforce(account_id)

    async def _enforce(self, account_id: str) -> int:
        instances = await self.db.read(cs.account_instances_newest_first, account_id)
        return await asyncio.to_thread(self._trim, account_id, instances)

    def _trim(self, account_id: str, instances: list[tuple[str, str]]) -> int:
        sizes = [(i, status, self._size(i)) for i, status in instances]
        total = sum(size for _, _, size in sizes)
        cut = 0
        for instance_id, status, size in reversed(sizes):  # oldest first
            if total <= self.max_log_bytes:
                break
            if status == "ended" and size > 0:
                total -= size - self._cut(instance_id, "account_max_log_bytes reached", size)
                cut += 1
        if cut:
            log.info("instance logs cut over quota", extra={"account": account_id, "n": cut})
        return cut

    def _log_path(self, instance_id: str) -> Path:
        return self.log_dir / f"{instance_id}.jsonl"

    def _size(self, instance_id: str) -> int:
        try:
            return self._log_path(instance_id).stat().st_size
        except OSError:
            return 0

    def _cut(self, instance_id: str, reason: str, size: int | None = None) -> int:
        """Replace a log by its notice line; returns the bytes kept (0 when no log)."""
        path = self._log_path(instance_id)
        line = notice_line(reason) + "\n"
        current = self._size(instance_id) if size is None else size
        if current <= len(line):
            return current  # nothing to cut (already a notice, or no log)
        tmp = path.with_suffix(".cut")
        tmp.write_text(line, encoding="utf-8")
        tmp.replace(path)
        return len(line)


def _delete_records(conn: Conn, cutoff: float) -> dict[str, Any]:
    """Records older than `cutoff`; dep counts follow the access records removed."""
    ids = cs.ended_instance_ids(conn, cutoff)
    cs.delete_instances(conn, ids)
    runs = cs.delete_schedule_runs_before(conn, cutoff)
    schedules = cs.delete_schedules_deleted_before(conn, cutoff)
    accesses = cs.delete_table_access_before(conn, int(cutoff * 1000))
    if accesses:
        cs.refresh_all_dep_counts(conn)
    return {
        "instance_ids": ids,
        "instances": len(ids),
        "schedule_runs": runs,
        "schedules": schedules,
        "table_access": accesses,
    }

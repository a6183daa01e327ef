"""Who used what: requests, items, errors, refusals by limit and upstream calls per key.

The request path only adds to a `Tally` (attribute increments on an object its subject
holds). Every `usage_flush` seconds the differences since the last flush are written under
the current UTC hour: to Redis with a fleet (every proxy adds to the same hashes, so any
proxy's admin API answers for the fleet), else to a SQLite file of this proxy's own. Both
survive a restart of the proxy. Metrics show the totals since start per project (keys would
make the label set grow with every key created).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from chainstate.sqlitewal import connect_wal

log = logging.getLogger(__name__)
FIELDS = ("requests", "items", "errors", "upstream")
OTHER = "other"
ANONYMOUS = "-"  # the project and key of requests without a key


class Tally:
    """The counts of one (project, key) since this proxy started."""

    __slots__ = ("errors", "flushed", "items", "key", "project", "refused", "requests", "upstream")

    def __init__(self, project: str, key: str) -> None:
        self.project = project
        self.key = key
        self.requests = 0
        self.items = 0
        self.errors = 0
        self.upstream = 0
        self.refused: dict[str, int] = {}  # limit or rule → refusals
        self.flushed: dict[str, int] = {}  # field → its value at the last flush

    def refuse(self, what: str) -> None:
        self.refused[what] = self.refused.get(what, 0) + 1

    def delta(self) -> dict[str, int]:
        """What changed since the last call (and remember it as flushed)."""
        now = {f: getattr(self, f) for f in FIELDS}
        for what, n in self.refused.items():
            now[f"refused:{what}"] = n
        out = {f: n - self.flushed.get(f, 0) for f, n in now.items() if n != self.flushed.get(f, 0)}
        self.flushed = now
        return out

    def undo(self, delta: dict[str, int]) -> None:
        """A flush that failed: its differences are written with the next one."""
        for f, n in delta.items():
            self.flushed[f] -= n


class Sink(Protocol):
    async def add(self, hour: str, rows: list[tuple[str, str, dict[str, int]]]) -> None: ...

    async def totals(
        self, project: str | None, key: str | None, by: str, since: float
    ) -> list[dict[str, Any]]: ...


def hour_of(now: float) -> str:
    return time.strftime("%Y%m%d%H", time.gmtime(now))


def label(hour_or_day: str) -> str:
    """`2026112814` → `2026-11-28T14:00Z`, `20261128` → `2026-11-28`."""
    day = f"{hour_or_day[:4]}-{hour_or_day[4:6]}-{hour_or_day[6:8]}"
    return f"{day}T{hour_or_day[8:10]}:00Z" if len(hour_or_day) > 8 else day


class SqliteSink:
    """Hour totals in one SQLite file (WAL); None: in memory (nothing kept)."""

    def __init__(self, path: str | None, retention_days: int) -> None:
        self.path = path
        self.retention = retention_days
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.db = connect_wal(path or ":memory:", check_same_thread=False)
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS usage (project TEXT, key TEXT, hour TEXT, field TEXT, "
            "n INTEGER, PRIMARY KEY (project, key, hour, field))"
        )
        self.db.commit()
        self._lock = asyncio.Lock()

    def _add(self, hour: str, rows: list[tuple[str, str, dict[str, int]]]) -> None:
        with self.db:
            self.db.executemany(
                "INSERT INTO usage VALUES (?, ?, ?, ?, ?) ON CONFLICT (project, key, hour, field)"
                " DO UPDATE SET n = n + excluded.n",
                [(p, k, hour, f, n) for p, k, d in rows for f, n in d.items()],
            )
            oldest = hour_of(time.time() - self.retention * 86400)
            self.db.execute("DELETE FROM usage WHERE hour < ?", (oldest,))

    async def add(self, hour: str, rows: list[tuple[str, str, dict[str, int]]]) -> None:
        async with self._lock:
            await asyncio.to_thread(self._add, hour, rows)

    def _totals(self, project: str | None, key: str | None, by: str, since: float) -> list[Any]:
        width = 10 if by == "hour" else 8
        sql = (
            f"SELECT project, key, substr(hour, 1, {width}) AS t, field, sum(n) FROM usage "
            "WHERE hour >= ?"
        )
        args: list[Any] = [hour_of(since)[:width]]
        if project is not None:
            sql += " AND project = ?"
            args.append(project)
        if key is not None:
            sql += " AND key = ?"
            args.append(key)
        sql += " GROUP BY project, key, t, field ORDER BY t, project, key"
        return self.db.execute(sql, args).fetchall()

    async def totals(
        self, project: str | None, key: str | None, by: str, since: float
    ) -> list[dict[str, Any]]:
        async with self._lock:
            rows = await asyncio.to_thread(self._totals, project, key, by, since)
        return _rows(rows)

    def close(self) -> None:
        self.db.close()


class RedisSink:
    """Hour and day totals in Redis hashes `{prefix}u:{h|d}:{period}:{project}:{key}`, with a
    set per period naming its (project, key) pairs; kept `retention_days`."""

    def __init__(self, redis: Any, prefix: str, retention_days: int) -> None:
        self.redis = redis
        self.prefix = prefix
        self.ttl = retention_days * 86400

    async def add(self, hour: str, rows: list[tuple[str, str, dict[str, int]]]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for kind, period in (("h", hour), ("d", hour[:8])):
            index = f"{self.prefix}u:{kind}:{period}"
            for project, key, delta in rows:
                name = f"{index}:{project}:{key}"
                for f, n in delta.items():
                    pipe.hincrby(name, f, n)
                pipe.expire(name, self.ttl)
                pipe.sadd(index, f"{project}:{key}")
            pipe.expire(index, self.ttl)
        await pipe.execute()

    async def totals(
        self, project: str | None, key: str | None, by: str, since: float
    ) -> list[dict[str, Any]]:
        kind, step, width = ("h", 3600, 10) if by == "hour" else ("d", 86400, 8)
        periods = []
        t = since - since % step
        while t <= time.time() and len(periods) < 2000:
            periods.append(hour_of(t)[:width])
            t += step
        pipe = self.redis.pipeline(transaction=False)
        for period in periods:
            pipe.smembers(f"{self.prefix}u:{kind}:{period}")
        members = await pipe.execute()
        wanted: list[tuple[str, str, str]] = []
        for period, pairs in zip(periods, members, strict=True):
            for pair in sorted(pairs):
                p, _, k = pair.decode().partition(":")
                if (project is None or p == project) and (key is None or k == key):
                    wanted.append((period, p, k))
        pipe = self.redis.pipeline(transaction=False)
        for period, p, k in wanted:
            pipe.hgetall(f"{self.prefix}u:{kind}:{period}:{p}:{k}")
        values = await pipe.execute()
        rows = []
        for (period, p, k), fields in zip(wanted, values, strict=True):
            for f, n in fields.items():
                rows.append((p, k, period, f.decode(), int(n)))
        return _rows(rows)


def _rows(rows: list[Any]) -> list[dict[str, Any]]:
    """(project, key, period, field, n) rows as one object per (period, project, key)."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for project, key, period, field, n in rows:
        entry = out.get((period, project, key))
        if entry is None:
            entry = out[(period, project, key)] = {
                "period": label(period),
                "project": project,
                "key": key,
                **dict.fromkeys(FIELDS, 0),
                "refused": {},
            }
        if field.startswith("refused:"):
            entry["refused"][field[8:]] = entry["refused"].get(field[8:], 0) + n
        else:
            entry[field] = entry.get(field, 0) + n
    return [out[k] for k in sorted(out)]


class Usage:
    """Every tally of this proxy, their flushes and their metrics."""

    def __init__(self, max_projects: int) -> None:
        self.tallies: dict[tuple[str, str], Tally] = {}
        self.sink: Sink | None = None
        self.max_projects = max_projects
        self.failures = 0
        # Brings the tallies up to date before they are read (the gate's leases count the
        # requests they admitted when they are settled)
        self.settle: Callable[[], None] | None = None

    def tally(self, project: str, key: str) -> Tally:
        tally = self.tallies.get((project, key))
        if tally is None:
            tally = self.tallies[(project, key)] = Tally(project, key)
        return tally

    async def flush(self, now: float | None = None) -> None:
        if self.sink is None:
            return
        if self.settle is not None:
            self.settle()
        hour = hour_of(time.time() if now is None else now)
        taken = [(t, t.delta()) for t in list(self.tallies.values())]
        rows = [(t.project, t.key, d) for t, d in taken if d]
        if not rows:
            return
        try:
            await self.sink.add(hour, rows)
        except Exception as exc:
            self.failures += 1
            log.warning("tenancy: usage not written (kept for the next flush): %s", exc)
            for t, d in taken:
                t.undo(d)

    def collector(self) -> Collector:
        return _UsageCollector(self)


class _UsageCollector(Collector):
    def __init__(self, usage: Usage) -> None:
        self.usage = usage

    def collect(self) -> Iterator[Any]:
        families = {
            f: CounterMetricFamily(
                f"chainstate_tenancy_{f}", f"{f} of client requests by project", labels=["project"]
            )
            for f in FIELDS
        }
        refused = CounterMetricFamily(
            "chainstate_tenancy_refused",
            "client requests refused by a limit or rule, by project and limit",
            labels=["project", "limit"],
        )
        if self.usage.settle is not None:
            self.usage.settle()
        sums: dict[str, list[int]] = {}
        refusals: dict[tuple[str, str], int] = {}
        named: set[str] = set()
        for tally in list(self.usage.tallies.values()):
            project = tally.project
            if project not in named:
                if len(named) >= self.usage.max_projects:
                    project = OTHER
                else:
                    named.add(project)
            row = sums.setdefault(project, [0, 0, 0, 0])
            for i, f in enumerate(FIELDS):
                row[i] += getattr(tally, f)
            for what, n in tally.refused.items():
                refusals[(project, what)] = refusals.get((project, what), 0) + n
        for project, row in sums.items():
            for i, f in enumerate(FIELDS):
                families[f].add_metric([project], row[i])
        for (project, what), n in refusals.items():
            refused.add_metric([project, what], n)
        yield from families.values()
        yield refused

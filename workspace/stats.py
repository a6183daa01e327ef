"""Per-table write statistics: minute and day counters bumped inside each write transaction,
and per-block records of block tables (stats/block: completeness ranges, lag)."""

from __future__ import annotations

import re
import time
from datetime import UTC, date, datetime, timedelta
from typing import Any

from workspace.chaincall import chain_height, finalized_height
from workspace.db import Conn
from workspace.errors import invalid
from workspace.http import AppCtx, Call, Endpoint
from workspace.openapi_shapes import BOOL, INT, INT_NULL, NUM, STR, arr, obj
from workspace.tabledefs import Table
from workspace.tables import ID_PARAM, load_table
from workspace.validate import Field, Int, Str

MINUTE_KEEP_S = 2 * 3600  # minute counters older than this are pruned on write
DATE_RE = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"


def utc_day(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d")


def record_write(conn: Conn, t: Table, rows: int, now: float) -> None:
    """Count `rows` written to `t` at `now` (same transaction as the write)."""
    if rows <= 0:
        return
    minute = int(now // 60 * 60)
    conn.execute(
        "INSERT INTO ws_stats_minute (table_id, minute_at, rows) VALUES (?, ?, ?) "
        "ON CONFLICT (table_id, minute_at) DO UPDATE SET "
        "rows = ws_stats_minute.rows + excluded.rows",
        [t.id, minute, rows],
    )
    conn.execute(
        "INSERT INTO ws_stats_daily (table_id, day, rows) VALUES (?, ?, ?) "
        "ON CONFLICT (table_id, day) DO UPDATE SET rows = ws_stats_daily.rows + excluded.rows",
        [t.id, utc_day(now), rows],
    )
    conn.execute(
        "DELETE FROM ws_stats_minute WHERE table_id = ? AND minute_at < ?",
        [t.id, minute - MINUTE_KEEP_S],
    )
    conn.execute(
        "UPDATE ws_tables SET last_write_at_ms = ?, first_write_at = COALESCE(first_write_at, ?) "
        "WHERE id = ?",
        [int(now * 1000), now, t.id],
    )


def record_block(conn: Conn, t: Table, height: int, block_ts: int, rows: int, now: float) -> None:
    now_ms = int(now * 1000)
    lag = max(0, now_ms - block_ts * 1000) if block_ts else None
    conn.execute(
        "INSERT INTO ws_table_blocks (table_id, block_height, rows, lag_ms, processed_at_ms) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (table_id, block_height) DO UPDATE SET "
        "rows = excluded.rows, lag_ms = excluded.lag_ms, "
        "processed_at_ms = excluded.processed_at_ms",
        [t.id, height, rows, lag, now_ms],
    )


def completeness(conn: Conn, table_id: str, max_ranges: int) -> tuple[list[dict], int]:
    """Processed height ranges (gaps and islands) and how many there are."""
    grouped = (
        "SELECT MIN(block_height) AS s, MAX(block_height) AS e FROM (SELECT block_height, "
        "block_height - ROW_NUMBER() OVER (ORDER BY block_height) AS g FROM ws_table_blocks "
        "WHERE table_id = ?) x GROUP BY g"
    )
    count = int(conn.scalar(f"SELECT COUNT(*) FROM ({grouped}) y", [table_id]) or 0)
    if count > max_ranges:
        return [], count
    ranges = conn.tuples(f"{grouped} ORDER BY s", [table_id])
    return [{"start": int(s), "end": int(e)} for s, e in ranges], count


def routes(ctx: AppCtx) -> list[Endpoint]:
    async def daily(call: Call) -> Any:
        p = call.params
        if p["year"] is not None:
            if p["from"] is not None or p["to"] is not None:
                raise invalid("supply either year or from and to, not both")
            first, last = date(p["year"], 1, 1), date(p["year"], 12, 31)
        elif p["from"] is not None and p["to"] is not None:
            first, last = _date(p["from"], "from"), _date(p["to"], "to")
            if first > last:
                raise invalid("from must not be after to")
            if (last - first).days + 1 > ctx.settings.stats_daily_max_days:
                raise invalid(f"from..to spans at most {ctx.settings.stats_daily_max_days} days")
        else:
            raise invalid("supply year, or both from and to (YYYY-MM-DD)")

        def q(conn: Conn) -> Any:
            t = load_table(conn, call.who, p["id"])
            got = dict(
                conn.tuples(
                    "SELECT day, rows FROM ws_stats_daily WHERE table_id = ? AND day >= ? "
                    "AND day <= ?",
                    [t.id, first.isoformat(), last.isoformat()],
                )
            )
            days = (last - first).days + 1
            buckets = []
            for n in range(days):
                d = (first + timedelta(days=n)).isoformat()
                buckets.append({"time_at": d, "rows": int(got.get(d, 0))})
            return {"buckets": buckets}

        return await call.db.read(q)

    async def minute(call: Call) -> Any:
        p = call.params
        now = int(time.time() // 60 * 60)
        first = now - (p["minutes"] - 1) * 60

        def q(conn: Conn) -> Any:
            t = load_table(conn, call.who, p["id"])
            got = dict(
                conn.tuples(
                    "SELECT minute_at, rows FROM ws_stats_minute WHERE table_id = ? "
                    "AND minute_at >= ?",
                    [t.id, first],
                )
            )
            return {
                "buckets": [
                    {"time_at": m, "rows": int(got.get(m, 0))} for m in range(first, now + 1, 60)
                ]
            }

        return await call.db.read(q)

    async def block(call: Call) -> Any:
        p = call.params
        t = await call.db.read(load_table, call.who, p["id"])
        if not t.is_block:
            raise invalid(f"table {t.id!r} is not a block table; stats/block needs one")

        def q(conn: Conn) -> Any:
            ranges, count = completeness(conn, t.id, ctx.settings.completeness_max_ranges)
            top = conn.scalar(
                "SELECT MAX(block_height) FROM ws_table_blocks WHERE table_id = ?", [t.id]
            )
            blocks = []
            if top is not None:
                low = max(int(top) - p["recent"] + 1, t.start_height or 0)
                got = {
                    int(r["block_height"]): r
                    for r in conn.all(
                        "SELECT block_height, rows, lag_ms FROM ws_table_blocks WHERE table_id = ? "
                        "AND block_height >= ? AND block_height <= ?",
                        [t.id, low, int(top)],
                    )
                }
                for h in range(int(top), low - 1, -1):
                    r = got.get(h)
                    blocks.append(
                        {
                            "block_height": h,
                            "rows": int(r["rows"]) if r else 0,
                            "lag_ms": None
                            if r is None or r["lag_ms"] is None
                            else int(r["lag_ms"]),
                            "processed": r is not None,
                        }
                    )
            return ranges, count, blocks

        ranges, count, blocks = await call.db.read(q)
        chain_id = t.chain_id or ""
        return {
            "start_height": t.start_height or 0,
            "consensus_height": await finalized_height(ctx, chain_id),
            "chain_height": await chain_height(ctx, chain_id),
            "completeness": ranges,
            "completeness_count": count,
            "blocks": blocks,
        }

    bucket_day = obj({"time_at": STR, "rows": INT})
    bucket_min = obj({"time_at": NUM, "rows": INT})
    date_kind = Str(pattern=DATE_RE, pattern_doc="be a date YYYY-MM-DD")
    tag = "stats"
    return [
        Endpoint(
            "GET",
            "/v1/table/stats/block",
            block,
            (ID_PARAM, Field("recent", Int(1, 60), default=30)),
            "Processed block ranges, recent blocks and their lag (block tables)",
            obj(
                {
                    "start_height": INT,
                    "consensus_height": INT_NULL,
                    "chain_height": INT_NULL,
                    "completeness": arr(obj({"start": INT, "end": INT})),
                    "completeness_count": INT,
                    "blocks": arr(
                        obj(
                            {
                                "block_height": INT,
                                "rows": INT,
                                "lag_ms": INT_NULL,
                                "processed": BOOL,
                            }
                        )
                    ),
                }
            ),
            tag,
        ),
        Endpoint(
            "GET",
            "/v1/table/stats/daily",
            daily,
            (
                ID_PARAM,
                Field("year", Int(1, 9999), nullable=True),
                Field("from", date_kind, nullable=True),
                Field("to", date_kind, nullable=True),
            ),
            "Rows written per UTC day",
            obj({"buckets": arr(bucket_day)}),
            tag,
        ),
        Endpoint(
            "GET",
            "/v1/table/stats/minute",
            minute,
            (ID_PARAM, Field("minutes", Int(1, 60), default=30)),
            "Rows written per minute, the last `minutes` minutes",
            obj({"buckets": arr(bucket_min)}),
            tag,
        ),
    ]


def _date(text: str, name: str) -> date:
    if not re.fullmatch(DATE_RE, text):
        raise invalid(f"{name} must be a date YYYY-MM-DD")
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise invalid(f"{name} {text!r} is not a valid date") from None

"""Table rows: create (upsert), update, delete, get, list (JSON filter), query (guarded SQL),
plus the internal write path for block tables used by notebooks (`write_block`).

Every write bumps the table's per-minute and per-day counters in the same transaction.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

from workspace import stats
from workspace.coltypes import TYPES, BadValue
from workspace.db import Conn, Database, QueryDenied, QueryGuard, QueryTimeout
from workspace.errors import (
    INVALID_FILTER,
    INVALID_SQL,
    INVALID_VALUE,
    QUERY_TIMEOUT,
    ApiError,
    conflict,
    invalid,
    not_found,
)
from workspace.http import AppCtx, Call, Endpoint, loads_exact
from workspace.openapi_shapes import NULL, ROW_GET, ROW_LIST, ROW_QUERY
from workspace.sqlquery import compile_query, order_sql
from workspace.tabledefs import Table, q
from workspace.tables import load_table, require_inited
from workspace.validate import ID_255, START, Arr, Field, Int, Obj, Str

FILTER_OPS = {"eq": "=", "neq": "<>", "gt": ">", "lt": "<", "gte": ">=", "lte": "<="}
_CHUNK = 500


def bad_value(message: str) -> ApiError:
    return ApiError(INVALID_VALUE, message)


def encode_value(col: dict[str, Any], value: Any, max_bytes: int) -> Any:
    if value is None:
        if col["is_system"]:
            raise bad_value(f"column {col['name']!r} must not be null")
        return None
    try:
        stored = TYPES[col["type"]].encode(value)
    except BadValue as exc:
        raise bad_value(f"column {col['name']!r} ({col['type']}) {exc}") from None
    if isinstance(stored, str) and len(stored.encode()) > max_bytes:
        raise bad_value(f"column {col['name']!r}: value longer than {max_bytes} bytes")
    return stored


def encode_row(t: Table, data: dict[str, Any], max_bytes: int) -> dict[str, Any]:
    out = {}
    for name, value in data.items():
        col = t.column(name)
        if col is None:
            raise bad_value(f"table {t.id!r} has no column {name!r}")
        out[name] = encode_value(col, value, max_bytes)
    return out


def decode_rows(t: Table, rows: Iterable[tuple[Any, ...]]) -> list[dict[str, Any]]:
    decoders = [(c["name"], TYPES[c["type"]].decode) for c in t.columns]
    return [{name: dec(v) for (name, dec), v in zip(decoders, row, strict=True)} for row in rows]


def result_columns(t: Table) -> list[dict[str, Any]]:
    return [{"id": c["id"], "name": c["name"], "type": c["type"]} for c in t.columns]


def select_list(t: Table) -> str:
    return ", ".join(q(c["name"]) for c in t.columns)


def upsert_rows(conn: Conn, t: Table, rows: list[dict[str, Any]], now: float) -> int:
    """Insert or update rows (already encoded) by `id`; bumps the write counters."""
    for row in rows:
        names = list(row)
        cols = ", ".join(q(n) for n in names)
        marks = ", ".join("?" * len(names))
        updates = ", ".join(f"{q(n)} = excluded.{q(n)}" for n in names if n != "id")
        action = f"DO UPDATE SET {updates}" if updates else "DO NOTHING"
        conn.execute(
            f"INSERT INTO {q(t.physical)} ({cols}) VALUES ({marks}) ON CONFLICT ({q('id')}) "
            + action,
            list(row.values()),
        )
    stats.record_write(conn, t, len(rows), now)
    return len(rows)


def write_block(
    conn: Conn,
    t: Table,
    block_height: int,
    block_id: str,
    block_timestamp: int,
    rows: list[dict[str, Any]],
    max_bytes: int = 1 << 20,
    now: float | None = None,
) -> int:
    """Write one processed block's rows into a block table (the notebook write path) and
    record the block for stats/block. Call inside `Database.run` so it is one transaction."""
    if not t.is_block:
        raise invalid(f"table {t.id!r} is not a block table")
    require_inited(t)
    now = time.time() if now is None else now
    system = {
        "block_height": block_height,
        "block_id": block_id,
        "block_timestamp": block_timestamp,
    }
    encode_row(t, system, max_bytes)  # the block itself is checked even with no rows
    encoded = [encode_row(t, {**r, **system}, max_bytes) for r in rows]
    for r in encoded:
        if r.get("id") is None:
            raise bad_value("every block table row needs an id")
    upsert_rows(conn, t, encoded, now)
    stats.record_block(conn, t, block_height, block_timestamp, len(rows), now)
    return len(rows)


def parse_filter(
    t: Table, text: str | None, max_conditions: int, max_depth: int = 64
) -> tuple[str, list[Any]]:
    """row/list `filter` -> (SQL condition, params); conditions combine with AND.

    Absent, empty, `[]` and JSON `null` all mean no filter: `null` is what a client
    serializing an unset filter sends (as PostgREST and Datasette treat a missing filter)."""
    if text is None or text.strip() == "":
        return "", []
    try:
        conds = loads_exact(text, max_depth)
    except ValueError as exc:
        raise ApiError(INVALID_FILTER, f"filter is not valid JSON: {exc}") from None
    if conds is None:
        return "", []
    if not isinstance(conds, list):
        raise ApiError(INVALID_FILTER, "filter must be a JSON array of conditions")
    if len(conds) > max_conditions:
        raise ApiError(INVALID_FILTER, f"filter has more than {max_conditions} conditions")
    sql, params = [], []
    for i, c in enumerate(conds):
        if not isinstance(c, dict) or set(c) != {"field", "op", "value"}:
            raise ApiError(INVALID_FILTER, f"filter[{i}] must be an object with field, op, value")
        field, op, value = c["field"], c["op"], c["value"]
        col = t.column(field) if isinstance(field, str) else None
        if col is None:
            raise ApiError(INVALID_FILTER, f"filter[{i}].field {field!r} is not a column")
        if op not in FILTER_OPS:
            raise ApiError(INVALID_FILTER, f"filter[{i}].op must be one of {', '.join(FILTER_OPS)}")
        if value is None:
            if op not in ("eq", "neq"):
                raise ApiError(INVALID_FILTER, f"filter[{i}]: null works only with eq and neq")
            sql.append(f"{q(col['name'])} IS {'NOT ' if op == 'neq' else ''}NULL")
            continue
        if isinstance(value, list | dict):
            raise ApiError(
                INVALID_FILTER, f"filter[{i}].value must be a string, number, boolean or null"
            )
        try:
            stored = TYPES[col["type"]].encode(value)
        except BadValue as exc:
            raise ApiError(
                INVALID_FILTER, f"filter[{i}].value for {field!r} ({col['type']}) {exc}"
            ) from None
        sql.append(f"{q(col['name'])} {FILTER_OPS[op]} ?")
        params.append(stored)
    return " AND ".join(sql), params


def routes(ctx: AppCtx) -> list[Endpoint]:
    s = ctx.settings

    def normal_table(conn: Conn, call: Call, table_id: str) -> Table:
        t = load_table(conn, call.who, table_id, write=True)
        if t.table_type != "normal":
            raise conflict(
                f"rows of {t.table_type} tables are written by their pipeline; "
                "only normal tables take row writes through the API"
            )
        require_inited(t)
        return t

    async def create(call: Call) -> Any:
        p = call.params

        def run(conn: Conn) -> None:
            t = normal_table(conn, call, p["table_id"])
            row = encode_row(t, p["data"], s.max_value_bytes)
            if row.get("id") is None:
                raise bad_value("data must include the primary key 'id'")
            upsert_rows(conn, t, [row], time.time())

        await call.db.run(run)
        return None

    async def update(call: Call) -> Any:
        p = call.params

        def run(conn: Conn) -> None:
            t = normal_table(conn, call, p["table_id"])
            id_col = t.column("id") or {}
            key = encode_value(id_col, p["id"], s.max_value_bytes)
            row = encode_row(t, p["data"], s.max_value_bytes)
            if "id" in row and row["id"] != key:
                raise bad_value("data.id must equal id (the primary key cannot change)")
            row.pop("id", None)
            if not conn.scalar(f"SELECT 1 FROM {q(t.physical)} WHERE {q('id')} = ?", [key]):
                raise not_found(f"row {p['id']!r}")
            if row:
                sets = ", ".join(f"{q(n)} = ?" for n in row)
                conn.execute(
                    f"UPDATE {q(t.physical)} SET {sets} WHERE {q('id')} = ?", [*row.values(), key]
                )
            stats.record_write(conn, t, 1, time.time())

        await call.db.run(run)
        return None

    async def delete(call: Call) -> Any:
        p = call.params

        def run(conn: Conn) -> None:
            t = normal_table(conn, call, p["table_id"])
            key = encode_value(t.column("id") or {}, p["id"], s.max_value_bytes)
            cur = conn.execute(f"DELETE FROM {q(t.physical)} WHERE {q('id')} = ?", [key])
            if cur.rowcount == 0:
                raise not_found(f"row {p['id']!r}")
            stats.record_write(conn, t, 1, time.time())

        await call.db.run(run)
        return None

    def readable(conn: Conn, call: Call) -> Table:
        t = load_table(conn, call.who, call.params["table_id"])
        require_inited(t)
        return t

    async def get(call: Call) -> Any:
        def run(conn: Conn) -> Any:
            t = readable(conn, call)
            id_col = t.column("id") or {}
            keys = list(
                dict.fromkeys(
                    encode_value(id_col, k, s.max_value_bytes) for k in call.params["pks"]
                )
            )
            found: list[tuple[Any, ...]] = []
            for i in range(0, len(keys), _CHUNK):
                chunk = keys[i : i + _CHUNK]
                found += conn.tuples(
                    f"SELECT {select_list(t)} FROM {q(t.physical)} WHERE {q('id')} IN "
                    f"({', '.join('?' * len(chunk))})",
                    chunk,
                )
            order = {k: n for n, k in enumerate(keys)}
            id_pos = [c["name"] for c in t.columns].index("id")
            found.sort(key=lambda r: order.get(r[id_pos], 0))
            rows = decode_rows(t, found)
            return {"columns": result_columns(t), "rows": rows, "total_count": len(rows)}

        return await call.db.read(run)

    async def list_rows(call: Call) -> Any:
        p = call.params

        def run(conn: Conn) -> Any:
            t = readable(conn, call)
            where, params = parse_filter(t, p["filter"], s.max_filter_conditions, s.max_json_depth)
            order_col = p["order_by"] or "id"
            if t.column(order_col) is None:
                raise invalid(f"order_by {order_col!r} is not a column of {t.id!r}")
            order = order_sql(order_col, p["direction"])
            if order_col != "id":
                order += ", " + order_sql("id", p["direction"])
            sql = f"SELECT {select_list(t)} FROM {q(t.physical)}"
            if where:
                sql += f" WHERE {where}"
            sql += f" ORDER BY {order} LIMIT ? OFFSET ?"
            rows = decode_rows(t, conn.tuples(sql, [*params, p["limit"], p["start"]]))
            return {
                "columns": result_columns(t),
                "rows": rows,
                "total_count": None,
                "start": p["start"],
                "limit": p["limit"],
            }

        return await call.db.read(run)

    async def query(call: Call) -> Any:
        t = await call.db.read(readable, call)
        sql = call.params["sql"]
        if len(sql.encode()) > s.query_max_sql_bytes:
            raise ApiError(INVALID_SQL, f"sql is longer than {s.query_max_sql_bytes} bytes")
        # parsing is pure Python: off the event loop, so other requests go on meanwhile
        compiled = await asyncio.to_thread(compile_query, sql, t, call.db.dialect, s.query_max_rows)

        def run(conn: Conn) -> list[tuple[Any, ...]]:
            cur = conn.execute(compiled.sql)
            return [tuple(r) for r in cur.fetchmany(compiled.fetch)]

        try:
            found = await call.db.read_only(run, QueryGuard(t.physical, s.query_timeout_ms))
        except QueryTimeout as exc:
            raise ApiError(QUERY_TIMEOUT, str(exc)) from None
        except QueryDenied as exc:
            raise ApiError(INVALID_SQL, f"the database rejected the query: {exc}") from None
        truncated = len(found) > compiled.max_rows
        rows = decode_rows(t, found[: compiled.max_rows])
        return {
            "columns": [{"name": c["name"], "type": c["type"]} for c in t.columns],
            "rows": rows,
            "total_count": None,
            "rows_count": len(rows),
            "truncated": truncated,
        }

    table_id = Field("table_id", ID_255, required=True)
    tag = "rows"
    return [
        Endpoint(
            "POST",
            "/v1/table/row/create",
            create,
            (table_id, Field("data", Obj(free=True), required=True)),
            "Insert a row, or update it when its id exists (normal tables)",
            NULL,
            tag,
        ),
        Endpoint(
            "POST",
            "/v1/table/row/update",
            update,
            (
                table_id,
                Field("id", Str(1), required=True),
                Field("data", Obj(free=True), required=True),
            ),
            "Update the given fields of an existing row (normal tables)",
            NULL,
            tag,
        ),
        Endpoint(
            "POST",
            "/v1/table/row/delete",
            delete,
            (table_id, Field("id", Str(1), required=True)),
            "Delete a row (normal tables)",
            NULL,
            tag,
        ),
        Endpoint(
            "POST",
            "/v1/table/row/get",
            get,
            (table_id, Field("pks", Arr(Str(), max_items=s.row_get_max_pks), required=True)),
            "Rows by primary key",
            ROW_GET,
            tag,
        ),
        Endpoint(
            "GET",
            "/v1/table/row/list",
            list_rows,
            (
                table_id,
                Field("start", START, default=0),
                Field(
                    "limit", Int(1, s.row_list_max_limit), default=min(1000, s.row_list_max_limit)
                ),
                Field(
                    "filter",
                    Str(),
                    nullable=True,
                    doc='JSON array of {"field","op","value"}; op: eq neq gt lt gte lte',
                ),
                Field("order_by", Str(1, 64), nullable=True, doc="column name (default id)"),
                Field("direction", Str(enum=("asc", "desc")), default="desc"),
            ),
            "A page of rows, filtered and ordered",
            ROW_LIST,
            tag,
        ),
        Endpoint(
            "POST",
            "/v1/table/row/query",
            query,
            (
                table_id,
                Field(
                    "sql",
                    Str(1),
                    required=True,
                    doc="SELECT * FROM <table> [WHERE] [ORDER BY] [LIMIT]",
                ),
            ),
            "Run one guarded single-table SELECT",
            ROW_QUERY,
            tag,
        ),
    ]


async def write_block_rows(
    db: Database,
    table_id: str,
    block_height: int,
    block_id: str,
    block_timestamp: int,
    rows: list[dict[str, Any]],
) -> int:
    """Async entry point for other modules (notebooks): one block, one transaction."""

    def run(conn: Conn) -> int:
        row = conn.one("SELECT * FROM ws_tables WHERE id = ?", [table_id])
        if row is None:
            raise not_found(f"table {table_id!r}")
        return write_block(conn, Table.from_row(row), block_height, block_id, block_timestamp, rows)

    return await db.run(run)

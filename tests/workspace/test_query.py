"""row/query: the allowed shape, everything else refused, the database guard underneath."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import psycopg
import pytest

from tests.workspace.conftest import Workspace, uid
from workspace.db import Conn, QueryDenied, QueryGuard, QueryTimeout
from workspace.rows import encode_row, upsert_rows
from workspace.tabledefs import Table

N_ROWS = 10_050


@pytest.fixture(scope="module")
def qt(ws: Workspace) -> Table:
    """A normal table with N_ROWS rows (written in one transaction, directly)."""
    a = ws.alice
    space = uid("q")
    a.ok("POST", "/v1/space/create", {"id": space})
    tid = a.ok(
        "POST", "/v1/table/create", {"space": space, "name": "nums", "table_type": "normal"}
    )["id"]
    a.ok(
        "POST",
        "/v1/table/init",
        {
            "id": tid,
            "columns": [
                {"id": "id", "name": "id", "type": "STRING"},
                {"id": "n", "name": "n", "type": "INT"},
                {"id": "big", "name": "big", "type": "UINT256"},
                {"id": "d", "name": "d", "type": "DECIMAL"},
                {"id": "flag", "name": "flag", "type": "BOOLEAN"},
                {"id": "s", "name": "s", "type": "STRING"},
            ],
        },
    )

    def fill(conn: Conn) -> Table:
        t = Table.from_row(conn.one("SELECT * FROM ws_tables WHERE id = ?", [tid]) or {})
        rows = [
            encode_row(
                t,
                {
                    "id": f"r{i:05d}",
                    "n": i,
                    "big": str(i * 10**20),
                    "d": f"{i}.5",
                    "flag": i % 2 == 0,
                    "s": f"v{i % 7}",
                },
                1 << 20,
            )
            for i in range(N_ROWS)
        ]
        upsert_rows(conn, t, rows, time.time())
        return t

    return ws.db.run_sync(fill)


def query(ws: Workspace, t: Table, sql: str) -> tuple[int, Any]:
    return ws.alice.post("/v1/table/row/query", {"table_id": t.id, "sql": sql})


def ok(ws: Workspace, t: Table, sql: str) -> dict:
    status, env = query(ws, t, sql)
    assert status == 200, (sql, env)
    return env["data"]


def test_allowed_shapes(ws: Workspace, qt: Table) -> None:
    t = qt
    space, name = t.id.split(".", 1)
    for ref in (t.id, name, f'"{space}"."{name}"', f'"{t.id}"', f"{t.id} AS x"):
        d = ok(ws, t, f"SELECT * FROM {ref} WHERE n = 3")
        assert [r["id"] for r in d["rows"]] == ["r00003"], ref
    d = ok(ws, t, f"select * from {t.id} where n >= 10 and n < 13 order by n desc")
    assert [r["n"] for r in d["rows"]] == ["12", "11", "10"]
    assert d["rows_count"] == 3 and d["truncated"] is False and d["total_count"] is None
    assert d["columns"][0] == {"name": "id", "type": "STRING"}
    d = ok(
        ws,
        t,
        f"SELECT * FROM {t.id} WHERE big > 100000000000000000000 AND big <= "
        f"'300000000000000000000' ORDER BY big",
    )
    assert [r["n"] for r in d["rows"]] == ["2", "3"]
    d = ok(ws, t, f"SELECT * FROM {t.id} WHERE d BETWEEN -1 AND 2.5 ORDER BY d DESC")
    assert [r["d"] for r in d["rows"]] == ["2.5", "1.5", "0.5"]
    d = ok(ws, t, f"SELECT * FROM {t.id} WHERE n IN (1, 2, 3) AND flag = TRUE")
    assert [r["id"] for r in d["rows"]] == ["r00002"]
    d = ok(ws, t, f"SELECT * FROM {t.id} WHERE s LIKE 'v6%' AND NOT (n > 20) ORDER BY n")
    assert [r["n"] for r in d["rows"]] == ["6", "13", "20"]
    assert ok(ws, t, f"SELECT * FROM {t.id} WHERE s LIKE 'V6%'")["rows"] == []  # case-sensitive
    d = ok(ws, t, f"SELECT * FROM {t.id} WHERE s IS NOT NULL ORDER BY n LIMIT 2 OFFSET 5")
    assert [r["n"] for r in d["rows"]] == ["5", "6"]
    d = ok(
        ws, t, f"SELECT * FROM {t.id} WHERE n = 1 /* a tautology reads only this table */ OR 1=1"
    )
    assert d["rows_count"] == 10_000 and d["truncated"] is True
    d = ok(ws, t, f"SELECT * FROM {t.id} ORDER BY id;")
    assert d["rows_count"] == 10_000 and d["truncated"] is True
    d = ok(ws, t, f"SELECT * FROM {t.id} LIMIT 10000")
    assert d["rows_count"] == 10_000 and d["truncated"] is False


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT n FROM {t}",
        "SELECT *, n FROM {t}",
        "SELECT COUNT(*) FROM {t}",
        "SELECT * FROM {t} GROUP BY n",
        "SELECT DISTINCT * FROM {t}",
        "SELECT * FROM {t} a JOIN {t} b ON a.id = b.id",
        "SELECT * FROM {t}, {t}",
        "SELECT * FROM ws_credentials",
        "SELECT * FROM sqlite_master",
        "SELECT * FROM pg_catalog.pg_user",
        "SELECT * FROM (SELECT * FROM {t})",
        "SELECT * FROM {t} WHERE id IN (SELECT secret_hash FROM ws_credentials)",
        "SELECT * FROM {t} WHERE EXISTS (SELECT 1)",
        "SELECT * FROM {t} WHERE n = 1; DROP TABLE ws_spaces",
        "SELECT * FROM {t}; SELECT * FROM {t}",
        "SELECT * FROM {t} UNION SELECT * FROM {t}",
        "WITH x AS (SELECT 1) SELECT * FROM {t}",
        "DELETE FROM {t}",
        "UPDATE {t} SET n = 1",
        "INSERT INTO {t} (id) VALUES ('x')",
        "DROP TABLE {t}",
        "PRAGMA table_info(ws_spaces)",
        "ATTACH DATABASE '/tmp/x.db' AS x",
        "SELECT * FROM {t} WHERE load_extension('x') = 1",
        "SELECT * FROM {t} WHERE lower(s) = 'v1'",
        "SELECT * FROM {t} WHERE n + 1 = 2",
        "SELECT * FROM {t} WHERE -n < 0",
        "SELECT * FROM {t} WHERE flag",
        "SELECT * FROM {t} WHERE NOT flag",
        "SELECT * FROM {t} WHERE flag IS TRUE",
        "SELECT * FROM {t} WHERE 5 BETWEEN n AND big",
        "SELECT * FROM {t} WHERE 'v1' LIKE s",
        "SELECT * FROM {t} WHERE 3 IN (n, big)",
        "SELECT * FROM {t} WHERE nope = 1",
        "SELECT * FROM {t} WHERE other.n = 1",
        "SELECT * FROM {t} WHERE n = 'abc'",
        "SELECT * FROM {t} WHERE big = -1",
        "SELECT * FROM {t} WHERE n = big",
        "SELECT * FROM {t} WHERE big LIKE '1%'",
        "SELECT * FROM {t} ORDER BY 1",
        "SELECT * FROM {t} ORDER BY random()",
        "SELECT * FROM {t} LIMIT -1",
        "SELECT * FROM {t} LIMIT n",
        "SELECT * FROM {t} FOR UPDATE",
        "SELECT * FROM {t} WHERE n = ?",
        "SELECT * FROM {t} WHERE n = 1 OR typeof(n) = 'integer'",
        "SELECT * FROM {t} HAVING n > 1",
        "SELECT * FROM {t} WHERE",
        "SELEC * FROM {t}",
        "",
        "   ",
    ],
)
def test_refused(ws: Workspace, qt: Table, sql: str) -> None:
    status, env = query(ws, qt, sql.format(t=qt.id))
    assert status == 400 and env["code"] in (40000, 40003), (sql, env)
    assert env["message"]


def test_refused_changes_nothing(ws: Workspace, qt: Table) -> None:
    count = ws.alice.ok("GET", "/v1/table", id=qt.id)["table_rows"]
    assert count == N_ROWS
    tables = ws.alice.ok("GET", "/v1/table/list", limit=100)["total_count"]
    query(ws, qt, f"DROP TABLE {qt.id}")
    query(ws, qt, f"SELECT * FROM {qt.id}; DELETE FROM {qt.id}")
    assert ws.alice.ok("GET", "/v1/table", id=qt.id)["table_rows"] == N_ROWS
    assert ws.alice.ok("GET", "/v1/table/list", limit=100)["total_count"] == tables


async def test_database_guard(ws: Workspace, qt: Table) -> None:
    """Below the shape check: read-only, one table (SQLite authorizer), a time limit."""
    guard = QueryGuard(qt.physical, 200)
    phys = f'"{qt.physical}"'

    def run(sql: str) -> Any:
        def fn(conn: Conn) -> Any:
            return conn.tuples(sql)

        return fn

    assert len(await ws.db.read_only(run(f"SELECT id FROM {phys} LIMIT 3"), guard)) == 3
    with pytest.raises(QueryDenied):
        await ws.db.read_only(run(f"DELETE FROM {phys}"), guard)
    with pytest.raises(QueryDenied):
        await ws.db.read_only(run(f"INSERT INTO {phys} (id) VALUES ('zz')"), guard)
    if ws.db.dialect == "sqlite":
        with pytest.raises(QueryDenied):
            await ws.db.read_only(run("SELECT * FROM ws_credentials"), guard)
        with pytest.raises(QueryDenied):
            await ws.db.read_only(run("ATTACH DATABASE ':memory:' AS x"), guard)
        with pytest.raises(QueryDenied):
            await ws.db.read_only(run("PRAGMA table_info(ws_spaces)"), guard)
    started = time.monotonic()
    with pytest.raises(QueryTimeout):
        await ws.db.read_only(run(f"SELECT COUNT(*) FROM {phys} a, {phys} b, {phys} c"), guard)
    assert time.monotonic() - started < 5
    with pytest.raises((sqlite3.Error, psycopg.Error)):  # plain reads cannot write either
        await ws.db.read(run(f"DELETE FROM {phys}"))
    assert ws.alice.ok("GET", "/v1/table", id=qt.id)["table_rows"] == N_ROWS


def test_hostile_statements_are_clear_400s(ws: Workspace, qt: Table) -> None:
    """Deep nesting, an oversized statement and out-of-range numbers: 40003, never a 500."""
    deep = "(" * 3000 + "n = 1" + ")" * 3000
    status, env = query(ws, qt, f"SELECT * FROM {qt.id} WHERE {deep}")
    assert (status, env["code"]) == (400, 40003), env
    assert "nested" in env["message"]
    huge = f"SELECT * FROM {qt.id} WHERE n IN ({','.join(['1'] * 40_000)})"
    status, env = query(ws, qt, huge)
    assert (status, env["code"]) == (400, 40003), env
    assert "bytes" in env["message"]
    status, env = query(ws, qt, f"SELECT * FROM {qt.id} OFFSET 9223372036854775808")
    assert (status, env["code"]) == (400, 40003), env
    assert "OFFSET" in env["message"]
    status, env = query(ws, qt, f"SELECT * FROM {qt.id} WHERE load_extension('x') = 1")
    assert "load_extension" in env["message"].lower(), env  # names what the user wrote
    assert ws.alice.ok("GET", "/v1/table", id=qt.id)["table_rows"] == N_ROWS


def test_long_in_list_is_fast(ws: Workspace, qt: Table) -> None:
    """A 10000-literal IN list (within the size limit) is checked in linear time."""
    items = ",".join(str(i) for i in range(10_000))
    started = time.monotonic()
    d = ok(ws, qt, f"SELECT * FROM {qt.id} WHERE n IN ({items}) ORDER BY n LIMIT 3")
    assert [r["n"] for r in d["rows"]] == ["0", "1", "2"]
    assert time.monotonic() - started < 4

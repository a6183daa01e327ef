"""Persistence for Functions, test cases, Notebooks, instances, schedules and table access.

Plain synchronous functions over a `workspace.db.Conn` (one transaction each through
`Database.run`), portable between SQLite and PostgreSQL. Instances and schedules are stored
as a JSON document plus the columns lists filter on. `ComputeStore` is the async facade the
instance manager, the scheduler and the endpoints use.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from workspace.db import Conn, Database, Migration


def _copy_from_doc(table: str, column: str) -> Migration:
    """A migration step filling a new `column` from each row's `doc_json` field of that name."""

    def step(conn: Conn) -> None:
        for row_id, raw in conn.tuples(f"SELECT id, doc_json FROM {table}"):
            value = json.loads(raw).get(column)
            conn.execute(f"UPDATE {table} SET {column} = ? WHERE id = ?", [value, row_id])

    return step


MIGRATIONS: list[Migration] = [
    """CREATE TABLE ws_functions (
        id TEXT PRIMARY KEY, space TEXT NOT NULL, account_id TEXT NOT NULL, name TEXT NOT NULL,
        language TEXT NOT NULL, code TEXT NOT NULL, parameters_json TEXT NOT NULL,
        return_type TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX ws_functions_space ON ws_functions (space)",
    # args_key: canonical JSON of the arguments; a duplicate per Function is a 409.
    """CREATE TABLE ws_function_testcases (
        id TEXT PRIMARY KEY, function_id TEXT NOT NULL, arguments_json TEXT NOT NULL,
        args_key TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL, UNIQUE (function_id, args_key))""",
    """CREATE TABLE ws_notebooks (
        id TEXT PRIMARY KEY, space TEXT NOT NULL, account_id TEXT NOT NULL, name TEXT NOT NULL,
        language TEXT NOT NULL, code TEXT NOT NULL, parameters_json TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX ws_notebooks_space ON ws_notebooks (space)",
    """CREATE TABLE ws_nb_instances (
        id TEXT PRIMARY KEY, account_id TEXT NOT NULL, user_id TEXT, notebook_id TEXT,
        schedule_id TEXT, status TEXT NOT NULL, display_status TEXT NOT NULL,
        launched TEXT NOT NULL, name TEXT, created_at DOUBLE PRECISION NOT NULL,
        doc_json TEXT NOT NULL)""",
    "CREATE INDEX ws_nb_instances_account ON ws_nb_instances (account_id, created_at)",
    "CREATE INDEX ws_nb_instances_status ON ws_nb_instances (status)",
    """CREATE TABLE ws_nb_schedules (
        id TEXT PRIMARY KEY, account_id TEXT NOT NULL, space TEXT NOT NULL,
        deleted_at DOUBLE PRECISION, created_at DOUBLE PRECISION NOT NULL,
        doc_json TEXT NOT NULL)""",
    # One row per due time of a schedule: started (with its instance) or skipped (with why).
    """CREATE TABLE ws_nb_schedule_runs (
        id TEXT PRIMARY KEY, schedule_id TEXT NOT NULL, due_at DOUBLE PRECISION NOT NULL,
        status TEXT NOT NULL, instance_id TEXT, reason TEXT,
        created_at DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX ws_nb_schedule_runs_schedule ON ws_nb_schedule_runs (schedule_id, due_at)",
    # Which instance read or wrote which table, last time (table/instance/list, deps).
    """CREATE TABLE ws_table_access (
        table_id TEXT NOT NULL, instance_id TEXT NOT NULL, access TEXT NOT NULL,
        reader TEXT NOT NULL, last_accessed_at_ms BIGINT NOT NULL,
        PRIMARY KEY (table_id, instance_id, access))""",
    "CREATE INDEX ws_table_access_reader ON ws_table_access (table_id, access, reader)",
    # retention (workspace.compute.retention) and bounded lists
    "ALTER TABLE ws_nb_instances ADD COLUMN exited_at DOUBLE PRECISION",
    _copy_from_doc("ws_nb_instances", "exited_at"),
    "CREATE INDEX ws_nb_instances_ended ON ws_nb_instances (status, exited_at)",
    "CREATE INDEX ws_table_access_recent"
    " ON ws_table_access (table_id, access, last_accessed_at_ms)",
    "CREATE INDEX ws_table_access_time ON ws_table_access (last_accessed_at_ms)",
    "CREATE INDEX ws_nb_schedule_runs_created ON ws_nb_schedule_runs (created_at)",
    "ALTER TABLE ws_nb_schedules ADD COLUMN content_id TEXT",
    _copy_from_doc("ws_nb_schedules", "content_id"),
    "CREATE INDEX ws_nb_schedules_account ON ws_nb_schedules (account_id, created_at)",
]


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def args_key(arguments: Sequence[Any]) -> str:
    """Canonical JSON of positional arguments: equal arguments give equal keys."""
    return json.dumps(list(arguments), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# Functions ------------------------------------------------------------------------------


def function_from_row(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "space": row["space"],
        "account_id": row["account_id"],
        "name": row["name"],
        "language": row["language"],
        "code": row["code"],
        "parameters": json.loads(row["parameters_json"]),
        "return_type": row["return_type"],
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }


def get_function(conn: Conn, function_id: str) -> dict[str, Any] | None:
    row = conn.one("SELECT * FROM ws_functions WHERE id = ?", [function_id])
    return function_from_row(row) if row else None


def put_function(conn: Conn, fn: dict[str, Any]) -> None:
    conn.execute("DELETE FROM ws_functions WHERE id = ?", [fn["id"]])
    conn.execute(
        "INSERT INTO ws_functions (id, space, account_id, name, language, code, parameters_json,"
        " return_type, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            fn["id"],
            fn["space"],
            fn["account_id"],
            fn["name"],
            fn["language"],
            fn["code"],
            _dump(fn["parameters"]),
            fn["return_type"],
            fn["created_at"],
            fn["updated_at"],
        ],
    )


def delete_function(conn: Conn, function_id: str) -> None:
    conn.execute("DELETE FROM ws_function_testcases WHERE function_id = ?", [function_id])
    conn.execute("DELETE FROM ws_functions WHERE id = ?", [function_id])


SpaceFilter = tuple[str, list[Any]]  # ("space IN (SELECT …)", params): the visible Spaces
SCAN_CHUNK = 200  # rows fetched at a time by a code search


def list_functions(
    conn: Conn,
    spaces: SpaceFilter,
    name: str | None,
    order_by: str,
    direction: str,
    start: int,
    limit: int,
    keyword: str | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """A page of the Functions in the visible Spaces (and the total), `keyword` matching the
    name (ASCII letters in any case). Only the page's rows are read."""
    where, params = _spaces_and_name(spaces, name)
    if keyword:
        where += " AND LOWER(name) LIKE ? ESCAPE '\\'"
        params.append("%" + _like(ascii_lower(keyword)) + "%")
    order = _order(order_by, direction)
    rows, total = _page(conn, "ws_functions", where, params, order, start, limit)
    return [function_from_row(r) for r in rows], total


def search_function_code(
    conn: Conn,
    spaces: SpaceFilter,
    name: str | None,
    order_by: str,
    direction: str,
    start: int,
    limit: int,
    keyword: str,
    matches: Callable[[str], tuple[list[dict[str, Any]], int]],
) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], int]:
    """A page of (Function, its matched lines) among those whose code has a line `matches`
    (and the total). The database narrows the candidates to code containing `keyword` (ASCII
    letters in any case; PostgreSQL's LOWER folds more, so it keeps a superset); their code
    is streamed `SCAN_CHUNK` rows at a time, so memory holds one chunk and the page whatever
    the number of Functions."""
    where, params = _spaces_and_name(spaces, name)
    where += " AND LOWER(code) LIKE LOWER(?) ESCAPE '\\'"
    params.append("%" + _like(ascii_lower(keyword)) + "%")
    sql = f"SELECT id, code FROM ws_functions WHERE {where} {_order(order_by, direction)}"
    page: list[tuple[str, dict[str, Any]]] = []
    total = 0
    for function_id, code in conn.stream(sql, params, SCAN_CHUNK):
        lines, count = matches(code)
        if count == 0:
            continue
        if start <= total < start + limit:
            page.append((function_id, {"matched_lines": lines, "matched_line_count": count}))
        total += 1
    out = []
    for function_id, extra in page:
        fn = get_function(conn, function_id)
        if fn is not None:
            out.append((fn, extra))
    return out, total


def _spaces_and_name(spaces: SpaceFilter, name: str | None) -> tuple[str, list[Any]]:
    where, params = spaces[0], list(spaces[1])
    if name:
        where += " AND name LIKE ? ESCAPE '\\'"
        params.append("%" + _like(name) + "%")
    return where, params


def _order(order_by: str, direction: str) -> str:
    return f"ORDER BY {order_by} {'ASC' if direction == 'asc' else 'DESC'}, id ASC"


NEWEST_FIRST = "ORDER BY created_at DESC, id ASC"


def _page(
    conn: Conn, table: str, where: str, params: list[Any], order: str, start: int, limit: int
) -> tuple[list[dict[str, Any]], int]:
    """One page of `table`'s rows matching `where` (only the page is read) and the total."""
    total = conn.scalar(f"SELECT COUNT(*) FROM {table} WHERE {where}", params)
    rows = conn.all(
        f"SELECT * FROM {table} WHERE {where} {order} LIMIT ? OFFSET ?", [*params, limit, start]
    )
    return rows, int(total or 0)


def ascii_lower(text: str) -> str:
    """Lower-case A-Z only: the same on SQLite (whose LOWER() is ASCII) and in Python."""
    return text.translate(_ASCII_LOWER)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


# Test cases -----------------------------------------------------------------------------


def testcase_from_row(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "function_id": row["function_id"],
        "arguments": json.loads(row["arguments_json"]),
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }


def get_testcase(conn: Conn, testcase_id: str) -> dict[str, Any] | None:
    row = conn.one("SELECT * FROM ws_function_testcases WHERE id = ?", [testcase_id])
    return testcase_from_row(row) if row else None


def find_testcase_by_args(conn: Conn, function_id: str, key: str) -> str | None:
    return conn.scalar(
        "SELECT id FROM ws_function_testcases WHERE function_id = ? AND args_key = ?",
        [function_id, key],
    )


def put_testcase(conn: Conn, tc: dict[str, Any]) -> None:
    conn.execute("DELETE FROM ws_function_testcases WHERE id = ?", [tc["id"]])
    conn.execute(
        "INSERT INTO ws_function_testcases (id, function_id, arguments_json, args_key,"
        " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
        [
            tc["id"],
            tc["function_id"],
            _dump(tc["arguments"]),
            args_key(tc["arguments"]),
            tc["created_at"],
            tc["updated_at"],
        ],
    )


def delete_testcase(conn: Conn, testcase_id: str) -> None:
    conn.execute("DELETE FROM ws_function_testcases WHERE id = ?", [testcase_id])


def list_testcases(
    conn: Conn, function_id: str, start: int, limit: int, order_by: str, direction: str
) -> tuple[list[dict[str, Any]], int]:
    total = conn.scalar(
        "SELECT COUNT(*) FROM ws_function_testcases WHERE function_id = ?", [function_id]
    )
    rows = conn.all(
        f"SELECT * FROM ws_function_testcases WHERE function_id = ? ORDER BY {order_by} "
        f"{'ASC' if direction == 'asc' else 'DESC'}, id ASC LIMIT ? OFFSET ?",
        [function_id, limit, start],
    )
    return [testcase_from_row(r) for r in rows], int(total or 0)


# Notebooks ------------------------------------------------------------------------------


def notebook_from_row(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "space": row["space"],
        "account_id": row["account_id"],
        "name": row["name"],
        "language": row["language"],
        "code": row["code"],
        "parameters": json.loads(row["parameters_json"]),
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }


def get_notebook(conn: Conn, notebook_id: str) -> dict[str, Any] | None:
    row = conn.one("SELECT * FROM ws_notebooks WHERE id = ?", [notebook_id])
    return notebook_from_row(row) if row else None


def put_notebook(conn: Conn, nb: dict[str, Any]) -> None:
    conn.execute("DELETE FROM ws_notebooks WHERE id = ?", [nb["id"]])
    conn.execute(
        "INSERT INTO ws_notebooks (id, space, account_id, name, language, code, parameters_json,"
        " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            nb["id"],
            nb["space"],
            nb["account_id"],
            nb["name"],
            nb["language"],
            nb["code"],
            _dump(nb["parameters"]),
            nb["created_at"],
            nb["updated_at"],
        ],
    )


def delete_notebook(conn: Conn, notebook_id: str) -> None:
    conn.execute("DELETE FROM ws_notebooks WHERE id = ?", [notebook_id])


def list_notebooks(
    conn: Conn,
    spaces: SpaceFilter,
    name: str | None,
    start: int,
    limit: int,
    order_by: str,
    direction: str,
) -> tuple[list[dict[str, Any]], int]:
    where, params = _spaces_and_name(spaces, name)
    order = _order(order_by, direction)
    rows, total = _page(conn, "ws_notebooks", where, params, order, start, limit)
    return [notebook_from_row(r) for r in rows], total


# Instances ------------------------------------------------------------------------------


def put_instance(conn: Conn, doc: dict[str, Any]) -> None:
    conn.execute("DELETE FROM ws_nb_instances WHERE id = ?", [doc["id"]])
    conn.execute(
        "INSERT INTO ws_nb_instances (id, account_id, user_id, notebook_id, schedule_id, status,"
        " display_status, launched, name, created_at, exited_at, doc_json)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            doc["id"],
            doc["account_id"],
            doc["user_id"],
            doc["notebook_id"],
            doc["schedule_id"],
            doc["status"],
            doc["display_status"],
            doc["launched"],
            doc["name"],
            doc["created_at"],
            doc.get("exited_at"),
            _dump(doc),
        ],
    )


def get_instance(conn: Conn, instance_id: str) -> dict[str, Any] | None:
    raw = conn.scalar("SELECT doc_json FROM ws_nb_instances WHERE id = ?", [instance_id])
    return json.loads(raw) if raw else None


def running_instances(conn: Conn) -> list[dict[str, Any]]:
    rows = conn.tuples("SELECT doc_json FROM ws_nb_instances WHERE status = 'running'")
    return [json.loads(r[0]) for r in rows]


def list_instances(
    conn: Conn, account_id: str, filters: dict[str, Any], start: int, limit: int
) -> tuple[list[dict[str, Any]], int]:
    """Instances of one account, newest first. `keyword` takes precedence over `name` and
    matches the instance name or the launcher's personal account slug."""
    where = ["account_id = ?"]
    params: list[Any] = [account_id]
    for col in ("notebook_id", "schedule_id", "display_status", "launched"):
        if filters.get(col) is not None:
            where.append(f"{col} = ?")
            params.append(filters[col])
    if filters.get("keyword"):
        pattern = "%" + _like(filters["keyword"]) + "%"
        where.append(
            "(name LIKE ? ESCAPE '\\' OR user_id IN (SELECT id FROM ws_accounts"
            " WHERE type = 'personal' AND slug LIKE ? ESCAPE '\\'))"
        )
        params += [pattern, pattern]
    elif filters.get("name"):
        where.append("name LIKE ? ESCAPE '\\'")
        params.append("%" + _like(filters["name"]) + "%")
    clause = " AND ".join(where)
    rows, total = _page(conn, "ws_nb_instances", clause, params, NEWEST_FIRST, start, limit)
    return [json.loads(r["doc_json"]) for r in rows], total


# Schedules ------------------------------------------------------------------------------


def put_schedule(conn: Conn, doc: dict[str, Any]) -> None:
    conn.execute("DELETE FROM ws_nb_schedules WHERE id = ?", [doc["id"]])
    conn.execute(
        "INSERT INTO ws_nb_schedules (id, account_id, space, deleted_at, created_at,"
        " content_id, doc_json) VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            doc["id"],
            doc["account_id"],
            doc["space"],
            doc.get("deleted_at"),
            doc["created_at"],
            doc.get("content_id"),
            _dump(doc),
        ],
    )


def get_schedule(conn: Conn, schedule_id: str) -> dict[str, Any] | None:
    raw = conn.scalar("SELECT doc_json FROM ws_nb_schedules WHERE id = ?", [schedule_id])
    return json.loads(raw) if raw else None


def active_schedules(conn: Conn) -> list[dict[str, Any]]:
    rows = conn.tuples("SELECT doc_json FROM ws_nb_schedules WHERE deleted_at IS NULL")
    return [json.loads(r[0]) for r in rows]


def list_schedules(
    conn: Conn,
    account_id: str,
    content_id: str | None,
    include_deleted: bool,
    start: int,
    limit: int,
) -> tuple[list[dict[str, Any]], int]:
    """A page of an account's schedules, newest first (only the page is read)."""
    where = "account_id = ?"
    params: list[Any] = [account_id]
    if not include_deleted:
        where += " AND deleted_at IS NULL"
    if content_id is not None:
        where += " AND content_id = ?"
        params.append(content_id)
    rows, total = _page(conn, "ws_nb_schedules", where, params, NEWEST_FIRST, start, limit)
    return [json.loads(r["doc_json"]) for r in rows], total


def add_schedule_run(conn: Conn, run: dict[str, Any]) -> None:
    conn.execute(
        "INSERT INTO ws_nb_schedule_runs (id, schedule_id, due_at, status, instance_id, reason,"
        " created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            run["id"],
            run["schedule_id"],
            run["due_at"],
            run["status"],
            run.get("instance_id"),
            run.get("reason"),
            run["created_at"],
        ],
    )


def list_schedule_runs(
    conn: Conn, schedule_id: str, start: int, limit: int
) -> tuple[list[dict[str, Any]], int]:
    total = conn.scalar(
        "SELECT COUNT(*) FROM ws_nb_schedule_runs WHERE schedule_id = ?", [schedule_id]
    )
    rows = conn.all(
        "SELECT * FROM ws_nb_schedule_runs WHERE schedule_id = ? ORDER BY due_at DESC, id ASC"
        " LIMIT ? OFFSET ?",
        [schedule_id, limit, start],
    )
    return rows, int(total or 0)


# Table access ---------------------------------------------------------------------------


def record_access(
    conn: Conn, table_id: str, instance_id: str, access: str, reader: str, at_ms: int
) -> None:
    """Remember that `instance_id` (run on behalf of `reader`: a notebook or Function id)
    read or wrote `table_id` at `at_ms`."""
    conn.execute(
        "DELETE FROM ws_table_access WHERE table_id = ? AND instance_id = ? AND access = ?",
        [table_id, instance_id, access],
    )
    conn.execute(
        "INSERT INTO ws_table_access (table_id, instance_id, access, reader,"
        " last_accessed_at_ms) VALUES (?, ?, ?, ?, ?)",
        [table_id, instance_id, access, reader, at_ms],
    )
    if access == "read" and reader:
        refresh_dep_count(conn, table_id)


_SET_DEP_COUNT = (
    "UPDATE ws_spaces SET dep_count = (SELECT COUNT(DISTINCT a.reader) FROM ws_table_access a"
    " JOIN ws_tables t ON t.id = a.table_id WHERE t.space = ws_spaces.id"
    " AND a.access = 'read' AND a.reader <> '')"
)


def refresh_dep_count(conn: Conn, table_id: str) -> None:
    """Keep the Space's stored `dep_count` equal to the distinct readers of its tables."""
    conn.execute(
        _SET_DEP_COUNT + " WHERE id = (SELECT space FROM ws_tables WHERE id = ?)", [table_id]
    )


def table_accesses(
    conn: Conn, table_id: str, access: str, account_id: str, limit: int
) -> list[tuple[int, dict[str, Any]]]:
    """(last_accessed_at_ms, instance doc) of `account_id`'s instances that read or wrote
    `table_id`, newest access first; one indexed query, at most `limit` rows read."""
    rows = conn.tuples(
        "SELECT a.last_accessed_at_ms, i.doc_json FROM ws_table_access a"
        " JOIN ws_nb_instances i ON i.id = a.instance_id"
        " WHERE a.table_id = ? AND a.access = ? AND i.account_id = ?"
        " ORDER BY a.last_accessed_at_ms DESC, a.instance_id ASC LIMIT ?",
        [table_id, access, account_id, limit],
    )
    return [(int(ms), json.loads(raw)) for ms, raw in rows]


def table_reader_count(conn: Conn, table_id: str) -> int:
    """A table's `deps`: distinct Notebooks / saved Functions that read it (ad-hoc
    function/run calls record reader '' and are not dependencies)."""
    return int(
        conn.scalar(
            "SELECT COUNT(DISTINCT reader) FROM ws_table_access WHERE table_id = ?"
            " AND access = 'read' AND reader <> ''",
            [table_id],
        )
        or 0
    )


def space_reader_count(conn: Conn, table_ids: Sequence[str]) -> int:
    """A Space's `dep_count`: distinct readers over its tables."""
    if not table_ids:
        return 0
    marks = ", ".join("?" for _ in table_ids)
    return int(
        conn.scalar(
            f"SELECT COUNT(DISTINCT reader) FROM ws_table_access WHERE table_id IN ({marks})"
            " AND access = 'read' AND reader <> ''",
            list(table_ids),
        )
        or 0
    )


# Retention -------------------------------------------------------------------------------


def ended_instance_ids(conn: Conn, before: float) -> list[str]:
    """Instances that ended before `before` (Unix seconds)."""
    rows = conn.tuples(
        "SELECT id FROM ws_nb_instances WHERE status = 'ended'"
        " AND COALESCE(exited_at, created_at) < ?",
        [before],
    )
    return [r[0] for r in rows]


def delete_instances(conn: Conn, ids: Sequence[str]) -> None:
    for i in range(0, len(ids), 500):
        chunk = list(ids[i : i + 500])
        marks = ", ".join("?" for _ in chunk)
        conn.execute(f"DELETE FROM ws_nb_instances WHERE id IN ({marks})", chunk)


def delete_schedule_runs_before(conn: Conn, before: float) -> int:
    return int(
        conn.execute("DELETE FROM ws_nb_schedule_runs WHERE created_at < ?", [before]).rowcount
    )


def delete_schedules_deleted_before(conn: Conn, before: float) -> int:
    cur = conn.execute(
        "DELETE FROM ws_nb_schedules WHERE deleted_at IS NOT NULL AND deleted_at < ?", [before]
    )
    return int(cur.rowcount)


def delete_table_access_before(conn: Conn, before_ms: int) -> int:
    cur = conn.execute("DELETE FROM ws_table_access WHERE last_accessed_at_ms < ?", [before_ms])
    return int(cur.rowcount)


def refresh_all_dep_counts(conn: Conn) -> None:
    conn.execute(_SET_DEP_COUNT)


def accounts_with_instances(conn: Conn) -> list[str]:
    return [r[0] for r in conn.tuples("SELECT DISTINCT account_id FROM ws_nb_instances")]


def account_instances_newest_first(conn: Conn, account_id: str) -> list[tuple[str, str]]:
    """(id, status) of every instance of an account, newest first (its logs' owners)."""
    rows = conn.tuples(
        "SELECT id, status FROM ws_nb_instances WHERE account_id = ?"
        " ORDER BY created_at DESC, id ASC",
        [account_id],
    )
    return [(r[0], r[1]) for r in rows]


class ComputeStore:
    """Async facade over the database for the manager, the scheduler and the endpoints."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def put_instance(self, doc: dict[str, Any]) -> None:
        await self.db.run(put_instance, doc)

    async def get_instance(self, instance_id: str) -> dict[str, Any] | None:
        return await self.db.read(get_instance, instance_id)

    async def running_instances(self) -> list[dict[str, Any]]:
        return await self.db.read(running_instances)

    async def put_schedule(self, doc: dict[str, Any]) -> None:
        await self.db.run(put_schedule, doc)

    async def get_schedule(self, schedule_id: str) -> dict[str, Any] | None:
        return await self.db.read(get_schedule, schedule_id)

    async def active_schedules(self) -> list[dict[str, Any]]:
        return await self.db.read(active_schedules)

    async def add_schedule_run(self, run: dict[str, Any]) -> None:
        await self.db.run(add_schedule_run, run)

    async def get_notebook(self, notebook_id: str) -> dict[str, Any] | None:
        return await self.db.read(get_notebook, notebook_id)

    async def record_access(
        self, table_id: str, instance_id: str, access: str, reader: str, at_ms: int
    ) -> None:
        await self.db.run(record_access, table_id, instance_id, access, reader, at_ms)

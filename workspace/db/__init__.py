"""Workspace storage: SQLite (WAL, the default) or PostgreSQL behind one small interface.

Code that touches storage is plain synchronous functions taking a `Conn`; `Database.run(fn,
*args)` runs one such function as ONE transaction on the database's writer thread (commit on
return, rollback on exception), so the event loop never blocks and every multi-statement change
(row write + its stats counters, metadata + DDL) is atomic. SQL is written once with `?`
placeholders and portable types (TEXT, INTEGER, BIGINT, DOUBLE PRECISION); the PostgreSQL
connection translates placeholders. `Database.read(fn, *args)` runs a read-only function in
one snapshot on a pool of reader connections (reads never wait for a write's fsync).
`Database.read_only(fn, guard)` runs user-shaped queries (row/query) on a separate read-only
connection with a time limit (see `QueryGuard`).

Adding schema from another module (e.g. Functions/Notebooks):
    MIGRATIONS: list[Migration] = [
        "CREATE TABLE ws_functions (id TEXT PRIMARY KEY, space TEXT NOT NULL, ...)",
        "CREATE INDEX ws_functions_space ON ws_functions (space)",
        lambda conn: ...,          # or a callable for dialect-specific steps (conn.dialect)
    ]
and run `db.migrate("<module name>", MIGRATIONS)` (workspace.app does this at startup for
every module in ROUTE_MODULES that defines MIGRATIONS). Steps are numbered by position and
recorded in `ws_migrations`; append new steps, never edit applied ones. Prefix table names
with `ws_` (physical row tables are `t_<hex>`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from workspace.settings import SQLITE, WorkspaceSettings

T = TypeVar("T")


class Conn:
    """A connection inside one transaction. `dialect` is "sqlite" or "postgresql"."""

    dialect: str

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> Any:
        raise NotImplementedError

    def all(self, sql: str, params: Sequence[Any] | None = None) -> list[dict[str, Any]]:
        cur = self.execute(sql, params)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def one(self, sql: str, params: Sequence[Any] | None = None) -> dict[str, Any] | None:
        rows = self.all(sql, params)
        return rows[0] if rows else None

    def tuples(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self.execute(sql, params).fetchall()]

    def scalar(self, sql: str, params: Sequence[Any] | None = None) -> Any:
        row = self.execute(sql, params).fetchone()
        return None if row is None else row[0]

    def stream(
        self, sql: str, params: Sequence[Any] | None = None, chunk: int = 256
    ) -> Iterator[tuple[Any, ...]]:
        """Rows one at a time, fetched `chunk` at a time: memory holds one chunk, whatever
        the size of the result (SQLite steps lazily; PostgreSQL overrides this with a
        server-side cursor, its default cursor reads the whole result at once)."""
        cur = self.execute(sql, params)
        while rows := cur.fetchmany(chunk):
            yield from (tuple(r) for r in rows)


Migration = str | Callable[[Conn], None]


class QueryTimeout(Exception):
    """A guarded read-only query ran past its time limit."""


class QueryDenied(Exception):
    """The database refused a guarded query (authorizer / read-only transaction)."""


@dataclass(frozen=True)
class QueryGuard:
    """Limits for a user-shaped read: the only table it may read and a wall-clock limit.

    SQLite enforces `table` with its authorizer (reads of that table only; no ATTACH, PRAGMA
    or writes) on a `mode=ro` connection; PostgreSQL runs it in a READ ONLY transaction with
    `statement_timeout` (it has no authorizer: the sqlglot shape check is the table guard)."""

    table: str
    timeout_ms: int


class Database:
    """One workspace database; implementations in `workspace.db.sqlite` / `.postgres`."""

    dialect: str

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        raise NotImplementedError

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a read-only `fn` in one snapshot on a reader thread (reads do not queue behind
        writes). Writing inside `fn` fails; use `run` for anything that writes."""
        return await self.run(fn, *args)

    async def read_only(self, fn: Callable[..., T], guard: QueryGuard, *args: Any) -> T:
        raise NotImplementedError

    def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn` as one transaction in the calling thread (CLI commands, start-up)."""
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    def close_sync(self) -> None:
        raise NotImplementedError

    def migrate(self, module: str, steps: Sequence[Migration]) -> int:
        """Apply the steps of `module` not applied yet; returns how many were applied."""
        return self.run_sync(apply_migrations, module, steps)


class ReaderPool:
    """`size` threads, each with its own connection (made lazily by `connect`, remade when
    `alive(conn)` is false), for concurrent snapshot reads."""

    def __init__(
        self,
        size: int,
        connect: Callable[[], Any],
        alive: Callable[[Any], bool],
        prefix: str,
    ) -> None:
        self._connect, self._alive = connect, alive
        self._local = threading.local()
        self._conns: list[Any] = []
        self._lock = threading.Lock()
        self.executor = ThreadPoolExecutor(size, thread_name_prefix=prefix)

    def conn(self) -> Any:
        raw = getattr(self._local, "conn", None)
        if raw is None or not self._alive(raw):
            raw = self._connect()
            self._local.conn = raw
            with self._lock:
                self._conns.append(raw)
        return raw

    def close(self) -> None:
        self.executor.shutdown(wait=True)
        with self._lock:
            for raw in self._conns:
                raw.close()
            self._conns.clear()


MIGRATIONS_TABLE = """CREATE TABLE IF NOT EXISTS ws_migrations (
    module TEXT NOT NULL, version INTEGER NOT NULL, applied_at BIGINT NOT NULL,
    PRIMARY KEY (module, version))"""


def apply_migrations(conn: Conn, module: str, steps: Sequence[Migration]) -> int:
    import time

    conn.execute(MIGRATIONS_TABLE)
    if conn.dialect == "postgresql":  # one migrator at a time across processes
        conn.execute("SELECT pg_advisory_xact_lock(7331)")
    done = conn.scalar("SELECT MAX(version) FROM ws_migrations WHERE module = ?", [module])
    done = -1 if done is None else int(done)
    applied = 0
    for version, step in enumerate(steps):
        if version <= done:
            continue
        if callable(step):
            step(conn)
        else:
            conn.execute(step)
        conn.execute(
            "INSERT INTO ws_migrations (module, version, applied_at) VALUES (?, ?, ?)",
            [module, version, int(time.time())],
        )
        applied += 1
    return applied


def open_database(settings: WorkspaceSettings) -> Database:
    """The configured database (SQLite file under the data dir, or a PostgreSQL URL)."""
    if settings.database == SQLITE:
        from workspace.db.sqlite import SqliteDatabase

        settings.ensure_workspace_dir()
        return SqliteDatabase(settings.sqlite_path, readers=settings.db_readers)
    import psycopg

    from chainstate.config import ConfigError
    from chainstate.logs import redact
    from workspace.db.postgres import PostgresDatabase

    try:
        return PostgresDatabase(settings.database, readers=settings.db_readers)
    except psycopg.OperationalError as exc:
        reason = str(exc).strip().splitlines()[0]
        raise ConfigError(
            f"cannot connect to the workspace database {redact(settings.database)}: {reason}"
        ) from None

"""SQLite backend: one writer connection (WAL, synchronous=FULL) on its own thread, and a
separate `mode=ro` connection for guarded user queries."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from chainstate.sqlitewal import connect_wal
from workspace.db import Conn, Database, QueryDenied, QueryGuard, QueryTimeout, ReaderPool

T = TypeVar("T")

# Authorizer action codes allowed for a guarded query (sqlite3.SQLITE_* constants).
_ALLOWED_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_FUNCTION}


class SqliteConn(Conn):
    dialect = "sqlite"

    def __init__(self, raw: sqlite3.Connection) -> None:
        self.raw = raw

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> Any:
        return self.raw.execute(sql, () if params is None else tuple(params))


def _connect(path: Path, read_only: bool = False) -> sqlite3.Connection:
    if read_only:
        raw = sqlite3.connect(
            f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
        )
        raw.execute("PRAGMA case_sensitive_like = ON")  # LIKE as on PostgreSQL
    else:
        raw = connect_wal(str(path), isolation_level=None, check_same_thread=False)
        raw.execute("PRAGMA synchronous=FULL")  # a committed write survives a crash
    raw.execute("PRAGMA busy_timeout=10000")
    return raw


class SqliteDatabase(Database):
    dialect = "sqlite"

    def __init__(self, path: Path, readers: int = 4) -> None:
        self.path = path
        self._writer = _connect(path)
        self._readers = ReaderPool(
            readers, lambda: _connect(path, read_only=True), lambda raw: True, "ws-sqlite-r"
        )
        self._lock = threading.Lock()  # run_sync (CLI/start-up) vs the writer thread
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="ws-sqlite")
        self._ro_pool = ThreadPoolExecutor(1, thread_name_prefix="ws-sqlite-ro")
        self._ro: sqlite3.Connection | None = None

    def _tx(self, fn: Callable[..., T], *args: Any) -> T:
        with self._lock:
            raw = self._writer
            raw.execute("BEGIN IMMEDIATE")
            try:
                result = fn(SqliteConn(raw), *args)
            except BaseException:
                raw.execute("ROLLBACK")
                raise
            raw.execute("COMMIT")
            return result

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._tx, fn, *args)

    def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        return self._tx(fn, *args)

    def _read(self, fn: Callable[..., T], *args: Any) -> T:
        raw = self._readers.conn()
        raw.execute("BEGIN")  # one snapshot for the whole function
        try:
            return fn(SqliteConn(raw), *args)
        finally:
            raw.execute("ROLLBACK")

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._readers.executor, self._read, fn, *args)

    def _guarded(self, fn: Callable[..., T], guard: QueryGuard, *args: Any) -> T:
        if self._ro is None:
            self._ro = _connect(self.path, read_only=True)
        raw = self._ro
        deadline = time.monotonic() + guard.timeout_ms / 1000
        timed_out = False

        def authorize(action: int, arg1: Any, arg2: Any, dbname: Any, trigger: Any) -> int:
            if action in _ALLOWED_ACTIONS:
                return sqlite3.SQLITE_OK
            if action == sqlite3.SQLITE_READ and arg1 == guard.table and dbname in ("main", None):
                return sqlite3.SQLITE_OK
            return sqlite3.SQLITE_DENY

        def progress() -> int:
            nonlocal timed_out
            timed_out = time.monotonic() > deadline
            return 1 if timed_out else 0

        raw.execute("BEGIN")
        raw.set_authorizer(authorize)
        raw.set_progress_handler(progress, 1000)
        try:
            return fn(SqliteConn(raw), *args)
        except sqlite3.DatabaseError as exc:
            if timed_out:
                raise QueryTimeout(f"query ran longer than {guard.timeout_ms} ms") from None
            raise QueryDenied(str(exc)) from None
        finally:
            raw.set_authorizer(None)
            raw.set_progress_handler(None, 0)
            raw.execute("ROLLBACK")

    async def read_only(self, fn: Callable[..., T], guard: QueryGuard, *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._ro_pool, self._guarded, fn, guard, *args)

    def close_sync(self) -> None:
        self._readers.close()
        self._pool.shutdown(wait=True)
        self._ro_pool.shutdown(wait=True)
        with self._lock:
            self._writer.close()
        if self._ro is not None:
            self._ro.close()

    async def close(self) -> None:
        await asyncio.to_thread(self.close_sync)

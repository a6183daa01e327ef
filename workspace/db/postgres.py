"""PostgreSQL backend: a writer connection on its own thread, and a separate connection for
guarded user queries run in READ ONLY transactions with a `statement_timeout`."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import psycopg

from workspace.db import Conn, Database, QueryDenied, QueryGuard, QueryTimeout, ReaderPool

T = TypeVar("T")


class PostgresConn(Conn):
    dialect = "postgresql"

    def __init__(self, raw: psycopg.Connection) -> None:
        self.raw = raw

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> Any:
        if params is None:
            return self.raw.execute(sql.encode())  # no placeholder processing at all
        return self.raw.execute(_placeholders(sql), list(params))

    def stream(
        self, sql: str, params: Sequence[Any] | None = None, chunk: int = 256
    ) -> Iterator[tuple[Any, ...]]:
        """Through a server-side cursor (inside the caller's transaction): PostgreSQL sends
        `chunk` rows per round trip instead of the whole result at once."""
        name = f"ws_stream_{next(_CURSOR_IDS)}"
        with self.raw.cursor(name=name) as cur:
            cur.itersize = chunk
            cur.execute(_placeholders(sql), list(params or []))
            while rows := cur.fetchmany(chunk):
                yield from (tuple(r) for r in rows)


_CURSOR_IDS = itertools.count()


def _placeholders(sql: str) -> str:
    return sql.replace("%", "%%").replace("?", "%s")


class PostgresDatabase(Database):
    dialect = "postgresql"

    def __init__(self, url: str, readers: int = 4) -> None:
        self.url = url
        self._writer = self._connect()
        self._readers = ReaderPool(
            readers, self._connect, lambda raw: not (raw.closed or raw.broken), "ws-pg-r"
        )
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="ws-pg")
        self._ro_pool = ThreadPoolExecutor(1, thread_name_prefix="ws-pg-ro")
        self._ro: psycopg.Connection | None = None

    def _connect(self) -> psycopg.Connection:
        # autocommit: no implicit transactions; every unit of work is an explicit transaction()
        return psycopg.connect(self.url, autocommit=True, connect_timeout=10)

    def _tx(self, fn: Callable[..., T], *args: Any) -> T:
        with self._lock:
            if self._writer.closed or self._writer.broken:
                self._writer = self._connect()
            with self._writer.transaction():
                return fn(PostgresConn(self._writer), *args)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._tx, fn, *args)

    def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        return self._tx(fn, *args)

    def _read(self, fn: Callable[..., T], *args: Any) -> T:
        raw = self._readers.conn()
        with raw.transaction(force_rollback=True):
            raw.execute("SET TRANSACTION READ ONLY")
            return fn(PostgresConn(raw), *args)

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._readers.executor, self._read, fn, *args)

    def _guarded(self, fn: Callable[..., T], guard: QueryGuard, *args: Any) -> T:
        if self._ro is None or self._ro.closed or self._ro.broken:
            self._ro = self._connect()
        raw = self._ro
        try:
            with raw.transaction(force_rollback=True):
                raw.execute("SET TRANSACTION READ ONLY")
                raw.execute(
                    "SELECT set_config('statement_timeout', %s, true)", [str(guard.timeout_ms)]
                )
                return fn(PostgresConn(raw), *args)
        except psycopg.errors.QueryCanceled:
            raise QueryTimeout(f"query ran longer than {guard.timeout_ms} ms") from None
        except psycopg.Error as exc:  # read-only violation, type errors in the user's WHERE
            raise QueryDenied(str(exc).strip()) from None

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

"""Durable store of emitted blocks: SQLite in WAL mode, one row per canonical height.

Each block's complete `trace_vendorBlock` result is stored as canonical JSON bytes with its
hash and parent hash, committed with `synchronous=FULL` before it is served: a restart
neither re-traces nor loses a block. A reorg deletes the rows above the fork point in one
transaction. Writes run in a worker thread on their own connection; reads use another.

Every value a block's StateDiff writes (`post`) is also kept by field and height, in the same
transaction as the block: the state after any stored block is then one indexed read per
field, so a new block's `pre` can be checked against it before it is emitted, and anvil's
state file against it before it is loaded.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import orjson

from chainstate.sqlitewal import connect_wal
from nodes.writer.blockdiff import diff_values

SCHEMA = """
CREATE TABLE IF NOT EXISTS blocks (
    number      INTEGER PRIMARY KEY,
    hash        TEXT NOT NULL UNIQUE,
    parent_hash TEXT NOT NULL,
    output      BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS vals (
    key    TEXT NOT NULL,
    number INTEGER NOT NULL,
    value  TEXT NOT NULL,
    PRIMARY KEY (key, number)
) WITHOUT ROWID;
"""
VALUES_INDEXED = "values_indexed"  # meta key: every stored block's values are in `vals`


def post_values(output: bytes) -> list[tuple[str, str]]:
    """The values a stored `trace_vendorBlock` result's StateDiff writes."""
    return diff_values(orjson.loads(output)["StateDiff"]["post"])


class StoreError(RuntimeError):
    """The store refused a write that would break the chain it holds."""


@dataclass(frozen=True, slots=True)
class StoredHead:
    number: int
    hash: str


class BlockStore:
    """Emitted blocks by height and by hash."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._write_lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = self._connect()
        self._writer.executescript(SCHEMA)
        self._index_values()
        self._reader = self._connect()
        # values_at/state_at run in worker threads: a connection of their own
        self._values = self._connect()
        self._values_lock = threading.Lock()

    def _connect(self) -> sqlite3.Connection:
        conn = connect_wal(self.path, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=5000")
        return conn

    def close(self) -> None:
        self._reader.close()
        with self._values_lock:
            self._values.close()
        with self._write_lock:
            self._writer.close()

    # -- reads (event loop thread) -------------------------------------------------

    def head(self) -> StoredHead | None:
        row = self._reader.execute(
            "SELECT number, hash FROM blocks ORDER BY number DESC LIMIT 1"
        ).fetchone()
        return StoredHead(row[0], row[1]) if row else None

    def hash_at(self, number: int) -> str | None:
        row = self._reader.execute("SELECT hash FROM blocks WHERE number = ?", (number,)).fetchone()
        return row[0] if row else None

    def output_by_number(self, number: int) -> bytes | None:
        row = self._reader.execute(
            "SELECT output FROM blocks WHERE number = ?", (number,)
        ).fetchone()
        return bytes(row[0]) if row else None

    def output_by_hash(self, block_hash: str) -> bytes | None:
        row = self._reader.execute(
            "SELECT output FROM blocks WHERE hash = ?", (block_hash,)
        ).fetchone()
        return bytes(row[0]) if row else None

    def get_meta(self, key: str) -> str | None:
        row = self._reader.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def values_at(self, keys: Iterable[str], number: int) -> dict[str, str]:
        """The value of each field or slot (`diff_values` keys) after block `number`, for
        those a stored block wrote (the others are still zero)."""
        out: dict[str, str] = {}
        query = "SELECT value FROM vals WHERE key = ? AND number <= ? ORDER BY number DESC LIMIT 1"
        with self._values_lock:
            for key in keys:
                row = self._values.execute(query, (key, number)).fetchone()
                if row is not None:
                    out[key] = row[0]
        return out

    def state_at(self, number: int) -> dict[str, str]:
        """Every field and slot a stored block up to `number` wrote, with its value then."""
        with self._values_lock:
            rows = self._values.execute(
                "SELECT key, value FROM vals AS v WHERE number = "
                "(SELECT MAX(number) FROM vals WHERE key = v.key AND number <= ?)",
                (number,),
            )
            return dict(rows.fetchall())

    # -- writes (worker thread) ------------------------------------------------

    def set_meta(self, key: str, value: str) -> None:
        with self._write_lock:
            self._writer.execute(
                "INSERT INTO meta(key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    def append(
        self,
        number: int,
        block_hash: str,
        parent_hash: str,
        output: bytes,
        values: list[tuple[str, str]] | None = None,
    ) -> None:
        """Store the next block; it must extend the stored head. `values`: what its
        StateDiff writes (`diff_values` of its `post`), read from `output` when not given."""
        if values is None:
            values = post_values(output)
        with self._write_lock:
            cur = self._writer.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                row = cur.execute(
                    "SELECT number, hash FROM blocks ORDER BY number DESC LIMIT 1"
                ).fetchone()
                expected = 0 if row is None else row[0] + 1
                if number != expected:
                    raise StoreError(f"block {number} does not follow the stored head")
                if row is not None and row[1] != parent_hash:
                    raise StoreError(f"block {number}'s parent is not the stored head")
                cur.execute(
                    "INSERT INTO blocks(number, hash, parent_hash, output) VALUES (?, ?, ?, ?)",
                    (number, block_hash, parent_hash, output),
                )
                cur.executemany(
                    "INSERT INTO vals(key, number, value) VALUES (?, ?, ?)",
                    [(key, number, value) for key, value in values],
                )
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise

    def wait_idle(self) -> None:
        """Return once no write is in flight (one cancelled half-way in its thread ends
        first)."""
        with self._write_lock:
            pass

    def rewind(self, to_number: int) -> int:
        """Delete every block above `to_number` (-1 deletes all); returns how many."""
        with self._write_lock:
            cur = self._writer.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                dropped = cur.execute("DELETE FROM blocks WHERE number > ?", (to_number,)).rowcount
                cur.execute("DELETE FROM vals WHERE number > ?", (to_number,))
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            return dropped

    def _index_values(self) -> None:
        """A store written before `vals` existed gets its blocks' values once, at open."""
        done = self._writer.execute("SELECT 1 FROM meta WHERE key = ?", (VALUES_INDEXED,))
        if done.fetchone() is not None:
            return
        cur = self._writer.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            cur.execute("DELETE FROM vals")
            for number, output in self._writer.execute(
                "SELECT number, output FROM blocks ORDER BY number"
            ):
                cur.executemany(
                    "INSERT INTO vals(key, number, value) VALUES (?, ?, ?)",
                    [(key, number, value) for key, value in post_values(bytes(output))],
                )
            cur.execute(
                "INSERT OR REPLACE INTO meta(key, value) VALUES (?, '1')", (VALUES_INDEXED,)
            )
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise

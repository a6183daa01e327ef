"""Durable store of emitted blocks: SQLite in WAL mode, one row per canonical height.

Each block's complete `trace_vendorBlock` result is stored as canonical JSON bytes with its
hash and parent hash, committed with `synchronous=FULL` before it is served: a restart
neither re-traces nor loses a block. A reorg deletes the rows above the fork point in one
transaction. Writes run in a worker thread on their own connection; reads use another.
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

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
"""


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
        self._reader = self._connect()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=5000")
        return conn

    def close(self) -> None:
        self._reader.close()
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

    # -- writes (worker thread) ------------------------------------------------

    def set_meta(self, key: str, value: str) -> None:
        with self._write_lock:
            self._writer.execute(
                "INSERT INTO meta(key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    def append(self, number: int, block_hash: str, parent_hash: str, output: bytes) -> None:
        """Store the next block; it must extend the stored head."""
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
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise

    def rewind(self, to_number: int) -> int:
        """Delete every block above `to_number` (-1 deletes all); returns how many."""
        with self._write_lock:
            cur = self._writer.execute("DELETE FROM blocks WHERE number > ?", (to_number,))
            return cur.rowcount

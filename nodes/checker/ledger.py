"""The checker's durable record of confirmed and forked blocks (SQLite, WAL).

A restarted checker continues from its last confirmed height and still answers for every
block it confirmed before, and still knows which replicas diverged (and at which height):
a replica that applied a wrong block holds wrong state until it is resynced, so the verdict
outlives the round that found it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from chainstate.sqlitewal import connect_wal

SCHEMA = """
CREATE TABLE IF NOT EXISTS blocks (
    id TEXT PRIMARY KEY,
    num INTEGER NOT NULL,
    validation_hash TEXT NOT NULL,
    is_fork INTEGER NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS canonical_by_num ON blocks(num) WHERE is_fork = 0;
CREATE TABLE IF NOT EXISTS diverged (
    replica TEXT PRIMARY KEY,
    height INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS skipped (
    low INTEGER PRIMARY KEY,
    high INTEGER NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class BlockRecord:
    id: str
    num: int
    validation_hash: str  # full 0x keccak hex
    is_fork: bool

    def to_json(self) -> dict[str, object]:
        """The spec's checker block record; validation_hash = first 8 bytes as unsigned int."""
        return {
            "id": self.id,
            "num": self.num,
            "validation_hash": int(self.validation_hash[2:18], 16),
            "is_fork": self.is_fork,
        }


class Ledger:
    def __init__(self, path: Path | None) -> None:
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        self._db = connect_wal(str(path) if path else ":memory:", isolation_level=None)
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        self._db.close()

    def _one(self, sql: str, *args: object) -> BlockRecord | None:
        row = self._db.execute(sql, args).fetchone()
        return BlockRecord(row[0], row[1], row[2], bool(row[3])) if row else None

    def latest(self) -> BlockRecord | None:
        return self._one(
            "SELECT id, num, validation_hash, is_fork FROM blocks WHERE is_fork = 0 "
            "ORDER BY num DESC LIMIT 1"
        )

    def at_height(self, num: int) -> BlockRecord | None:
        return self._one(
            "SELECT id, num, validation_hash, is_fork FROM blocks WHERE num = ? AND is_fork = 0",
            num,
        )

    def by_id(self, block_id: str) -> BlockRecord | None:
        return self._one(
            "SELECT id, num, validation_hash, is_fork FROM blocks WHERE id = ?", block_id
        )

    def confirm(self, record: BlockRecord, forks: list[BlockRecord]) -> None:
        """Record a confirmed block and the blocks that lost at its height, atomically."""
        with self._db:
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM blocks WHERE id = ?", (record.id,))
            self._db.execute(
                "INSERT INTO blocks VALUES (?, ?, ?, 0)",
                (record.id, record.num, record.validation_hash),
            )
            for fork in forks:
                self._db.execute(
                    "INSERT OR REPLACE INTO blocks VALUES (?, ?, ?, 1)",
                    (fork.id, fork.num, fork.validation_hash),
                )

    def demote_above(self, num: int) -> int:
        """Confirmed blocks above `num` that the replicas no longer hold: mark them fork;
        returns how many. Skipped heights above `num` are forgotten with them (the
        heights may be confirmed again on the new chain)."""
        with self._db:
            cur = self._db.execute(
                "UPDATE blocks SET is_fork = 1 WHERE num > ? AND is_fork = 0", (num,)
            )
            self._db.execute("DELETE FROM skipped WHERE low > ?", (num,))
            self._db.execute("UPDATE skipped SET high = ? WHERE high > ?", (num, num))
            return cur.rowcount

    def skip(self, low: int, high: int) -> None:
        """Record heights `low`..`high` as skipped: no replica held them any more when the
        checker reached them, so they were never confirmed (nor will be)."""
        with self._db:
            self._db.execute("INSERT OR REPLACE INTO skipped VALUES (?, ?)", (low, high))

    def skipped_at(self, num: int) -> tuple[int, int] | None:
        """The skipped range that holds height `num`, or None."""
        row = self._db.execute(
            "SELECT low, high FROM skipped WHERE low <= ? AND high >= ? ORDER BY low DESC",
            (num, num),
        ).fetchone()
        return (row[0], row[1]) if row else None

    def demote(self, num: int) -> None:
        """A confirmed block that the replicas no longer hold (a reorg below): mark it fork."""
        with self._db:
            self._db.execute("UPDATE blocks SET is_fork = 1 WHERE num = ? AND is_fork = 0", (num,))

    def mark_diverged(self, replica: str, height: int) -> bool:
        """Record that `replica` disagreed with the confirmed block at `height` (the lowest
        such height is kept); True when it was not marked before."""
        with self._db:
            row = self._db.execute(
                "SELECT height FROM diverged WHERE replica = ?", (replica,)
            ).fetchone()
            if row is not None and row[0] <= height:
                return False
            self._db.execute("INSERT OR REPLACE INTO diverged VALUES (?, ?)", (replica, height))
            return row is None

    def clear_diverged(self, replica: str) -> None:
        with self._db:
            self._db.execute("DELETE FROM diverged WHERE replica = ?", (replica,))

    def diverged(self) -> dict[str, int]:
        """Replica → the lowest confirmed height at which it held another block or hash."""
        return dict(self._db.execute("SELECT replica, height FROM diverged").fetchall())

"""Two processes opening one new SQLite file at once both get it in WAL mode."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from chainstate.sqlitewal import connect_wal


def _hold_exclusive(path: Path, release: threading.Event) -> threading.Thread:
    holder = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE IF NOT EXISTS t (x)")
    holder.execute("BEGIN EXCLUSIVE")

    def wait_then_release() -> None:
        release.wait(5)
        holder.execute("COMMIT")
        holder.close()

    thread = threading.Thread(target=wait_then_release)
    thread.start()
    return thread


def test_wal_switch_waits_for_a_writer_holding_the_file(tmp_path: Path) -> None:
    path = tmp_path / "usage.sqlite"
    release = threading.Event()
    thread = _hold_exclusive(path, release)
    threading.Timer(0.3, release.set).start()
    db = connect_wal(str(path), timeout=5)
    thread.join()
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_wal_switch_gives_up_after_its_timeout(tmp_path: Path) -> None:
    path = tmp_path / "usage.sqlite"
    release = threading.Event()
    thread = _hold_exclusive(path, release)
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            connect_wal(str(path), timeout=0.2)
    finally:
        release.set()
        thread.join()


def test_many_openers_of_new_files_at_once(tmp_path: Path) -> None:
    """Without the retry about one file in ten fails here with "database is locked"."""
    errors: list[BaseException] = []
    for n in range(100):
        path = str(tmp_path / f"shared-{n}.sqlite")
        together = threading.Barrier(8)

        def open_one(path: str = path, together: threading.Barrier = together) -> None:
            together.wait()
            try:
                connect_wal(path).execute("CREATE TABLE IF NOT EXISTS t (x)")
            except sqlite3.OperationalError as exc:
                errors.append(exc)

        threads = [threading.Thread(target=open_one) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []

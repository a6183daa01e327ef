"""Opening a SQLite file in WAL mode when other processes may open it at the same moment.

Switching a new file to WAL takes an exclusive lock, and SQLite answers "database is locked"
to a second connection doing the same at once without waiting on its busy timeout (two
proxies sharing one usage file, started together). The switch is retried until the timeout.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

BUSY_SECONDS = 10.0


def connect_wal(path: str, timeout: float = BUSY_SECONDS, **kwargs: Any) -> sqlite3.Connection:
    """A connection to `path` in WAL mode that waits up to `timeout` s for other writers."""
    db = sqlite3.connect(path, timeout=timeout, **kwargs)
    if path == ":memory:":
        return db
    deadline = time.monotonic() + timeout
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return db
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                db.close()
                raise
            time.sleep(0.02)

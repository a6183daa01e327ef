"""The file-backed ConfigStore: one JSON file, written atomically (temp file + rename).

For a single proxy process (and `chainstate up`); many processes sharing configuration use
the etcd store. `FileStore(None)` keeps everything in memory (tests, throwaway runs).
`watch` yields this process's own changes, so the proxy applies configuration through the
same snapshot + watch path as with etcd. Because no other process sees those changes, the
file is locked (`flock` on `<file>.lock`) while a store has it open: a second proxy on the
same file would silently overwrite the first one's admin changes, so it is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import tempfile
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path

import orjson

from chainstate.config import ConfigError
from proxy.store import StoreEvent

HISTORY = 10_000  # recent events kept so a watch may start at an older revision


class FileStore:
    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path is not None else None
        self._data: dict[str, bytes] = {}
        self._revision = 0
        self._history: deque[StoreEvent] = deque(maxlen=HISTORY)
        self._watchers: list[tuple[str, asyncio.Queue[StoreEvent | None]]] = []
        self._lock = asyncio.Lock()
        self._started = False
        self._lock_fd: int | None = None  # holds the file's flock while started

    @property
    def available(self) -> bool:
        return True

    async def start(self) -> None:
        if self._started:
            return
        if self.path is None:
            self._started = True
            return
        self._lock_fd = _lock(self.path)
        try:
            if self.path.exists():
                doc = orjson.loads(self.path.read_bytes())
                self._revision = int(doc["revision"])
                self._data = {k: v.encode() for k, v in doc["data"].items()}
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            self._unlock()
            raise ConfigError(f"proxy store {self.path} is unreadable: {exc}") from None
        self._started = True

    async def close(self) -> None:
        for _, queue in self._watchers:
            queue.put_nowait(None)
        self._watchers = []
        self._started = False
        self._unlock()

    def _unlock(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor releases the flock

    async def snapshot(self, prefix: str = "") -> tuple[dict[str, bytes], int]:
        return {k: v for k, v in self._data.items() if k.startswith(prefix)}, self._revision

    async def put(self, key: str, value: bytes) -> int:
        try:
            value.decode()
        except UnicodeDecodeError:
            raise ValueError("the file store keeps UTF-8 values only") from None
        async with self._lock:
            return await self._commit({key: value}, [])

    async def delete(self, key: str) -> int:
        async with self._lock:
            if key not in self._data:
                return self._revision
            return await self._commit({}, [key])

    async def delete_prefix(self, prefix: str) -> int:
        async with self._lock:
            keys = [k for k in self._data if k.startswith(prefix)]
            if not keys:
                return self._revision
            return await self._commit({}, keys)

    async def replace(self, key: str, expected: bytes | None, value: bytes | None) -> int | None:
        async with self._lock:
            if self._data.get(key) != expected:
                return None
            if value is None:
                return await self._commit({}, [key]) if key in self._data else self._revision
            return await self._commit({key: value}, [])

    async def _commit(self, puts: dict[str, bytes], deletes: list[str]) -> int:
        """Persist first, then change memory and tell watchers (a failed write changes nothing)."""
        data = dict(self._data)
        data.update(puts)
        for key in deletes:
            data.pop(key, None)
        revision = self._revision + 1
        if self.path is not None:
            await asyncio.to_thread(_write_atomic, self.path, data, revision)
        self._data, self._revision = data, revision
        events = [StoreEvent(k, v, revision) for k, v in puts.items()]
        events += [StoreEvent(k, None, revision) for k in deletes]
        for event in events:
            self._history.append(event)
            for prefix, queue in self._watchers:
                if event.key.startswith(prefix):
                    queue.put_nowait(event)
        return revision

    async def watch(self, prefix: str, start_revision: int) -> AsyncIterator[StoreEvent]:
        queue: asyncio.Queue[StoreEvent | None] = asyncio.Queue()
        for event in self._history:
            if event.revision >= start_revision and event.key.startswith(prefix):
                queue.put_nowait(event)
        entry = (prefix, queue)
        self._watchers.append(entry)
        try:
            while True:
                event = await queue.get()
                if event is None:
                    return
                yield event
        finally:
            with contextlib.suppress(ValueError):
                self._watchers.remove(entry)


def _lock(path: Path) -> int:
    """An open descriptor holding an exclusive flock on `<path>.lock` (released when it is
    closed, also when the process dies); ConfigError when another process holds it."""
    lock_path = path.with_name(path.name + ".lock")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ConfigError(f"proxy store {path}: cannot open {lock_path}: {exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise ConfigError(
            f"proxy store {path} is in use by another process (pid {holder}): a file store "
            "serves one proxy; give each proxy its own --store, or share one configuration "
            "with --store etcd://host:port/prefix/"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _write_atomic(path: Path, data: dict[str, bytes], revision: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"revision": revision, "data": {k: v.decode() for k, v in sorted(data.items())}}
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise

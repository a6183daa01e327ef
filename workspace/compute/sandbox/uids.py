"""Sandbox uids: each concurrent run gets an unprivileged uid of its own (root servers only),
never shared by two runs at the same time, and cleaned before it is handed out again.

A uid identifies everything a run left: its processes (daemonized or not) are killed by uid,
and when runs can write outside their own tmpfs (the `shared` file system fallback) the files
that uid left in the machine's temp folders are deleted before the next run gets it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import stat
import time
from collections.abc import Callable, Container, Iterable
from pathlib import Path

import psutil

log = logging.getLogger("workspace.compute.sandbox")

SHARED_TEMP_FOLDERS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")


class UidPool:
    """Unprivileged uids handed to concurrent runs, one each, so runs never share one.

    `on_release(uid)` runs before a returned uid can be handed out again (its leftovers are
    removed there); a uid is taken from the front and returned to the back, so a uid rests
    as long as possible between two runs."""

    def __init__(self, base: int, count: int) -> None:
        self._free = list(range(base, base + count))
        self.on_release: list[Callable[[int], None]] = []

    def acquire(self) -> int:
        if not self._free:
            raise RuntimeError("no free sandbox uid")
        return self._free.pop(0)

    def release(self, uid: int) -> None:
        for clean in self.on_release:
            clean(uid)
        self._free.append(uid)


class UidsInUse(RuntimeError):
    """Another live server on this machine holds the same sandbox uids."""


CLAIM_WAIT_SECONDS = 2.0  # a starting server's sweep holds a free block's lock this briefly


def claim_uids(work_root: Path, uids: range) -> int:
    """Lock `<work_root>/uids-<first>-<last>.lock` for as long as the returned descriptor
    stays open (the server's life; the kernel drops the lock when the process dies). Only a
    server holding it may sweep those uids' processes and run folders: the lock is free only
    when the server that used them is gone. UidsInUse when a live server holds it."""
    work_root.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + CLAIM_WAIT_SECONDS
    while (fd := _lock(work_root / _lock_name(uids))) is None:
        if time.monotonic() >= deadline:
            raise UidsInUse(
                f"sandbox uids {uids.start}..{uids.stop - 1} are used by another live server "
                f"on this machine (same port or [compute] uid_base): give each server its own"
            )
        time.sleep(0.05)
    return fd


def sweep_free_blocks(work_root: Path, remove: Callable[[range], int]) -> None:
    """For each uid block whose lock is free (its server closed or died): `remove(uids)`
    while holding the lock; once that keeps nothing (it returns how many folders it kept),
    the lock file goes too."""
    for path in work_root.glob("uids-*.lock"):
        bounds = path.name.removeprefix("uids-").removesuffix(".lock").split("-")
        if len(bounds) != 2 or not all(b.isdigit() for b in bounds):
            continue
        fd = _lock(path)
        if fd is None:
            continue
        try:
            if not remove(range(int(bounds[0]), int(bounds[1]) + 1)):
                path.unlink(missing_ok=True)
        finally:
            os.close(fd)


def _lock_name(uids: range) -> str:
    return f"uids-{uids.start}-{uids.stop - 1}.lock"


def _lock(path: Path) -> int | None:
    """An exclusive lock on `path` (made if missing), or None while another holds it. The
    locked file must still be the one at `path`: a sweeper deletes a free block's file while
    holding its lock, and a lock on the deleted file would guard nothing."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.stat(path).st_ino == os.fstat(fd).st_ino:
            return fd
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.ENOENT):
            os.close(fd)
            raise
    os.close(fd)
    return None


def kill_run_processes(pid: int, uid: int | None, created: float | None = None) -> None:
    """SIGKILL the process tree and, with a private uid, every process of that uid. This
    walks the machine's process table (a fork bomb's uid up to 20 times): call it off the
    event loop. `created`: the run's start time (`psutil.Process.create_time`); a process
    with that pid but another start time is not the run (its pid was reused after it was
    reaped) and its children are left alone."""
    with contextlib.suppress(psutil.Error):
        run = psutil.Process(pid)
        if created is None or run.create_time() == created:
            for child in run.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    child.kill()
    if uid is not None:
        kill_uid_processes(uid)


def kill_uid_processes(uid: int) -> None:
    """SIGKILL every process of `uid` (a sandbox uid: only runs use it)."""
    for _ in range(20):  # a fork bomb keeps forking while we kill; repeat until none remain
        if not _kill_uids(range(uid, uid + 1)):
            return


def _kill_uids(uids: range) -> int:
    killed = 0
    for p in psutil.process_iter(["uids"]):
        ids = p.info.get("uids")
        if ids is not None and ids.real in uids:
            with contextlib.suppress(psutil.Error):
                p.kill()
                killed += 1
    return killed


def sweep_uids(uids: range) -> int:
    """Kill processes left by a previous server in the sandbox uid range; returns the count."""
    return _kill_uids(uids)


def remove_uid_files(uids: Container[int], folders: Iterable[str] = SHARED_TEMP_FOLDERS) -> int:
    """Delete what `uids` left in the machine's shared temp folders (files, sockets, folders
    they own, at any depth); returns how many entries went. Symlinks are removed, never
    followed."""
    removed = 0
    for folder in folders:
        for dirpath, dirnames, filenames in os.walk(folder, onerror=lambda _: None):
            keep = []
            for name in [*filenames, *dirnames]:
                path = os.path.join(dirpath, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                is_dir = stat.S_ISDIR(st.st_mode)
                if st.st_uid not in uids:
                    if is_dir and st.st_mode & 0o002:
                        keep.append(name)  # others may write there: so may the uid have
                    continue
                removed += 1
                if is_dir:
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
            dirnames[:] = keep  # a uid creates entries only where others may write
    if removed:
        log.info("removed files sandbox uids left", extra={"n": removed})
    return removed


def ensure_owner(path: Path, uid: int) -> None:
    """Hand a folder tree (e.g. the Go build cache) to `uid`; a no-op when it already is."""
    path.mkdir(parents=True, exist_ok=True)
    if path.stat().st_uid == uid:
        return
    for dirpath, dirnames, filenames in os.walk(path):
        for name in [*dirnames, *filenames]:
            with contextlib.suppress(OSError):
                os.lchown(os.path.join(dirpath, name), uid, uid)
    os.chown(path, uid, uid)
    path.chmod(0o700)

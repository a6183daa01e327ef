"""The namespaces a run lives in, and how they are built: the bubblewrap command, or (root
without bubblewrap) the same view made with mount calls in the child before it executes.

A run sees the machine's files read-only, except its own folders: its home (the run's
working directory) and private temp folders bound over `/tmp`, `/var/tmp`, `/run` and
`/dev/shm`. `/run` is replaced whole, not only `/run/lock`: it holds the Unix sockets of the
machine's services (PostgreSQL, D-Bus, …), which a network namespace does not hide. Paths
the server exposes on purpose (the SDK socket) are bound read-only at their own path.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MNT_DETACH = 0x2
PR_SET_PDEATHSIG = 1
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (new syscall table)
TEMP_MOUNTS = ("/tmp", "/var/tmp", "/run", "/dev/shm")  # replaced by the run's own folders

# Loaded once here: find_library may spawn a process, which a forked child must not do.
LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    _check(LIBC.unshare(flags), "unshare")


def mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None
) -> None:
    def enc(value: str | None) -> bytes | None:
        return None if value is None else value.encode()

    _check(LIBC.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def umount(target: str) -> None:
    """Detach `target` and everything mounted below it (lazily: open files keep it alive)."""
    _check(LIBC.umount2(target.encode(), MNT_DETACH), f"umount {target}")


def read_only_tree() -> None:
    """Make every mount of this (private) mount namespace read-only (Linux >= 5.12)."""
    attr = _MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
    result = LIBC.syscall(
        SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)
    )
    _check(result, "mount_setattr /")


def private_mounts() -> None:
    """A mount namespace of the caller's own whose changes never reach the host."""
    unshare(CLONE_NEWNS)
    mount(None, "/", None, MS_REC | MS_PRIVATE, None)


def hidepid_proc() -> None:
    """A fresh /proc listing only the processes of the caller's uid (after its setuid)."""
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")


@dataclass(frozen=True)
class FsView:
    """What a run's file system looks like: `binds` (host path -> path inside, writable),
    applied in order after the root is made read-only, then `exposed` read-only paths."""

    home: Path
    binds: tuple[tuple[Path, str], ...]
    exposed: tuple[Path, ...] = ()
    temp_sizes: int | None = None  # bwrap without a run tmpfs: size of each temp tmpfs
    extra: tuple[tuple[Path, Path], ...] = ()  # job binds into the home (bwrap, not root)


def bwrap_argv(
    bwrap: str, own_network: bool, view: FsView | None, cwd: Path | None = None
) -> list[str]:
    """bwrap's options for a run: its own user, PID, IPC and mount namespaces with a fresh
    /proc (only the run's processes) and a minimal /dev; the machine's files read-only but
    for the run's own folders (`view`; None: the host's files as they are, for probes).
    `own_network`: bwrap makes the network namespace too (when the server is not root and
    cannot make one before bwrap's). `cwd`: where the program starts (default: the home).

    `--as-pid-1`: the program is the namespace's PID 1 and bwrap waits for it itself. With
    bwrap's own init instead, bwrap exits without reaping that init, which is left a zombie
    for the machine's PID 1: slow to go on some hosts, never in a container whose PID 1 is
    this server, and counted against the run uid's RLIMIT_NPROC until then."""
    argv = [bwrap, "--unshare-user", "--unshare-pid", "--unshare-ipc", "--as-pid-1"]
    argv += ["--disable-userns", "--die-with-parent"]
    if own_network:
        argv.append("--unshare-net")
    if view is None:
        return [*argv, "--bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--"]
    argv += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    if view.temp_sizes is not None:  # no run tmpfs (not root): one sized tmpfs per folder
        for dest in TEMP_MOUNTS:
            argv += ["--size", str(view.temp_sizes), "--perms", "1777", "--tmpfs", dest]
        argv += ["--dir", "/run/lock"]
    for src, dest in view.binds:
        argv += ["--bind", str(src), dest]
    for path in view.exposed:
        argv += ["--ro-bind", str(path), str(path)]
    for src, dest in view.extra:
        argv += ["--bind", str(src), str(dest)]
    return [*argv, "--chdir", str(cwd or view.home), "--"]


def private_filesystem(view: FsView, cwd: Path | None = None) -> None:
    """Build `view` with mount calls (root, in the child, inside `private_mounts()`): the
    same file system a bwrap run gets, for a root server without bubblewrap. Ends in `cwd`
    (default: the home), entered again on the new mounts.

    The sources are opened first: binding the run's temp folder over /tmp hides the run's
    own folders when they live under /tmp, so they are re-bound from those handles."""
    handles = [(os.open(src, os.O_PATH), dest) for src, dest in view.binds]
    handles += [(os.open(path, os.O_PATH), str(path)) for path in view.exposed]
    read_only_tree()
    writable = len(view.binds)
    for i, (fd, dest) in enumerate(handles):
        _mount_point(dest, directory=stat.S_ISDIR(os.fstat(fd).st_mode))
        mount(f"/proc/self/fd/{fd}", dest, None, MS_BIND | MS_REC, None)
        if i < writable:  # a bind keeps its source's flags: read-only after read_only_tree()
            mount(None, dest, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV, None)
        os.close(fd)
    os.chdir(cwd or view.home)  # the old working directory is on the read-only mount


def _mount_point(dest: str, directory: bool) -> None:
    if directory:
        os.makedirs(dest, exist_ok=True)
        return
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    try:
        os.close(os.open(dest, os.O_CREAT | os.O_WRONLY, 0o600))
    except OSError as exc:
        if exc.errno != errno.EEXIST:
            raise


def bind_into(binds: Sequence[tuple[Path, Path]]) -> None:
    """Job binds (e.g. the Go build cache) into the run's home, as root in the child's own
    mount namespace: the run's uid could not reach their sources itself."""
    for src, dest in binds:
        os.makedirs(dest, exist_ok=True)
        mount(str(src), str(dest), None, MS_BIND | MS_REC, None)

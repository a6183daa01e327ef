"""A run's folders: `<work_root>/run-XXXX/` holding `home` (its working directory) and the
folders it sees as `/tmp`, `/var/tmp`, `/run` and `/dev/shm`.

With a root server the whole folder is a tmpfs of its own, mounted for the run, sized by the
run's write budget (`write_bytes`, `write_files` as tmpfs `size` and `nr_inodes`), owned by
the run's uid: everything the run can write is in it, and unmounting it at the end leaves
nothing behind. Without root it is a plain folder and bubblewrap sizes the temp folders.

A run's tmpfs is mounted on `run-<uid>` (a uid serves one run at a time), a private mount,
and that folder is kept, empty and unmounted, after the run for the uid's next run. bwrap
copies every mount of the machine into a starting run's namespace and then remounts each
copy read-only: a copy whose mount point was removed meanwhile (rmdir detaches the mounts of
other namespaces on it) or unmounted (a shared mount's unmount reaches the copies) fails that
start with "Unable to apply mount flags". A kept folder and a private mount change neither.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from workspace.compute.sandbox.limits import Limits
from workspace.compute.sandbox.namespaces import (
    MS_NODEV,
    MS_NOSUID,
    MS_PRIVATE,
    TEMP_MOUNTS,
    FsView,
    mount,
    umount,
)

# host folder name in the run's folder -> where the run sees it
TEMP_FOLDERS = dict(zip(("tmp", "var-tmp", "run", "shm"), TEMP_MOUNTS, strict=True))


@dataclass(frozen=True)
class RunDirs:
    """The folders of one run (see the module docstring)."""

    root: Path
    tmpfs: bool  # root is a tmpfs mounted for this run
    kept: bool = False  # root stays (empty, unmounted) after the run: see the module docstring

    @property
    def home(self) -> Path:
        return self.root / "home"

    def view(
        self, exposed: tuple[Path, ...], limits: Limits, extra: tuple[tuple[Path, Path], ...] = ()
    ) -> FsView:
        """The run's file system: its temp folders, its home, the server's exposed paths."""
        home = (self.home, str(self.home))
        if self.tmpfs:
            temps = tuple((self.root / name, dest) for name, dest in TEMP_FOLDERS.items())
            return FsView(self.home, (*temps, home), exposed)
        return FsView(self.home, (home,), exposed, temp_sizes=limits.write_bytes, extra=extra)


def create_run_dirs(
    work_root: Path, uid: int | None, limits: Limits, tmpfs: bool, slot: str | None = None
) -> RunDirs:
    """Make a run's folders, owned by `uid` (mode 0700); a sized tmpfs when `tmpfs`, on the
    kept folder `run-<slot or uid>`. A `slot` is the caller's alone (it holds a lock): what a
    crashed holder left there goes. A uid's folder still mounted is another run's: the uid
    serves two runs at once, which is refused (FileExistsError)."""
    name = slot or (None if uid is None else str(uid))
    if tmpfs and name is not None:
        root = work_root / f"run-{name}"
        root.mkdir(mode=0o700, exist_ok=True)
        if os.path.ismount(root):
            if slot is None:
                raise FileExistsError(errno.EEXIST, "a live run holds this folder", str(root))
            remove_run_dirs(RunDirs(root, True, kept=True))
    else:
        root = Path(tempfile.mkdtemp(prefix="run-", dir=work_root))
    dirs = RunDirs(root, tmpfs, kept=tmpfs and name is not None)
    try:
        if tmpfs:
            owner = uid if uid is not None else os.getuid()
            options = (
                f"size={max(limits.write_bytes, 64 * 1024)},nr_inodes={limits.write_files + 16},"
                f"mode=0700,uid={owner},gid={owner}"
            )
            mount("tmpfs", str(root), "tmpfs", MS_NOSUID | MS_NODEV, options)
            mount(None, str(root), None, MS_PRIVATE, None)
        folders = [dirs.home, *(root / name for name in TEMP_FOLDERS), root / "run" / "lock"]
        for folder in folders:
            folder.mkdir()
            if uid is not None:
                os.chown(folder, uid, uid)
        (root / "tmp").chmod(0o1777)
        if uid is not None:
            os.chown(root, uid, uid)
        root.chmod(0o700)
        return dirs
    except BaseException:
        remove_run_dirs(dirs)
        raise


def remove_run_dirs(dirs: RunDirs) -> None:
    """Delete a run's folders and unmount its tmpfs (a kept folder stays, empty); safe to
    call twice.

    The files go first, while the tmpfs is still mounted: runs started meanwhile hold a copy
    of every mount in their own mount namespace, so unmounting alone would keep this run's
    files in memory until the last of them ends."""
    mounted = dirs.tmpfs or os.path.ismount(dirs.root)
    if mounted or dirs.kept:
        for entry in list(dirs.root.iterdir()) if dirs.root.is_dir() else []:
            shutil.rmtree(entry, ignore_errors=True)
    if mounted:
        with contextlib.suppress(OSError):
            umount(str(dirs.root))
    if not dirs.kept:
        shutil.rmtree(dirs.root, ignore_errors=True)


def can_mount_tmpfs(work_root: Path) -> str | None:
    """None when this process may mount a run's tmpfs under `work_root`, otherwise why not.
    Uses the kept folder `run-probe`: call it under `probe_lock`."""
    if os.geteuid() != 0:
        return "not root"
    try:
        work_root.mkdir(parents=True, exist_ok=True)
        limits = Limits(write_bytes=1 << 20, write_files=8)
        probe = create_run_dirs(work_root, None, limits, True, slot=PROBE_SLOT)
    except OSError as exc:
        return f"cannot mount a tmpfs: {exc.strerror or exc}"
    remove_run_dirs(probe)
    return None


PROBE_SLOT = "probe"


@contextlib.contextmanager
def probe_lock(work_root: Path) -> Iterator[None]:
    """Held while probing: servers sharing `work_root` take turns with the `run-probe`
    folder."""
    work_root.mkdir(parents=True, exist_ok=True)
    fd = os.open(work_root / "probe.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def remove_leftover_run_dirs(work_root: Path, owned: range, keep: bool = True) -> int:
    """Run folders left by a server that died (kill -9): unmount and empty the kept
    `run-<uid>` folders of the uids `owned` (deleted too unless `keep` or mounted until now:
    nobody uses them any more, and an unmounted folder is in no mount bwrap copies); delete
    older per-run folders whose owner is one of them (or this server's own uid when runs
    share it). Returns how many `run-<uid>` folders stay."""
    if not work_root.is_dir():
        return 0
    kept = 0
    for entry in work_root.iterdir():
        if not entry.name.startswith("run-"):
            continue
        slot = entry.name.removeprefix("run-")
        if slot == PROBE_SLOT:  # the probe's own: taken over under its lock
            continue
        if slot.isdigit():
            if int(slot) in owned:
                mounted = os.path.ismount(entry)
                remove_run_dirs(RunDirs(entry, mounted, kept=keep or mounted))
                kept += keep or mounted
            continue
        try:
            mine = entry.stat().st_uid in owned
        except OSError:
            continue
        if mine:
            remove_run_dirs(RunDirs(entry, os.path.ismount(entry)))
    return kept

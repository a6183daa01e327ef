"""A run's folders: `<work_root>/run-XXXX/` holding `home` (its working directory) and the
folders it sees as `/tmp`, `/var/tmp`, `/run` and `/dev/shm`.

With a root server the whole folder is a tmpfs of its own, mounted for the run, sized by the
run's write budget (`write_bytes`, `write_files` as tmpfs `size` and `nr_inodes`), owned by
the run's uid: everything the run can write is in it, and unmounting it at the end leaves
nothing behind. Without root it is a plain folder and bubblewrap sizes the temp folders.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from workspace.compute.sandbox.limits import Limits
from workspace.compute.sandbox.namespaces import (
    MS_NODEV,
    MS_NOSUID,
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


def create_run_dirs(work_root: Path, uid: int | None, limits: Limits, tmpfs: bool) -> RunDirs:
    """Make a run's folders, owned by `uid` (mode 0700); a sized tmpfs when `tmpfs`."""
    root = Path(tempfile.mkdtemp(prefix="run-", dir=work_root))
    try:
        if tmpfs:
            owner = uid if uid is not None else os.getuid()
            options = (
                f"size={max(limits.write_bytes, 64 * 1024)},nr_inodes={limits.write_files + 16},"
                f"mode=0700,uid={owner},gid={owner}"
            )
            mount("tmpfs", str(root), "tmpfs", MS_NOSUID | MS_NODEV, options)
        dirs = RunDirs(root, tmpfs)
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
        remove_run_dirs(RunDirs(root, tmpfs))
        raise


def remove_run_dirs(dirs: RunDirs) -> None:
    """Delete a run's folders and unmount its tmpfs; safe to call twice.

    The files go first, while the tmpfs is still mounted: runs started meanwhile hold a copy
    of every mount in their own mount namespace, so unmounting alone would keep this run's
    files in memory until the last of them ends."""
    mounted = dirs.tmpfs or os.path.ismount(dirs.root)
    if mounted:
        for entry in list(dirs.root.iterdir()) if dirs.root.is_dir() else []:
            shutil.rmtree(entry, ignore_errors=True)
        with contextlib.suppress(OSError):
            umount(str(dirs.root))
    shutil.rmtree(dirs.root, ignore_errors=True)


def can_mount_tmpfs(work_root: Path) -> str | None:
    """None when this process may mount a run's tmpfs under `work_root`, otherwise why not."""
    if os.geteuid() != 0:
        return "not root"
    try:
        work_root.mkdir(parents=True, exist_ok=True)
        probe = create_run_dirs(work_root, None, Limits(write_bytes=1 << 20, write_files=8), True)
    except OSError as exc:
        return f"cannot mount a tmpfs: {exc.strerror or exc}"
    remove_run_dirs(probe)
    return None


def remove_leftover_run_dirs(work_root: Path, owned: range) -> None:
    """Run folders left by a server that died (kill -9): unmount and delete those whose owner
    is one of this server's uids (or this server's own uid when runs share it)."""
    if not work_root.is_dir():
        return
    for entry in work_root.iterdir():
        if not entry.name.startswith("run-"):
            continue
        try:
            mine = entry.stat().st_uid in owned
        except OSError:
            continue
        if mine:
            remove_run_dirs(RunDirs(entry, os.path.ismount(entry)))

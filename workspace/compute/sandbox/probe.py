"""What this machine lets the sandbox do, probed once at start and reported.

Each feature (network namespace, PID namespace, private read-only file system, a tmpfs per
run, per-run uids, a cpu cgroup) is tried the way runs use it; a missing one is logged as a
warning and listed in `Isolation.notes` (shown by `GET /v1/notebook/instance/specs`), never
skipped silently.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from workspace.compute.sandbox.limits import Limits, MiB
from workspace.compute.sandbox.namespaces import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWUSER,
    bwrap_argv,
    hidepid_proc,
    private_filesystem,
    private_mounts,
    unshare,
)
from workspace.compute.sandbox.rundirs import (
    PROBE_SLOT,
    RunDirs,
    can_mount_tmpfs,
    create_run_dirs,
    probe_lock,
    remove_leftover_run_dirs,
    remove_run_dirs,
)

log = logging.getLogger("workspace.compute.sandbox")

PROBE_UID = 65534  # nobody: the probes run the way a run does, under a non-root uid
PROBE_LIMITS = Limits(write_bytes=1 * MiB, write_files=64)
# the probe program: lists /proc (the shell alone is PID 1), writes its /tmp, and must fail
# to write the machine's root folder
PROBE_SCRIPT = (
    "echo /proc/[0-9]*; : > /tmp/probe || exit 3; "
    "if (: > /chainstate-probe) 2>/dev/null; then rm -f /chainstate-probe; exit 4; fi"
)


def default_work_root() -> Path:
    return Path(tempfile.gettempdir()) / "chainstate-sandbox"


@dataclass(frozen=True)
class Isolation:
    """What this machine lets the sandbox do, probed once at start."""

    network: str  # "netns" (root), "userns+netns" (unprivileged) or "none"
    drop_uid: bool  # runs get their own uid (needs root)
    cpu_cgroup: str | None  # parent cgroup folder used for max_cpu, or None
    cgroup_version: int | None
    notes: tuple[str, ...] = ()
    # "pidns" (bubblewrap: own PID namespace and /proc), "hidepid" (root: a private /proc
    # with hidepid=2, each run's own uid hides the rest) or "none"
    processes: str = "none"
    bwrap: str | None = None  # the bwrap binary when processes == "pidns"
    # "private": read-only root, private temp folders, only the run's folders writable;
    # "shared": the machine's files as the run's uid may use them
    filesystem: str = "shared"
    run_tmpfs: bool = False  # each run's folders are a tmpfs sized by its write budget

    @property
    def network_isolated(self) -> bool:
        return self.network != "none"

    @property
    def processes_isolated(self) -> bool:
        # hidepid hides only other uids: without a uid per run it hides nothing of ours
        return self.processes == "pidns" or (self.processes == "hidepid" and self.drop_uid)

    @property
    def filesystem_private(self) -> bool:
        return self.filesystem == "private"

    def as_dict(self) -> dict[str, Any]:
        return {
            "network": self.network,
            "network_isolated": self.network_isolated,
            "processes": self.processes,
            "processes_isolated": self.processes_isolated,
            "filesystem": self.filesystem,
            "filesystem_private": self.filesystem_private,
            "write_quota": "tmpfs" if self.run_tmpfs else "temp folders only",
            "per_run_uid": self.drop_uid,
            "cpu_quota": self.cpu_cgroup is not None,
            "notes": list(self.notes),
        }


def _probe_child(setup: Callable[[], None]) -> int:
    """Fork a throwaway child that runs `setup`; its exit code (0: it worked)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            setup()
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@contextlib.contextmanager
def _probe_dirs(work_root: Path, root: bool, tmpfs: bool) -> Any:
    work_root.mkdir(parents=True, exist_ok=True)
    work_root.chmod(0o711)
    uid = PROBE_UID if root else None
    dirs = create_run_dirs(work_root, uid, PROBE_LIMITS, tmpfs, slot=PROBE_SLOT)
    try:
        yield dirs
    finally:
        remove_run_dirs(dirs)


def _run_bwrap(argv: list[str], root: bool, network: str, cwd: str) -> str | None:
    def setup() -> None:
        if network == "netns":
            unshare(CLONE_NEWNET)
        if root:
            os.setgroups([])
            os.setgid(PROBE_UID)
            os.setuid(PROBE_UID)

    try:
        out = subprocess.run(
            argv, preexec_fn=setup, capture_output=True, timeout=10, cwd=cwd, env={}, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bwrap could not start: {exc}"
    if out.returncode in (3, 4):
        return "bwrap's file system view did not work (temp folder not writable or root writable)"
    if out.returncode != 0:
        return f"bwrap failed: {out.stderr.decode(errors='replace').strip()[:200]}"
    seen = out.stdout.split()
    if len(seen) > 1:  # the shell is PID 1 and alone
        return f"bwrap's PID namespace listed {len(seen)} processes"
    return None


def _probe_bwrap(
    bwrap: str, root: bool, network: str, work_root: Path, tmpfs: bool
) -> tuple[str | None, str | None]:
    """(why bwrap cannot give a PID namespace or None, why not a private file system or None):
    `sh` is started through bwrap the way runs start (network namespace first, then the
    probe uid, the run's file system view)."""
    path = shutil.which(bwrap)
    if path is None:
        return f"bubblewrap ({bwrap}) is not installed", "no bubblewrap"
    own_net = network == "userns+netns"
    with _probe_dirs(work_root, root, tmpfs) as dirs:
        view = dirs.view((), PROBE_LIMITS)
        argv = [*bwrap_argv(path, own_net, view), "/bin/sh", "-c", PROBE_SCRIPT]
        fs_why = _run_bwrap(argv, root, network, "/")
    if fs_why is None:
        return None, None
    argv = [*bwrap_argv(path, own_net, None), "/bin/sh", "-c", "echo /proc/[0-9]*"]
    return _run_bwrap(argv, root, network, "/"), fs_why


def _fallback_setup(dirs: RunDirs | None) -> Callable[[], None]:
    """In a throwaway child: the root fallback as runs get it (private mounts, the run's file
    system view when `dirs`, a hidepid=2 /proc, the probe uid); fails unless the parent
    (root) is hidden and, with `dirs`, the root folder is read-only."""

    def setup() -> None:
        parent = str(os.getppid())
        private_mounts()
        unshare(CLONE_NEWIPC)
        if dirs is not None:
            private_filesystem(dirs.view((), PROBE_LIMITS))
        hidepid_proc()
        os.setgroups([])
        os.setgid(PROBE_UID)
        os.setuid(PROBE_UID)
        if parent in os.listdir("/proc"):
            raise OSError(errno.EPERM, "hidepid=2 did not hide the server")
        if dirs is not None:
            try:
                os.close(os.open("/chainstate-probe", os.O_CREAT | os.O_WRONLY, 0o600))
            except OSError:
                return
            raise OSError(errno.EPERM, "the root folder stayed writable")

    return setup


def _probe_processes(
    bwrap: str | None, root: bool, network: str, work_root: Path, tmpfs: bool
) -> tuple[str, str | None, str, list[str]]:
    """(process mode, bwrap path, file system mode, notes): a PID namespace through bwrap
    when it works here; as root otherwise a private /proc with hidepid=2 (and the same file
    system view made with mount calls); else nothing, with the reasons."""
    notes: list[str] = []
    if bwrap:
        why, fs_why = _probe_bwrap(bwrap, root, network, work_root, tmpfs)
    else:
        why, fs_why = "bwrap disabled by configuration", "no bubblewrap"
    if why is None:
        if fs_why is not None:
            notes.append(f"file system not private ({fs_why}): runs share /tmp and may write")
        return "pidns", shutil.which(bwrap or ""), "shared" if fs_why else "private", notes
    if root:
        with _probe_dirs(work_root, root, tmpfs) as dirs:
            fs_ok = _probe_child(_fallback_setup(dirs)) == 0
        if fs_ok or _probe_child(_fallback_setup(None)) == 0:
            notes.append(
                f"no PID namespace ({why}): runs get a private /proc with hidepid=2 instead"
            )
            if not fs_ok:
                notes.append("file system not private: runs share /tmp and the host's files")
            return "hidepid", None, "private" if fs_ok else "shared", notes
    notes.append(
        f"process isolation unavailable ({why}): runs can list every process and command line"
    )
    notes.append("file system not private: runs share /tmp and may write the host's files")
    return "none", None, "shared", notes


def _probe_cgroup() -> tuple[str | None, int | None, str]:
    """Find a writable cpu controller (v2 unified root or v1 `cpu` hierarchy)."""
    v2 = Path("/sys/fs/cgroup")
    candidates: list[tuple[Path, int, str]] = []
    if (v2 / "cgroup.controllers").exists() and "cpu" in (v2 / "cgroup.controllers").read_text():
        candidates.append((v2, 2, "cpu.max"))
    candidates.append((v2 / "cpu", 1, "cpu.cfs_quota_us"))
    why = "no cpu cgroup controller found"
    for root, version, knob in candidates:
        if not root.is_dir():
            continue
        _remove_stale_cgroups(root)
        folder = root / f"chainstate-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # one per probe
        try:
            folder.mkdir()
            if version == 2:
                with contextlib.suppress(OSError):
                    (v2 / "cgroup.subtree_control").write_text("+cpu")
                    (folder / "cgroup.subtree_control").write_text("+cpu")
            if (folder / knob).exists():
                return str(folder), version, f"cpu quota through cgroup v{version} at {folder}"
            why = f"cgroup v{version} at {root} has no {knob}"
        except OSError as exc:
            why = f"cgroup v{version} cpu not writable: {exc.strerror}"
        with contextlib.suppress(OSError):
            folder.rmdir()
    return None, None, why


def _remove_stale_cgroups(root: Path) -> None:
    """Remove empty cgroup folders left by servers that died (kill -9) before cleaning up."""
    for folder in root.glob("chainstate-*"):
        pid = folder.name.split("-")[1]
        if not pid.isdigit() or psutil.pid_exists(int(pid)):
            continue
        for child in folder.glob("run-*"):
            with contextlib.suppress(OSError):
                child.rmdir()
        with contextlib.suppress(OSError):
            folder.rmdir()


def probe_isolation(
    use_cgroups: bool = True, bwrap: str | None = "bwrap", work_root: Path | None = None
) -> Isolation:
    """Detect network and PID namespaces, the private file system, a tmpfs per run, uid
    dropping and the cpu cgroup once; log the outcome. `bwrap`: the bubblewrap binary (None:
    do not use it); `work_root`: where run folders go (the tmpfs probe mounts there)."""
    work_root = work_root or default_work_root()
    notes: list[str] = []
    root = os.geteuid() == 0
    if root and _probe_child(lambda: unshare(CLONE_NEWNET)) == 0:
        network = "netns"
    elif _probe_child(lambda: unshare(CLONE_NEWUSER | CLONE_NEWNET)) == 0:
        network = "userns+netns"
    else:
        network = "none"
        notes.append("network namespaces unavailable: user code can reach the network")
    if not root:
        notes.append("not root: runs share this user's uid and RLIMIT_NPROC budget")
    with probe_lock(work_root):
        if root:  # per-probe folders of the older layout that a killed probe left mounted
            remove_leftover_run_dirs(work_root, range(PROBE_UID, PROBE_UID + 1), keep=False)
        tmpfs_why = can_mount_tmpfs(work_root)
        processes, bwrap_path, filesystem, more = _probe_processes(
            bwrap, root, network, work_root, tmpfs_why is None
        )
    notes += more
    if tmpfs_why is not None:
        notes.append(
            f"no tmpfs per run ({tmpfs_why}): write_bytes bounds each temp folder, and the "
            "run's own folder only per file (file_size_bytes); write_files is not enforced"
        )
    cgroup, version, note = _probe_cgroup() if use_cgroups else (None, None, "cgroups disabled")
    if cgroup is None:
        notes.append(f"max_cpu not enforced: {note}")
    iso = Isolation(
        network,
        root,
        cgroup,
        version,
        tuple(notes),
        processes,
        bwrap_path,
        filesystem,
        tmpfs_why is None,
    )
    level = logging.WARNING if notes else logging.INFO
    log.log(level, "sandbox isolation probed", extra={"isolation": iso.as_dict()})
    return iso


def release_isolation(iso: Isolation) -> None:
    """Remove the parent cgroup folder created by the probe (empty by then)."""
    if iso.cpu_cgroup:
        with contextlib.suppress(OSError):
            Path(iso.cpu_cgroup).rmdir()

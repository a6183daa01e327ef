"""Starting runs: a job's files placed in its own folders, then the program spawned with a
clean environment, its uid, namespaces, cgroup and rlimits; cleaned up once it has ended.

The child's set-up between fork and exec (`Sandbox._preexec`) runs in this order: own
session, cgroup, network namespace, (root) own mount namespace with the job's binds and, in
the root fallback without bubblewrap, the run's file system view and a hidepid /proc; then
the run's uid, the parent-death signal and, last, the rlimits.
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import signal
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from workspace.compute.sandbox.limits import KiB, Limits, apply_rlimits, nproc_budget
from workspace.compute.sandbox.namespaces import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWUSER,
    LIBC,
    PR_SET_PDEATHSIG,
    FsView,
    bind_into,
    bwrap_argv,
    hidepid_proc,
    private_filesystem,
    private_mounts,
    unshare,
)
from workspace.compute.sandbox.probe import Isolation, default_work_root
from workspace.compute.sandbox.process import RunResult, SandboxProcess
from workspace.compute.sandbox.rundirs import RunDirs, create_run_dirs, remove_run_dirs
from workspace.compute.sandbox.uids import kill_run_processes

RESULT_FD_ENV = "CHAINSTATE_RESULT_FD"
# bwrap's own process (it waits for the run's program) counts against the run's RLIMIT_NPROC;
# it is added so the run keeps its documented budget
WRAPPER_PROCESSES = 1


@dataclass
class Job:
    """One process to run: argv, files to place in its home, extra environment."""

    argv: list[str]
    files: Mapping[str, bytes | str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    subdir: str | None = None  # working directory inside the home
    executables: tuple[str, ...] = ()  # files made executable (mode 0755)
    # host folders the run may write, as folder name in its home -> host path (the Go build
    # cache); the run's uid need not be able to reach the host path itself
    binds: Mapping[str, Path] = field(default_factory=dict)


def _check_traversable(path: Path) -> None:
    """Runs use other uids: every existing ancestor of the work root must be searchable."""
    for folder in [path, *path.parents]:
        if folder.exists() and not folder.stat().st_mode & 0o001:
            raise ValueError(f"sandbox work root {path}: {folder} is not searchable by others")


def _place_files(
    home: Path, files: Mapping[str, bytes | str], uid: int | None, executables: tuple[str, ...]
) -> None:
    """Write the job's files into the run's home, owned by the run's uid."""
    for name, content in files.items():
        target = home / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content.encode() if isinstance(content, str) else content)
        if name in executables:
            target.chmod(0o755)
    if uid is not None:
        for path in home.rglob("*"):
            os.chown(path, uid, uid)


def _require_program(name: str, cwd: Path, path: str) -> None:
    """bwrap reports a missing program only through its exit status: fail as exec would."""
    found = (cwd / name).is_file() if "/" in name else shutil.which(name, path=path) is not None
    if not found:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name)


class Sandbox:
    """Spawns isolated runs. One per server; `isolation` says what is enforced."""

    def __init__(
        self,
        isolation: Isolation,
        work_root: Path | None = None,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self.isolation = isolation
        self.work_root = Path(work_root or default_work_root())
        self.base_env = dict(base_env or {"PATH": "/usr/local/bin:/usr/bin:/bin"})
        self.exposed: list[Path] = []  # host paths every run sees read-only (the SDK socket)
        if isolation.drop_uid:
            _check_traversable(self.work_root)

    def expose(self, path: Path) -> None:
        """Let every later run reach `path` (read-only, at the same path)."""
        if path not in self.exposed:
            self.exposed.append(path)

    async def start(
        self,
        job: Job,
        uid: int | None = None,
        on_output: Callable[[bytes], None] | None = None,
    ) -> SandboxProcess:
        """Create the run's folders, write the job's files and spawn the process."""
        iso = self.isolation
        uid = uid if iso.drop_uid else None
        if not self.work_root.is_dir():
            self.work_root.mkdir(parents=True, exist_ok=True)
            self.work_root.chmod(0o711)  # each run's uid must reach its own folder
        dirs = await asyncio.to_thread(
            create_run_dirs, self.work_root, uid, job.limits, iso.run_tmpfs
        )
        try:
            return await self._spawn(job, dirs, uid, on_output)
        except BaseException:
            await asyncio.to_thread(remove_run_dirs, dirs)
            raise

    async def _spawn(
        self,
        job: Job,
        dirs: RunDirs,
        uid: int | None,
        on_output: Callable[[bytes], None] | None,
    ) -> SandboxProcess:
        iso = self.isolation
        home = dirs.home
        cwd = home / job.subdir if job.subdir else home
        binds = tuple((src, home / name) for name, src in job.binds.items())
        _place_files(home, job.files, uid, job.executables)
        view: FsView | None = None
        if iso.filesystem_private:
            view = dirs.view(tuple(self.exposed), job.limits, () if iso.drop_uid else binds)
        elif binds and not iso.drop_uid:  # no namespaces to bind in: link to the host path
            for src, dest in binds:
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.symlink_to(src)
        cgroup = self._make_cgroup(job.limits.cpu_percent)
        r_fd, w_fd = os.pipe()
        env = {
            **self.base_env,
            "HOME": str(home),
            "TMPDIR": "/tmp" if view is not None else str(home),
            "LANG": "C.UTF-8",
            RESULT_FD_ENV: str(w_fd),
            **job.env,
        }
        argv, wrappers = list(job.argv), 0
        if iso.processes == "pidns" and iso.bwrap:
            _require_program(argv[0], cwd, env.get("PATH", os.defpath))
            argv = [*bwrap_argv(iso.bwrap, iso.network == "userns+netns", view, cwd), *argv]
            wrappers = WRAPPER_PROCESSES
        nproc = nproc_budget(uid, job.limits.processes)
        setup = self._preexec(
            job.limits,
            uid,
            cgroup,
            None if nproc is None else nproc + wrappers,
            binds if iso.drop_uid else (),
            view if iso.processes == "hidepid" else None,
            cwd,
        )
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=cwd,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                pass_fds=(w_fd,),
                preexec_fn=setup,
                limit=64 * KiB,
            )
        finally:
            os.close(w_fd)
        reader = asyncio.StreamReader(limit=64 * KiB)
        loop = asyncio.get_running_loop()
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(r_fd, "rb", 0)
        )
        return SandboxProcess(proc, job.limits, dirs, uid, cgroup, reader, on_output, wrappers)

    async def run(self, job: Job, uid: int | None = None) -> RunResult:
        """Start, wait (wall clock enforced) and clean up one run."""
        sp = await self.start(job, uid)
        try:
            return await sp.wait()
        finally:
            await self.cleanup(sp)

    async def cleanup(self, sp: SandboxProcess) -> None:
        """Remove the run's folders and cgroup once it has ended (off the event loop)."""
        await asyncio.to_thread(kill_run_processes, sp.pid, sp.uid, sp.created)
        await asyncio.to_thread(remove_run_dirs, sp.dirs)
        if sp.cgroup is not None:
            for _ in range(50):  # the kernel may need a moment after the last exit
                try:
                    sp.cgroup.rmdir()
                    break
                except OSError:
                    await asyncio.sleep(0.02)

    def _make_cgroup(self, cpu_percent: int | None) -> Path | None:
        if cpu_percent is None or self.isolation.cpu_cgroup is None:
            return None
        folder = Path(self.isolation.cpu_cgroup) / f"run-{uuid.uuid4().hex[:12]}"
        folder.mkdir()
        period = 100_000
        quota = max(1000, cpu_percent * period // 100)
        if self.isolation.cgroup_version == 2:
            (folder / "cpu.max").write_text(f"{quota} {period}")
        else:
            (folder / "cpu.cfs_period_us").write_text(str(period))
            (folder / "cpu.cfs_quota_us").write_text(str(quota))
        return folder

    def _preexec(
        self,
        limits: Limits,
        uid: int | None,
        cgroup: Path | None,
        nproc: int | None,
        binds: tuple[tuple[Path, Path], ...],
        fallback_view: FsView | None,
        cwd: Path,
    ) -> Callable[[], None]:
        network = self.isolation.network
        processes = self.isolation.processes
        if processes == "pidns" and network == "userns+netns":
            network = "bwrap"  # bwrap makes the user and network namespaces itself
        own_mounts = bool(binds) or processes == "hidepid"

        def setup() -> None:  # runs in the child between fork and exec
            os.setsid()
            if cgroup is not None:
                with open(cgroup / "cgroup.procs", "w") as fh:
                    fh.write(str(os.getpid()))
            if network == "netns":
                unshare(CLONE_NEWNET)
            elif network == "userns+netns":
                unshare(CLONE_NEWUSER | CLONE_NEWNET)
            if own_mounts:  # as root, before the uid: nothing here reaches the host
                private_mounts()
                bind_into(binds)
            if processes == "hidepid":
                unshare(CLONE_NEWIPC)
                if fallback_view is not None:
                    private_filesystem(fallback_view, cwd)
                hidepid_proc()  # before the uid it hides the rest from
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # dies with the server
            apply_rlimits(limits, nproc)  # last: nothing above may need a new fd or process

        return setup

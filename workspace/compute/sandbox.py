"""Isolated subprocess runs for user code (Functions and Notebook instances).

Every run is a subprocess with a clean environment, its own temp dir (removed afterwards),
rlimits (CPU seconds, data memory, file size, open files, processes), a wall-clock limit,
output captured while streaming with a cap, the network off through a new network
namespace, and the machine's other processes out of sight: a new PID namespace with its own
/proc through bubblewrap, or (root without a working bwrap) a private /proc mounted with
hidepid=2. What the machine allows is probed once at start (`probe_isolation`) and reported;
a missing isolation feature is logged as a warning and shown in `Isolation.as_dict()`, never
skipped silently. When running as root each concurrent run gets its own unprivileged uid, so
`RLIMIT_NPROC` bounds a fork bomb and every leftover process of a run can be swept by uid.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

log = logging.getLogger("workspace.compute.sandbox")

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REC = 0x4000
MS_PRIVATE = 0x40000
PR_SET_PDEATHSIG = 1
RESULT_FD_ENV = "CHAINSTATE_RESULT_FD"
PROBE_UID = 65534  # nobody: the probe runs bwrap the way a run does, under a non-root uid
# bwrap's own process (it waits for the run's program) counts against the run's RLIMIT_NPROC;
# it is added so the run keeps its documented budget
WRAPPER_PROCESSES = 1


@dataclass(frozen=True)
class Limits:
    """Per-run limits; every field is a documented setting (docs/compute.md)."""

    wall_seconds: float = 10.0  # wall clock from spawn to kill
    cpu_seconds: int = 20  # RLIMIT_CPU, all threads (SIGXCPU, then SIGKILL a second later)
    memory_bytes: int = 512 * MiB  # RLIMIT_DATA: heap/anonymous memory (Go/Node start fine)
    file_size_bytes: int = 16 * MiB  # RLIMIT_FSIZE: largest file the run may write
    open_files: int = 256  # RLIMIT_NOFILE
    processes: int = 64  # RLIMIT_NPROC for the run's own uid (threads count too)
    output_bytes: int = 256 * KiB  # stdout+stderr kept in the record
    output_hard_bytes: int | None = 16 * MiB  # more than this in total kills the run
    result_bytes: int = 8 * MiB  # largest JSON result accepted on the result fd
    cpu_percent: int | None = None  # 100 = one vCPU; enforced through a cpu cgroup


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

    @property
    def network_isolated(self) -> bool:
        return self.network != "none"

    @property
    def processes_isolated(self) -> bool:
        # hidepid hides only other uids: without a uid per run it hides nothing of ours
        return self.processes == "pidns" or (self.processes == "hidepid" and self.drop_uid)

    def as_dict(self) -> dict[str, Any]:
        return {
            "network": self.network,
            "network_isolated": self.network_isolated,
            "processes": self.processes,
            "processes_isolated": self.processes_isolated,
            "per_run_uid": self.drop_uid,
            "cpu_quota": self.cpu_cgroup is not None,
            "notes": list(self.notes),
        }


@dataclass
class Job:
    """One process to run: argv, files to place in its temp dir, extra environment."""

    argv: list[str]
    files: Mapping[str, bytes | str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    subdir: str | None = None  # working directory inside the temp dir
    executables: tuple[str, ...] = ()  # files made executable (mode 0755)


@dataclass
class RunResult:
    """What happened to one run, in the sandbox's terms (the record builder maps it)."""

    exit_code: int | None
    signal: int | None
    reason: str | None  # timeout | output_limit | canceled | memory_watchdog | None
    output: bytes
    output_size: int
    output_truncated: bool
    result: bytes | None
    result_too_large: bool
    started_at: float
    finished_at: float
    duration_ms: int
    queue_wait_ms: int = 0


# Loaded once here: find_library may spawn a process, which a forked child must not do.
LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _unshare(flags: int) -> None:
    if LIBC.unshare(flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None
) -> None:
    def enc(value: str | None) -> bytes | None:
        return None if value is None else value.encode()

    if LIBC.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _private_proc() -> None:
    """A private mount namespace whose /proc lists only the processes of the caller's uid
    (needs root; each run's own uid then hides every other process of the machine)."""
    _unshare(CLONE_NEWNS)
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None)  # nothing leaks back to the host
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")


def _bwrap_argv(bwrap: str, own_network: bool) -> list[str]:
    """bwrap's options for a run: its own user, PID and mount namespaces with a fresh /proc
    (only the run's processes) and a minimal /dev; the host's files otherwise as they are
    (the run's uid and folder modes guard them). `own_network`: bwrap makes the network
    namespace too (when the server is not root and cannot make one before bwrap's).

    `--as-pid-1`: the program is the namespace's PID 1 and bwrap waits for it itself. With
    bwrap's own init instead, bwrap exits without reaping that init, which is left a zombie
    for the machine's PID 1: slow to go on some hosts, never in a container whose PID 1 is
    this server, and counted against the run uid's RLIMIT_NPROC until then."""
    argv = [bwrap, "--unshare-user", "--unshare-pid", "--as-pid-1", "--disable-userns"]
    argv.append("--die-with-parent")
    argv += ["--bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    if own_network:
        argv.append("--unshare-net")
    return [*argv, "--"]


def _probe_child(setup: Callable[[], None]) -> bool:
    """Fork a throwaway child that runs `setup` (e.g. an unshare); True when it worked."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            setup()
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def _probe_bwrap(bwrap: str, root: bool, network: str) -> str | None:
    """Start `sh` through bwrap the way runs start (network namespace first, then the probe
    uid); None when it saw only its own PID namespace, otherwise why not."""
    path = shutil.which(bwrap)
    if path is None:
        return f"bubblewrap ({bwrap}) is not installed"

    def setup() -> None:
        if network == "netns":
            _unshare(CLONE_NEWNET)
        if root:
            os.setgroups([])
            os.setgid(PROBE_UID)
            os.setuid(PROBE_UID)

    argv = [*_bwrap_argv(path, network == "userns+netns"), "/bin/sh", "-c", "echo /proc/[0-9]*"]
    try:
        out = subprocess.run(
            argv, preexec_fn=setup, capture_output=True, timeout=10, cwd="/", env={}, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bwrap could not start: {exc}"
    if out.returncode != 0:
        return f"bwrap failed: {out.stderr.decode(errors='replace').strip()[:200]}"
    seen = out.stdout.split()
    if len(seen) > 1:  # the shell is PID 1 and alone
        return f"bwrap's PID namespace listed {len(seen)} processes"
    return None


def _hidepid_works() -> None:
    """In a throwaway child: mount the private /proc, drop to the probe uid, and check that
    the parent (root) is no longer listed."""
    parent = str(os.getppid())
    _private_proc()
    os.setgroups([])
    os.setgid(PROBE_UID)
    os.setuid(PROBE_UID)
    if parent in os.listdir("/proc"):
        raise OSError(errno.EPERM, "hidepid=2 did not hide the server")


def _probe_processes(
    bwrap: str | None, root: bool, network: str
) -> tuple[str, str | None, str | None]:
    """(mode, bwrap path, note): a PID namespace through bwrap when it works here; as root
    otherwise a private /proc with hidepid=2; else nothing, with the reason."""
    why = _probe_bwrap(bwrap, root, network) if bwrap else "bwrap disabled by configuration"
    if why is None:
        return "pidns", shutil.which(bwrap or ""), None
    if root and _probe_child(_hidepid_works):
        note = f"no PID namespace ({why}): runs get a private /proc with hidepid=2 instead"
        return "hidepid", None, note
    note = f"process isolation unavailable ({why}): runs can list every process and command line"
    return "none", None, note


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


def probe_isolation(use_cgroups: bool = True, bwrap: str | None = "bwrap") -> Isolation:
    """Detect network and PID namespaces, uid dropping and the cpu cgroup once; log the
    outcome. `bwrap`: the bubblewrap binary (None: do not use it)."""
    notes: list[str] = []
    root = os.geteuid() == 0
    if root and _probe_child(lambda: _unshare(CLONE_NEWNET)):
        network = "netns"
    elif _probe_child(lambda: _unshare(CLONE_NEWUSER | CLONE_NEWNET)):
        network = "userns+netns"
    else:
        network = "none"
        notes.append("network namespaces unavailable: user code can reach the network")
    if not root:
        notes.append("not root: runs share this user's uid and RLIMIT_NPROC budget")
    processes, bwrap_path, note = _probe_processes(bwrap, root, network)
    if note:
        notes.append(note)
    cgroup, version, note = _probe_cgroup() if use_cgroups else (None, None, "cgroups disabled")
    if cgroup is None:
        notes.append(f"max_cpu not enforced: {note}")
    iso = Isolation(network, root, cgroup, version, tuple(notes), processes, bwrap_path)
    level = logging.WARNING if notes else logging.INFO
    log.log(level, "sandbox isolation probed", extra={"isolation": iso.as_dict()})
    return iso


def release_isolation(iso: Isolation) -> None:
    """Remove the parent cgroup folder created by the probe (empty by then)."""
    if iso.cpu_cgroup:
        with contextlib.suppress(OSError):
            Path(iso.cpu_cgroup).rmdir()


class UidPool:
    """Unprivileged uids handed to concurrent runs, one each, so runs never share one."""

    def __init__(self, base: int, count: int) -> None:
        self._free = list(range(base, base + count))

    def acquire(self) -> int:
        if not self._free:
            raise RuntimeError("no free sandbox uid")
        return self._free.pop(0)

    def release(self, uid: int) -> None:
        self._free.append(uid)


class SandboxProcess:
    """A spawned run: streams output to a callback, keeps a capped copy, can be killed."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        job: Job,
        workdir: Path,
        uid: int | None,
        cgroup: Path | None,
        result_reader: asyncio.StreamReader,
        on_output: Callable[[bytes], None] | None,
        wrappers: int = 0,
    ) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.job = job
        self.workdir = workdir
        self.uid = uid
        self.cgroup = cgroup
        self.wrappers = wrappers  # bwrap's processes in front of the user's program
        self.started_at = time.time()
        self._t0 = time.monotonic()
        self._result_reader = result_reader
        self._on_output = on_output
        self._kept = bytearray()
        self._size = 0
        self.reason: str | None = None
        self._out_task = asyncio.ensure_future(self._pump_output())
        self._res_task = asyncio.ensure_future(self._read_result())

    async def _pump_output(self) -> None:
        assert self.proc.stdout is not None
        limits = self.job.limits
        while chunk := await self.proc.stdout.read(64 * KiB):
            self._size += len(chunk)
            room = limits.output_bytes - len(self._kept)
            if room > 0:
                self._kept += chunk[:room]
            if self._on_output is not None:
                self._on_output(chunk)
            if limits.output_hard_bytes is not None and self._size > limits.output_hard_bytes:
                self.kill("output_limit")

    async def _read_result(self) -> tuple[bytes | None, bool]:
        cap = self.job.limits.result_bytes
        data = bytearray()
        while chunk := await self._result_reader.read(64 * KiB):
            if len(data) + len(chunk) > cap:
                # the writer would block on the full pipe until the wall clock: end it now
                self.kill("result_too_large")
                return None, True
            data += chunk
        return (bytes(data) if data else None), False

    def processes(self) -> list[psutil.Process]:
        """The run's live processes: the user's program and every descendant (bwrap's own
        process, the first one, left out)."""
        try:
            main = psutil.Process(self.pid)
            return [main, *main.children(recursive=True)][self.wrappers :]
        except psutil.Error:
            return []

    def kill(self, reason: str) -> None:
        """Kill the run and everything it started; the first reason given is kept."""
        if self.reason is None:
            self.reason = reason
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        _sweep(self.pid, self.uid)

    async def wait(self, wall_seconds: float | None = None) -> RunResult:
        """Wait for exit (killing at the wall clock), then collect output and result."""
        limit = self.job.limits.wall_seconds if wall_seconds is None else wall_seconds
        try:
            await asyncio.wait_for(self.proc.wait(), timeout=limit)
        except TimeoutError:
            self.kill("timeout")
            await self.proc.wait()
        except asyncio.CancelledError:
            self.kill("canceled")
            await asyncio.shield(self.proc.wait())
            raise
        _sweep(self.pid, self.uid)  # leftovers (daemonized children) die with the run
        finished = time.time()
        duration_ms = int((time.monotonic() - self._t0) * 1000)
        for task in (self._out_task, self._res_task):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), timeout=2.0)
        result, too_large = self._res_task.result() if self._res_task.done() else (None, False)
        self._out_task.cancel()
        self._res_task.cancel()
        code = self.proc.returncode
        if self.wrappers and code is not None and code - 128 in _SIGNALS:
            code = 128 - code  # bwrap exits 128 + n when the program died of signal n
        return RunResult(
            exit_code=code if code is not None and code >= 0 else None,
            signal=-code if code is not None and code < 0 else None,
            reason=self.reason,
            output=bytes(self._kept),
            output_size=self._size,
            output_truncated=self._size > len(self._kept),
            result=result,
            result_too_large=too_large,
            started_at=self.started_at,
            finished_at=finished,
            duration_ms=duration_ms,
        )


_SIGNALS = frozenset(int(s) for s in signal.valid_signals())


def _sweep(pid: int, uid: int | None) -> None:
    """SIGKILL the process tree and, with a private uid, every process of that uid."""
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
    if uid is None:
        return
    for _ in range(20):  # a fork bomb keeps forking while we kill; repeat until none remain
        found = False
        for p in psutil.process_iter(["uids"]):
            uids = p.info.get("uids")
            if uids is not None and uids.real == uid:
                found = True
                with contextlib.suppress(psutil.Error):
                    p.kill()
        if not found:
            return


def _check_traversable(path: Path) -> None:
    """Runs use other uids: every existing ancestor of the work root must be searchable."""
    for folder in [path, *path.parents]:
        if folder.exists() and not folder.stat().st_mode & 0o001:
            raise ValueError(f"sandbox work root {path}: {folder} is not searchable by others")


def _prepare_workdir(
    workdir: Path, files: Mapping[str, bytes | str], uid: int | None, executables: tuple[str, ...]
) -> None:
    """Write the job's files and hand the folder to the run's uid."""
    for name, content in files.items():
        target = workdir / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content.encode() if isinstance(content, str) else content)
        if name in executables:
            target.chmod(0o755)
    if uid is not None:
        for path in [workdir, *workdir.rglob("*")]:
            os.chown(path, uid, uid)
        workdir.chmod(0o700)


class Sandbox:
    """Spawns isolated runs. One per server; `isolation` says what is enforced."""

    def __init__(
        self,
        isolation: Isolation,
        work_root: Path | None = None,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self.isolation = isolation
        self.work_root = Path(work_root or Path(tempfile.gettempdir()) / "chainstate-sandbox")
        self.base_env = dict(base_env or {"PATH": "/usr/local/bin:/usr/bin:/bin"})
        if isolation.drop_uid:
            _check_traversable(self.work_root)

    async def start(
        self,
        job: Job,
        uid: int | None = None,
        on_output: Callable[[bytes], None] | None = None,
    ) -> SandboxProcess:
        """Create the temp dir, write the job's files and spawn the process."""
        uid = uid if self.isolation.drop_uid else None
        if not self.work_root.is_dir():
            self.work_root.mkdir(parents=True, exist_ok=True)
            self.work_root.chmod(0o711)  # each run's uid must reach its own folder
        workdir = Path(tempfile.mkdtemp(prefix="run-", dir=self.work_root))
        cwd = workdir / job.subdir if job.subdir else workdir
        argv, wrappers = list(job.argv), 0
        try:
            _prepare_workdir(workdir, job.files, uid, job.executables)
            cgroup = self._make_cgroup(job.limits.cpu_percent)
            r_fd, w_fd = os.pipe()
            env = {
                **self.base_env,
                "HOME": str(workdir),
                "TMPDIR": str(workdir),
                "LANG": "C.UTF-8",
                RESULT_FD_ENV: str(w_fd),
                **job.env,
            }
            iso = self.isolation
            if iso.processes == "pidns" and iso.bwrap:
                _require_program(argv[0], cwd, env.get("PATH", os.defpath))
                argv = [*_bwrap_argv(iso.bwrap, iso.network == "userns+netns"), *argv]
                wrappers = WRAPPER_PROCESSES
            nproc = _nproc_budget(uid, job)
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    cwd=cwd,
                    env=env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                    pass_fds=(w_fd,),
                    preexec_fn=self._preexec(
                        job.limits, uid, cgroup, None if nproc is None else nproc + wrappers
                    ),
                    limit=64 * KiB,
                )
            finally:
                os.close(w_fd)
            reader = asyncio.StreamReader(limit=64 * KiB)
            loop = asyncio.get_running_loop()
            await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(r_fd, "rb", 0)
            )
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        return SandboxProcess(proc, job, workdir, uid, cgroup, reader, on_output, wrappers)

    async def run(self, job: Job, uid: int | None = None) -> RunResult:
        """Start, wait (wall clock enforced) and clean up one run."""
        sp = await self.start(job, uid)
        try:
            return await sp.wait()
        finally:
            await self.cleanup(sp)

    async def cleanup(self, sp: SandboxProcess) -> None:
        """Remove the run's temp dir and cgroup once it has ended (off the event loop)."""
        await asyncio.to_thread(_sweep, sp.pid, sp.uid)
        await asyncio.to_thread(shutil.rmtree, sp.workdir, True)
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
        self, limits: Limits, uid: int | None, cgroup: Path | None, nproc: int | None
    ) -> Callable[[], None]:
        network = self.isolation.network
        processes = self.isolation.processes
        if processes == "pidns" and network == "userns+netns":
            network = "bwrap"  # bwrap makes the user and network namespaces itself

        def setup() -> None:  # runs in the child between fork and exec
            os.setsid()
            if cgroup is not None:
                with open(cgroup / "cgroup.procs", "w") as fh:
                    fh.write(str(os.getpid()))
            if network == "netns":
                _unshare(CLONE_NEWNET)
            elif network == "userns+netns":
                _unshare(CLONE_NEWUSER | CLONE_NEWNET)
            if processes == "hidepid":
                _private_proc()  # as root, before the uid it hides the rest from
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # dies with the server
            # limits last: nothing above may need a new fd or process once they apply
            cpu = max(1, int(limits.cpu_seconds))
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
            resource.setrlimit(resource.RLIMIT_DATA, (limits.memory_bytes, limits.memory_bytes))
            size = limits.file_size_bytes
            resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
            resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            if nproc is not None:
                resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))

        return setup


def _require_program(name: str, cwd: Path, path: str) -> None:
    """bwrap reports a missing program only through its exit status: fail as exec would."""
    found = (cwd / name).is_file() if "/" in name else shutil.which(name, path=path) is not None
    if not found:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name)


def _nproc_budget(uid: int | None, job: Job) -> int | None:
    """RLIMIT_NPROC for a run. With its own uid: the run's limit. Sharing the server's
    (non-root) uid, the limit counts every process of that user, so the budget is what the
    user runs now plus the run's limit. Root without a uid of its own: not enforceable."""
    if uid is not None:
        return job.limits.processes
    if os.geteuid() == 0:
        return None
    me = os.getuid()
    mine = 0
    for p in psutil.process_iter(["uids", "num_threads"]):
        ids = p.info.get("uids")
        if ids is not None and ids.real == me:
            mine += p.info.get("num_threads") or 1
    return mine + job.limits.processes


def sweep_uids(uids: range) -> int:
    """Kill processes left by a previous server in the sandbox uid range; returns the count."""
    killed = 0
    for p in psutil.process_iter(["uids"]):
        ids = p.info.get("uids")
        if ids is not None and ids.real in uids:
            with contextlib.suppress(psutil.Error):
                p.kill()
                killed += 1
    return killed


class QueueFull(Exception):
    """More runs are waiting than the pool's queue allows."""


class WorkerPool:
    """Bounds concurrent runs and measures how long each waited for a slot."""

    def __init__(self, workers: int, max_queue: int, uids: UidPool) -> None:
        self.workers = workers
        self.max_queue = max_queue
        self._sem = asyncio.Semaphore(workers)
        self._uids = uids
        self.waiting = 0
        self.running = 0

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[tuple[int, int]]:
        """Yield (uid, queue_wait_ms); raise QueueFull when too many are waiting."""
        if self._sem.locked() and self.waiting >= self.max_queue:
            raise QueueFull(f"{self.waiting} runs already waiting for a worker")
        t0 = time.monotonic()
        self.waiting += 1
        try:
            await self._sem.acquire()
        finally:
            self.waiting -= 1
        wait_ms = int((time.monotonic() - t0) * 1000)
        uid = self._uids.acquire()
        self.running += 1
        try:
            yield uid, wait_ms
        finally:
            self.running -= 1
            self._uids.release(uid)
            self._sem.release()

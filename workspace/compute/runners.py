"""Language runners: turn (language, code, entry, positional args) into an `Outcome`.

python, javascript and go run in the sandbox through a small harness per language that calls
the entry function and writes one JSON document to a dedicated fd; sql runs in process through
the data API's read-only query guard (an injected `SqlExecutor`). Go code is compiled once per
code hash into a cache, sharing one GOCACHE so repeat builds are fast.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import sys
import sysconfig
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workspace.compute.sandbox import (
    GiB,
    Job,
    Limits,
    MiB,
    QueueFull,
    RunResult,
    Sandbox,
    WorkerPool,
)
from workspace.compute.sandbox.uids import ensure_owner
from workspace.http import json_shape

log = logging.getLogger("workspace.compute.runners")
PROBE_AGAIN = 5.0  # seconds between probes for a Python interpreter while none has passed

RUNTIME_DIR = Path(__file__).resolve().parent / "runtime"
LANGUAGES = ("python", "go", "javascript", "sql")
DEFAULT_ENTRY = {"python": "main", "javascript": "main", "go": "Main", "sql": ""}
IDENTIFIER = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$]{0,127}$")

GO_CACHE_IN_HOME = ".cache/go-build"
# The whole Go environment of a build: no go.work (GOWORK=off), no env file (GOENV=off), no
# network, no cgo, this machine's toolchain; the run's clean environment adds nothing else.
GO_BUILD_ENV = {
    "GOWORK": "off",
    "GOENV": "off",
    "GOFLAGS": "-mod=mod",
    "GOPROXY": "off",
    "GOSUMDB": "off",
    "GOTOOLCHAIN": "local",
    "GOTELEMETRY": "off",
    "CGO_ENABLED": "0",
}

# failure code -> retryable
FAILURE_CODES: dict[str, bool] = {
    "exception": False,
    "compile_error": False,
    "entry_not_found": False,
    "bad_arguments": False,
    "bad_return": False,
    "memory_limit": False,
    "output_limit": False,
    "result_too_large": False,
    "cpu_limit": False,
    "timeout": True,
    "crashed": False,
    "queue_full": True,
    "unsupported": False,
    "internal": True,
}


class SqlError(Exception):
    """A SQL Function that the guard rejected or the database failed; shown in the record."""


class SqlTimeout(SqlError):
    """A SQL Function that ran past its time limit (a `timeout` record)."""


class SqlResultTooLarge(SqlError):
    """A SQL Function whose result passed `function_result_bytes` while it was fetched."""


SqlExecutor = Callable[[str, list[Any]], Awaitable[Any]]
"""(sql, positional args) -> JSON value; bound to the caller's account by the endpoint."""


@dataclass
class Outcome:
    """The language-independent result of one execution (the record builder's input)."""

    status: str  # succeeded | failed | timeout
    return_value: Any = None
    failure: dict[str, Any] | None = None
    error_stack: str = ""
    local_vars: dict[str, Any] = field(default_factory=dict)
    text: str = ""
    truncated: bool = False
    original_size_bytes: int = 0
    execution_duration_ms: int = 0
    queue_wait_ms: int = 0
    started_at: float | None = None
    finished_at: float | None = None

    @classmethod
    def failed(cls, code: str, message: str, status: str = "failed", **kw: Any) -> Outcome:
        failure = {"code": code, "message": message, "retryable": FAILURE_CODES.get(code, False)}
        return cls(status=status, failure=failure, **kw)


@dataclass(frozen=True)
class RunnerSettings:
    """Tools and limits for Function runs (see docs/compute.md for defaults)."""

    python: str = sys.executable
    node: str = "node"
    go: str = "go"
    limits: Limits = field(default_factory=Limits)
    go_build_seconds: float = 120.0
    go_build_memory_bytes: int = 2 * GiB
    cache_dir: Path = Path(".chainstate/compute")
    # the uid `go build` runs as on a root server (never a run's uid; builds take turns)
    build_uid: int | None = None
    max_json_depth: int = 64  # deepest return value accepted (the max_json_depth setting)


def entry_name(language: str, func_name: str | None) -> str:
    """The entry function to call: `func_name`, or the language's default."""
    name = func_name or DEFAULT_ENTRY[language]
    if language != "sql" and not IDENTIFIER.match(name):
        raise ValueError(f"func_name {name!r} is not a valid identifier")
    return name


def outcome_from_run(result: RunResult, limits: Limits, max_depth: int = 64) -> Outcome:
    """Map a sandbox run plus the harness's JSON document to an Outcome (`max_depth`: the
    deepest return value accepted, the `max_json_depth` setting)."""
    text = result.output.decode("utf-8", errors="replace")
    common = {
        "text": text,
        "truncated": result.output_truncated,
        "original_size_bytes": result.output_size,
        "execution_duration_ms": result.duration_ms,
        "queue_wait_ms": result.queue_wait_ms,
        "started_at": result.started_at,
        "finished_at": result.finished_at,
    }
    if result.reason == "timeout":
        msg = f"wall-clock limit of {limits.wall_seconds:g} s exceeded"
        return Outcome.failed("timeout", msg, status="timeout", **common)
    if result.reason == "output_limit":
        msg = f"output exceeded {limits.output_hard_bytes} bytes; the run was stopped"
        return Outcome.failed("output_limit", msg, **common)
    if result.reason == "canceled":
        return Outcome.failed("internal", "the run was canceled", **common)
    if result.signal in (signal.SIGXCPU, signal.SIGKILL) and result.reason is None:
        msg = f"CPU time limit of {limits.cpu_seconds} s exceeded"
        return Outcome.failed("cpu_limit", msg, status="timeout", **common)
    if result.result_too_large:
        msg = f"return value larger than {limits.result_bytes} bytes"
        return Outcome.failed("result_too_large", msg, **common)
    try:
        doc = parse_result(result.result, max_depth)
    except BadResult as exc:
        return Outcome.failed("bad_return", str(exc), **common)
    if doc is None:
        return _crash(result, text, common)
    if doc.get("ok") is True:
        return Outcome(status="succeeded", return_value=doc.get("value"), **common)
    code = str(doc.get("code") or "exception")
    if code not in FAILURE_CODES:
        code = "exception"
    return Outcome.failed(
        code,
        str(doc.get("message") or code),
        error_stack=str(doc.get("stack") or ""),
        local_vars=doc.get("locals") if isinstance(doc.get("locals"), dict) else {},
        **common,
    )


class BadResult(ValueError):
    """A result document nested deeper than the server accepts."""


def parse_result(raw: bytes | None, max_depth: int) -> dict[str, Any] | None:
    """The JSON document a run wrote to its result fd: None when absent or not an object.
    Code can write anything there, so depth is bounded (BadResult) before the value is
    stored or answered (both recurse over it)."""
    if not raw:
        return None
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise BadResult(f"return value nested deeper than {max_depth} levels") from None
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    if json_shape(doc.get("value"))[0] > max_depth:
        raise BadResult(f"return value nested deeper than {max_depth} levels")
    return doc


_OOM_MARKERS = ("out of memory", "MemoryError", "Cannot allocate memory", "heap limit")


def _crash(result: RunResult, text: str, common: dict[str, Any]) -> Outcome:
    tail = text[-2000:]
    if any(m in text[:2000] or m in tail for m in _OOM_MARKERS):
        return Outcome.failed("memory_limit", "memory limit exceeded", error_stack=tail, **common)
    how = (
        f"killed by signal {signal.Signals(result.signal).name}"
        if result.signal
        else f"exited with code {result.exit_code}"
    )
    return Outcome.failed(
        "crashed", f"the process {how} without a result", error_stack=tail, **common
    )


class CodeRunner:
    """Runs Function code in any supported language under the worker pool."""

    def __init__(
        self,
        sandbox: Sandbox,
        pool: WorkerPool,
        settings: RunnerSettings,
    ) -> None:
        self.sandbox = sandbox
        self.pool = pool
        self.settings = settings
        # The harnesses live in the project's tree, which may sit under a folder runs see
        # as their own empty one (a clone in /tmp): every run gets them read-only.
        sandbox.expose(RUNTIME_DIR)
        self._go_locks: dict[str, asyncio.Lock] = {}
        self._build_lock = asyncio.Lock()  # one build at a time: they share the build uid
        if sandbox.isolation.drop_uid and settings.build_uid is None:
            raise ValueError("a root server needs a build uid: go build never runs as root")
        self.python = settings.python
        self.python_env: dict[str, str] = {}
        self.notes: list[str] = []
        self._python_found = False
        self._probed_at = -PROBE_AGAIN
        self._probe_lock = asyncio.Lock()

    async def prepare(self) -> None:
        """Pick a Python interpreter the sandbox uid can execute, once at start.

        The venv's interpreter may live under a folder other users cannot enter (pyenv under
        /root); then the system python3 of the same minor version runs with the venv's
        site-packages on its path, and the choice is reported.
        """
        async with self.pool.slot() as (uid, _):
            await self._probe(uid)

    async def python_for(self, uid: int) -> str:
        """The interpreter a Python run starts. While no candidate has passed, the probe is
        made again (with the run's own uid, at most every `PROBE_AGAIN` seconds): a probe that
        failed once for a passing reason must not fail every later Python run of the process
        (the first run after a failed start probe probes at once)."""
        if not self._python_found and time.monotonic() - self._probed_at >= PROBE_AGAIN:
            async with self._probe_lock:
                if not self._python_found:
                    self._probed_at = time.monotonic()
                    await self._probe(uid)
        return self.python

    async def _probe(self, uid: int) -> None:
        candidates = [self.settings.python, "/usr/bin/python3"]
        want = f"{sys.version_info.major}.{sys.version_info.minor}"
        probe = "import sys; print('%d.%d' % sys.version_info[:2])"
        why_not: list[str] = []
        for exe in candidates:
            try:
                res = await self.sandbox.run(
                    Job([exe, "-I", "-c", probe], limits=Limits(wall_seconds=20)), uid
                )
            except OSError as exc:
                why_not.append(f"{exe}: {exc.strerror}")
                continue
            said = res.output.decode(errors="replace").strip()
            if res.exit_code == 0 and said == want:
                self._use(exe)
                return
            how = f"signal {res.signal}" if res.signal else f"exit code {res.exit_code}"
            reason = f", {res.reason}" if res.reason else ""
            why_not.append(f"{exe}: {how}{reason}, said {said[-300:]!r}")
        self.notes.append(
            f"no python {want} runnable in the sandbox ({'; '.join(why_not)}); "
            f"probed again at the next Python run (after {PROBE_AGAIN:g} s)"
        )
        log.warning(self.notes[-1])

    def _use(self, exe: str) -> None:
        self.python = exe
        self._python_found = True
        if exe != self.settings.python:
            site = _site_packages()
            for path in site.split(os.pathsep):
                self.sandbox.expose(Path(path))
            self.python_env = {"CHAINSTATE_SITE_PACKAGES": site}
            note = f"sandbox python: {exe} with the venv's site-packages"
            self.notes.append(note)
            log.info(note)

    async def run(
        self,
        language: str,
        code: str,
        func_name: str | None,
        args: list[Any],
        *,
        env: Mapping[str, str] | None = None,
        sql: SqlExecutor | None = None,
        limits: Limits | None = None,
    ) -> Outcome:
        """Execute and never raise for user errors: every failure is an Outcome."""
        if language not in LANGUAGES:
            return Outcome.failed("unsupported", f"language {language!r} is not supported")
        entry = entry_name(language, func_name)
        limits = limits or self.settings.limits
        if language == "sql":
            return await self._run_sql(code, args, sql, limits)
        try:
            async with self.pool.slot() as (uid, wait_ms):
                job = await self._job(language, code, entry, args, limits, uid)
                if isinstance(job, Outcome):
                    job.queue_wait_ms = wait_ms
                    return job
                job.env = {**job.env, **(env or {})}
                result = await self.sandbox.run(job, uid)
                result.queue_wait_ms = wait_ms
                return outcome_from_run(result, limits, self.settings.max_json_depth)
        except QueueFull as exc:
            return Outcome.failed("queue_full", str(exc))
        except OSError as exc:  # the toolchain cannot be started (missing binary, no access)
            log.warning("sandbox start failed", extra={"language": language, "error": str(exc)})
            return Outcome.failed("internal", f"cannot start the {language} runtime: {exc}")

    async def _job(
        self, language: str, code: str, entry: str, args: list[Any], limits: Limits, uid: int
    ) -> Job | Outcome:
        job_doc = json.dumps({"entry": entry, "args": args, "mode": "function"})
        if language == "python":
            harness = str(RUNTIME_DIR / "python_harness.py")
            argv = [await self.python_for(uid), "-I", "-X", "utf8", harness]
            files = {"job.json": job_doc, "main.py": code}
            return Job(argv, files, dict(self.python_env), limits)
        if language == "javascript":
            heap_mb = max(16, limits.memory_bytes * 3 // 4 // (1024 * 1024))
            harness = str(RUNTIME_DIR / "js_harness.js")
            argv = [self.settings.node, f"--max-old-space-size={heap_mb}", harness]
            files = {"job.json": job_doc, "main.js": code}
            return Job(argv, files, {}, limits)
        binary = await self._go_binary(code, entry)
        if isinstance(binary, Outcome):
            return binary
        # copied into the run's folder: the cache may sit where the run's uid cannot reach
        files = {"job.json": job_doc, "fn.bin": await asyncio.to_thread(binary.read_bytes)}
        return Job(["./fn.bin"], files, {"GOMAXPROCS": "2"}, limits, executables=("fn.bin",))

    async def _run_sql(
        self, code: str, args: list[Any], sql: SqlExecutor | None, limits: Limits
    ) -> Outcome:
        if sql is None:
            return Outcome.failed("unsupported", "SQL Functions need the workspace data store")
        started = time.time()
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(limits.wall_seconds):
                value = await sql(code, args)
        except TimeoutError:
            msg = f"wall-clock limit of {limits.wall_seconds:g} s exceeded"
            return Outcome.failed(
                "timeout", msg, status="timeout", started_at=started, finished_at=time.time()
            )
        except SqlTimeout as exc:
            return Outcome.failed(
                "timeout",
                str(exc),
                status="timeout",
                started_at=started,
                finished_at=time.time(),
                execution_duration_ms=int((time.monotonic() - t0) * 1000),
            )
        except SqlError as exc:
            return Outcome.failed(
                "result_too_large" if isinstance(exc, SqlResultTooLarge) else "exception",
                str(exc),
                started_at=started,
                finished_at=time.time(),
                execution_duration_ms=int((time.monotonic() - t0) * 1000),
            )
        return Outcome(
            status="succeeded",
            return_value=value,
            started_at=started,
            finished_at=time.time(),
            execution_duration_ms=int((time.monotonic() - t0) * 1000),
        )

    async def _go_binary(self, code: str, entry: str) -> Path | Outcome:
        """Compile (or reuse) the binary for this code + entry."""
        if not re.search(r"^\s*package\s+main\b", code, re.M):
            code = "package main\n\n" + code
        key = hashlib.sha256(f"{entry}\0{code}".encode()).hexdigest()[:32]
        bin_dir = self.settings.cache_dir / "go-bin"
        binary = bin_dir / f"{key}.bin"
        lock = self._go_locks.setdefault(key, asyncio.Lock())
        async with lock:
            if binary.exists():
                return binary
            return await self._go_build(code, entry, binary)

    async def _go_build(self, code: str, entry: str, binary: Path) -> Path | Outcome:
        async with self._build_lock:
            return await self._go_build_locked(code, entry, binary)

    async def _go_build_locked(self, code: str, entry: str, binary: Path) -> Path | Outcome:
        """`go build` as the build uid in the sandbox: the module, the Go environment and the
        build cache are the server's own, so nothing a run left (a go.work, GOFLAGS, an env
        file) can steer it, and it can read nothing the build uid may not."""
        cache = self.settings.cache_dir.resolve()
        gocache = cache / "gocache"
        (cache / "go-bin").mkdir(parents=True, exist_ok=True)
        uid = self.settings.build_uid if self.sandbox.isolation.drop_uid else None
        if uid is not None:
            await asyncio.to_thread(ensure_owner, gocache, uid)
        else:
            gocache.mkdir(parents=True, exist_ok=True)
        wrapper = (RUNTIME_DIR / "go_main.go").read_text().replace("__ENTRY__", entry)
        files = {
            "src/go.mod": "module userfn\n\ngo 1.19\n",
            "src/user.go": code,
            "src/chainstate_main.go": wrapper,
        }
        limits = Limits(
            wall_seconds=self.settings.go_build_seconds,
            cpu_seconds=int(self.settings.go_build_seconds) * 2,
            memory_bytes=self.settings.go_build_memory_bytes,
            file_size_bytes=256 * MiB,
            open_files=1024,
            processes=512,
            write_bytes=512 * MiB,
            write_files=100_000,
        )
        job = Job(
            [self.settings.go, "build", "-trimpath", "-o", "../fn.bin", "."],
            files,
            GO_BUILD_ENV,
            limits,
            subdir="src",
            binds={GO_CACHE_IN_HOME: gocache},  # $HOME/.cache/go-build: Go's default GOCACHE
        )
        sp = await self.sandbox.start(job, uid=uid)
        try:
            result = await sp.wait()
            built = sp.workdir / "fn.bin"
            if result.exit_code == 0 and built.exists():
                tmp = binary.with_suffix(f".{os.getpid()}.tmp")
                shutil.copyfile(built, tmp)
                tmp.chmod(0o755)
                tmp.replace(binary)
                return binary
        finally:
            await self.sandbox.cleanup(sp)
        text = result.output.decode("utf-8", errors="replace")
        if result.reason == "timeout":
            return Outcome.failed("timeout", "go build timed out", status="timeout", text=text)
        text = text.replace(str(sp.workdir / "src") + "/", "")
        return Outcome.failed(
            "compile_error", _first_line(text) or "go build failed", error_stack=text, text=text
        )


def _site_packages() -> str:
    paths = sysconfig.get_paths()
    return os.pathsep.join(dict.fromkeys([paths["purelib"], paths["platlib"]]))


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            return line.strip()
    return ""

"""Notebook instances: long-running sandboxed Python with logs, metrics, deadlines and exits.

An instance is `running` from launch until its process ends; then `ended` with `exit_code`,
`oom_killed`, `exit_message` and a `display_status` of succeeded / failed / canceled.
Foreground instances carry a `deadline` (150 s after launch or after the last keepalive) and are
ended by the reaper when it passes; background instances have none. State is kept in the
compute store, logs in one JSON-lines file per instance, so both survive a restart; instances
found `running` at start-up belonged to a previous server and are ended as failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import psutil
from cachetools import LRUCache

from workspace.compute.periodic import Periodic
from workspace.compute.quotas import QUOTA_INSTANCES, AccountQuotas, InFlight
from workspace.compute.runners import RUNTIME_DIR, BadResult, CodeRunner, parse_result
from workspace.compute.sandbox import (
    GiB,
    Job,
    Limits,
    MiB,
    RunResult,
    Sandbox,
    SandboxProcess,
    UidPool,
)

log = logging.getLogger("workspace.compute.instances")

Clock = Callable[[], float]
EXIT_KILLED = 137  # 128 + SIGKILL, as a shell reports a killed process
EXIT_LOST = -1  # the process was lost with a previous server: no exit status exists


class InstanceError(Exception):
    """A request about an instance that cannot be honoured (status 400 / 404 by `kind`)."""

    def __init__(self, message: str, kind: str = "invalid") -> None:
        super().__init__(message)
        self.kind = kind


class InstanceStore(Protocol):
    """Persistence the manager needs (implemented by workspace.compute.store)."""

    async def put_instance(self, doc: dict[str, Any]) -> None: ...
    async def get_instance(self, instance_id: str) -> dict[str, Any] | None: ...
    async def running_instances(self) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class InstanceSettings:
    """Notebook instance limits and timings (documented in docs/compute.md)."""

    foreground_ttl_seconds: float = 150.0  # keepalive extends the deadline this far (spec)
    max_runtime_seconds: float = 6 * 3600.0  # any instance is stopped after this long
    max_running: int = 8  # concurrent running instances on this server
    default_max_cpu: int = 100  # 100 = one vCPU
    default_max_memory: int = 1 * GiB
    allowed_quotas: tuple[tuple[int, int], ...] = (
        (50, 512 * MiB),
        (100, 1 * GiB),
        (200, 2 * GiB),
    )
    cpu_seconds: int = 6 * 3600  # RLIMIT_CPU per process
    metrics_interval_seconds: float = 5.0  # container metrics sampling period
    metrics_max_points: int = 720  # per chart and instance (one hour at 5 s)
    log_max_bytes: int = 16 * MiB  # per instance; later lines are dropped with one notice
    log_line_max_chars: int = 16 * 1024  # a longer output line is cut
    logs_page_lines: int = 1000  # lines per logs/history response
    reaper_interval_seconds: float = 1.0  # deadline checks
    write_bytes: int = 256 * MiB  # everything an instance writes (its folders' tmpfs)
    write_files: int = 100_000  # files and folders an instance may create
    uid_base: int = 2_200_000  # instances use uids [uid_base, uid_base + max_running)

    def quota_allowed(self, max_cpu: int, max_memory: int) -> bool:
        return any(max_cpu <= cpu and max_memory <= mem for cpu, mem in self.allowed_quotas)


@dataclass
class _Live:
    """In-memory side of a running instance."""

    id: str
    account_id: str
    sp: SandboxProcess
    uid: int | None
    max_memory: int
    log_path: Path
    started_mono: float
    task: asyncio.Task[None] | None = None
    partial: bytes = b""
    log_bytes: int = 0
    log_dropped: bool = False
    last_ts: int = 0
    cpu_prev: tuple[float, float] | None = None
    net_prev: tuple[float, int, int] | None = None
    points: dict[str, deque[list[float]]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    log_fh: IO[str] | None = None  # open while running: one open per instance, not per line
    # blockx counters since the last sample (fed by the SDK gateway)
    calls: int = 0
    tasks: int = 0
    task_ms: list[float] = field(default_factory=list)
    block_ts: float | None = None


class LogFile:
    """Append-only JSON lines; every line's `timestamp` (Unix µs) is unique and increasing."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read_after(self, cursor: int | None, limit: int) -> tuple[list[dict[str, Any]], int]:
        """Lines with timestamp > cursor (all when None), at most `limit`; and the new cursor.

        The timestamps increase through the file, so the first line after the cursor is found
        by bisecting byte offsets: a page costs a few seeks plus its own lines, not a parse
        of the whole (up to 16 MiB) file."""
        out: list[dict[str, Any]] = []
        last = cursor or 0
        try:
            fh = self.path.open("rb")
        except FileNotFoundError:
            return out, last
        with fh:
            if cursor is not None:
                fh.seek(_offset_after(fh, cursor))
            for raw in fh:
                rec = _record(raw)
                if rec is None:
                    continue  # a line cut by a crash, or still being written
                ts = int(rec.get("timestamp", 0))
                if cursor is not None and ts <= cursor:
                    continue
                out.append(rec)
                last = ts
                if len(out) >= limit:
                    break
        return out, last


def _record(raw: bytes) -> dict[str, Any] | None:
    try:
        rec = json.loads(raw)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) else None


def _timestamp(raw: bytes) -> int | None:
    rec = _record(raw)
    return None if rec is None else int(rec.get("timestamp", 0))


def _offset_after(fh: IO[bytes], cursor: int) -> int:
    """A line start such that every complete line before it has timestamp <= cursor."""
    lo = 0  # a line start; every line before it is <= cursor
    hi = fh.seek(0, 2)  # a line start or the end; no line from it on is <= cursor
    while lo < hi:
        mid = (lo + hi) // 2
        fh.seek(mid - 1 if mid > 0 else 0)
        if mid > 0:
            fh.readline()  # to the first line starting at or after mid
        start = fh.tell()
        if start >= hi:
            break  # no line starts in [mid, hi): the scan from lo is short
        ts = _timestamp(fh.readline())
        if ts is None:
            break  # a damaged line: let the scan from lo sort it out
        if ts <= cursor:
            lo = fh.tell()
        else:
            hi = start
    return lo


class InstanceManager:
    """Launches and supervises notebook instances; one per server."""

    def __init__(
        self,
        sandbox: Sandbox,
        runner: CodeRunner,
        store: InstanceStore,
        settings: InstanceSettings,
        log_dir: Path,
        clock: Clock = time.time,
        env_for: Callable[[dict[str, Any]], Awaitable[dict[str, str]]] | None = None,
        quotas: AccountQuotas | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.runner = runner
        self.store = store
        self.settings = settings
        self.log_dir = log_dir
        self.clock = clock
        self.env_for = env_for
        # the service sets `uid_base` per server (tests construct managers directly) and adds
        # the clean-up of a uid's leftovers to the pool's on_release
        self.uid_pool = UidPool(settings.uid_base, settings.max_running)
        limit = (quotas or AccountQuotas()).max_running_instances
        self.account_running = InFlight(
            QUOTA_INSTANCES, "max_running_instances", limit, "instances running"
        )
        self._live: dict[str, _Live] = {}
        # called with (instance doc, run env) when an instance's process has ended
        self.on_end: Callable[[dict[str, Any], dict[str, str]], None] | None = None
        self._loops = [
            Periodic(self.reap, settings.reaper_interval_seconds, "instance reaper"),
            Periodic(self._sample_all, settings.metrics_interval_seconds, "instance sampler"),
        ]
        self._lock = asyncio.Lock()
        # recent history kept in memory only, bounded (documented: metrics of old instances)
        self._ended_points: LRUCache[str, dict[str, deque[list[float]]]] = LRUCache(256)
        self._last_ts: LRUCache[str, int] = LRUCache(4096)

    # lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """End instances left running by a previous server; start the reaper and sampler."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for doc in await self.store.running_instances():
            self._append_event(doc["id"], "the server restarted while the instance was running")
            await self._finish(
                doc,
                exit_code=EXIT_LOST,
                display="failed",
                message="server restarted while the instance was running; its process was lost",
            )
        for loop in self._loops:
            loop.start()

    async def close(self) -> None:
        """Stop background loops and end every running instance (as failed, with a reason)."""
        for loop in self._loops:
            await loop.close()
        for live in list(self._live.values()):
            live.sp.kill("shutdown")
        for live in list(self._live.values()):
            if live.task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await live.task

    # operations ------------------------------------------------------------------------

    async def launch(
        self,
        *,
        code: str,
        notebook: dict[str, Any] | None,
        parameters: list[dict[str, Any]],
        arguments: list[dict[str, Any]],
        globals_: dict[str, Any],
        account_id: str,
        user_id: str | None,
        name: str | None,
        background: bool,
        max_cpu: int | None,
        max_memory: int | None,
        debug: bool = False,
        schedule_id: str | None = None,
        launched: str = "manual",
        rights_account_id: str | None = None,
    ) -> dict[str, Any]:
        """Record and start one instance; returns the stored instance document.

        `rights_account_id`: whose rights its SDK calls get (the Notebook's owner; the
        launching account by default). Raises QuotaExceeded past the account's quota."""
        cpu = max_cpu if max_cpu is not None else self.settings.default_max_cpu
        mem = max_memory if max_memory is not None else self.settings.default_max_memory
        if cpu <= 0 or mem <= 0 or not self.settings.quota_allowed(cpu, mem):
            raise InstanceError(
                f"quota max_cpu={cpu} max_memory={mem} is not allowed; see instance/specs"
            )
        async with self._lock:
            if len(self._live) >= self.settings.max_running:
                raise InstanceError(
                    f"{self.settings.max_running} instances are already running", kind="busy"
                )
            mine = sum(1 for live in self._live.values() if live.account_id == account_id)
            self.account_running.check(account_id, mine)
            now = self.clock()
            doc: dict[str, Any] = {
                "id": uuid.uuid4().hex,
                "notebook_id": notebook["id"] if notebook else None,
                "space": notebook["space"] if notebook else None,
                "name": name if name is not None else (notebook or {}).get("name"),
                "code": code,
                "parameters": parameters,
                "arguments": arguments,
                "max_memory": mem,
                "max_cpu": cpu,
                "max_network_rx": 0,
                "max_network_tx": 0,
                "account_id": account_id,
                "user_id": user_id,
                "rights_account_id": rights_account_id or account_id,
                "schedule_id": schedule_id,
                "background": background,
                "debug": debug,
                "deadline": None if background else now + self.settings.foreground_ttl_seconds,
                "status": "running",
                "exit_code": None,
                "oom_killed": None,
                "exited_at": None,
                "created_at": now,
                "updated_at": now,
                "display_status": "starting",
                "launched": launched,
                "exit_message": None,
            }
            await self.store.put_instance(doc)
            uid = self.uid_pool.acquire()
            try:
                live = await self._spawn(doc, globals_, uid)
            except Exception as exc:
                self.uid_pool.release(uid)
                log.warning("instance start failed", extra={"instance": doc["id"]})
                await self._finish(
                    doc, exit_code=EXIT_LOST, display="failed", message=f"could not start: {exc}"
                )
                return doc
            self._live[doc["id"]] = live
            live.log_fh = live.log_path.open("a", encoding="utf-8")
            doc["display_status"] = "running"
            doc["updated_at"] = self.clock()
            await self.store.put_instance(doc)
            live.task = asyncio.create_task(self._supervise(doc, live))
        return doc

    async def cancel(self, instance_id: str) -> None:
        """Ask a running instance to stop; a finished one is left as it is."""
        await self._require(instance_id)
        live = self._live.get(instance_id)
        if live is not None:
            self._append_event(instance_id, "cancel requested")
            live.sp.kill("canceled")
            if live.task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(live.task)

    async def keepalive(self, instance_id: str) -> None:
        """Foreground and unfinished: deadline = now + 150 s. Otherwise nothing changes."""
        doc = await self._require(instance_id)
        if doc["status"] != "running" or doc["background"]:
            return
        now = self.clock()
        doc["deadline"] = now + self.settings.foreground_ttl_seconds
        doc["updated_at"] = now
        await self.store.put_instance(doc)

    async def set_background(self, instance_id: str, background: bool) -> None:
        """One way: foreground -> background. Moving back is refused."""
        doc = await self._require(instance_id)
        if not background:
            if doc["background"]:
                raise InstanceError("a background instance cannot move back to the foreground")
            return
        if doc["background"]:
            return
        doc["background"] = True
        doc["deadline"] = None
        doc["updated_at"] = self.clock()
        await self.store.put_instance(doc)

    def logs(self, instance_id: str, cursor: int | None) -> tuple[list[dict[str, Any]], int]:
        return LogFile(self._log_path(instance_id)).read_after(
            cursor, self.settings.logs_page_lines
        )

    def is_running(self, instance_id: str) -> bool:
        return instance_id in self._live

    def container_points(self, instance_id: str) -> dict[str, list[list[float]]]:
        live = self._live.get(instance_id)
        source = live.points if live is not None else self._ended_points.get(instance_id, {})
        return {name: list(points) for name, points in source.items()}

    async def reap(self) -> int:
        """End foreground instances whose deadline has passed; returns how many."""
        now = self.clock()
        ended = 0
        for instance_id in list(self._live):
            doc = await self.store.get_instance(instance_id)
            if doc is None or doc["background"] or doc["deadline"] is None:
                continue
            if doc["deadline"] < now:
                self._append_event(instance_id, "deadline passed without keepalive")
                self._live[instance_id].sp.kill("expired")
                ended += 1
        return ended

    # internals -------------------------------------------------------------------------

    async def _require(self, instance_id: str) -> dict[str, Any]:
        doc = await self.store.get_instance(instance_id)
        if doc is None:
            raise InstanceError(f"instance {instance_id!r} not found", kind="not_found")
        return doc

    def _log_path(self, instance_id: str) -> Path:
        return self.log_dir / f"{instance_id}.jsonl"

    async def _spawn(self, doc: dict[str, Any], globals_: dict[str, Any], uid: int) -> _Live:
        limits = Limits(
            wall_seconds=self.settings.max_runtime_seconds,
            cpu_seconds=self.settings.cpu_seconds,
            memory_bytes=doc["max_memory"],
            output_bytes=0,
            output_hard_bytes=None,
            cpu_percent=doc["max_cpu"],
            file_size_bytes=256 * MiB,
            open_files=1024,
            processes=128,
            write_bytes=self.settings.write_bytes,
            write_files=self.settings.write_files,
        )
        job_doc = {"entry": None, "args": [], "mode": "script", "globals": globals_}
        harness = str(RUNTIME_DIR / "python_harness.py")
        env = dict(self.runner.python_env)
        if self.env_for is not None:
            env.update(await self.env_for(doc))
        job = Job(
            [await self.runner.python_for(uid), "-I", "-u", "-X", "utf8", harness],
            {"job.json": json.dumps(job_doc), "main.py": doc["code"]},
            env,
            limits,
        )
        holder: dict[str, _Live] = {}
        sp = await self.sandbox.start(
            job, uid, on_output=lambda chunk: self._on_output(holder["live"], chunk)
        )
        log_path = self._log_path(doc["id"])
        live = _Live(doc["id"], doc["account_id"], sp, uid, doc["max_memory"], log_path, 0.0)
        live.started_mono = time.monotonic()
        live.env = env
        holder["live"] = live
        self._append_event(doc["id"], "instance started")
        return live

    def _on_output(self, live: _Live, chunk: bytes) -> None:
        data = live.partial + chunk
        *lines, live.partial = data.split(b"\n")
        if len(live.partial) > self.settings.log_line_max_chars * 4:
            lines.append(live.partial)
            live.partial = b""
        for line in lines:
            self._write_log(live.id, "output", line.decode("utf-8", errors="replace"))
        if live.log_fh is not None:
            live.log_fh.flush()  # readers of logs/history see lines as they come

    def _append_event(self, instance_id: str, message: str) -> None:
        self._write_log(instance_id, "event", message)

    def _write_log(self, instance_id: str, kind: str, text: str) -> None:
        live = self._live.get(instance_id)
        limit = self.settings.log_max_bytes
        if live is not None and live.log_bytes > limit:
            if live.log_dropped:
                return
            live.log_dropped = True
            kind, text = "event", f"log limit of {limit} bytes reached; later output is dropped"
        cut = self.settings.log_line_max_chars
        if len(text) > cut:
            text = text[:cut] + "…"
        now_us = int(time.time() * 1_000_000)
        ts = max(now_us, self._last_ts.get(instance_id, 0) + 1)
        self._last_ts[instance_id] = ts
        line = json.dumps({"timestamp": ts, "type": kind, "message": text}) + "\n"
        if live is not None and live.log_fh is not None:
            live.log_bytes += len(line)
            live.log_fh.write(line)
            return
        with self._log_path(instance_id).open("a", encoding="utf-8") as fh:
            fh.write(line)

    async def _supervise(self, doc: dict[str, Any], live: _Live) -> None:
        try:
            result = await live.sp.wait()
        finally:
            self._live.pop(doc["id"], None)
            self._ended_points[doc["id"]] = live.points
            if live.partial:
                self._write_log(doc["id"], "output", live.partial.decode(errors="replace"))
            if live.log_fh is not None:
                live.log_fh.close()
                live.log_fh = None
            await self.sandbox.cleanup(live.sp)
            if live.uid is not None:
                self.uid_pool.release(live.uid)
            if self.on_end is not None:
                self.on_end(doc, live.env)
        fresh = await self.store.get_instance(doc["id"]) or doc
        if fresh["status"] == "ended":  # already ended elsewhere (a newer server's start-up)
            return
        await self._finish(fresh, **self._exit_of(result, fresh))

    def _exit_of(self, result: RunResult, doc: dict[str, Any]) -> dict[str, Any]:
        reason = result.reason
        if reason == "canceled":
            return {"exit_code": EXIT_KILLED, "display": "canceled", "message": "canceled"}
        if reason == "expired":
            ttl = self.settings.foreground_ttl_seconds
            msg = f"expired: the foreground deadline passed (no keepalive within {ttl:g} s)"
            return {"exit_code": EXIT_KILLED, "display": "canceled", "message": msg}
        if reason == "oom":
            msg = f"out of memory: exceeded max_memory of {doc['max_memory']} bytes"
            return {"exit_code": EXIT_KILLED, "display": "failed", "message": msg, "oom": True}
        if reason == "timeout":
            limit = self.settings.max_runtime_seconds
            msg = f"stopped after the maximum runtime of {limit:g} s"
            return {"exit_code": EXIT_KILLED, "display": "failed", "message": msg}
        if reason == "shutdown":
            msg = "server shut down while the instance was running"
            return {"exit_code": EXIT_KILLED, "display": "failed", "message": msg}
        doc_res = _parse(result.result)
        if doc_res is not None and doc_res.get("ok") is True:
            return {"exit_code": 0, "display": "succeeded", "message": "completed"}
        if doc_res is not None:
            msg = str(doc_res.get("message") or "failed")
            if doc_res.get("code") == "memory_limit":
                msg = f"out of memory: {msg} (max_memory {doc['max_memory']} bytes)"
                return {"exit_code": EXIT_KILLED, "display": "failed", "message": msg, "oom": True}
            return {"exit_code": 1, "display": "failed", "message": msg}
        if result.signal:
            sig = result.signal
            return {
                "exit_code": 128 + sig,
                "display": "failed",
                "message": f"killed by signal {sig}",
            }
        code = result.exit_code if result.exit_code is not None else EXIT_LOST
        return {"exit_code": code, "display": "failed", "message": f"exited with code {code}"}

    async def _finish(
        self,
        doc: dict[str, Any],
        *,
        exit_code: int,
        display: str,
        message: str,
        oom: bool = False,
    ) -> None:
        now = self.clock()
        doc.update(
            status="ended",
            exit_code=exit_code,
            oom_killed=oom,
            exited_at=now,
            updated_at=now,
            display_status=display,
            exit_message=message,
            deadline=None,
        )
        await self.store.put_instance(doc)
        self._append_event(doc["id"], f"instance ended: {display}: {message}")

    async def _sample_all(self) -> None:
        for live in list(self._live.values()):
            self.sample(live)

    def sample(self, live: _Live) -> None:
        """Record cpu %, memory bytes and network rates; kill past max_memory (OOM)."""
        now = time.time()
        procs = live.sp.processes()
        cpu_total = 0.0
        rss = 0
        read = 0  # processes whose figures were read (none: the program is gone or not yet up)
        for p in procs:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                mem = p.memory_info().rss
                cpu_total += t.user + t.system + t.children_user + t.children_system
                rss += mem
                read += 1
        mono = time.monotonic()
        if read:  # (no process read: no cpu or memory point, rather than a false 0)
            if live.cpu_prev is not None and mono > live.cpu_prev[0]:
                pct = max(0.0, (cpu_total - live.cpu_prev[1]) / (mono - live.cpu_prev[0]) * 100)
                self._point(live, "cpu", now, round(pct, 2))
            live.cpu_prev = (mono, cpu_total)
            self._point(live, "memory", now, rss)
        # the user's program: bwrap's first process may sit outside the run's network namespace
        rx, tx = _net_bytes(procs[0].pid if procs else live.sp.pid)
        if live.net_prev is not None and mono > live.net_prev[0]:
            dt = mono - live.net_prev[0]
            self._point(live, "net_rx", now, round((rx - live.net_prev[1]) / dt, 2))
            self._point(live, "net_tx", now, round((tx - live.net_prev[2]) / dt, 2))
        live.net_prev = (mono, rx, tx)
        interval = self.settings.metrics_interval_seconds
        self._point(live, "calls", now, round(live.calls / interval, 3))
        self._point(live, "tasks", now, round(live.tasks / interval, 3))
        if live.task_ms:
            self._point(live, "task_duration", now, round(sum(live.task_ms) / len(live.task_ms), 3))
        if live.block_ts is not None:
            self._point(live, "block_lag", now, max(0, int((now - live.block_ts) * 1000)))
        live.calls = live.tasks = 0
        live.task_ms = []
        if rss > live.max_memory:
            self._append_event(live.id, f"memory {rss} bytes exceeds max_memory")
            live.sp.kill("oom")

    def record_blockx(self, instance_id: str, kind: str, event: dict[str, Any]) -> None:
        """An SDK event of a running instance: a chain call, a finished task or a block."""
        live = self._live.get(instance_id)
        if live is None:
            return
        if kind == "call":
            live.calls += 1
        elif kind == "task":
            live.tasks += 1
            ms = event.get("ms")
            if isinstance(ms, int | float) and ms >= 0:
                live.task_ms.append(float(ms))
        elif kind == "block":
            ts = event.get("timestamp")
            if isinstance(ts, int | float) and (live.block_ts is None or ts > live.block_ts):
                live.block_ts = float(ts)

    def _point(self, live: _Live, name: str, ts: float, value: float) -> None:
        series = live.points.setdefault(name, deque(maxlen=self.settings.metrics_max_points))
        series.append([round(ts, 3), value])


def _net_bytes(pid: int) -> tuple[int, int]:
    """Received and sent bytes over every interface of the process's network namespace."""
    rx = tx = 0
    with contextlib.suppress(OSError), open(f"/proc/{pid}/net/dev") as fh:
        for line in fh.readlines()[2:]:
            fields = line.split(":", 1)[1].split()
            rx += int(fields[0])
            tx += int(fields[8])
    return rx, tx


def _parse(raw: bytes | None) -> dict[str, Any] | None:
    try:
        return parse_result(raw, max_depth=64)  # a script's value is None: depth is a forgery
    except BadResult:
        return None

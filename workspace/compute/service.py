"""The compute service: one per workspace app, assembling sandbox, pool, runners, instance
manager, scheduler, SQL runner and SDK gateway, with an explicit start/close lifecycle."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import psutil
from aiohttp import web

from chainstate.config import ConfigError
from workspace.auth import Principal
from workspace.compute.instances import InstanceManager, InstanceSettings
from workspace.compute.runners import CodeRunner, Outcome, RunnerSettings, SqlError
from workspace.compute.sandbox import (
    Isolation,
    Limits,
    Sandbox,
    UidPool,
    WorkerPool,
    probe_isolation,
    release_isolation,
    sweep_uids,
)
from workspace.compute.scheduler import Scheduler
from workspace.compute.sdk import SdkGateway
from workspace.compute.sqlfunc import SqlFunctionRunner, compile_sql, own_table_lookup
from workspace.compute.store import ComputeStore
from workspace.http import AppCtx, Endpoint
from workspace.settings import private_dir

log = logging.getLogger("workspace.compute")

SDK_MODULES = ("workspace.tables", "workspace.rows", "workspace.chaincall")
UID_ROOT = 2_000_000
UID_BLOCK = 64
UID_HALF = 32


@dataclass(frozen=True)
class ComputeSettings:
    """Compute limits and places; defaults documented in docs/compute.md."""

    workers: int = 2  # Function runs at once (the worker pool)
    max_queue: int = 64  # Function runs waiting for a worker; more get `queue_full`
    function_limits: Limits = field(default_factory=Limits)
    instance: InstanceSettings = field(default_factory=InstanceSettings)
    # Each server owns 64 sandbox uids: [uid_base, +64), by default 2_000_000 + 64 * port, so
    # servers on one machine never share uids and a restarted server sweeps its predecessor's
    # leftovers. Function runs use the first `workers`, instances the 32 from uid_base + 32.
    uid_base: int | None = None
    port: int = 0
    go_build_seconds: float = 120.0
    sql_timeout_ms: int = 5000  # SQL Function wall-clock limit
    sql_max_rows: int = 10000  # SQL Function rows; more is a failed run
    sql_max_code_bytes: int = 65536  # longer SQL is refused before parsing (a failed run)
    scheduler_tick_seconds: float = 1.0
    use_cgroups: bool = True  # max_cpu through a cpu cgroup when the machine allows it
    require_network_isolation: bool = False  # refuse to start without a network namespace
    bwrap: str = "bwrap"  # bubblewrap, for each run's own PID namespace ("": do not use it)
    require_process_isolation: bool = False  # refuse to start when runs could see processes
    sandbox_dir: Path | None = None  # run folders (default: <tmp>/chainstate-sandbox)
    data_dir: Path = Path(".chainstate/workspace")  # instance logs live here
    cache_dir: Path | None = None  # Go build cache (default: <data_dir>/compute-cache)

    @classmethod
    def from_mapping(cls, values: dict[str, Any], data_dir: Path, port: int) -> ComputeSettings:
        """From the `[compute]` TOML table: flat keys; Limits fields prefixed `function_`,
        InstanceSettings fields prefixed `instance_`. Unknown keys or bad types: ConfigError."""
        base = cls(data_dir=data_dir, port=port)
        groups: dict[str, tuple[Any, dict[str, Any]]] = {
            "function_": (base.function_limits, {}),
            "instance_": (base.instance, {}),
            "": (base, {}),
        }
        for key, value in values.items():
            for prefix, (target, out) in groups.items():
                name = key[len(prefix) :] if key.startswith(prefix) else None
                known = {f.name: f for f in fields(target)}
                if name in known and name not in _NOT_SETTABLE[prefix]:
                    out[name] = _coerce(key, getattr(target, name), value)
                    break
            else:
                raise ConfigError(f"[compute] unknown setting {key!r}")
        return replace(
            base,
            function_limits=replace(base.function_limits, **groups["function_"][1]),
            instance=replace(base.instance, **groups["instance_"][1]),
            **groups[""][1],
        )


# nested groups and values the service derives itself (the instance uid range, the port)
_NOT_SETTABLE = {
    "": {"function_limits", "instance", "port"},
    "instance_": {"uid_base"},
    "function_": set(),
}


def _coerce(key: str, default: Any, value: Any) -> Any:
    if key.endswith("_dir"):
        if not isinstance(value, str):
            raise ConfigError(f"[compute] {key} must be a path string")
        return Path(value)
    if key.endswith("allowed_quotas"):
        ok = isinstance(value, list) and all(
            isinstance(q, list) and len(q) == 2 and all(isinstance(x, int) for x in q)
            for q in value
        )
        if not ok:
            raise ConfigError(f"[compute] {key} must be a list of [max_cpu, max_memory] pairs")
        return tuple(tuple(q) for q in value)
    want = type(default) if default is not None else int
    if isinstance(value, bool) != (want is bool) or not isinstance(
        value, want | (int if want is float else want)
    ):
        raise ConfigError(f"[compute] {key} must be a {want.__name__}")
    return want(value)


class ComputeService:
    """Functions and Notebooks execution for one workspace app."""

    def __init__(self, ctx: AppCtx, settings: ComputeSettings, clock: Any = time.time) -> None:
        self.ctx = ctx
        self.settings = settings
        self.clock = clock
        self.store = ComputeStore(ctx.db)
        self.isolation: Isolation | None = None
        self.notes: list[str] = []
        self._started = False

    # lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        s = self.settings
        # runs use other uids: logs and the build cache must stay unreadable to them
        for folder in (s.data_dir, s.cache_dir):
            if folder is not None:
                await asyncio.to_thread(private_dir, folder)
        iso = await asyncio.to_thread(probe_isolation, s.use_cgroups, s.bwrap or None)
        if s.require_network_isolation and not iso.network_isolated:
            release_isolation(iso)
            raise RuntimeError(f"network isolation required but unavailable: {iso.notes}")
        if s.require_process_isolation and not iso.processes_isolated:
            release_isolation(iso)
            raise RuntimeError(f"process isolation required but unavailable: {iso.notes}")
        self.isolation = iso
        if s.workers > UID_HALF or s.instance.max_running > UID_HALF:
            raise ValueError(f"workers and instance max_running are limited to {UID_HALF}")
        base = s.uid_base if s.uid_base is not None else UID_ROOT + UID_BLOCK * s.port
        self.instance_settings = replace(s.instance, uid_base=base + UID_HALF)
        if iso.drop_uid:
            killed = sweep_uids(range(base, base + UID_BLOCK))
            if killed:
                log.warning("killed processes left by a previous server", extra={"n": killed})
        root = s.sandbox_dir or Path(tempfile.gettempdir()) / "chainstate-sandbox"
        self.sandbox = Sandbox(iso, work_root=root)
        await asyncio.to_thread(_remove_leftovers, root, range(base, base + UID_BLOCK))
        self.pool = WorkerPool(s.workers, s.max_queue, UidPool(base, s.workers))
        runner_settings = RunnerSettings(
            limits=s.function_limits,
            go_build_seconds=s.go_build_seconds,
            cache_dir=s.cache_dir or s.data_dir / "compute-cache",
        )
        self.runner = CodeRunner(self.sandbox, self.pool, runner_settings)
        await self.runner.prepare()
        self.notes = [*iso.notes, *self.runner.notes]
        self.sql = SqlFunctionRunner(self.ctx.db, s.sql_timeout_ms, s.sql_max_rows)
        endpoints: list[Endpoint] = []
        for name in SDK_MODULES:
            endpoints += importlib.import_module(name).routes(self.ctx)
        self.gateway = SdkGateway(
            self.ctx,
            endpoints,
            self.store.record_access,
            root / f"sdk-{os.getpid()}-{uuid.uuid4().hex[:8]}.sock",
        )
        await self.gateway.start()
        self.manager = InstanceManager(
            self.sandbox,
            self.runner,
            self.store,
            self.instance_settings,
            s.data_dir / "instance-logs",
            clock=self.clock,
            env_for=self._instance_env,
        )
        self.manager.on_end = self._instance_ended
        await self.manager.start()
        self.scheduler = Scheduler(
            self.store,
            self._launch_scheduled,
            self.manager.is_running,
            clock=self.clock,
            tick_seconds=s.scheduler_tick_seconds,
        )
        await self.scheduler.start()
        self._started = True
        log.info("compute started", extra={"isolation": iso.as_dict(), "notes": self.notes})

    async def close(self) -> None:
        if not self._started:
            return
        self._started = False
        await self.scheduler.close()
        await self.manager.close()
        await self.gateway.close()
        await self.sql.close()
        if self.isolation is not None:
            release_isolation(self.isolation)

    def describe(self) -> dict[str, Any]:
        """What is enforced on this machine (shown by instance/specs)."""
        iso = self.isolation.as_dict() if self.isolation else {}
        return {**iso, "notes": list(self.notes)}

    # Functions -------------------------------------------------------------------------

    async def run_function(
        self,
        who: Principal,
        language: str,
        code: str,
        func_name: str | None,
        args: list[Any],
        reader: str,
        run_id: str,
    ) -> Outcome:
        """Execute Function code as `who`; failures are Outcomes, never exceptions."""
        if language == "sql":
            return await self.runner.run(
                "sql", code, None, args, sql=lambda text, a: self._sql(who, text, a, run_id, reader)
            )
        env: dict[str, str] = {}
        if language == "python":
            env = self.gateway.open_session(who, run_id, reader)
        try:
            return await self.runner.run(language, code, func_name, args, env=env)
        finally:
            if env:
                self.gateway.close_session(env)

    async def _sql(
        self, who: Principal, text: str, args: list[Any], run_id: str, reader: str
    ) -> Any:
        limit = self.settings.sql_max_code_bytes
        if len(text.encode()) > limit:  # parsing is slow and holds a database reader
            raise SqlError(f"the SQL is longer than {limit} bytes")

        def compile_(conn: Any) -> Any:
            return compile_sql(text, own_table_lookup(conn, who.account_id), conn.dialect)

        compiled = await self.ctx.db.read(compile_)
        rows = await self.sql.run(compiled, args)
        now_ms = int(self.clock() * 1000)
        for table in compiled.tables:
            await self.store.record_access(table.id, run_id, "read", reader, now_ms)
        return rows

    # Notebooks -------------------------------------------------------------------------

    async def _instance_env(self, doc: dict[str, Any]) -> dict[str, str]:
        who = Principal(doc["account_id"], doc["user_id"] or doc["account_id"], "token")
        reader = doc["notebook_id"] or doc["id"]
        instance_id = doc["id"]

        def on_metric(kind: str, event: dict[str, Any]) -> None:
            self.manager.record_blockx(instance_id, kind, event)

        return self.gateway.open_session(who, instance_id, reader, on_metric)

    def _instance_ended(self, doc: dict[str, Any], env: dict[str, str]) -> None:
        self.gateway.close_session(env)

    async def _launch_scheduled(self, sched: dict[str, Any]) -> str:
        from workspace.compute.params import bind_names

        notebook = await self.store.get_notebook(sched["content_id"])
        if notebook is None:
            raise LookupError(f"notebook {sched['content_id']!r} no longer exists")
        globals_ = bind_names(notebook["parameters"], sched["arguments"])
        doc = await self.manager.launch(
            code=notebook["code"],
            notebook=notebook,
            parameters=notebook["parameters"],
            arguments=sched["arguments"],
            globals_=globals_,
            account_id=sched["account_id"],
            user_id=sched.get("user_id"),
            name=sched.get("name") or notebook["name"],
            background=True,
            max_cpu=sched.get("max_cpu"),
            max_memory=sched.get("max_memory"),
            schedule_id=sched["id"],
            launched="schedule",
        )
        return str(doc["id"])


def _remove_leftovers(root: Path, uids: range) -> None:
    """Run folders of this server's uids and SDK sockets of dead servers (after kill -9)."""
    if not root.is_dir():
        return
    for entry in root.iterdir():
        try:
            if entry.name.startswith("run-") and entry.stat().st_uid in uids:
                shutil.rmtree(entry, ignore_errors=True)
            elif entry.name.startswith("sdk-") and entry.name.endswith(".sock"):
                pid = entry.name.split("-")[1]
                if pid.isdigit() and not psutil.pid_exists(int(pid)):
                    entry.unlink()
        except OSError:
            continue


COMPUTE_KEY = web.AppKey("workspace_compute", ComputeService)

"""The compute service: one per workspace app, assembling sandbox, pool, runners, instance
manager, scheduler, SQL runner and SDK gateway, with an explicit start/close lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
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
from workspace.compute.quotas import QUOTA_FUNCTION_RUNS, AccountQuotas, InFlight
from workspace.compute.retention import Retention, RetentionSettings
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
from workspace.compute.sandbox.probe import default_work_root
from workspace.compute.sandbox.rundirs import remove_leftover_run_dirs
from workspace.compute.sandbox.uids import (
    claim_uids,
    kill_uid_processes,
    remove_uid_files,
    sweep_free_blocks,
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
MAX_INSTANCES = UID_HALF - 1  # the block's last uid is the Go build's


@dataclass(frozen=True)
class ComputeSettings:
    """Compute limits and places; defaults documented in docs/compute.md."""

    workers: int = 2  # Function runs at once (the worker pool)
    max_queue: int = 64  # Function runs waiting for a worker; more get `queue_full`
    function_limits: Limits = field(default_factory=Limits)
    instance: InstanceSettings = field(default_factory=InstanceSettings)
    account: AccountQuotas = field(default_factory=AccountQuotas)
    retention: RetentionSettings = field(default_factory=RetentionSettings)
    # Each server owns 64 sandbox uids: [uid_base, +64), by default 2_000_000 + 64 * port, so
    # servers on one machine never share uids and a restarted server sweeps its predecessor's
    # leftovers. Function runs use the first `workers`, instances up to 31 from uid_base + 32,
    # and the last one, uid_base + 63, is the Go build's.
    uid_base: int | None = None
    port: int = 0
    go_build_seconds: float = 120.0
    sql_timeout_ms: int = 5000  # SQL Function wall-clock limit
    sql_max_rows: int = 10000  # SQL Function rows; more is a failed run
    sql_max_code_bytes: int = 65536  # longer SQL is refused before parsing (a failed run)
    sql_max_value_bytes: int = 1024 * 1024  # one value (SQLite) / one row (PostgreSQL)
    scheduler_tick_seconds: float = 1.0
    use_cgroups: bool = True  # max_cpu through a cpu cgroup when the machine allows it
    require_network_isolation: bool = False  # refuse to start without a network namespace
    bwrap: str = "bwrap"  # bubblewrap, for each run's own PID namespace ("": do not use it)
    require_process_isolation: bool = False  # refuse to start when runs could see processes
    require_filesystem_isolation: bool = False  # refuse to start when runs could share files
    sandbox_dir: Path | None = None  # run folders (default: <tmp>/chainstate-sandbox)
    data_dir: Path = Path(".chainstate/workspace")  # instance logs live here
    cache_dir: Path | None = None  # Go build cache (default: <data_dir>/compute-cache)

    @classmethod
    def from_mapping(cls, values: dict[str, Any], data_dir: Path, port: int) -> ComputeSettings:
        """From the `[compute]` TOML table: flat keys; Limits fields prefixed `function_`,
        InstanceSettings fields `instance_`, AccountQuotas fields `account_`, the rest
        (RetentionSettings' and this class's own) unprefixed. Unknown keys or bad types:
        ConfigError."""
        base = cls(data_dir=data_dir, port=port)
        found: dict[str | None, dict[str, Any]] = {group: {} for _, group in _GROUPS}
        for key, value in values.items():
            for prefix, group in _GROUPS:
                target = base if group is None else getattr(base, group)
                name = key.removeprefix(prefix) if key.startswith(prefix) else None
                settable = {f.name for f in fields(target)} - _NOT_SETTABLE.get(group, set())
                if name in settable:
                    found[group][name] = _coerce(key, getattr(target, name), value)
                    break
            else:
                raise ConfigError(f"[compute] unknown setting {key!r}")
        nested = {g: replace(getattr(base, g), **found[g]) for _, g in _GROUPS if g is not None}
        return replace(base, **nested, **found[None])


# (key prefix, nested settings field of ComputeSettings or None for its own fields), in the
# order keys are matched
_GROUPS: list[tuple[str, str | None]] = [
    ("function_", "function_limits"),
    ("instance_", "instance"),
    ("account_", "account"),
    ("", "retention"),
    ("", None),
]
# values the service derives itself (the instance uid range, the port) and the nested groups
_NOT_SETTABLE: dict[str | None, set[str]] = {
    None: {"function_limits", "instance", "account", "retention", "port"},
    "instance": {"uid_base"},
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
        self._background: set[asyncio.Task[Any]] = set()
        self._uid_lock: int | None = None  # held for the server's life: see claim_uids

    # lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        s = self.settings
        # runs use other uids: logs and the build cache must stay unreadable to them
        for folder in (s.data_dir, s.cache_dir):
            if folder is not None:
                await asyncio.to_thread(private_dir, folder)
        root = s.sandbox_dir or default_work_root()
        iso = await asyncio.to_thread(probe_isolation, s.use_cgroups, s.bwrap or None, root)
        self._require(iso)
        self.isolation = iso
        if s.workers > UID_HALF or s.instance.max_running > MAX_INSTANCES:
            raise ValueError(
                f"workers are limited to {UID_HALF}, instance max_running to {MAX_INSTANCES}"
            )
        base = s.uid_base if s.uid_base is not None else UID_ROOT + UID_BLOCK * s.port
        uids = range(base, base + UID_BLOCK)
        self.instance_settings = replace(s.instance, uid_base=base + UID_HALF)
        try:
            if iso.drop_uid:
                self._uid_lock = await asyncio.to_thread(claim_uids, root, uids)
            await self._start_with(iso, root, uids, base)
        except BaseException:
            self._release_uids()
            release_isolation(iso)
            raise
        self._started = True
        log.info("compute started", extra={"isolation": iso.as_dict(), "notes": self.notes})

    async def _start_with(self, iso: Isolation, root: Path, uids: range, base: int) -> None:
        """The rest of `start`, holding the sandbox uids (as root)."""
        s = self.settings
        await asyncio.to_thread(self._remove_leftovers, iso, root, uids)
        self.sandbox = Sandbox(iso, work_root=root)
        function_uids = UidPool(base, s.workers)
        function_uids.on_release.append(self._clean_uid)
        self.pool = WorkerPool(s.workers, s.max_queue, function_uids)
        self.function_runs = InFlight(
            QUOTA_FUNCTION_RUNS,
            "max_function_runs",
            s.account.max_function_runs,
            "Function runs queued or running",
        )
        runner_settings = RunnerSettings(
            limits=s.function_limits,
            go_build_seconds=s.go_build_seconds,
            cache_dir=s.cache_dir or s.data_dir / "compute-cache",
            build_uid=uids[-1],
            max_json_depth=self.ctx.settings.max_json_depth,
        )
        self.runner = CodeRunner(self.sandbox, self.pool, runner_settings)
        await self.runner.prepare()
        self.notes = [*iso.notes, *self.runner.notes]
        self.sql = SqlFunctionRunner(
            self.ctx.db,
            s.sql_timeout_ms,
            s.sql_max_rows,
            result_bytes=s.function_limits.result_bytes,
            max_value_bytes=s.sql_max_value_bytes,
            max_columns=self.ctx.settings.max_columns,
        )
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
        self.sandbox.expose(self.gateway.socket_path)
        log_dir = s.data_dir / "instance-logs"
        self.manager = InstanceManager(
            self.sandbox,
            self.runner,
            self.store,
            self.instance_settings,
            log_dir,
            clock=self.clock,
            env_for=self._instance_env,
            quotas=s.account,
        )
        self.manager.uid_pool.on_release.append(self._clean_uid)
        self.manager.on_end = self._instance_ended
        await self.manager.start()
        self.retention = Retention(
            self.ctx.db, log_dir, s.retention, s.account.max_log_bytes, clock=self.clock
        )
        await self.retention.start()
        self.scheduler = Scheduler(
            self.store,
            self._launch_scheduled,
            self.manager.is_running,
            clock=self.clock,
            tick_seconds=s.scheduler_tick_seconds,
        )
        await self.scheduler.start()

    def _release_uids(self) -> None:
        if self._uid_lock is not None:
            os.close(self._uid_lock)
            self._uid_lock = None

    def _require(self, iso: Isolation) -> None:
        """Refuse to start when an isolation the settings require is missing here."""
        s = self.settings
        missing = [
            what
            for what, required, present in (
                ("network", s.require_network_isolation, iso.network_isolated),
                ("process", s.require_process_isolation, iso.processes_isolated),
                ("file system", s.require_filesystem_isolation, iso.filesystem_private),
            )
            if required and not present
        ]
        if missing:
            release_isolation(iso)
            raise RuntimeError(f"{missing[0]} isolation required but unavailable: {iso.notes}")

    def _remove_leftovers(self, iso: Isolation, root: Path, uids: range) -> None:
        """What a crashed predecessor on the same port left: processes of its uids, run
        folders (tmpfs mounts included), files its uids left in shared temp folders, and
        SDK sockets of dead servers. Called holding the uids' lock, so that predecessor is
        gone."""
        if not iso.drop_uid:
            return
        killed = sweep_uids(uids)
        if killed:
            log.warning("killed processes left by a previous server", extra={"n": killed})
        remove_leftover_run_dirs(root, uids)
        if not iso.filesystem_private:
            remove_uid_files(uids)
        _remove_dead_sockets(root)
        # the kept folders of servers gone for good (another port): nobody reuses them
        sweep_free_blocks(root, lambda block: remove_leftover_run_dirs(root, block, keep=False))

    def _clean_uid(self, uid: int) -> None:
        """Before a sandbox uid is handed out again: nothing of its last run may remain. Its
        processes were killed when the run was cleaned up; without a private file system,
        what it left in the shared temp folders goes now."""
        if self.isolation is not None and not self.isolation.filesystem_private:
            kill_uid_processes(uid)
            remove_uid_files(range(uid, uid + 1))

    async def close(self) -> None:
        if not self._started:
            return
        self._started = False
        await self.scheduler.close()
        await self.retention.close()
        await self.manager.close()
        await self.gateway.close()
        await self.sql.close()
        self._release_uids()
        if self.isolation is not None:
            release_isolation(self.isolation)

    def describe(self) -> dict[str, Any]:
        """What is enforced on this machine (shown by instance/specs)."""
        iso = self.isolation.as_dict() if self.isolation else {}
        return {**iso, "notes": list(self.notes)}

    # Functions -------------------------------------------------------------------------

    async def run_function(
        self,
        caller: Principal,
        rights: Principal,
        language: str,
        code: str,
        func_name: str | None,
        args: list[Any],
        reader: str,
        run_id: str,
    ) -> Outcome:
        """Execute Function code for `caller` (whose quota it counts against) with `rights`
        (whose tables its SDK calls and SQL may use: see workspace.compute_api.run_rights).
        Failures are Outcomes; only a quota refusal raises (QuotaExceeded, an HTTP 429).

        Table access is recorded per saved Function (`reader`, its id), not per run, so the
        records grow with Functions and tables, not with calls; an ad-hoc run (`reader` "")
        is no table's dependency and records nothing."""
        run_id = reader or run_id
        with self.function_runs.hold(caller.account_id):
            if language == "sql":

                def sql(text: str, a: list[Any]) -> Any:
                    return self._sql(rights, text, a, run_id, reader)

                return await self.runner.run("sql", code, None, args, sql=sql)
            env: dict[str, str] = {}
            if language == "python":
                env = self.gateway.open_session(rights, run_id, reader)
            try:
                return await self.runner.run(language, code, func_name, args, env=env)
            finally:
                if env:
                    self.gateway.close_session(env)

    async def _sql(
        self, rights: Principal, text: str, args: list[Any], run_id: str, reader: str
    ) -> Any:
        limit = self.settings.sql_max_code_bytes
        if len(text.encode()) > limit:  # parsing is slow and holds a database reader
            raise SqlError(f"the SQL is longer than {limit} bytes")

        def compile_(conn: Any) -> Any:
            return compile_sql(text, own_table_lookup(conn, rights.account_id), conn.dialect)

        compiled = await self.ctx.db.read(compile_)
        rows = await self.sql.run(compiled, args)
        now_ms = int(self.clock() * 1000)
        for table in compiled.tables if reader else ():
            await self.store.record_access(table.id, run_id, "read", reader, now_ms)
        return rows

    # Notebooks -------------------------------------------------------------------------

    async def _instance_env(self, doc: dict[str, Any]) -> dict[str, str]:
        """The SDK session of an instance: the rights chosen at launch (the Notebook owner's
        when another account launched it; see workspace.compute_api.run_rights)."""
        rights = doc.get("rights_account_id") or doc["account_id"]
        if rights == doc["account_id"]:
            who = Principal(doc["account_id"], doc["user_id"] or doc["account_id"], "token")
        else:
            who = Principal(rights, rights, "owner")
        reader = doc["notebook_id"] or doc["id"]
        instance_id = doc["id"]

        def on_metric(kind: str, event: dict[str, Any]) -> None:
            self.manager.record_blockx(instance_id, kind, event)

        return self.gateway.open_session(who, instance_id, reader, on_metric)

    def _instance_ended(self, doc: dict[str, Any], env: dict[str, str]) -> None:
        self.gateway.close_session(env)
        task = asyncio.create_task(self.retention.enforce_account(doc["account_id"]))
        self._background.add(task)  # the account's log quota, checked as each log completes
        task.add_done_callback(self._background.discard)

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
            rights_account_id=notebook["account_id"],
        )
        return str(doc["id"])


def _remove_dead_sockets(root: Path) -> None:
    """SDK sockets of servers that died (kill -9)."""
    if not root.is_dir():
        return
    for entry in root.glob("sdk-*.sock"):
        pid = entry.name.split("-")[1]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            with contextlib.suppress(OSError):
                entry.unlink()


COMPUTE_KEY = web.AppKey("workspace_compute", ComputeService)

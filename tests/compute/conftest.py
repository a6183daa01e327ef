"""Compute fixtures: one isolation probe per session, a shared Go build cache."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from tests.conftest import free_port
from tests.workspace.conftest import backend, upstream, ws  # noqa: F401 - shared fixtures
from workspace import auth
from workspace.app import create_app, migrate_all
from workspace.compute.instances import InstanceSettings
from workspace.compute.runners import CodeRunner, RunnerSettings
from workspace.compute.sandbox import (
    Isolation,
    Limits,
    Sandbox,
    UidPool,
    WorkerPool,
    probe_isolation,
    release_isolation,
)
from workspace.compute.service import COMPUTE_KEY, ComputeService
from workspace.db import Database, open_database
from workspace.settings import WorkspaceSettings

REPO = Path(__file__).resolve().parents[2]
# Kept between sessions (gitignored) so the first Go build of the standard library is paid once.
GO_CACHE = REPO / ".chainstate" / "test-compute-cache"

FAST = Limits(wall_seconds=5, cpu_seconds=5, memory_bytes=256 * 1024 * 1024)
BUILD_UID = 2_100_063  # the runner fixture's Go build uid (its pool uses 2_100_000..3)


@pytest.fixture(scope="session")
def isolation() -> Iterator[Isolation]:
    iso = probe_isolation()
    yield iso
    release_isolation(iso)


@pytest.fixture
def sandbox(isolation: Isolation) -> Iterator[Sandbox]:
    # Not under pytest's tmp_path: that is 0700 and the runs' own uids must reach their folder.
    root = Path(tempfile.mkdtemp(prefix="cs-compute-"))
    root.chmod(0o711)
    yield Sandbox(isolation, work_root=root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(params=["probed", "hidepid"])
def private_sandbox(request: pytest.FixtureRequest, sandbox: Sandbox) -> Sandbox:
    """The machine's best isolation (bubblewrap), and the root fallback without it (a hidepid
    /proc and the same file system view made with mount calls)."""
    iso = sandbox.isolation
    if request.param == "hidepid":
        if not iso.drop_uid:
            pytest.skip("hidepid=2 needs root and a uid per run")
        iso = replace(iso, processes="hidepid", bwrap=None)
    if not iso.processes_isolated or not iso.filesystem_private:
        pytest.fail(f"process or file system isolation unavailable here: {iso.notes}")
    return Sandbox(iso, work_root=sandbox.work_root)


@pytest.fixture
def pool() -> WorkerPool:
    return WorkerPool(workers=2, max_queue=8, uids=UidPool(2_100_000, 4))


@pytest.fixture
async def runner(sandbox: Sandbox, pool: WorkerPool) -> AsyncIterator[CodeRunner]:
    settings = RunnerSettings(limits=FAST, cache_dir=GO_CACHE, build_uid=BUILD_UID)
    r = CodeRunner(sandbox, pool, settings)
    await r.prepare()
    yield r


# ---- the workspace app with compute, in process (one per test module) -------------------


@dataclass
class Client:
    """The /v1 API as one credential over a shared aiohttp session."""

    base: str
    headers: dict[str, str]
    session: aiohttp.ClientSession

    async def get(self, path: str, **params: Any) -> tuple[int, Any]:
        query = {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in params.items()}
        async with self.session.get(self.base + path, params=query, headers=self.headers) as r:
            return r.status, await r.json()

    async def post(self, path: str, body: Any = None) -> tuple[int, Any]:
        async with self.session.post(self.base + path, json=body or {}, headers=self.headers) as r:
            return r.status, await r.json()

    async def ok(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        status, env = await (self.get(path, **params) if method == "GET" else self.post(path, body))
        assert status == 200 and env["code"] == 0, (status, env)
        return env["data"]

    async def fail(self, method: str, path: str, body: Any = None, **params: Any) -> int:
        status, env = await (self.get(path, **params) if method == "GET" else self.post(path, body))
        assert status >= 400 and env["code"] != 0 and env["data"] is None, (status, env)
        return status


async def wait_ended(client: Client, instance_id: str, seconds: float = 15) -> dict[str, Any]:
    """The instance once it has ended (AssertionError when it is still running after
    `seconds`)."""
    for _ in range(int(seconds * 10)):
        doc = await client.ok("GET", "/v1/notebook/instance", id=instance_id)
        if doc["status"] == "ended":
            return doc
        await asyncio.sleep(0.1)
    raise AssertionError(f"{instance_id} still running")


NOTE_COLUMNS = [
    {"id": "id", "name": "id", "type": "STRING"},
    {"id": "n", "name": "note", "type": "STRING"},
]


async def note_table(client: Client, note: str, visibility: str = "private") -> str:
    """A fresh Space of the client's account holding table `t` (id, note) with one row
    `r1` whose note is `note`; returns the table id."""
    space = f"s{uuid.uuid4().hex[:10]}"
    await client.ok("POST", "/v1/space/create", {"id": space, "visibility": visibility})
    body = {"space": space, "name": "t", "table_type": "normal"}
    t = await client.ok("POST", "/v1/table/create", body)
    await client.ok("POST", "/v1/table/init", {"id": t["id"], "columns": NOTE_COLUMNS})
    row = {"table_id": t["id"], "data": {"id": "r1", "note": note}}
    await client.ok("POST", "/v1/table/row/create", row)
    return str(t["id"])


@dataclass
class Stack:
    app: web.Application
    svc: ComputeService
    alice: Client
    bob: Client
    key: Client  # alice's access key
    ids: dict[str, str]
    db: Database


TEST_COMPUTE = dict(
    cache_dir=GO_CACHE,
    workers=2,
    max_queue=16,
    function_limits=Limits(wall_seconds=3, cpu_seconds=8, memory_bytes=256 * 1024 * 1024),
    instance=InstanceSettings(
        allowed_quotas=((100, 256 * 1024 * 1024), (200, 512 * 1024 * 1024)),
        default_max_memory=256 * 1024 * 1024,
        metrics_interval_seconds=0.2,
        max_running=4,
    ),
)


@asynccontextmanager
async def running_stack(
    data_dir: Path, proxy_url: str, database: str = "sqlite", **compute: Any
) -> AsyncIterator[Stack]:
    """The app with compute on a free port, accounts alice and bob (and alice's access key);
    `compute`: ComputeSettings fields set on top of TEST_COMPUTE."""
    port = free_port()
    settings = WorkspaceSettings.from_config(
        {"data_dir": str(data_dir), "workspace": {"port": port}}
    ).with_overrides(proxy_url=proxy_url, database=database)
    db = open_database(settings)
    migrate_all(db)

    def accounts(conn: Any) -> dict[str, str]:
        ids: dict[str, str] = {}
        for name in ("alice", "bob"):
            ids[name] = auth.create_account(conn, "personal", f"{name}{port}", name)["id"]
            ids[f"{name}_token"] = auth.create_credential(conn, "token", ids[name])[1]
        ids["alice_key"] = auth.create_credential(conn, "key", ids["alice"])[1]
        return ids

    ids = db.run_sync(accounts)
    app = create_app(settings)
    svc = app[COMPUTE_KEY]
    svc.settings = replace(svc.settings, **{**TEST_COMPUTE, **compute})  # type: ignore[arg-type]
    runner = web.AppRunner(app)
    try:
        await runner.setup()
    except BaseException:  # a start that fails (e.g. UidsInUse) leaves nothing open
        await runner.cleanup()
        db.close_sync()
        raise
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    base = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:

        def client(token: str, account: str) -> Client:
            headers = {"Authorization": f"Bearer {token}", "X-Account-ID": account}
            return Client(base, headers, session)

        yield Stack(
            app,
            svc,
            client(ids["alice_token"], ids["alice"]),
            client(ids["bob_token"], ids["bob"]),
            Client(base, {"AccessKey": ids["alice_key"]}, session),
            ids,
            db,
        )
    await runner.cleanup()
    db.close_sync()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(
    tmp_path_factory: pytest.TempPathFactory,
    upstream: str,  # noqa: F811
    backend: str,  # noqa: F811
) -> AsyncIterator[Stack]:
    """The app on each backend: SQLite, and a fresh PostgreSQL schema (CHAINSTATE_TEST_PG)."""
    async with running_stack(tmp_path_factory.mktemp("ws"), upstream, backend) as s:
        yield s


SECRET_ARGV = "postgresql://chainstate:pr0cess-s3cret@db.internal/chainstate"


@pytest.fixture
def secret_process() -> Iterator[subprocess.Popen[bytes]]:
    """A long-running process of the server's machine with a secret on its command line
    (like the workspace's own `--database ...`): no run may see it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "--database", SECRET_ARGV]
    )
    yield proc
    proc.kill()
    proc.wait()

"""An attacker's Function and Notebook against a real server with real runs: read or write any
path outside the run's folder, leave a file for a later run, reach the network (TCP, the
machine's Unix sockets, an abstract socket), see another process, read or write another
account's rows through the SDK. Every attempt must find nothing. Run with bubblewrap on both
backends, and with the root fallback without bubblewrap (SQLite)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import pytest_asyncio

from tests.compute.conftest import REPO, Stack, note_table, running_stack, wait_ended
from tests.workspace.conftest import pg_schema

pytestmark = pytest.mark.asyncio(loop_scope="module")

ATTACK = r"""
import json, os, socket, stat
import chainstate_sdk as cs

MARKER = "attacker-was-here"


def attempt(fn):
    try:
        fn()
        return "ok"
    except Exception as exc:
        return type(exc).__name__


def read(path):
    if os.path.isdir(path):
        return os.listdir(path)
    with open(path, "rb") as fh:
        return fh.read(64)


def write(folder):
    with open(os.path.join(folder, MARKER), "w") as fh:
        fh.write("x")


def sockets_under(top, limit=2000):
    found = []
    for dirpath, dirnames, filenames in os.walk(top):
        for name in filenames:
            path = os.path.join(dirpath, name)
            try:
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    found.append(path)
            except OSError:
                pass
        if len(found) > limit:
            break
    return found


def connect_unix(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1)
    try:
        s.connect(path)
    finally:
        s.close()


def connect_tcp(host, port):
    socket.create_connection((host, port), timeout=1).close()


def attack(ctx):
    found = {}
    for path in ctx["read"]:
        if attempt(lambda: read(path)) == "ok":
            found["read " + path] = True
    for folder in ctx["write"]:
        if attempt(lambda: write(folder)) == "ok":
            found["write " + folder] = True
    for path in ctx["leftovers"]:
        if os.path.exists(path):
            found["leftover " + path] = True
    for folder in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", os.environ["HOME"]):
        write(folder)  # allowed: the run's own folders; the next run must not see them
    for host, port in ctx["tcp"]:
        if attempt(lambda: connect_tcp(host, port)) == "ok":
            found[f"tcp {host}:{port}"] = True
    sdk = os.environ.get("CHAINSTATE_SDK_SOCKET")
    for top in ("/run", "/var/run", "/tmp", "/var/tmp", "/dev"):
        for path in sockets_under(top):
            if path != sdk and attempt(lambda: connect_unix(path)) == "ok":
                found["unix " + path] = True
    if attempt(lambda: connect_unix("\0" + ctx["abstract"])) == "ok":
        found["abstract socket"] = True
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    if len(pids) != 1:
        found["processes"] = pids
    for table in ctx["private_tables"]:
        calls = {
            "table": lambda: cs.table(table),
            "list_rows": lambda: cs.list_rows(table),
            "get_rows": lambda: cs.get_rows(table, ["r1"]),
            "query": lambda: cs.query(table, f"SELECT * FROM {table}"),
        }
        for name, call in calls.items():
            if attempt(call) == "ok":
                found[f"sdk {name} {table}"] = True
    for table in ctx.get("own_tables", []):  # the control: the SDK itself works here
        if attempt(lambda: cs.list_rows(table)) != "ok":
            found["sdk cannot read own table " + table] = True
    for table in ctx["public_tables"]:
        calls = {
            "upsert": lambda: cs.upsert(table, {"id": "r9", "note": "attacker"}),
            "update": lambda: cs.update(table, "r1", {"note": "attacker"}),
            "delete": lambda: cs.delete(table, "r1"),
        }
        for name, call in calls.items():
            if attempt(call) == "ok":
                found[f"sdk {name} {table}"] = True
    return found
"""
FUNCTION = ATTACK + "\ndef main(ctx):\n    return attack(ctx)\n"
NOTEBOOK = ATTACK + "\nprint('RESULT ' + json.dumps(attack(ctx)), flush=True)\n"
VICTIM_CODE = "import time\nopen('victim-file', 'w').write('alice private')\ntime.sleep(60)\n"
HIDDEN = ["/tmp", "/var/tmp", "/dev/shm", "/run/lock"]


@pytest.fixture(scope="module")
def data_dir() -> Iterator[Path]:
    """Outside /tmp (runs see the path; only the folder's mode guards it), readable by all."""
    parent = REPO / ".chainstate"
    parent.mkdir(exist_ok=True)
    path = Path(parent / f"cs-attack-{uuid.uuid4().hex[:8]}")
    path.mkdir(mode=0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest_asyncio.fixture(
    scope="module",
    loop_scope="module",
    params=[("sqlite", "bwrap"), ("postgresql", "bwrap"), ("sqlite", "fallback")],
    ids=["sqlite", "postgresql", "sqlite-no-bwrap"],
)
async def attacked(
    request: pytest.FixtureRequest, data_dir: Path, upstream: str
) -> AsyncIterator[Stack]:
    database, mode = request.param
    extra = {"bwrap": ""} if mode == "fallback" else {}
    folder = data_dir / f"{request.param_index}"
    folder.mkdir(mode=0o755)
    with contextlib.ExitStack() as schemas:
        if database == "postgresql":
            database = schemas.enter_context(pg_schema())
        async with running_stack(folder, upstream, database, **extra) as stack:
            iso = stack.svc.isolation
            assert iso is not None
            if not (iso.drop_uid and iso.filesystem_private and iso.processes_isolated):
                pytest.fail(f"this machine lacks the isolation under test: {iso.notes}")
            yield stack


def context(stack: Stack, alice_home: Path, server_port: int, upstream: str) -> dict[str, Any]:
    svc = stack.svc
    data = svc.settings.data_dir
    up = urlparse(upstream)
    return {
        "read": [
            str(data / "workspace.db"),
            str(data / "instance-logs"),
            str(data),
            str(alice_home / "victim-file"),
            str(alice_home),
            "/etc/shadow",
            "/root",
            f"/proc/{os.getpid()}/environ",
            f"/proc/{os.getpid()}/cmdline",
        ],
        "write": [
            "/",
            "/etc",
            "/usr/local/bin",
            "/var",
            "/root",
            str(data),
            str(data.parent),
            str(REPO),
            str(alice_home),
        ],
        "leftovers": [os.path.join(f, "attacker-was-here") for f in HIDDEN],
        "tcp": [["127.0.0.1", server_port], [up.hostname, up.port], ["10.0.0.1", 80]],
        "abstract": "",
        "private_tables": [],
        "public_tables": [],
    }


async def alice_victim(stack: Stack) -> tuple[str, Path]:
    """A running instance of alice's with a file in its folder (another account's run)."""
    space = f"v{uuid.uuid4().hex[:8]}"
    await stack.alice.ok("POST", "/v1/space/create", {"id": space})
    nb = await stack.alice.ok(
        "POST", "/v1/notebook/create", {"space": space, "name": "victim", "code": VICTIM_CODE}
    )
    inst = await stack.alice.ok("POST", "/v1/notebook/instance/create", {"notebook_id": nb["id"]})
    live = stack.svc.manager._live[inst["id"]]
    home = live.sp.workdir
    for _ in range(100):
        if await asyncio.to_thread((home / "victim-file").exists):
            return inst["id"], home
        await asyncio.sleep(0.05)
    raise AssertionError("alice's instance did not start")


@pytest.fixture
def abstract_socket() -> Iterator[str]:
    """A listening abstract Unix socket on the server's machine (its network namespace)."""
    name = f"cs-attack-{uuid.uuid4().hex}"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind("\0" + name)
    srv.listen()
    yield name
    srv.close()


async def test_an_attacker_finds_nothing(
    attacked: Stack, upstream: str, abstract_socket: str
) -> None:
    stack = attacked
    alice_private = await note_table(stack.alice, "alice's private row")
    alice_public = await note_table(stack.alice, "alice's public row", "public")
    victim, alice_home = await alice_victim(stack)
    port = int(stack.alice.base.rsplit(":", 1)[1])
    ctx = context(stack, alice_home, port, upstream)
    ctx.update(
        abstract=abstract_socket,
        private_tables=[alice_private],
        public_tables=[alice_public],
    )
    try:
        # 1. a Function of bob's: it leaves files in every folder it may write
        body = {"language": "python", "code": FUNCTION, "arguments": [{"value": ctx}]}
        rec = await stack.bob.ok("POST", "/v1/function/run", body)
        assert rec["status"] == "succeeded", rec["output"]
        assert leaks(rec["return_value"]) == {}
        # 2. a later Notebook of bob's finds none of them, nor anything else
        space = f"b{uuid.uuid4().hex[:8]}"
        await stack.bob.ok("POST", "/v1/space/create", {"id": space})
        params = [{"name": "ctx", "type": "JSON"}]
        nb = await stack.bob.ok(
            "POST",
            "/v1/notebook/create",
            {"space": space, "name": "attack", "code": NOTEBOOK, "parameters": params},
        )
        body = {"notebook_id": nb["id"], "arguments": [{"name": "ctx", "value": ctx}]}
        inst = await stack.bob.ok("POST", "/v1/notebook/instance/create", body)
        doc = await wait_ended(stack.bob, inst["id"], 30)
        logs = await stack.bob.ok("GET", "/v1/notebook/instance/logs/history", id=inst["id"])
        results = [r["message"] for r in logs["logs"] if r["message"].startswith("RESULT ")]
        assert doc["display_status"] == "succeeded" and results, logs
        assert leaks(json.loads(results[0].removeprefix("RESULT "))) == {}
        # 3. and a later Function of alice's does not see what bob's runs left either (her
        # own tables are hers to use: the SDK part does not apply)
        mine = {**ctx, "private_tables": [], "public_tables": [], "own_tables": [alice_private]}
        look = {"language": "python", "code": FUNCTION, "arguments": [{"value": mine}]}
        rec = await stack.alice.ok("POST", "/v1/function/run", look)
        assert rec["status"] == "succeeded", rec["output"]
        assert leaks(rec["return_value"]) == {}
    finally:
        await stack.alice.ok("POST", "/v1/notebook/instance/cancel", {"id": victim})
    # nothing the runs wrote reached the machine, and alice's rows are untouched
    places = [*ctx["write"], *HIDDEN, str(stack.svc.sandbox.work_root)]
    assert await asyncio.to_thread(host_markers, places) == []
    rows = await stack.alice.ok("GET", "/v1/table/row/list", table_id=alice_public)
    assert [r["note"] for r in rows["rows"]] == ["alice's public row"]


def leaks(found: dict[str, Any]) -> dict[str, Any]:
    """What a run found, but writes to a folder under a run's own private ones (the
    project's tree in a clone under /tmp): those land in the run's tmpfs, and the host
    check after the runs proves it."""
    return {
        what: v
        for what, v in found.items()
        if not (what.startswith("write ") and under_hidden(what.removeprefix("write ")))
    }


def under_hidden(path: str) -> bool:
    return any(path == top or path.startswith(top + "/") for top in HIDDEN)


def host_markers(places: list[str]) -> list[str]:
    return [p for p in places if os.path.exists(os.path.join(p, "attacker-was-here"))]

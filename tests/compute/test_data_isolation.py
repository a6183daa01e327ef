"""Sandboxed code cannot read the workspace's own files (database, instance logs, build cache):
the runs use other uids, so the folder holding them must not be readable by others. Nor can it
see the machine's processes: not the server's, not another account's running instance."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.compute.conftest import REPO, SECRET_ARGV, running_stack

pytestmark = pytest.mark.asyncio(loop_scope="function")

PEEK = """import os

def main(paths):
    out = {}
    for p in paths:
        try:
            if os.path.isdir(p):
                os.listdir(p)
            else:
                with open(p, "rb") as fh:
                    fh.read(16)
            out[p] = "read"
        except OSError as exc:
            out[p] = type(exc).__name__
    return out
"""


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """Like a checkout's .chainstate/: readable by others (not pytest's 0700 tmp folders), and
    outside /tmp, which runs do not see at all: here only the folder's mode protects it."""
    parent = REPO / ".chainstate"
    parent.mkdir(exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="cs-data-", dir=parent))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_runs_cannot_read_the_workspace_files(upstream: str, data_dir: Path) -> None:
    async with running_stack(data_dir, upstream) as stack:
        assert stack.svc.isolation is not None
        if not stack.svc.isolation.drop_uid:
            pytest.skip("runs share the server's uid when it is not root")
        ws = data_dir / "workspace"
        paths = [str(ws / "workspace.db"), str(ws / "instance-logs"), str(ws)]
        body = {"language": "python", "code": PEEK, "arguments": [{"value": paths}]}
        rec = await stack.bob.ok("POST", "/v1/function/run", body)
        assert rec["status"] == "succeeded", rec["output"]
        # In a checkout under /tmp the folder is not even there for runs (their /tmp is their
        # own); elsewhere its mode is what keeps them out.
        hidden = str(data_dir).startswith(("/tmp/", "/var/tmp/"))
        refused = "FileNotFoundError" if hidden else "PermissionError"
        assert rec["return_value"] == {p: refused for p in paths}
        assert (ws.stat().st_mode & 0o777) == 0o700


PROCESSES = """import os

def main():
    seen = {}
    for pid in os.listdir('/proc'):
        if pid.isdigit():
            try:
                with open(f'/proc/{pid}/cmdline', 'rb') as fh:
                    seen[pid] = fh.read().replace(bytes(1), b' ').decode()
            except OSError as exc:
                seen[pid] = type(exc).__name__
    return seen
"""


async def test_runs_see_only_their_own_processes(
    upstream: str, data_dir: Path, secret_process: subprocess.Popen[bytes]
) -> None:
    async with running_stack(data_dir, upstream) as stack:
        assert stack.svc.isolation is not None
        if not stack.svc.isolation.processes_isolated:
            pytest.fail(f"process isolation unavailable: {stack.svc.isolation.notes}")
        space = f"p{uuid.uuid4().hex[:8]}"
        await stack.alice.ok("POST", "/v1/space/create", {"id": space})
        marker = "alice-instance-marker"
        code = f"import time\nprint({marker!r}, flush=True)\ntime.sleep(60)\n"
        body = {"space": space, "name": "sleeper", "code": code}
        nb = await stack.alice.ok("POST", "/v1/notebook/create", body)
        inst = await stack.alice.ok(
            "POST", "/v1/notebook/instance/create", {"notebook_id": nb["id"]}
        )
        for _ in range(100):  # until alice's instance has printed, i.e. runs her code
            logs = await stack.alice.ok("GET", "/v1/notebook/instance/logs/history", id=inst["id"])
            if any(marker in line["message"] for line in logs["logs"]):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"alice's instance did not start: {logs}")
        rec = await stack.bob.ok(
            "POST", "/v1/function/run", {"language": "python", "code": PROCESSES}
        )
        await stack.alice.ok("POST", "/v1/notebook/instance/cancel", {"id": inst["id"]})
        assert rec["status"] == "succeeded", rec["output"]
        seen = rec["return_value"]
        assert len(seen) == 1, seen  # bob's run alone: no server, no alice, no secret
        assert SECRET_ARGV not in str(seen) and "python_harness" in next(iter(seen.values()))

"""Sandboxed code cannot read the workspace's own files (database, instance logs, build cache):
the runs use other uids, so the folder holding them must not be readable by others."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.compute.conftest import running_stack

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
    """Like a checkout's .chainstate/: readable by others (not pytest's 0700 tmp folders)."""
    path = Path(tempfile.mkdtemp(prefix="cs-data-"))
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
        assert rec["return_value"] == {p: "PermissionError" for p in paths}
        assert (ws.stat().st_mode & 0o777) == 0o700

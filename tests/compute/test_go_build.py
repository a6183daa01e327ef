"""`go build` of Go Functions: it runs as the server's build uid (never root, never a run's
uid) in the sandbox, with GOWORK=off and the server's own Go environment, so nothing a run
or anyone else planted (a go.work beside or above the build folder, a symlink to a root-only
file, an env file) changes or breaks it, and it reads nothing the build uid may not."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.compute.conftest import BUILD_UID, GO_CACHE, Stack
from workspace.compute.runners import CodeRunner

ROOT_ONLY = "root-only-secret-line-7c1e"


@pytest.fixture(params=["file", "symlink"])
def planted(request: pytest.FixtureRequest, runner: CodeRunner) -> Iterator[Path]:
    """A go.work in the work root, the parent of every build folder (go looks for one in
    every parent): a plain one, or a symlink to a root-only file (whose first line `go` run
    as root printed in its error)."""
    work_root = runner.sandbox.work_root
    secret = work_root / "secret"
    secret.write_text(ROOT_ONLY + "\n")
    secret.chmod(0o600)
    go_work = work_root / "go.work"
    if request.param == "file":
        go_work.write_text("go 1.19\n\nuse ./nowhere\n")
    else:
        go_work.symlink_to(secret)
    yield work_root
    go_work.unlink()
    secret.unlink()


async def test_planted_go_work_changes_nothing(runner: CodeRunner, planted: Path) -> None:
    code = f"func Main(a int) int {{ return a * {os.getpid() % 1000 + 2} }}"  # a fresh build
    out = await runner.run("go", code, None, [3])
    assert out.status == "succeeded", out
    assert out.return_value == 3 * (os.getpid() % 1000 + 2)
    assert ROOT_ONLY not in out.text + out.error_stack


async def test_a_build_error_shows_no_root_only_file(runner: CodeRunner, planted: Path) -> None:
    out = await runner.run("go", "func Main() int { return undefined_name }", None, [])
    assert out.failure is not None and out.failure["code"] == "compile_error"
    assert "undefined" in out.failure["message"] and ROOT_ONLY not in out.error_stack


async def test_the_build_runs_as_the_build_uid(runner: CodeRunner) -> None:
    if not runner.sandbox.isolation.drop_uid:
        pytest.skip("per-run uids need root")
    out = await runner.run("go", "func Main() int { return 11 }", None, [])
    assert out.status == "succeeded", out
    cache = GO_CACHE / "gocache"
    owner = await asyncio.to_thread(lambda: cache.stat().st_uid)
    assert owner == BUILD_UID  # and the cache is closed to everyone else
    assert await asyncio.to_thread(lambda: cache.stat().st_mode & 0o777) == 0o700


@pytest.mark.asyncio(loop_scope="module")
async def test_a_go_work_written_by_a_run_breaks_no_go_function(stack: Stack) -> None:
    """Finding 2 of issue 12, as a user sees it: a Python run writes /tmp/go.work (and one in
    its home); every account's Go Function still builds and runs."""
    plant = (
        "import os\n\ndef main():\n"
        "    for d in ('/tmp', os.environ['HOME'], '/var/tmp'):\n"
        "        open(os.path.join(d, 'go.work'), 'w').write('go 1.19\\n')\n"
    )
    rec = await stack.alice.ok("POST", "/v1/function/run", {"language": "python", "code": plant})
    assert rec["status"] == "succeeded", rec["output"]
    go = {"language": "go", "code": "func Main(a int) int { return a + 40 }"}
    rec = await stack.bob.ok("POST", "/v1/function/run", {**go, "arguments": [{"value": 2}]})
    assert rec["status"] == "succeeded", rec["output"]
    assert rec["return_value"] == 42

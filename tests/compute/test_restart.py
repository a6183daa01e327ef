"""A real `chainstate workspace` process killed (or stopped) while instances run: the
instances' processes die with it, and after the restart they are ended as failed with a clear
exit_message; new instances run normally."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.workspace.conftest import Workspace, make_workspace

CODE = "import time\nprint('started', flush=True)\nwhile True:\n    time.sleep(0.1)\n"


@pytest.fixture
def server(tmp_path: Path, upstream: str) -> Iterator[Workspace]:
    ws = make_workspace("sqlite", tmp_path, upstream)
    try:
        yield ws
    finally:
        ws.stop()
        ws.db.close_sync()


def harness_pids(ws: Workspace) -> set[int]:
    """Host pids of the server's instance processes (bwrap and the program; inside its PID
    namespace the program sees itself as pid 1, so it cannot tell its host pid)."""
    found = set()
    for p in psutil.Process(ws.proc.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "python_harness" in " ".join(p.cmdline()):
                found.add(p.pid)
    return found


def start_instance(ws: Workspace, nb_id: str) -> tuple[str, set[int]]:
    before = harness_pids(ws)
    inst = ws.alice.ok("POST", "/v1/notebook/instance/create", {"notebook_id": nb_id})
    for _ in range(100):
        logs = ws.alice.ok("GET", "/v1/notebook/instance/logs/history", id=inst["id"])["logs"]
        pids = harness_pids(ws) - before
        if pids and any(r["message"] == "started" for r in logs):
            return inst["id"], pids
        time.sleep(0.05)
    raise AssertionError("the instance did not start")


def gone(pids: set[int], seconds: float = 5) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = 0
        for pid in pids:
            with contextlib.suppress(psutil.NoSuchProcess):
                alive += psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        if not alive:
            return True
        time.sleep(0.05)
    return False


def test_kill_and_stop_while_instances_run(server: Workspace) -> None:
    ws = server
    ws.alice.ok("POST", "/v1/space/create", {"id": "restart"})
    nb = ws.alice.ok(
        "POST", "/v1/notebook/create", {"space": "restart", "name": "forever", "code": CODE}
    )
    killed_id, killed_pid = start_instance(ws, nb["id"])
    ws.proc.kill()  # kill -9: no clean-up code runs in the server
    ws.proc.wait()
    assert gone(killed_pid), "the instance outlived its server"
    ws.start()
    doc = ws.alice.ok("GET", "/v1/notebook/instance", id=killed_id)
    assert (doc["status"], doc["display_status"]) == ("ended", "failed")
    assert "server restarted" in doc["exit_message"]
    logs = ws.alice.ok("GET", "/v1/notebook/instance/logs/history", id=killed_id)["logs"]
    assert any("server restarted" in r["message"] for r in logs)

    stopped_id, stopped_pid = start_instance(ws, nb["id"])
    ws.stop()  # SIGTERM: a clean shutdown ends running instances itself
    assert gone(stopped_pid)
    ws.start()
    doc = ws.alice.ok("GET", "/v1/notebook/instance", id=stopped_id)
    assert doc["display_status"] == "failed"
    assert doc["exit_message"] == "server shut down while the instance was running"

    fresh, _ = start_instance(ws, nb["id"])  # the restarted server runs instances normally
    ws.alice.ok("POST", "/v1/notebook/instance/cancel", {"id": fresh})
    assert ws.alice.ok("GET", "/v1/notebook/instance", id=fresh)["display_status"] == "canceled"


COMPUTE_CONFIG = """
[compute]
instance_foreground_ttl_seconds = 1.5
instance_reaper_interval_seconds = 0.1
function_wall_seconds = 1.0
"""


def test_config_section_and_real_time_deadline(tmp_path: Path, upstream: str) -> None:
    """[compute] settings reach the server; a foreground instance without keepalive is ended
    when its deadline passes, one kept alive keeps running."""
    ws = make_workspace("sqlite", tmp_path, upstream, extra_config=COMPUTE_CONFIG)
    try:
        a = ws.alice
        a.ok("POST", "/v1/space/create", {"id": "ttl"})
        nb = a.ok("POST", "/v1/notebook/create", {"space": "ttl", "name": "nb", "code": CODE})
        left, _ = start_instance(ws, nb["id"])
        kept, _ = start_instance(ws, nb["id"])
        doc = a.ok("GET", "/v1/notebook/instance", id=left)
        assert doc["deadline"] - doc["created_at"] == pytest.approx(1.5, abs=0.01)
        for _ in range(8):
            a.ok("POST", "/v1/notebook/instance/keepalive", {"id": kept})
            time.sleep(0.4)
        doc = a.ok("GET", "/v1/notebook/instance", id=left)
        assert doc["display_status"] == "canceled" and "expired" in doc["exit_message"]
        assert a.ok("GET", "/v1/notebook/instance", id=kept)["status"] == "running"
        a.ok("POST", "/v1/notebook/instance/cancel", {"id": kept})
        rec = a.ok(
            "POST",
            "/v1/function/run",
            {"language": "python", "code": "def main():\n    while True:\n        pass\n"},
        )
        assert rec["status"] == "timeout"
        assert rec["output"]["failure"]["message"] == "wall-clock limit of 1 s exceeded"
    finally:
        ws.stop()
        ws.db.close_sync()

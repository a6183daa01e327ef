"""The sandbox: isolation, limits, output capture, the worker pool, and the abuse cases."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import time

import psutil
import pytest

from tests.compute.conftest import SECRET_ARGV
from tests.conftest import free_port
from workspace.compute.sandbox import (
    Isolation,
    Job,
    Limits,
    QueueFull,
    Sandbox,
    UidPool,
    WorkerPool,
    probe_isolation,
    process,
)

PY = "/usr/bin/python3"


def job(code: str, **limits: object) -> Job:
    return Job([PY, "-I", "-c", code], limits=Limits(**{"wall_seconds": 5, **limits}))


# Every process a run can see: pid -> command line (or the error reading it).
LIST_PROCESSES = """import json, os
seen = {}
for pid in os.listdir('/proc'):
    if pid.isdigit():
        try:
            with open(f'/proc/{pid}/cmdline', 'rb') as fh:
                seen[pid] = fh.read().replace(b'\\0', b' ').decode()
        except OSError as exc:
            seen[pid] = type(exc).__name__
print(json.dumps(seen))
"""


def test_isolation_is_probed_and_reported(isolation: Isolation) -> None:
    info = isolation.as_dict()
    assert set(info) >= {
        "network",
        "network_isolated",
        "processes",
        "processes_isolated",
        "per_run_uid",
        "cpu_quota",
        "filesystem",
        "filesystem_private",
        "write_quota",
        "notes",
    }
    if not isolation.network_isolated:  # never silently: the gap is in the notes
        assert any("network" in n for n in info["notes"])
    if isolation.processes != "pidns":
        assert any("PID namespace" in n or "process isolation" in n for n in info["notes"])
    if not isolation.filesystem_private:
        assert any("file system not private" in n for n in info["notes"])


def test_without_bwrap_the_fallback_is_reported() -> None:
    iso = probe_isolation(use_cgroups=False, bwrap="/nonexistent/bwrap")
    note = next(n for n in iso.notes if "/nonexistent/bwrap" in n)
    if os.geteuid() == 0:  # root: a private /proc with hidepid=2, the same private files
        assert iso.processes == "hidepid" and iso.processes_isolated
        assert "hidepid=2" in note
        assert iso.filesystem_private
    else:
        assert iso.processes == "none" and not iso.processes_isolated
        assert "can list every process" in note


async def test_a_run_sees_neither_the_server_nor_other_processes(
    private_sandbox: Sandbox, secret_process: subprocess.Popen[bytes]
) -> None:
    res = await private_sandbox.run(job(LIST_PROCESSES), uid=2_100_012)
    assert res.exit_code == 0, res.output
    seen = json.loads(res.output)
    assert SECRET_ARGV not in res.output.decode()
    assert str(os.getpid()) not in seen and str(secret_process.pid) not in seen
    assert not any("pytest" in cmdline for cmdline in seen.values())
    assert [c for c in seen.values() if LIST_PROCESSES.splitlines()[0] in c] != []  # itself
    assert len(seen) == 1, seen


async def test_a_concurrent_run_is_invisible(private_sandbox: Sandbox) -> None:
    marker = "other-run-marker-7f3a"
    other = await private_sandbox.start(
        Job([PY, "-I", "-c", "import time; time.sleep(30)", marker], limits=Limits()),
        uid=2_100_013,
    )
    try:
        for _ in range(250):  # until the other run's program is up
            if any(marker in " ".join(p.cmdline()) for p in other.processes()):
                break
            await asyncio.sleep(0.02)
        res = await private_sandbox.run(job(LIST_PROCESSES), uid=2_100_014)
        assert res.exit_code == 0, res.output
        assert marker not in res.output.decode()
        assert len(json.loads(res.output)) == 1
    finally:
        other.kill("canceled")
        await other.wait()
        await private_sandbox.cleanup(other)


async def test_a_signal_death_is_reported_as_the_signal(sandbox: Sandbox) -> None:
    res = await sandbox.run(job("import ctypes; ctypes.string_at(0)"))
    assert res.signal == signal.SIGSEGV and res.exit_code is None


async def test_clean_env_own_uid_and_temp_dir_removed(sandbox: Sandbox) -> None:
    os.environ["CHAINSTATE_TEST_SECRET"] = "s3cret"
    try:
        res = await sandbox.run(
            job("import os, json; print(json.dumps([dict(os.environ), os.getuid(), os.getcwd()]))"),
            uid=2_100_010,
        )
    finally:
        del os.environ["CHAINSTATE_TEST_SECRET"]
    env, uid, cwd = json.loads(res.output)
    assert "CHAINSTATE_TEST_SECRET" not in env
    # PWD: bubblewrap sets it to the run's own folder
    assert set(env) <= {"PATH", "HOME", "TMPDIR", "LANG", "CHAINSTATE_RESULT_FD", "PWD"}
    if sandbox.isolation.drop_uid:
        assert uid == 2_100_010
    assert env["HOME"] == cwd and env.get("PWD", cwd) == cwd
    assert not await asyncio.to_thread(os.path.exists, cwd)


async def test_result_fd_carries_the_result(sandbox: Sandbox) -> None:
    code = "import os; os.write(int(os.environ['CHAINSTATE_RESULT_FD']), b'[1]')"
    res = await sandbox.run(job(code))
    assert res.result == b"[1]" and res.exit_code == 0


async def test_network_is_off(sandbox: Sandbox) -> None:
    if not sandbox.isolation.network_isolated:
        pytest.fail(f"network isolation unavailable here: {sandbox.isolation.notes}")
    port = free_port()
    srv = socket.socket()
    srv.bind(("127.0.0.1", port))
    srv.listen()
    srv.setblocking(False)
    try:
        code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)"
        res = await sandbox.run(job(code))
        assert res.exit_code == 1
        assert b"unreachable" in res.output or b"refused" in res.output
        with pytest.raises(BlockingIOError):
            srv.accept()
    finally:
        srv.close()


async def test_wall_clock_kills_an_infinite_loop(sandbox: Sandbox) -> None:
    t0 = time.monotonic()
    res = await sandbox.run(job("while True: pass", wall_seconds=1))
    assert res.reason == "timeout"
    assert time.monotonic() - t0 < 3


async def test_fork_bomb_is_contained_and_swept(sandbox: Sandbox) -> None:
    if not sandbox.isolation.drop_uid:
        pytest.skip("per-run uid needs root; RLIMIT_NPROC would count the server's own processes")
    uid = 2_100_011
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    res = await sandbox.run(job(code, wall_seconds=1.5, processes=32), uid=uid)
    assert res.reason == "timeout"
    alive = [
        p
        for p in psutil.process_iter(["uids", "status"])
        if p.info["uids"] and p.info["uids"].real == uid and p.info["status"] != "zombie"
    ]
    assert alive == []


async def test_a_kill_does_not_hold_the_event_loop(sandbox: Sandbox, monkeypatch) -> None:
    """Killing a run also sweeps the machine's process table for what it left (for a fork
    bomb's uid, pass after pass): that runs in a thread, so the server's other requests and
    runs go on meanwhile, and the run still ends killed with its reason."""
    real = process.kill_run_processes

    def slow(*args: object) -> None:  # a long process table, a fork bomb in it
        time.sleep(0.5)
        real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(process, "kill_run_processes", slow)
    sp = await sandbox.start(job("import time; time.sleep(30)"), uid=2_100_015)
    try:
        t0 = time.perf_counter()
        sp.kill("canceled")
        assert time.perf_counter() - t0 < 0.1
        res = await sp.wait()
        assert res.reason == "canceled" and res.exit_code is None
    finally:
        await sandbox.cleanup(sp)


async def test_huge_allocation_fails_cleanly(sandbox: Sandbox) -> None:
    res = await sandbox.run(job("b = bytearray(10 * 1024 ** 3)", memory_bytes=256 * 1024**2))
    assert res.exit_code == 1 and b"MemoryError" in res.output


async def test_output_is_capped_while_streaming(sandbox: Sandbox) -> None:
    code = "import sys\nsys.stdout.write('x' * 300000)"
    res = await sandbox.run(job(code, output_bytes=1000))
    assert res.exit_code == 0 and res.reason is None
    assert len(res.output) == 1000 and res.output_size == 300000 and res.output_truncated


async def test_100mb_print_is_stopped(sandbox: Sandbox) -> None:
    code = "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 1048576)"
    res = await sandbox.run(job(code, output_hard_bytes=4 * 1024 * 1024))
    assert res.reason == "output_limit"
    assert len(res.output) <= Limits().output_bytes


async def test_file_size_limit(sandbox: Sandbox) -> None:
    code = "open('big', 'wb').write(b'x' * 2_000_000)"
    res = await sandbox.run(job(code, file_size_bytes=1_000_000))
    assert res.exit_code == 1 and b"File too large" in res.output


async def test_open_files_limit(sandbox: Sandbox) -> None:
    code = "fs = [open('/dev/null') for _ in range(100)]"
    res = await sandbox.run(job(code, open_files=50))
    assert res.exit_code == 1 and b"Too many open files" in res.output


async def test_cpu_seconds_limit(sandbox: Sandbox) -> None:
    res = await sandbox.run(job("while True: pass", cpu_seconds=1, wall_seconds=10))
    assert res.reason is None and res.signal is not None  # SIGXCPU, then SIGKILL


async def test_cpu_quota_slows_a_busy_loop(sandbox: Sandbox) -> None:
    if sandbox.isolation.cpu_cgroup is None:
        pytest.fail(f"cpu quota unavailable: {sandbox.isolation.notes}")
    code = "import time\nwhile time.process_time() < 0.3:\n    pass"
    res = await sandbox.run(job(code, cpu_percent=20, wall_seconds=10))
    assert res.exit_code == 0
    assert res.duration_ms >= 1000  # 0.3 s of CPU at 20 % needs about 1.5 s


async def test_pool_records_queue_wait_and_bounds_the_queue(sandbox: Sandbox) -> None:
    pool = WorkerPool(workers=1, max_queue=1, uids=UidPool(2_100_020, 2))

    async def one() -> int:
        async with pool.slot() as (uid, wait_ms):
            await sandbox.run(job("import time; time.sleep(0.4)"), uid)
            return wait_ms

    first = asyncio.create_task(one())
    await asyncio.sleep(0.05)
    second = asyncio.create_task(one())
    await asyncio.sleep(0.05)
    with pytest.raises(QueueFull):
        async with pool.slot():
            pass
    waits = await asyncio.gather(first, second)
    assert waits[0] < 100 and waits[1] >= 250

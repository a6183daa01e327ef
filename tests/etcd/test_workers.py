"""proxy.workers: N processes on one port, restart on crash, clean stop, crash-loop guard."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def start_supervisor(port: int, n: int, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.etcd.worker_app", str(port), str(n), *extra],
        cwd=ROOT,
        stderr=subprocess.PIPE,
    )


def get_pid(port: int) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/pid", timeout=2) as resp:
        pid, index = resp.read().decode().split()
    return int(pid), index


def workers_of(sup: subprocess.Popen[bytes]) -> set[int]:
    alive = set()
    for child in psutil.Process(sup.pid).children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.add(child.pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def wait_serving(port: int, pids: set[int] | None = None, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            pid, _ = get_pid(port)
            if pids is None or pid in pids:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError("workers did not serve in time")


def wait_workers(sup: subprocess.Popen[bytes], n: int, within: float = 15.0) -> set[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        pids = workers_of(sup)
        if len(pids) == n:
            return pids
        time.sleep(0.05)
    raise AssertionError(f"expected {n} workers, have {workers_of(sup)}")


@pytest.fixture
def supervisor() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = free_port()
    sup = start_supervisor(port, 3)
    try:
        yield sup, port
    finally:
        if sup.poll() is None:
            for child in psutil.Process(sup.pid).children():
                child.kill()
            sup.kill()
        sup.wait(10)


def test_workers_share_a_port_restart_and_stop(
    supervisor: tuple[subprocess.Popen[bytes], int],
) -> None:
    sup, port = supervisor
    pids = wait_workers(sup, 3)
    wait_serving(port)
    # Every worker accepts connections on the same port (the kernel spreads new connections).
    seen: set[int] = set()
    indexes: set[str] = set()
    deadline = time.monotonic() + 10
    while seen != pids and time.monotonic() < deadline:
        pid, index = get_pid(port)
        seen.add(pid)
        indexes.add(index)
    assert seen == pids
    assert indexes == {"0", "1", "2"}

    victim = next(iter(pids))
    psutil.Process(victim).kill()  # a crash
    while victim in workers_of(sup):
        time.sleep(0.01)
    new = wait_workers(sup, 3)
    assert victim not in new and len(new & pids) == 2
    replacement = (new - pids).pop()
    wait_serving(port, {replacement})

    sup.send_signal(signal.SIGTERM)
    assert sup.wait(10) == 0
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in new)
    with pytest.raises(OSError):
        get_pid(port)


def test_workers_die_with_a_killed_supervisor(
    supervisor: tuple[subprocess.Popen[bytes], int],
) -> None:
    sup, _ = supervisor
    pids = wait_workers(sup, 3)
    sup.kill()
    sup.wait(10)
    deadline = time.monotonic() + 10
    while any(psutil.pid_exists(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(psutil.pid_exists(p) for p in pids)


def test_crash_loop_gives_up_with_an_error() -> None:
    sup = start_supervisor(free_port(), 2, "crash")
    try:
        assert sup.wait(20) == 1
        assert sup.stderr is not None
        assert b"giving up" in sup.stderr.read()
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait(10)

"""A real etcd server for the etcd store tests, on free ports with a temporary data dir.

The server can be killed (SIGKILL) and started again on the same ports and data dir, which is
what the restart and outage tests need. Locally a missing `etcd` binary skips these tests; under
CI (the `CI` env var is set) it fails them, because CI installs etcd (`.ci/run` → `./dev test`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
ETCD_START_TIMEOUT = 15.0  # seconds to wait for /health after starting etcd


def etcd_binary() -> str:
    """The etcd executable, or skip (locally) / fail (CI) with a clear reason."""
    path = shutil.which("etcd")
    if path:
        return path
    reason = "etcd is not installed (apt-get install etcd-server; ./dev test installs it)"
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


class EtcdServer:
    """One single-member etcd cluster that tests can kill and restart in place."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def url(self, prefix: str = "/chainstate/") -> str:
        """The `--store` URL for this server."""
        return f"etcd://{self.endpoint}{prefix}"

    def start(self) -> None:
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        cmd = [
            self.binary,
            "--name=test",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=test={peer}",
            "--logger=zap",
            "--log-level=error",
        ]
        log = (self.workdir / "etcd.log").open("ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True)
        log.close()
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + ETCD_START_TIMEOUT
        url = f"http://127.0.0.1:{self.client_port}/health"
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited early; see {self.workdir / 'etcd.log'}")
            try:
                with urllib.request.urlopen(url, timeout=1) as resp:
                    if b'"true"' in resp.read():
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"etcd did not become healthy; see {self.workdir / 'etcd.log'}")

    def kill(self) -> None:
        """SIGKILL, like a crash: no graceful shutdown."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@pytest.fixture(scope="module")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """One etcd per test module; tests that kill it must leave it running again."""
    server = EtcdServer(etcd_binary(), tmp_path_factory.mktemp("etcd"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def etcd(etcd_server: EtcdServer) -> EtcdServer:
    """The module's etcd, restarted first if a previous test left it down."""
    if not etcd_server.running:
        etcd_server.start()
    return etcd_server


@pytest.fixture
def etcd_not_started(tmp_path: Path) -> Iterator[EtcdServer]:
    """An etcd whose ports are reserved but which is not running yet (etcd-down-at-start)."""
    server = EtcdServer(etcd_binary(), tmp_path)
    try:
        yield server
    finally:
        server.stop()


def _arg(args: tuple[str, ...], name: str) -> str | None:
    """The value of option `name` in a command line, or None."""
    return args[args.index(name) + 1] if name in args else None


class ProxyProcess:
    """`chainstate proxy` as a subprocess, with stdout (banner, console spans) and stderr
    (JSON logs) kept in files for assertions."""

    def __init__(self, workdir: Path, name: str, *args: str, env: dict[str, str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # readiness is `/metrics` answering: on the admin listener (its own port when given),
        # behind the admin token when the proxy has one
        token = _arg(args, "--admin-token")
        self.auth = {"Authorization": f"Bearer {token}"} if token else {}
        admin_port = _arg(args, "--admin-port")
        self.admin_url = f"http://127.0.0.1:{admin_port}" if admin_port else self.url
        self.stdout_path = workdir / f"{name}.out"
        self.stderr_path = workdir / f"{name}.err"
        config = workdir / f"{name}.toml"
        config.write_text("[proxy]\nhead_poll_interval = 0.2\n")
        cmd = [
            sys.executable, "-m", "stack.cli", "proxy",
            "--port", str(self.port), "--config", str(config), *args,
        ]  # fmt: skip
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                cmd, cwd=ROOT, stdout=out, stderr=err, env={**os.environ, **(env or {})}
            )

    def wait_ready(self, url: str | None = None, within: float = 20.0) -> ProxyProcess:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"proxy exited {self.proc.returncode}: {self.stderr()}")
            try:
                metrics = f"{url or self.admin_url}/metrics"
                ready = urllib.request.Request(metrics, headers=self.auth)
                with urllib.request.urlopen(ready, timeout=1):
                    return self
            except (urllib.error.URLError, OSError):
                time.sleep(0.05)
        raise RuntimeError(f"proxy not ready: {self.stderr()}")

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


@pytest.fixture
def start_proxy(tmp_path: Path) -> Iterator[Callable[..., ProxyProcess]]:
    """Start `chainstate proxy` processes for one test; all are stopped afterwards."""
    started: list[ProxyProcess] = []

    def start(name: str, *args: str, env: dict[str, str] | None = None) -> ProxyProcess:
        proxy = ProxyProcess(tmp_path, name, *args, env=env)
        started.append(proxy)
        return proxy

    try:
        yield start
    finally:
        for proxy in started:
            proxy.stop()

"""The processes a benchmark starts: each on a free loopback port, in its own session, pinned
to a core when the machine has two, waited for until it answers, and stopped in reverse order
whatever happens (error, Ctrl-C, SIGTERM); and the CPU time each one used."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

READY_TIMEOUT = 30.0  # seconds a started service has to answer its first request
STOP_GRACE = 5.0  # seconds between SIGTERM and SIGKILL when stopping a service
PROBE = b'{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":[]}'


PORTS_FROM = 20000  # free_port's lowest port: above the well-known services' (5432, 8545, ...)
_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback TCP port that is free right now, drawn below the kernel's ephemeral range.

    A port the kernel hands out for `bind(0)` comes from the range it also uses for the local
    end of outgoing connections, so a service started a moment later could find it taken by
    one of those (the started stack's own connections to anvil or etcd); ports below the range
    are only ever taken by someone binding them on purpose. A port is handed out once per
    process."""
    low = _ephemeral_low()
    for _ in range(1000):
        port = random.randrange(PORTS_FROM, low) if low > PORTS_FROM + 1000 else 0
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            port = s.getsockname()[1]
        _handed_out.add(port)
        return port
    raise OSError("no free loopback port found")


def _ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral range (0 when it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def split_cpus() -> tuple[list[int] | None, list[int] | None]:
    """(service core, load core) when at least two CPUs are usable, else no pinning."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None
    return [cpus[0]], [cpus[1]]


@dataclass
class Service:
    """A subprocess under test, its log file and readiness URL."""

    name: str
    cmd: list[str]
    ready_url: str
    cpus: list[int] | None
    log_path: Path
    probe: bytes | None = PROBE  # JSON-RPC body that must get a result; None: GET → 200
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C reaches us; we stop it in order
            )
        if self.cpus:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(self.proc.pid, self.cpus)

    def log_tail(self, limit: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Poll until the probe is answered; fail fast if the process died."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            req = urllib.request.Request(
                self.ready_url, data=self.probe, headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(req, timeout=2) as resp:
                    body = resp.read()
                    if resp.status == 200 and (self.probe is None or b'"result"' in body):
                        return
            except (OSError, urllib.error.URLError) as exc:
                last = str(exc)
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} not ready after {timeout:g}s ({last}):\n{self.log_tail()}")

    def stop(self) -> None:
        self.terminate()
        self.reap(STOP_GRACE)

    def terminate(self) -> None:
        """SIGTERM to the service's process group (it stops gracefully)."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)

    def reap(self, grace: float) -> None:
        """Wait up to `grace` seconds for the terminated service, then SIGKILL its group."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@dataclass
class Services:
    """Every service a suite started, stopped in reverse order (see `running`)."""

    workdir: Path
    started: list[Service] = field(default_factory=list)

    def start(
        self,
        name: str,
        cmd: list[str],
        ready_url: str,
        cpus: list[int] | None,
        probe: bytes | None = PROBE,
        ready_timeout: float = READY_TIMEOUT,
    ) -> Service:
        svc = Service(name, cmd, ready_url, cpus, self.workdir / f"{name}.log", probe)
        self.started.append(svc)
        svc.start()
        svc.wait_ready(ready_timeout)
        return svc

    def stop_all(self) -> None:
        """Every service is sent SIGTERM at once (newest first), then given what is left of
        one STOP_GRACE before SIGKILL: a Ctrl-C waits at most one grace period, not one per
        service (on a loaded machine each may use most of it)."""
        services = list(reversed(self.started))
        for svc in services:
            svc.terminate()
        deadline = time.monotonic() + STOP_GRACE
        for svc in services:
            svc.reap(max(0.0, deadline - time.monotonic()))
        self.started.clear()


@contextlib.contextmanager
def running(keep_dir: str | None = None) -> Iterator[Services]:
    """Services that are stopped on exit, on error, on Ctrl-C and on SIGTERM."""

    def on_term(signum: int, frame: Any) -> None:
        # Re-raised as SIGINT: inside an event loop (uvloop.run) only SIGINT is turned into
        # a clean cancellation; an exception raised here would be swallowed by the loop.
        os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGTERM, on_term)
    # A suite started in the background by a script inherits SIGINT ignored: SIGTERM (made
    # SIGINT above) and SIGINT must still stop it, so SIGINT is Python's own while it runs.
    previous_int = signal.getsignal(signal.SIGINT)
    if previous_int is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    tmp = None if keep_dir else tempfile.TemporaryDirectory(prefix="chainstate-bench-")
    workdir = Path(keep_dir or tmp.name)  # type: ignore[union-attr]
    workdir.mkdir(parents=True, exist_ok=True)
    services = Services(workdir)
    try:
        yield services
    finally:
        services.stop_all()
        signal.signal(signal.SIGTERM, previous)
        if previous_int is signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        if tmp is not None:
            tmp.cleanup()


def python_cmd(*args: str) -> list[str]:
    """Run a module of this project with the current interpreter (same venv)."""
    return [sys.executable, *args]


def rpc_call(url: str, method: str, params: list[Any], timeout: float = 10.0) -> Any:
    """One JSON-RPC call (set-up only, not measured); raises RuntimeError on an error."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        answer = json.loads(resp.read())
    if "error" in answer:
        raise RuntimeError(f"{method} on {url}: {answer['error']}")
    return answer["result"]


def cpu_seconds(proc: psutil.Process | None) -> float | None:
    """CPU seconds of a service: its process and the processes it started (anvil runs
    under a wrapper)."""
    if proc is None:
        return None
    total = 0.0
    try:
        for each in (proc, *proc.children(recursive=True)):
            with contextlib.suppress(psutil.Error):
                times = each.cpu_times()
                total += times.user + times.system
    except psutil.Error:
        return None
    return total

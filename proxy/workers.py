"""`--workers N`: N server processes on one port under a small supervisor.

Each worker is a full proxy process (own event loop, own etcd watch, own health checks and
head tracking) that binds the shared port with SO_REUSEPORT, so the kernel spreads incoming
connections across them. Workers share nothing but the configuration store: admin writes go
to etcd and every worker applies them from its watch.

The supervisor (the parent) does no serving. It restarts a worker that exits, gives up when a
worker slot crashes too often (a bad config or a taken port would otherwise loop forever),
and on SIGINT/SIGTERM stops all workers gracefully (SIGTERM, then SIGKILL after a grace
period; a second signal kills at once).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.process import BaseProcess

log = logging.getLogger(__name__)

DEFAULT_STOP_TIMEOUT = 10.0  # seconds a worker gets to finish in-flight requests on stop
DEFAULT_RESTART_DELAY = 0.5  # seconds before a crashed worker is started again
DEFAULT_MAX_RESTARTS = 5  # restarts of one worker slot allowed within RESTART_WINDOW …
DEFAULT_RESTART_WINDOW = 60.0  # … seconds; more means a crash loop: the supervisor gives up
WORKER_INDEX_ENV = "CHAINSTATE_WORKER_INDEX"  # set in each worker: 0 … N-1

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> None:
    """Linux: get SIGTERM when the supervisor dies, so no worker outlives a killed parent."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _worker_main(serve_one: Callable[[], None], index: int, parent_pid: int) -> None:
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent(parent_pid)
    os.environ[WORKER_INDEX_ENV] = str(index)
    serve_one()


class Supervisor:
    """Keeps `n` worker processes running until told to stop."""

    def __init__(
        self,
        n: int,
        serve_one: Callable[[], None],
        *,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT,
        restart_delay: float = DEFAULT_RESTART_DELAY,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        restart_window: float = DEFAULT_RESTART_WINDOW,
        start_method: str = "fork",
    ) -> None:
        if n < 1:
            raise ValueError("the number of workers must be at least 1")
        self.n = n
        self.serve_one = serve_one
        self.stop_timeout = stop_timeout
        self.restart_delay = restart_delay
        self.max_restarts = max_restarts
        self.restart_window = restart_window
        self._ctx = multiprocessing.get_context(start_method)
        self._workers: dict[int, BaseProcess] = {}
        self._due: dict[int, float] = {}  # slot → monotonic time of its pending restart
        self._crashes: dict[int, deque[float]] = {i: deque() for i in range(n)}
        self._wake_r, self._wake_w = socket.socketpair()

    def _spawn(self, slot: int) -> None:
        proc = self._ctx.Process(
            target=_worker_main,
            args=(self.serve_one, slot, os.getpid()),
            name=f"chainstate-worker-{slot}",
        )
        proc.start()
        self._workers[slot] = proc
        log.info("worker started", extra={"worker": slot, "pid": proc.pid})

    def _signals_received(self) -> bool:
        try:
            return bool(self._wake_r.recv(64))
        except BlockingIOError:
            return False

    def run(self) -> int:
        """Supervise until SIGINT/SIGTERM (exit 0) or a crash loop (exit 1)."""
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        previous = {
            sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        old_fd = signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
        try:
            for slot in range(self.n):
                self._spawn(slot)
            code = self._supervise()
        finally:
            self._stop_all()
            signal.set_wakeup_fd(old_fd)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._wake_r.close()
            self._wake_w.close()
        return code

    def _supervise(self) -> int:
        while True:
            timeout = None
            if self._due:
                timeout = max(0.0, min(self._due.values()) - time.monotonic())
            sentinels = {p.sentinel: slot for slot, p in self._workers.items()}
            ready = multiprocessing.connection.wait([self._wake_r, *sentinels], timeout)
            if self._wake_r in ready and self._signals_received():
                log.info("stopping workers")
                return 0
            for sentinel in ready:
                slot = sentinels.get(sentinel)  # type: ignore[call-overload]
                if slot is not None and not self._on_exit(slot):
                    return 1
            now = time.monotonic()
            for slot, due in list(self._due.items()):
                if due <= now:
                    del self._due[slot]
                    self._spawn(slot)

    def _on_exit(self, slot: int) -> bool:
        """Schedule a restart of the worker in `slot`; False when it crashes too often."""
        proc = self._workers.pop(slot)
        proc.join()
        now = time.monotonic()
        crashes = self._crashes[slot]
        crashes.append(now)
        while crashes and now - crashes[0] > self.restart_window:
            crashes.popleft()
        if len(crashes) > self.max_restarts:
            log.error(
                "worker keeps exiting; giving up",
                extra={"worker": slot, "exitcode": proc.exitcode, "exits": len(crashes)},
            )
            return False
        log.warning(
            "worker exited; restarting it",
            extra={"worker": slot, "pid": proc.pid, "exitcode": proc.exitcode},
        )
        self._due[slot] = now + self.restart_delay
        return True

    def _stop_all(self) -> None:
        alive = [p for p in self._workers.values() if p.is_alive()]
        for proc in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)  # type: ignore[arg-type]
        deadline = time.monotonic() + self.stop_timeout
        while alive:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            ready = multiprocessing.connection.wait(
                [self._wake_r, *(p.sentinel for p in alive)], remaining
            )
            if self._wake_r in ready and self._signals_received():
                log.warning("second stop signal: killing workers")
                break
            alive = [p for p in alive if p.is_alive()]
        for proc in alive:
            if proc.is_alive():
                log.warning("worker did not stop in time; killing it", extra={"pid": proc.pid})
                proc.kill()
        for proc in self._workers.values():
            proc.join()
        self._workers.clear()


def run_workers(n: int, serve_one: Callable[[], None], **options: float | int | str) -> int:
    """Run `serve_one` in `n` supervised processes; returns the supervisor's exit code.

    `serve_one` runs in a forked child and must create everything itself (event loop, store
    client, sockets with `reuse_port=True`); the parent must not have started an event loop
    or an etcd/gRPC client before calling this.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    return Supervisor(n, serve_one, **options).run()  # type: ignore[arg-type]

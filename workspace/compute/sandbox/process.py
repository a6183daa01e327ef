"""A spawned run: its output streamed to a callback with a capped copy kept, its JSON result
read from a dedicated pipe, the wall clock enforced, and its exit mapped to a `RunResult`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from workspace.compute.sandbox.limits import KiB, Limits
from workspace.compute.sandbox.rundirs import RunDirs
from workspace.compute.sandbox.uids import kill_run_processes

_SIGNALS = frozenset(int(s) for s in signal.valid_signals())
# After the run's processes are gone, its output and result pipes reach EOF at once; this only
# bounds a pipe some leftover still holds. 2 s was too short for a busy machine's event loop
# (CI once read no result from a `print('hi')` that had exited 0).
PIPE_DRAIN_SECONDS = 10.0


@dataclass
class RunResult:
    """What happened to one run, in the sandbox's terms (the record builder maps it)."""

    exit_code: int | None
    signal: int | None
    reason: str | None  # timeout | output_limit | canceled | memory_watchdog | None
    output: bytes
    output_size: int
    output_truncated: bool
    result: bytes | None
    result_too_large: bool
    started_at: float
    finished_at: float
    duration_ms: int
    queue_wait_ms: int = 0


class SandboxProcess:
    """A spawned run: streams output to a callback, keeps a capped copy, can be killed."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        limits: Limits,
        dirs: RunDirs,
        uid: int | None,
        cgroup: Path | None,
        result_reader: asyncio.StreamReader,
        on_output: Callable[[bytes], None] | None,
        wrappers: int = 0,
    ) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.limits = limits
        self.dirs = dirs
        self.workdir = dirs.home
        self.uid = uid
        self.cgroup = cgroup
        self.wrappers = wrappers  # bwrap's processes in front of the user's program
        self.started_at = time.time()
        self._t0 = time.monotonic()
        self._result_reader = result_reader
        self._on_output = on_output
        self._kept = bytearray()
        self._size = 0
        self.reason: str | None = None
        try:
            self.created: float | None = psutil.Process(self.pid).create_time()
        except psutil.Error:  # already gone: nothing of it to tell apart from a reused pid
            self.created = None
        self._sweep: asyncio.Future[None] | None = None  # the uid sweep `kill` started
        self._out_task = asyncio.ensure_future(self._pump_output())
        self._res_task = asyncio.ensure_future(self._read_result())

    async def _pump_output(self) -> None:
        assert self.proc.stdout is not None
        limits = self.limits
        while chunk := await self.proc.stdout.read(64 * KiB):
            self._size += len(chunk)
            room = limits.output_bytes - len(self._kept)
            if room > 0:
                self._kept += chunk[:room]
            if self._on_output is not None:
                self._on_output(chunk)
            if limits.output_hard_bytes is not None and self._size > limits.output_hard_bytes:
                self.kill("output_limit")

    async def _read_result(self) -> tuple[bytes | None, bool]:
        cap = self.limits.result_bytes
        data = bytearray()
        while chunk := await self._result_reader.read(64 * KiB):
            if len(data) + len(chunk) > cap:
                # the writer would block on the full pipe until the wall clock: end it now
                self.kill("result_too_large")
                return None, True
            data += chunk
        return (bytes(data) if data else None), False

    def processes(self) -> list[psutil.Process]:
        """The run's live processes: the user's program and every descendant (bwrap's own
        process, the first one, left out)."""
        try:
            main = psutil.Process(self.pid)
            if self.created is not None and main.create_time() != self.created:
                return []  # the run was reaped and its pid given to another process
            return [main, *main.children(recursive=True)][self.wrappers :]
        except psutil.Error:
            return []

    def kill(self, reason: str) -> None:
        """Kill the run and everything it started; the first reason given is kept. Its
        process group goes at once; the walk of the process table for whatever else it
        started runs in a thread (on the event loop it stalled every other request and run
        for up to a second while a fork bomb was killed), and `wait` waits for it."""
        if self.reason is None:
            self.reason = reason
        if self.proc.returncode is None:  # not reaped: the pid is still the run's
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
        if self._sweep is None or self._sweep.done():
            self._sweep = asyncio.ensure_future(self._kill_rest())

    async def _kill_rest(self) -> None:
        await asyncio.to_thread(kill_run_processes, self.pid, self.uid, self.created)

    async def wait(self, wall_seconds: float | None = None) -> RunResult:
        """Wait for exit (killing at the wall clock), then collect output and result."""
        limit = self.limits.wall_seconds if wall_seconds is None else wall_seconds
        try:
            await asyncio.wait_for(self.proc.wait(), timeout=limit)
        except TimeoutError:
            self.kill("timeout")
            await self.proc.wait()
        except asyncio.CancelledError:
            self.kill("canceled")
            await asyncio.shield(self.proc.wait())
            raise
        # leftovers (daemonized children) die too; off the loop: a fork bomb's kill walks every
        # process repeatedly, and a loop blocked that long let other runs' pipe-drain
        # windows expire before their results were read (recorded as `crashed`)
        if self._sweep is not None:
            await self._sweep
        await self._kill_rest()
        finished = time.time()
        duration_ms = int((time.monotonic() - self._t0) * 1000)
        for task in (self._out_task, self._res_task):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), timeout=PIPE_DRAIN_SECONDS)
        result, too_large = self._res_task.result() if self._res_task.done() else (None, False)
        self._out_task.cancel()
        self._res_task.cancel()
        code = self.proc.returncode
        if self.wrappers and code is not None and code - 128 in _SIGNALS:
            code = 128 - code  # bwrap exits 128 + n when the program died of signal n
        return RunResult(
            exit_code=code if code is not None and code >= 0 else None,
            signal=-code if code is not None and code < 0 else None,
            reason=self.reason,
            output=bytes(self._kept),
            output_size=self._size,
            output_truncated=self._size > len(self._kept),
            result=result,
            result_too_large=too_large,
            started_at=self.started_at,
            finished_at=finished,
            duration_ms=duration_ms,
        )

"""A pool of EVM worker processes with a wall-clock limit per job.

Why our own pool and not ProcessPoolExecutor: a job that runs past its time limit must be
stopped without stopping the others, and ProcessPoolExecutor cannot kill one task. Here each
worker is one process (a fork of the forkserver: `procs.py`) with its own pipe; a job
that overruns gets its worker killed and replaced, and the caller gets -39004. Workers are
separate processes because pyrevm holds the GIL while it runs and while it waits for state
reads; the event loop and the state feed it reads from must stay free. One worker per core
uses every core.

The parent's end of each worker's pipe is read and written by the event loop itself (a
protocol on the socket, `_Pipe`), in multiprocessing's framing, which the worker reads and
writes with its blocking `Connection`. Not a thread per round trip: handing a job to a
thread and the answer back cost more than the calls themselves (each hand-over wakes a
thread that must take the GIL from the loop).
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import socket
import struct
import time
from collections import OrderedDict
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from chainstate.jsonrpc import EVM_FAILED, SERVER_BUSY, TIME_LIMIT, JsonRpcError
from nodes.state.evm import procs
from nodes.state.evm.settings import EvmSettings
from nodes.state.evm.wire import HELD_ENVS, HeldEnvs, pack, unpack_answer
from nodes.state.evm.worker import (
    READY,
    Limits,
    WarmKey,
    detached,
    warm_key,
    worker_main,
)

log = logging.getLogger(__name__)

WORKER_START_TIMEOUT = 60.0  # seconds for a new worker to report ready (its imports done)

_SIZE = struct.Struct("!i")  # multiprocessing's frame header: the payload's size
_HUGE = struct.Struct("!Q")  # after a size of -1: the size of a payload over 2 GiB
_SMALL = 0x7FFFFFFF


def _frame(payload: bytes | memoryview) -> list[bytes | memoryview]:
    """`payload` framed as `Connection.send_bytes` frames it (the worker's `recv` reads it)."""
    size = len(payload)
    if size > _SMALL:
        return [_SIZE.pack(-1), _HUGE.pack(size), payload]
    return [_SIZE.pack(size), payload]


class _Pipe(asyncio.Protocol):
    """The parent's end of a worker's pipe on the event loop: frames in multiprocessing's
    format out, one answer (a pickled object) at a time in."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[Any] | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, obj: Any, blobs: list[bytes]) -> asyncio.Future[Any]:
        """Write `obj` pickled, then each blob as a raw message; the future of the answer."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.closed or self.transport is None or self.transport.is_closing():
            future.set_exception(EOFError("the worker's pipe is closed"))
            return future
        parts = _frame(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL))  # (no fds to reduce)
        for blob in blobs:
            parts += _frame(blob)
        self.waiter = future
        self.transport.writelines(parts)
        return future

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        while len(buffer) >= 4:
            size = _SIZE.unpack_from(buffer)[0]
            start = 4
            if size == -1:
                if len(buffer) < 12:
                    return
                size, start = _HUGE.unpack_from(buffer, 4)[0], 12
            end = start + size
            if len(buffer) < end:
                return
            frame = bytes(buffer[start:end])
            del buffer[:end]
            self._answered(frame)

    def _answered(self, frame: bytes) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is None or waiter.done():
            return  # (an answer nobody waits for: its caller's job was given up)
        try:
            waiter.set_result(pickle.loads(frame))
        except Exception as exc:  # (a worker's answer that does not unpickle)
            waiter.set_exception(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(EOFError("the worker's pipe closed"))

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class _Worker:
    """One worker process and the parent's end of its pipe."""

    def __init__(self, ctx: Any, limits: Limits, warm_blocks: int, coalesce_max: int = 0) -> None:
        # The parent's view of the worker's warm EVMs (same keys, same LRU rule); it only
        # steers work to a worker that has the block warm, so a stale entry costs time only.
        self.warm: OrderedDict[WarmKey, None] = OrderedDict()
        self.warm_blocks = max(1, warm_blocks)
        self.envs = HeldEnvs(max(HELD_ENVS, 2 * coalesce_max))  # the block envs it holds
        parent, child = ctx.Pipe(duplex=True)
        self.conn: Connection = parent  # until `attach`: the start-up handshake
        self.pipe = _Pipe()
        # [calls of the running job started, time.monotonic() the last one started]: the
        # worker writes it (`Runner.progress`), an overrun reads it (`Overrun`)
        self.progress: Any = ctx.RawArray("d", 2)
        self.proc: BaseProcess = ctx.Process(
            target=worker_main, args=(child, limits, warm_blocks, self.progress), daemon=True
        )
        self.proc.start()
        child.close()
        # Wait until the worker has imported pyrevm and py-evm, so startup never counts
        # against a job's time limit.
        if not self.conn.poll(WORKER_START_TIMEOUT) or self.conn.recv() != READY:
            self.kill()
            raise RuntimeError(f"EVM worker did not start within {WORKER_START_TIMEOUT:g}s")

    async def attach(self) -> None:
        """Hand the parent's end of the pipe to the event loop (`_Pipe`)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=os.dup(self.conn.fileno()))
        self.conn.close()
        loop = asyncio.get_running_loop()
        await loop.create_unix_connection(lambda: self.pipe, sock=sock)

    def note(self, job: dict[str, Any]) -> None:
        """Record that `job` is about to run here (mirrors Runner.warm_for's LRU); a job of
        groups may carry their warm keys (`warm`), as the executor took them."""
        warm = self.warm
        if job["kind"] == "groups":
            keys = job.get("warm") or [warm_key(one) for one in job["jobs"]]
        else:
            keys = [warm_key(job)]
        for key in keys:
            if key is None:
                continue
            if key in warm:
                warm.move_to_end(key)
            else:
                warm[key] = None
        while len(warm) > self.warm_blocks:
            warm.popitem(last=False)

    def send(self, job: dict[str, Any]) -> asyncio.Future[dict[str, Any]]:
        """Send a job; the future of its answer (EOFError when the worker dies first). The
        hex of long calldata follows the job as raw messages (`worker.detached`)."""
        job, blobs = detached(job)
        try:
            return self.pipe.send(pack(job, self.envs), blobs)
        except BaseException:
            self.envs.held.clear()  # (not sent: the worker is told every env again)
            raise

    def running(self) -> tuple[int, float]:
        """(position in its job of the call the worker is running, -1 when it runs no call
        of a `calls` job; for how many seconds it has run)."""
        started, since = self.progress[0], self.progress[1]
        return int(started) - 1, time.monotonic() - since if started else 0.0

    def kill(self) -> None:
        """Blocking (a thread's): the process killed; the loop closes `pipe`."""
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=2)
        self.conn.close()

    def stop(self) -> None:
        """Blocking (a thread's), after the loop closed `pipe`: closing the pipe makes the
        worker return; kill it if it does not."""
        self.conn.close()
        self.proc.join(timeout=2)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=2)


class Overrun(JsonRpcError):
    """A job stopped at its time limit: -39004, `data.reason` TIME_LIMIT (the call's own
    cost: final, another node would spend the same). `running`: the position in the job of
    the call it was running (-1: not a `calls` job, the job is one request's), `ran`: for
    how long; the executor tells a combined job's culprit from the calls that only
    shared its time (`Executor._after_failure`)."""

    def __init__(self, limit: float, running: int = -1, ran: float = 0.0) -> None:
        msg = f"execution exceeded the time limit of {limit:g}s"
        super().__init__(EVM_FAILED, msg, {"reason": TIME_LIMIT, "seconds": limit})
        self.limit = limit
        self.running = running
        self.ran = ran


def _settle(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _answered(future: asyncio.Future[Any], waiter: asyncio.Future[Any]) -> None:
    """A job's answer came (or its pipe failed: its exception marked as seen, a killed
    worker's pipe raises EOFError): its waiter settled."""
    if not future.cancelled():
        future.exception()
    if not waiter.done():
        waiter.set_result(None)


class WorkerPool:
    """`run(job, timeout)` on an idle worker; bounded queue; explicit `start`/`close`."""

    def __init__(self, settings: EvmSettings) -> None:
        self.settings = settings
        self.size = settings.worker_count
        self._ctx = procs.context()
        self._limits = Limits(
            max_trace_steps=settings.max_trace_steps,
            max_trace_bytes=settings.max_trace_bytes,
            max_return_bytes=settings.max_return_bytes,
            max_response_bytes=settings.max_response_bytes,
            warm_max_calls=settings.warm_max_calls,
            warm_memory_bytes=settings.warm_memory_mb * 1024 * 1024,
            warm_answers=settings.warm_answers,
        )
        self._idle: asyncio.Queue[_Worker] | None = None
        self._all: set[_Worker] = set()
        self._waiting = 0
        self._closed = False
        self._background: set[asyncio.Task[None]] = set()
        # Called after a worker was killed: workers read the store directly, and a worker
        # killed inside a read transaction leaves its LMDB reader slot to be freed.
        self.on_replace: Any = None

    def workers(self) -> list[_Worker]:
        """Every live worker (idle or busy)."""
        return list(self._all)

    @property
    def started(self) -> bool:
        return self._idle is not None

    async def _spawn(self) -> _Worker:
        """A new worker, started (in a thread: it waits for the process) and attached."""
        worker = await asyncio.to_thread(
            _Worker,
            self._ctx,
            self._limits,
            self.settings.worker_warm_blocks,
            self.settings.coalesce_max,
        )
        try:
            await worker.attach()
        except BaseException:
            await asyncio.to_thread(worker.kill)
            raise
        return worker

    async def start(self) -> None:
        if self._idle is not None:
            return
        self._idle = asyncio.Queue()
        workers = await asyncio.gather(*(self._spawn() for _ in range(self.size)))
        for w in workers:
            self._all.add(w)
            self._idle.put_nowait(w)
        log.info("evm workers started", extra={"workers": self.size})

    async def close(self) -> None:
        self._closed = True
        workers, self._all = list(self._all), set()
        for w in workers:
            w.pipe.close()
        await asyncio.gather(*(asyncio.to_thread(w.stop) for w in workers))
        self._idle = None

    async def acquire(self, prefer: WarmKey | None = None) -> _Worker:
        """An idle worker (waits), one that has the `prefer` block warm when one of the idle
        ones has; -32005 when too many callers already wait."""
        if self._idle is None:
            await self.start()
        assert self._idle is not None
        if self._waiting >= self.settings.queue_limit:
            raise JsonRpcError(SERVER_BUSY, "EVM executor busy: too many queued executions")
        self._waiting += 1
        try:
            worker = await self._idle.get()
        finally:
            self._waiting -= 1
        if prefer is None or prefer in worker.warm or self._idle.empty():
            return worker
        others = [self._idle.get_nowait() for _ in range(self._idle.qsize())]
        for i, other in enumerate(others):
            if prefer in other.warm:
                others[i], worker = worker, other
                break
        for other in others:
            self._idle.put_nowait(other)
        return worker

    def release(self, worker: _Worker) -> None:
        if self._idle is not None and worker in self._all:
            self._idle.put_nowait(worker)

    async def run(self, job: dict[str, Any], time_limit: float) -> dict[str, Any]:
        """The worker's answer dict; -32005 when too many jobs wait, -39004 on overrun
        (`Overrun`)."""
        answer = await self.run_on(await self.acquire(warm_key(job)), job, time_limit)
        return unpack_answer(answer)

    async def run_on(self, worker: _Worker, job: dict[str, Any], time_limit: float) -> Any:
        """Run on an acquired worker, which goes back to the pool (or is replaced); the
        answer as it came (`wire.pack_answer`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + time_limit
        worker.note(job)
        future = worker.send(job)
        # Waited for through `waiter`, which the answer or the deadline settles: the caller
        # leaving cancels only `waiter`, never the job's own future (what asyncio.shield and
        # wait_for did, with three more callbacks and futures per job).
        waiter = loop.create_future()
        future.add_done_callback(lambda done: _answered(done, waiter))
        timer = loop.call_at(deadline, _settle, waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            timer.cancel()
            # The caller left; the worker finishes the job (within its limit) and is reused.
            task = loop.create_task(self._finish(worker, future, deadline))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            raise
        timer.cancel()
        if not future.done():
            overrun = Overrun(time_limit, *worker.running())
            await self._replace(worker)
            raise overrun from None
        try:
            answer = future.result()
        except (EOFError, OSError, BrokenPipeError):
            await self._replace(worker)
            raise JsonRpcError(EVM_FAILED, "EVM worker crashed during execution") from None
        self.release(worker)
        return answer

    async def _finish(self, worker: _Worker, future: asyncio.Future[Any], deadline: float) -> None:
        remaining = max(0.0, deadline - asyncio.get_running_loop().time())
        try:
            await asyncio.wait_for(future, remaining)
        except Exception:
            await self._replace(worker)
            return
        self.release(worker)

    async def _replace(self, worker: _Worker) -> None:
        """Kill an overrunning or dead worker and put a fresh one in its place."""
        self._all.discard(worker)
        await asyncio.to_thread(worker.kill)
        worker.pipe.close()
        if self.on_replace is not None:
            self.on_replace()
        if self._closed or self._idle is None:
            return
        fresh = await self._spawn()
        self._all.add(fresh)
        self._idle.put_nowait(fresh)
        log.warning("evm worker replaced", extra={"pid": worker.proc.pid})

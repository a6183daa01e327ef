"""A pool of EVM worker processes with a wall-clock limit per job.

Why our own pool and not ProcessPoolExecutor: a job that runs past its time limit must be
stopped without stopping the others, and ProcessPoolExecutor cannot kill one task. Here each
worker is one spawned process with its own pipe; a job that overruns gets its worker killed
and replaced, and the caller gets -39004. Workers are separate processes because pyrevm
holds the GIL while it runs and while it waits for state reads; the event loop and the
state feed it reads from must stay free. One worker per core uses every core.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from chainstate.jsonrpc import EVM_FAILED, SERVER_BUSY, TIME_LIMIT, JsonRpcError
from nodes.state.evm.settings import EvmSettings
from nodes.state.evm.worker import (
    READY,
    Limits,
    WarmKey,
    detached,
    warm_key,
    worker_main,
)

log = logging.getLogger(__name__)

WORKER_START_TIMEOUT = 60.0  # seconds for a spawned worker to import pyrevm and report ready


class _Worker:
    """One worker process and the parent's end of its pipe."""

    def __init__(self, ctx: Any, limits: Limits, warm_blocks: int) -> None:
        # The parent's view of the worker's warm EVMs (same keys, same LRU rule); it only
        # steers work to a worker that has the block warm, so a stale entry costs time only.
        self.warm: OrderedDict[WarmKey, None] = OrderedDict()
        self.warm_blocks = max(1, warm_blocks)
        parent, child = ctx.Pipe(duplex=True)
        self.conn: Connection = parent
        # [calls of the running job started, time.monotonic() the last one started]: the
        # worker writes it (`Runner.progress`), an overrun reads it (`Overrun`)
        self.progress: Any = ctx.RawArray("d", 2)
        self.proc: BaseProcess = ctx.Process(
            target=worker_main, args=(child, limits, warm_blocks, self.progress), daemon=True
        )
        self.proc.start()
        child.close()
        # Wait until the worker has imported pyrevm, so startup never counts against a job's
        # time limit.
        if not self.conn.poll(WORKER_START_TIMEOUT) or self.conn.recv() != READY:
            self.kill()
            raise RuntimeError(f"EVM worker did not start within {WORKER_START_TIMEOUT:g}s")

    def note(self, job: dict[str, Any]) -> None:
        """Record that `job` is about to run here (mirrors Runner.evm_for's LRU)."""
        if job["kind"] == "groups":
            for one in job["jobs"]:
                self.note(one)
            return
        key = warm_key(job)
        if key is None:
            return
        self.warm[key] = None
        self.warm.move_to_end(key)
        while len(self.warm) > self.warm_blocks:
            self.warm.popitem(last=False)

    def roundtrip(self, job: dict[str, Any]) -> dict[str, Any]:
        """Blocking: send a job and wait for its answer (runs in a pool thread). The hex of
        long calldata follows the job as raw messages (`worker.detached`)."""
        job, blobs = detached(job)
        self.conn.send(job)
        for blob in blobs:
            self.conn.send_bytes(blob)
        return self.conn.recv()

    def running(self) -> tuple[int, float]:
        """(position in its job of the call the worker is running, -1 when it runs no call
        of a `calls` job; for how many seconds it has run)."""
        started, since = self.progress[0], self.progress[1]
        return int(started) - 1, time.monotonic() - since if started else 0.0

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=2)
        self.conn.close()

    def stop(self) -> None:
        """Closing the pipe makes the worker return; kill it if it does not."""
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


def _consume(future: asyncio.Future[Any]) -> None:
    """Mark a roundtrip's exception as seen (a killed worker's pipe raises EOFError)."""
    if not future.cancelled():
        future.exception()


class WorkerPool:
    """`run(job, timeout)` on an idle worker; bounded queue; explicit `start`/`close`."""

    def __init__(self, settings: EvmSettings) -> None:
        self.settings = settings
        self.size = settings.worker_count
        self._ctx = multiprocessing.get_context("spawn")
        self._limits = Limits(
            max_trace_steps=settings.max_trace_steps,
            max_trace_bytes=settings.max_trace_bytes,
            max_return_bytes=settings.max_return_bytes,
            max_response_bytes=settings.max_response_bytes,
            warm_max_calls=settings.warm_max_calls,
            warm_memory_bytes=settings.warm_memory_mb * 1024 * 1024,
        )
        self._idle: asyncio.Queue[_Worker] | None = None
        self._all: set[_Worker] = set()
        self._threads: ThreadPoolExecutor | None = None
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

    def _spawn(self) -> _Worker:
        return _Worker(self._ctx, self._limits, self.settings.warm_blocks)

    async def start(self) -> None:
        if self._idle is not None:
            return
        self._threads = ThreadPoolExecutor(self.size + 2, thread_name_prefix="evm-pipe")
        self._idle = asyncio.Queue()
        workers = await asyncio.gather(*(asyncio.to_thread(self._spawn) for _ in range(self.size)))
        for w in workers:
            self._all.add(w)
            self._idle.put_nowait(w)
        log.info("evm workers started", extra={"workers": self.size})

    async def close(self) -> None:
        self._closed = True
        workers, self._all = list(self._all), set()
        await asyncio.gather(*(asyncio.to_thread(w.stop) for w in workers))
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
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
        return await self.run_on(await self.acquire(warm_key(job)), job, time_limit)

    async def run_on(
        self, worker: _Worker, job: dict[str, Any], time_limit: float
    ) -> dict[str, Any]:
        """Run on an acquired worker, which goes back to the pool (or is replaced)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + time_limit
        worker.note(job)
        future = loop.run_in_executor(self._threads, worker.roundtrip, job)
        future.add_done_callback(_consume)
        try:
            answer = await asyncio.wait_for(asyncio.shield(future), time_limit)
        except TimeoutError:
            overrun = Overrun(time_limit, *worker.running())
            await self._replace(worker)
            raise overrun from None
        except (EOFError, OSError, BrokenPipeError):
            await self._replace(worker)
            raise JsonRpcError(EVM_FAILED, "EVM worker crashed during execution") from None
        except asyncio.CancelledError:
            # The caller left; the worker finishes the job (within its limit) and is reused.
            task = loop.create_task(self._finish(worker, future, deadline))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            raise
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
        if self.on_replace is not None:
            self.on_replace()
        if self._closed or self._idle is None:
            return
        fresh = await asyncio.to_thread(self._spawn)
        self._all.add(fresh)
        self._idle.put_nowait(fresh)
        log.warning("evm worker replaced", extra={"pid": worker.proc.pid})

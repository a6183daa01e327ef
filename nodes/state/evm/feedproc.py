"""The feed process: the state feed for plain block state, outside the node's event loop.

A cold EVM (any block not warm in its worker) reads every account and slot with one HTTP
exchange, one at a time (pyrevm 0.3.7 fork mode). Served from the node's event loop, those
exchanges queued behind all the node's other traffic and cost more than the reads. This
process opens the node's LMDB store read-only (LMDB serves many reader processes; commits of
the node are visible to the next read) and answers the feed's methods with `FeedCore` on its
own uvloop, on its own core when one is free.

It serves only the block's committed state: overlays (state overrides, simulations) live in
the node's memory and stay on the in-loop feed. It exits when the node closes its end of the
pipe or dies. The node falls back to the in-loop feed while this process is not running and
starts a new one, at most one attempt every RETRY_AFTER seconds (`url_if_running`).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from nodes.state.evm import procs

log = logging.getLogger(__name__)

START_TIMEOUT = 60.0  # seconds for a new feed process to open the store and listen
RETRY_AFTER = 5.0  # seconds between two attempts to start it (a crash loop stays cheap)


def feed_main(conn: Connection, path: str, map_size_mb: int, chain_id: int) -> None:
    """Entry point of the feed process."""
    import uvloop

    from nodes.state.evm.feed import FeedCore
    from nodes.state.store import StateStore

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the node decides when the feed ends
    store = StateStore(Path(path), map_size_mb=map_size_mb)
    try:
        store.open_readonly()
    except Exception as exc:
        conn.send({"error": f"cannot open the state store read-only: {exc}"})
        return
    try:
        uvloop.run(_serve(conn, FeedCore(store, chain_id)))
    finally:
        store.close()


async def _serve(conn: Connection, core: Any) -> None:
    from nodes.state.evm.feed import serve

    server, url = await serve(core)
    loop = asyncio.get_running_loop()
    gone: asyncio.Future[None] = loop.create_future()
    # The node never writes to the pipe: readable means its end closed (EOF).
    loop.add_reader(conn.fileno(), lambda: gone.done() or gone.set_result(None))
    conn.send({"url": url})
    await gone
    server.close()


class FeedProcess:
    """Owns one feed process over the LMDB store at `path` (in the node process)."""

    def __init__(
        self,
        path: Path,
        map_size_mb: int,
        chain_id: int,
        on_exit: Callable[[], Any] | None = None,
        retry_after: float = RETRY_AFTER,
    ) -> None:
        self.path = Path(path)
        self.on_exit = on_exit  # called when the process is found dead (free its LMDB slot)
        self.retry_after = retry_after
        self._next_try = 0.0  # time.monotonic() before which no new start is tried
        self.map_size_mb = map_size_mb
        self.chain_id = chain_id
        self._ctx = procs.context()  # a fork of the forkserver with its imports done
        self._proc: Any = None
        self._conn: Connection | None = None
        self._url: str | None = None
        self._starting: asyncio.Task[None] | None = None
        self._closed = False
        self._alive = False  # the process runs: set once started, cleared by `_ended`

    def url_if_running(self) -> str | None:
        """The process's URL, or None while it is not running (a new one is started).

        Asked once per EVM job: liveness is the flag `_ended` clears when the process's
        sentinel becomes readable (it exits or is killed), not `is_alive()`, which costs a
        getpid and a waitpid system call each time."""
        if self._alive:
            return self._url
        if self._proc is not None:
            log.warning("evm feed process ended; restarting", extra={"pid": self._proc.pid})
            self._proc.join(0)  # reaped (it has exited: its sentinel was readable)
            self._discard()
            if self.on_exit is not None:
                self.on_exit()
        idle = self._starting is None or self._starting.done()
        if not self._closed and idle and time.monotonic() >= self._next_try:
            self._starting = asyncio.get_running_loop().create_task(self.start())
        return None

    async def start(self) -> None:
        if self._closed or (self._proc is not None and self._proc.is_alive()):
            return
        self._next_try = time.monotonic() + self.retry_after
        try:
            proc, conn, url = await asyncio.to_thread(self._spawn)
        except Exception as exc:  # the node keeps answering through the in-loop feed
            log.error("evm feed process did not start: %s", exc)
            return
        # set here, on the loop, never from the thread: `url_if_running` sees it all or none
        self._proc, self._conn, self._url = proc, conn, url
        if self._closed:  # stopped while it started: `stop` ends it
            return
        asyncio.get_running_loop().add_reader(proc.sentinel, self._ended)
        self._alive = True
        if not proc.is_alive():  # died before the watch began
            self._ended()

    def _ended(self) -> None:
        """The process's sentinel is readable: it has exited (`url_if_running` restarts it)."""
        self._alive = False
        if self._proc is not None:
            asyncio.get_running_loop().remove_reader(self._proc.sentinel)

    def _spawn(self) -> tuple[Any, Connection, str]:
        parent, child = self._ctx.Pipe(duplex=True)
        args = (child, str(self.path), self.map_size_mb, self.chain_id)
        proc = self._ctx.Process(target=feed_main, args=args, daemon=True, name="evm-feed")
        proc.start()
        child.close()
        if not parent.poll(START_TIMEOUT):
            proc.kill()
            parent.close()
            raise RuntimeError(f"no answer within {START_TIMEOUT:g}s")
        hello = parent.recv()
        if "url" not in hello:
            proc.join(timeout=2)
            parent.close()
            raise RuntimeError(hello.get("error", "unknown error"))
        log.info("evm feed process started", extra={"url": hello["url"], "pid": proc.pid})
        return proc, parent, hello["url"]

    def _discard(self) -> None:
        if self._alive:
            self._ended()
        if self._conn is not None:
            self._conn.close()
        self._proc, self._conn, self._url = None, None, None

    async def stop(self) -> None:
        self._closed = True
        if self._starting is not None:
            await asyncio.gather(self._starting, return_exceptions=True)
        proc = self._proc
        self._discard()  # closing the pipe makes the process return
        if proc is not None:
            await asyncio.to_thread(_join_or_kill, proc)


def _join_or_kill(proc: Any) -> None:
    proc.join(timeout=3)
    if proc.is_alive():
        proc.kill()
        proc.join(timeout=2)

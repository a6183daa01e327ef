"""Busy polling: the event loop keeps polling for a short window after a request arrives.

Why: on a virtual machine a core with nothing to run halts, and waking it when the next bytes
arrive from another core costs tens of microseconds (on the project's 2-vCPU VM a round trip
between two cores took 102 µs against 26 µs on one core; `python -m bench.wakeups` measures
a machine). A proxy at one connection in turn waits twice per request (for the node's answer,
then for the client's next request), so those wake-ups, not the proxy's work, make most of
its added latency. While the window is open the loop is never idle: each turn polls the
sockets without sleeping (a callback scheduled with `call_soon` makes uvloop's poll not
block), and bytes arriving from another core are seen at the next turn. The server kicks it
when a request's bytes arrive and when an answer goes out (`chainstate.httpserver`).

The cost is CPU: a core spins for up to `window` after each request, which at a steady
moderate rate keeps it busy; an idle server spends nothing, and under full load it changes
nothing (the loop has work at every turn anyway). So it is a latency option, off unless a
port's `busy_poll_us` sets it (docs/http-server.md, "Busy polling", has the figures).
"""

from __future__ import annotations

import asyncio
import time


class BusyPoll:
    """Keeps `loop` polling for `window` seconds after the last `kick()`."""

    # `hot` and `spinning` are read and set by the server's hot path without a call: while
    # `spinning`, a kick is `hot = True`, one attribute store instead of a method call per
    # request and per answer (a call is the costlier part of a kick at c=1).
    __slots__ = ("_call_soon", "_last", "hot", "spinning", "stopped", "turns", "window")

    def __init__(self, loop: asyncio.AbstractEventLoop, window: float) -> None:
        self.window = window
        self._call_soon = loop.call_soon
        self.hot = False  # kicked since the last turn
        self.spinning = False  # a turn is scheduled
        self._last = 0.0
        # what the loop did, whatever CPU it was given (a preempted loop turns less often but
        # never sleeps through a window): turns polled so far, and when the last window ended
        self.turns = 0
        self.stopped = 0.0

    def kick(self) -> None:
        """Bytes arrived: keep polling for another window (one flag on the hot path)."""
        self.hot = True
        if not self.spinning:
            self.spinning = True
            self._last = time.perf_counter()
            self._call_soon(self._turn)

    def _turn(self) -> None:
        self.turns += 1
        now = time.perf_counter()
        if self.hot:
            self.hot = False
            self._last = now
        if now - self._last < self.window:
            self._call_soon(self._turn)
        else:
            self.spinning = False
            self.stopped = now

    def stop(self) -> None:
        """No more polling (the listener is closing): the next turn ends it."""
        self.window = 0.0
        self.hot = False

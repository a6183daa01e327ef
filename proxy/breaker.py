"""A circuit breaker per node: outlier ejection on the data path.

`breaker_failures` consecutive penalised outcomes (connection errors, HTTP failures, bad
answers, attempts past their deadline — never a retryable JSON-RPC answer, never the
proxy's own saturation) **open** it: the node gets no traffic for `breaker_cooldown`
seconds. Then it is **half-open**: one request at a time probes it; an answer closes it, a
failure opens it again for twice as long (up to `breaker_cooldown_max`). Every transition is
one log line, a count in metrics and visible in `getAllNodes`.

The breaker is about requests; the health poll (proxy/health.py) is about liveness and heads.
A node is routable only when both allow it (and the checker does, proxy/verdicts.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("proxy.breaker")

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"
STATE_VALUE = {CLOSED: 0, HALF_OPEN: 1, OPEN: 2}


class BreakerSettings:
    __slots__ = ("cooldown", "cooldown_max", "failures")

    def __init__(self, failures: int = 5, cooldown: float = 2.0, cooldown_max: float = 30.0):
        self.failures = failures
        self.cooldown = cooldown
        self.cooldown_max = cooldown_max


class Breaker:
    """The breaker of one node. `on_change` is called after every transition (the node
    recomputes whether it is routable)."""

    __slots__ = (
        "_timer",
        "cooldown",
        "failures",
        "last_failure",
        "on_change",
        "opened",
        "opens_at",
        "probing",
        "settings",
        "state",
        "transitions",
    )

    def __init__(self, settings: BreakerSettings, on_change: Callable[[], None]) -> None:
        self.settings = settings
        self.on_change = on_change
        self.state = CLOSED
        self.failures = 0  # consecutive penalised outcomes
        self.cooldown = settings.cooldown  # the next open period
        self.opened = 0  # times it opened (metrics)
        self.opens_at = 0.0  # monotonic time it becomes half-open (while open)
        self.probing = False  # half-open: a probe is in flight
        self.last_failure: str | None = None
        self.transitions: dict[str, int] = {}
        self._timer: asyncio.TimerHandle | None = None

    @property
    def closed(self) -> bool:
        return self.state is CLOSED

    def success(self, name: str) -> None:
        """An answer from the node (any JSON-RPC answer: the node works)."""
        self.failures = 0
        if self.state is not CLOSED:
            self.cooldown = self.settings.cooldown
            self._move(CLOSED, name, "the probe was answered")

    def failure(self, name: str, why: str) -> None:
        """A penalised outcome (`why` says what happened, for the log)."""
        self.failures += 1
        self.last_failure = why
        state = self.state
        if state is HALF_OPEN:
            self.cooldown = min(self.cooldown * 2, self.settings.cooldown_max)
            self._open(name, f"the probe failed: {why}")
        elif state is CLOSED and self.failures >= self.settings.failures:
            self._open(name, f"{self.failures} consecutive failures, last: {why}")

    def start_probe(self) -> None:
        """A request is being sent while half-open: no other until it ends."""
        self.probing = True
        self.on_change()

    def end_probe(self) -> None:
        """The probe ended without deciding (cancelled: a hedge won, the client left)."""
        if self.probing:
            self.probing = False
            self.on_change()

    def _open(self, name: str, why: str) -> None:
        self.opened += 1
        self.opens_at = time.monotonic() + self.cooldown
        self._move(OPEN, name, f"{why}; next probe in {self.cooldown:g}s")
        self._cancel_timer()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (unit tests): half-open when asked (`tick`)
            return
        self._timer = loop.call_later(self.cooldown, self._half_open, name)

    def tick(self, name: str, now: float) -> None:
        """Half-open once the cooldown has passed (for callers without a running loop)."""
        if self.state is OPEN and now >= self.opens_at:
            self._half_open(name)

    def _half_open(self, name: str) -> None:
        self._timer = None
        if self.state is OPEN:
            self._move(HALF_OPEN, name, "probing with the next request")

    def _move(self, state: str, name: str, why: str) -> None:
        old, self.state = self.state, state
        self.probing = False
        self.transitions[state] = self.transitions.get(state, 0) + 1
        log.warning("node %s breaker %s → %s: %s", name, old, state, why)
        self.on_change()

    def reset(self) -> None:
        """Back to closed without a log line (the node's entry was replaced)."""
        self._cancel_timer()
        self.state, self.failures, self.probing = CLOSED, 0, False
        self.cooldown = self.settings.cooldown

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def to_obj(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "state": self.state,
            "failures": self.failures,
            "opened": self.opened,
            "last_failure": self.last_failure,
        }
        if self.state is OPEN:
            obj["probe_in_s"] = round(max(0.0, self.opens_at - time.monotonic()), 3)
        return obj

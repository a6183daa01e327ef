"""Hedged attempts: a slow first attempt is joined by a second one on another node, not cut.

For an idempotent read sent to a plain-http node with an eligible node on another server
(another URL: one node entered under two kinds is one server; never the transaction
lifecycle, never a write node), one `Race` watches the first attempt with two
soft timers on the shared deadline lanes (proxy/deadlines.py, no timer per request):

1. at the **hedge delay** (the pool's recent `hedge_quantile` of this method's attempt times,
   at least `hedge_min_delay`), if the pool's hedge budget has a token, a second attempt
   starts on another eligible node (a *hedge*);
2. at the **attempt timeout** (`attempt_timeout_factor` × the recent p99, between
   `attempt_timeout_min` and the `upstream_timeout` ceiling) the first attempt counts as a
   timeout against its node's breaker, and a second attempt starts if none has (a retry
   that does not wait for the first to be given up).

A read whose only eligible node is the one of its kind (one `state` node in the pool) is
raced at the attempt timeout alone (no hedge): its second attempt goes to the next node that
holds the block (another kind: the archive node), as its retry would, so a silent node costs
a read the attempt timeout, not `upstream_timeout`. The lone node is struck only when such
a node is there (a second attempt started).

The first attempt keeps running until the ceiling: whichever answers first wins. A winning
second attempt hands its answer to the first attempt's waiting future (the connection's
own), so the request's task awaits exactly what it awaits without hedging — the common case
costs one entry in a deadline lane, no task and no extra timer. The loser is cancelled. A
first attempt with no future yet (still connecting to a host that drops packets, or waiting
for a connection slot) is cancelled when the second one wins, and the request's task takes
the winner's answer (`won_early`), as `Deadline.expired` turns its cancellation into a
timeout.

The budget is a token bucket per pool: each first attempt adds `hedge_budget` of a token
(0.1: at most about 10 % more upstream requests), a hedge takes one; the bucket holds at
most `BURST` tokens, so a sudden hang is covered at once. Retries after the attempt timeout
do not take tokens (they are retries; `max_attempts` and the breaker bound them).
"""

from __future__ import annotations

import asyncio
from asyncio import current_task
from collections.abc import Callable
from typing import Any

from proxy.deadlines import Deadlines

BURST = 50.0  # tokens a pool's hedge budget holds at most (and starts with)
HEDGE = "hedge"  # trigger labels (metrics)
TIMEOUT = "timeout"


class HedgeBudget:
    """Extra attempts a pool may still make: `ratio` of a token per first attempt."""

    __slots__ = ("ratio", "spent", "tokens")

    def __init__(self, ratio: float) -> None:
        self.ratio = ratio
        self.tokens = BURST
        self.spent = 0

    def earn(self) -> None:
        tokens = self.tokens + self.ratio
        self.tokens = tokens if tokens < BURST else BURST

    def take(self) -> bool:
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        self.spent += 1
        return True


class Race:
    """One first attempt and the second attempt that may join it (see the module doc).

    Built for every hedgeable attempt, so it holds references only: the second attempt's
    launch (`attempts.launch`) and the first one's strike (`attempts.late`) are looked up
    when a timer fires, which most attempts never see. `launch` returns the second
    attempt's task (or None when no other node is eligible now), the task `(node, raw)`.
    `usable(raw)` says whether an answer may win (a retryable error does not: the first
    attempt may still do better).
    """

    __slots__ = (
        "_attempts",
        "_budget",
        "_cancelling",
        "_deadlines",
        "_result",
        "_sent",
        "_timeout",
        "_timeout_after",
        "_usable",
        "connecting",
        "cut",
        "first",
        "lane",
        "lone",
        "stage",
        "struck",
        "task",
        "trigger",
        "waiter",
        "winner",
    )

    def __init__(
        self,
        deadlines: Deadlines,
        budget: HedgeBudget,
        attempts: Any,
        sent: tuple[Any, Any, bytes, Any],
        usable: Callable[[bytes], bool],
        hedge_delay: float | None,
        attempt_timeout: float | None,
        lone: bool = False,
    ) -> None:
        self._deadlines = deadlines
        self.lone = lone  # the first attempt's node is the only one of its kind
        # The task awaiting the first attempt (the request's), cancelled when a second
        # attempt wins before the first has a future to hand the answer to (`cut`). Found
        # with the loop given: without it `current_task` makes a getpid() system call.
        first = self.first = current_task(deadlines.loop)
        self._cancelling = 0 if first is None else first.cancelling()
        self.cut = False
        self.connecting = False  # the first attempt is opening its connection
        self._budget = budget
        self._attempts = attempts
        self._sent = sent  # (ctx, group, body, tracing context): `attempts.launch` reads it
        self._usable = usable
        self._timeout = attempt_timeout
        self.lane: dict[Any, float] | None = None
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None  # the first attempt's
        self.task: asyncio.Task[tuple[Any, bytes]] | None = None  # the second attempt
        self.winner: Any = None  # the node of the second attempt, when it won
        self.trigger = ""
        self.struck = False  # the first attempt was counted as a timeout already
        self._result: tuple[int, bytes] | None = None  # a win before the first was sent
        self._timeout_after: float | None = None
        if hedge_delay is not None and (attempt_timeout is None or hedge_delay < attempt_timeout):
            self.stage = HEDGE
            if attempt_timeout is not None:
                self._timeout_after = attempt_timeout - hedge_delay
            deadlines.schedule(hedge_delay, self)
        elif attempt_timeout is not None:
            self.stage = TIMEOUT
            deadlines.schedule(attempt_timeout, self)
        else:
            self.stage = ""

    # ---- the first attempt ---------------------------------------------------------------

    def connect(self) -> None:
        """The first attempt has its connection slot and opens a connection: a late answer
        from here on is the node's fault, as after the request was sent."""
        self.connecting = True

    def attach(self, waiter: asyncio.Future[tuple[int, bytes]]) -> None:
        """The first attempt was sent; `waiter` gets its (status, body)."""
        self.waiter = waiter
        if self._result is not None and not waiter.done():
            waiter.set_result(self._result)

    # ---- timers --------------------------------------------------------------------------

    def expire(self) -> None:
        """A soft timer is due (called by the deadline lanes)."""
        if self.stage == HEDGE:
            self.stage = ""
            if self._timeout_after is not None:
                self.stage = TIMEOUT
                self._deadlines.schedule(self._timeout_after, self)
            if self.task is None and self._budget.take():
                self._start(HEDGE)
        elif self.stage == TIMEOUT:
            self.stage = ""
            if self.task is None:
                self._start(TIMEOUT)
            # Sent (not waiting for a connection): the node's fault. A lone node is not
            # struck when no other node could take over: nothing was gained by counting it.
            sent = self.waiter is not None or self.connecting
            if sent and (self.task is not None or not self.lone):
                self.struck = True
                ctx, group = self._sent[0], self._sent[1]
                self._attempts.late(ctx, group.node, self._timeout)

    def _start(self, trigger: str) -> None:
        task = self._attempts.launch(self._sent, trigger)
        if task is not None:
            self.task = task
            self.trigger = trigger
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[tuple[Any, bytes]]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        node, raw = task.result()
        if not self._usable(raw):
            return
        waiter = self.waiter
        if waiter is None:
            if self._result is None:
                self.winner, self._result = node, (200, raw)
                first = self.first
                if first is not None and not first.done():
                    self.cut = True
                    first.cancel()  # (no future to end its wait: `won_early`)
        elif not waiter.done():
            self.winner = node
            waiter.set_result((200, raw))

    # ---- ending --------------------------------------------------------------------------

    def failed(self) -> None:
        """The first attempt failed (before it was sent, say: its connection refused): the
        request's task now awaits the second attempt itself (`second`), and its win must not
        cancel that task as it ends a first attempt still waiting to be sent."""
        self.first = None

    def won_early(self) -> bytes | None:
        """After a CancelledError in the first attempt: the second attempt's answer when
        its win caused it (the cancellation is then withdrawn), else None."""
        if not self.cut or self.first is None or self._result is None:
            return None
        if self.first.uncancel() > self._cancelling:
            return None  # cancelled by someone else as well: that one stands
        return self._result[1]

    async def second(self) -> tuple[Any, bytes]:
        """The second attempt's (node, answer) after the first failed; raises as it did, or
        RuntimeError when there is none."""
        if self.task is None:
            raise RuntimeError("no second attempt")
        return await self.task

    def close(self) -> None:
        """Stop the timers; cancel the second attempt unless it won."""
        if self.stage:
            self.stage = ""
            if self.lane is not None:
                self._deadlines.stop(self)
        task = self.task
        if task is not None and not task.done() and self.winner is None:
            task.cancel()

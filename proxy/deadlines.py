"""One deadline mechanism for every upstream attempt in flight.

`asyncio.timeout()` per attempt costs a Timeout object, a timer-heap entry and its
rescheduling on every request (measured: about 5 % of the proxy's CPU under load). Here an
attempt registers its task in a lane of attempts with the same time limit; a lane is in
deadline order (same limit, later start → later deadline), so one timer, armed at the earliest
deadline of all lanes, finds what expired by looking at the oldest entries only. An expired
attempt's task is cancelled, and the attempt turns that cancellation into a timeout
(`Deadline.expired`), as `asyncio.timeout` does; a cancellation from anyone else passes on.

The same lanes hold soft timers (`schedule`): any entry with an `expire()` method and a
`lane` slot, called when due without cancelling anything (the hedge and attempt-timeout
timers of proxy/hedge.py).
"""

from __future__ import annotations

import asyncio
import math
from asyncio import current_task
from typing import Any

MIN_GAP = 0.005  # seconds: the timer is never armed closer than this to its last run


class Deadline:
    """One attempt's registration: `expired()` after a cancellation says whether it was ours."""

    __slots__ = ("_cancelling", "_fired", "lane", "task")

    def __init__(self, task: asyncio.Task, lane: dict[Deadline, float]) -> None:
        self.task = task
        self.lane = lane
        self._cancelling = task.cancelling()
        self._fired = False

    def expired(self) -> bool:
        """After a CancelledError: True when the deadline caused it (the cancellation is then
        withdrawn and the caller answers a timeout instead)."""
        if not self._fired:
            return False
        return self.task.uncancel() <= self._cancelling

    def expire(self) -> None:
        self._fired = True
        self.task.cancel()


class Deadlines:
    """Deadlines of the attempts in flight, by time limit; one timer for all of them."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lanes: dict[float, dict[Deadline, float]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def start(self, seconds: float) -> Deadline:
        """Register the current task for `seconds`; `stop()` it when the attempt ends."""
        loop = self._loop or self._bind()
        task = current_task(loop)
        assert task is not None, "deadlines need a task"
        lane = self._lanes.get(seconds)
        if lane is None:
            lane = self._lanes[seconds] = {}
        token = Deadline(task, lane)
        due = loop.time() + seconds
        lane[token] = due
        if due < self._timer_at:
            self._arm(due)
        return token

    def schedule(self, seconds: float, entry: Any) -> None:
        """Call `entry.expire()` in `seconds` unless `stop(entry)` comes first. `entry` needs a
        `lane` attribute (set here)."""
        loop = self._loop or self._bind()
        lane = self._lanes.get(seconds)
        if lane is None:
            lane = self._lanes[seconds] = {}
        entry.lane = lane
        due = loop.time() + seconds
        lane[entry] = due
        if due < self._timer_at:
            self._arm(due)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, found once: `asyncio.get_running_loop()` makes a getpid()
        system call every time."""
        return self._loop or self._bind()

    def _bind(self) -> asyncio.AbstractEventLoop:
        self._loop = asyncio.get_running_loop()
        return self._loop

    @staticmethod
    def stop(token: Any) -> None:
        token.lane.pop(token, None)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        loop = self._loop or self._bind()
        self._timer_at = when
        self._timer = loop.call_at(when, self._expire)

    def _expire(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        now = (self._loop or self._bind()).time()
        earliest = math.inf
        for lane in list(self._lanes.values()):  # an expire() may schedule into a new lane
            while lane:
                token, due = next(iter(lane.items()))
                if due > now:
                    earliest = min(earliest, due)
                    break
                del lane[token]
                token.expire()
        if earliest < self._timer_at:  # (an expire() may have armed the timer already)
            self._arm(max(earliest, now + MIN_GAP))

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = math.inf
        self._lanes.clear()

    def __len__(self) -> int:
        return sum(len(lane) for lane in self._lanes.values())

"""A cap on the upstream answer bytes the proxy holds at once (`max_buffered_bytes`).

Each upstream answer with a Content-Length reserves its size when its head arrives, before
its body is read, and the client request that asked for it keeps the reservation until it
has been answered. When the budget is spent, a connection whose answer does not fit stops
reading (the node's bytes wait in the kernel and at the node, not in the proxy's memory)
until earlier requests finish, first come first served. A request that already holds a
reservation is never made to wait for another one (the sub-batches of one batch cannot
block each other), so the budget may be overdrawn by what such requests hold. Answers
without a length (chunked) are counted as they arrive, never waited for. One answer larger
than `max_answer_bytes` fails at once (`too_large`): every node would send the same one.
"""

from __future__ import annotations

import ctypes
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from chainstate.jsonrpc import SERVER_BUSY, JsonRpcError

TRIM_AFTER = 32 * 1024 * 1024  # a peak of held answers past which freed memory is trimmed
TRIM_EVERY = 1.0  # seconds between two trims at most


def _libc_trim() -> Callable[[int], Any] | None:
    """glibc's malloc_trim (None elsewhere: musl, macOS keep their own ways)."""
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


_TRIM = _libc_trim()


def over_budget(budget: ByteBudget | None) -> JsonRpcError | None:
    """The refusal of a new client request while the answers in flight hold more than the
    budget (503, before the process grows), or None."""
    if budget is None or budget.used <= budget.limit:
        return None
    return JsonRpcError(
        SERVER_BUSY,
        f"the proxy holds {budget.used} bytes of answers in flight, more than "
        f"{budget.limit} (max_buffered_bytes); retry after 1s",
    )


class ByteBudget:
    """Bytes reserved by holders (objects with an int `reserved` attribute)."""

    __slots__ = ("_since_trim", "_trimmed_at", "_waiting", "limit", "peak", "used", "waits")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0  # highest `used` seen (metrics)
        self.waits = 0  # answers that had to wait for room (metrics)
        self._waiting: deque[list[Any]] = deque()  # [size, holder, on_grant] entries
        self._since_trim = 0  # highest `used` since memory was last given back
        self._trimmed_at = 0.0

    def reserve(self, size: int, holder: Any) -> bool:
        """Reserve `size` for `holder` now if it fits (or the holder already holds some);
        False: call `wait` (or read on without a reservation)."""
        fits = self.used == 0 or self.used + size <= self.limit  # (alone: even if larger)
        if holder.reserved or (fits and not self._waiting):
            holder.reserved += size  # (`_grant` inline: once per answer with a length)
            self.used = used = self.used + size
            if used > self.peak:
                self.peak = used
            if used > self._since_trim:
                self._since_trim = used
            return True
        return False

    def add(self, size: int, holder: Any) -> None:
        """Count bytes that arrived without a reservation (an answer without a length)."""
        self._grant(size, holder)

    def wait(self, size: int, holder: Any, on_grant: Callable[[], None]) -> list[Any]:
        """Queue a reservation; `on_grant()` is called once it is made. Returns the entry
        (for `cancel`)."""
        entry = [size, holder, on_grant]
        self._waiting.append(entry)
        self.waits += 1
        return entry

    def cancel(self, entry: list[Any]) -> None:
        try:
            self._waiting.remove(entry)
        except ValueError:
            return
        self._wake()

    def release(self, holder: Any) -> None:
        """Everything `holder` reserved is free again (its client request was answered)."""
        if holder.reserved:
            self.used -= holder.reserved
            holder.reserved = 0
            if self._waiting:  # (`_wake`'s own test first: nobody waits, no call)
                self._wake()
            if not self.used and self._since_trim > TRIM_AFTER:
                self._trim()

    def _trim(self) -> None:
        """Give the memory of a spike of large answers back to the system: CPython's
        allocator frees large blocks itself, but glibc keeps freed heap pages (and
        the arenas of other threads) until malloc_trim. At most every TRIM_EVERY s."""
        now = time.monotonic()
        if _TRIM is None or now - self._trimmed_at < TRIM_EVERY:
            return
        self._trimmed_at = now
        self._since_trim = 0
        _TRIM(0)

    def _grant(self, size: int, holder: Any) -> None:
        holder.reserved += size
        self.used += size
        if self.used > self.peak:
            self.peak = self.used
        if self.used > self._since_trim:
            self._since_trim = self.used

    def _wake(self) -> None:
        waiting = self._waiting
        while waiting:
            size, holder, on_grant = waiting[0]
            if holder.reserved == 0 and self.used and self.used + size > self.limit:
                return
            waiting.popleft()
            self._grant(size, holder)
            on_grant()

"""Local limiters: token buckets, quotas and in-flight counts, checked without any I/O.

A bucket refills at its full rate and holds `burst_seconds` of it. With Redis, every proxy
adds what it admitted to a shared counter and takes off its own bucket what the others
admitted since its last sync (proxy/tenancy/shared.py): each bucket then tracks "rate × time
− what the whole fleet admitted", late by one sync interval at most. Without Redis (or while
it is down) a bucket refills at its rate divided by the number of proxies last seen.
"""

from __future__ import annotations

import calendar
import time
from dataclasses import dataclass

MIN_RATE = 1e-9


class Bucket:
    """A token bucket of one limit of one subject (`name` says which, e.g. `key:k1:rps`)."""

    __slots__ = (
        "active",
        "cap",
        "full_rate",
        "limit",
        "name",
        "pending",
        "rate",
        "seen",
        "stamp",
        "tokens",
    )

    def __init__(self, name: str, limit: str, rate: float, burst_seconds: float, now: float):
        self.name = name  # the shared counter's name
        self.limit = limit  # the setting a refusal names (`requests_per_second=50`)
        self.full_rate = rate
        self.rate = rate  # full_rate, or its share while the shared counters are down
        self.cap = max(1.0, rate * burst_seconds)
        self.tokens = self.cap
        self.stamp = now
        self.pending = 0  # admitted since the last sync (to add to the shared counter)
        self.seen = -1  # the shared counter's value at the last sync (-1: not synced yet)
        self.active = False  # in the sync's list (proxy/tenancy/shared.py)

    def take(self, n: int, now: float) -> float:
        """0.0 when `n` tokens were taken, else the seconds until they could be."""
        tokens = self.tokens + (now - self.stamp) * self.rate
        if tokens > self.cap:
            tokens = self.cap
        self.stamp = now
        if tokens >= n:
            self.tokens = tokens - n
            self.pending += n
            return 0.0
        self.tokens = tokens
        if n > self.cap:
            return float("inf")
        return (n - tokens) / max(self.rate, MIN_RATE)

    def deduct(self, others: int) -> None:
        """What the other proxies admitted since the last sync."""
        self.tokens -= others


class Quota:
    """Items per UTC day or calendar month. `known`: the count of the period as last read
    (the fleet's, from Redis; the stored usage's without it), `pending`: admitted since."""

    __slots__ = (
        "active",
        "ends",
        "known",
        "limit",
        "name",
        "pending",
        "period",
        "setting",
        "touched",
    )

    def __init__(self, name: str, setting: str, limit: int, period: str, now: float) -> None:
        self.name = name
        self.setting = setting  # `daily_items=100000`
        self.limit = limit
        self.period = period  # "day" | "month"
        self.known = 0
        self.pending = 0
        self.ends = period_end(period, now)
        self.active = False
        self.touched = 0.0

    def take(self, n: int, now: float) -> bool:
        self.touched = now
        if self.room(now) < n:
            return False
        self.pending += n
        return True

    def room(self, now: float) -> int:
        """Items this period still allows (from a new day or month on: all)."""
        if now >= self.ends:  # a new day or month
            self.ends = period_end(self.period, now)
            self.known = self.pending = 0
        return self.limit - self.known - self.pending

    def window(self, now: float) -> str:
        return period_of(self.period, now)

    def reset_after(self, now: float) -> int:
        """Seconds until the next period starts (the refusal's Retry-After)."""
        return max(1, int(period_end(self.period, now) - now))


@dataclass(slots=True)
class InFlight:
    """Requests of one subject in flight on this proxy (`count`), and on the other proxies
    of the fleet as they last reported it through Redis (`others`, proxy/tenancy/shared.py)."""

    limit: int
    setting: str
    name: str = ""  # the shared hash's name
    count: int = 0
    others: int = 0
    active: bool = False  # in the sync's list
    touched: float = 0.0  # (monotonic) its last request


def period_of(period: str, now: float) -> str:
    t = time.gmtime(now)
    return (
        f"{t.tm_year:04d}{t.tm_mon:02d}{t.tm_mday:02d}"
        if period == "day"
        else (f"{t.tm_year:04d}{t.tm_mon:02d}")
    )


def period_end(period: str, now: float) -> float:
    t = time.gmtime(now)
    if period == "day":
        return calendar.timegm((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0)) + 86400
    year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    return calendar.timegm((year, month, 1, 0, 0, 0))

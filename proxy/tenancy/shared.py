"""The local limiters kept in step with Redis, off the request path.

Every `sync_interval` one pipelined round trip adds what this proxy admitted to each active
limit's shared counter (`INCRBY`, which answers the fleet's total) and takes what the other
proxies admitted since the last sync off the local bucket; quotas learn the fleet's count of
their day or month. A proxy also announces itself once a second, so each knows how many
proxies share a limit: while Redis cannot be reached, buckets refill at their rate divided
by that number (and quotas fail open or closed, `quota_fail`), and the next sync that works
puts them back. The client: redis-py's asyncio client (the Redis project's own, maintained,
pipelining, timeouts per socket operation).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from proxy.tenancy.limits import Bucket, InFlight, Quota, period_end

log = logging.getLogger(__name__)
IDLE_S = 10.0  # a limiter untouched this long leaves the sync (its bucket is full again)
COUNTER_TTL_S = 3600  # a rate counter unused this long expires
FLEET_EVERY_S = 1.0  # seconds between announcements of this proxy
FLEET_WINDOW_S = 5.0  # proxies announced within this many seconds count as the fleet
OUTAGE_S = 0.5  # syncs failing this long are an outage, not one slow answer
INFLIGHT_STALE_S = 2.0  # another proxy's in-flight count older than this is ignored
INFLIGHT_TTL_S = 60  # an in-flight hash unused this long expires


class Active:
    """The limiters touched lately: the request path appends a limiter the first time it
    takes from it (a flag test per request), the sync drops the idle ones."""

    def __init__(self) -> None:
        self.buckets: list[Bucket] = []
        self.quotas: list[Quota] = []
        self.inflight: list[InFlight] = []


class Shared:
    def __init__(self, url: str, prefix: str, timeout: float, interval: float) -> None:
        import redis.asyncio as aioredis

        self.redis: Any = aioredis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout, retry_on_timeout=False
        )
        self.prefix = prefix
        self.timeout = timeout
        self.interval = interval
        self.id = uuid.uuid4().hex[:12]
        self.up: bool | None = None  # None until the first sync answers or fails
        self.fleet = 1
        self.failures = 0
        self.last_error = ""
        self._announced = 0.0
        self.down_since = 0.0  # (monotonic) when the current outage began

    async def close(self) -> None:
        await self.redis.aclose()

    async def sync(self, active: Active) -> None:
        """One round trip for every active limiter (and, once a second, the fleet)."""
        now = time.time()
        buckets = active.buckets
        quotas = active.quotas
        inflight = active.inflight
        sent_b = [b.pending for b in buckets]
        sent_q = [q.pending for q in quotas]
        pipe = self.redis.pipeline(transaction=False)
        prefix = self.prefix
        for bucket, n in zip(buckets, sent_b, strict=True):
            key = f"{prefix}rl:{bucket.name}"
            pipe.incrby(key, n)
            pipe.expire(key, COUNTER_TTL_S)
        for quota, n in zip(quotas, sent_q, strict=True):
            window = quota.window(now)
            key = f"{prefix}q:{quota.name}:{window}"
            pipe.incrby(key, n)
            pipe.expireat(key, int(period_end(quota.period, now)) + 86400)
        for slot in inflight:  # this proxy's count, and every proxy's as they reported it
            key = f"{prefix}cc:{slot.name}"
            pipe.hset(key, self.id, f"{slot.count}:{now:.3f}")
            pipe.expire(key, INFLIGHT_TTL_S)
            pipe.hgetall(key)
        announce = now - self._announced >= FLEET_EVERY_S
        if announce:
            fleet = f"{prefix}fleet"
            pipe.zadd(fleet, {self.id: now})
            pipe.zremrangebyscore(fleet, 0, now - FLEET_WINDOW_S)
            pipe.zcard(fleet)
        try:
            results = await asyncio.wait_for(pipe.execute(), self.timeout * 2)
        except Exception as exc:  # any failure of the round trip: Redis is down for us
            self._down(exc, buckets)
            for slot in inflight:
                slot.others = 0  # (local only until a sync works)
            return
        self._apply(results, buckets, sent_b, quotas, sent_q)
        self._others(results, len(buckets) * 2 + len(quotas) * 2, inflight, now)
        if announce:
            self._announced = now
            self.fleet = max(1, int(results[-1]))
        if self.up is not True:
            if self.up is False:
                log.warning("tenancy: Redis reachable again; limits shared by the fleet")
            self.up = True
            for bucket in buckets:
                bucket.rate = bucket.full_rate

    def _apply(
        self,
        results: list[Any],
        buckets: list[Bucket],
        sent_b: list[int],
        quotas: list[Quota],
        sent_q: list[int],
    ) -> None:
        i = 0
        for bucket, n in zip(buckets, sent_b, strict=True):
            total = int(results[i])
            i += 2
            bucket.pending -= n
            seen = bucket.seen
            # the first sync, or the counter expired: nothing known of the others yet
            others = 0 if seen < 0 or total < seen + n else total - seen - n
            if others:
                bucket.deduct(others)
            bucket.seen = total
        for quota, n in zip(quotas, sent_q, strict=True):
            quota.pending -= n
            quota.known = int(results[i])
            i += 2

    def _others(self, results: list[Any], at: int, inflight: list[InFlight], now: float) -> None:
        """Each in-flight limit's count on the other proxies, from their recent reports."""
        me = self.id.encode()
        for slot in inflight:
            reports = results[at + 2]
            at += 3
            others = 0
            for proxy, value in reports.items():
                if proxy == me:
                    continue
                count, _, stamp = value.partition(b":")
                try:
                    if now - float(stamp) <= INFLIGHT_STALE_S:
                        others += int(count)
                except ValueError:
                    continue  # (not ours to read)
            slot.others = others

    def _down(self, exc: BaseException, buckets: list[Bucket]) -> None:
        self.failures += 1
        self.last_error = f"{type(exc).__name__}: {exc}"[:200]
        now = time.monotonic()
        if self.up is not False:
            log.warning(
                "tenancy: Redis unreachable (%s); limits are local (rate / %d proxies)",
                self.last_error,
                self.fleet,
            )
            self.down_since = now
        self.up = False
        # A sync that failed once (a slow answer) keeps its counts for the next one: nothing
        # is lost. Past OUTAGE_S it is an outage: what was admitted meanwhile is never sent
        # (the others would take it for this proxy's use of the last interval), and the
        # others' count is unknown until a sync works again (quotas keep theirs: they count
        # totals).
        outage = now - self.down_since >= OUTAGE_S
        for bucket in buckets:
            bucket.rate = bucket.full_rate / self.fleet
            if outage:
                bucket.seen = -1
                bucket.pending = 0


def prune(active: Active, mono: float, wall: float) -> None:
    """Drop the limiters idle for IDLE_S (their flag cleared: the next take adds them again)."""
    buckets = []
    for bucket in active.buckets:
        if bucket.pending or mono - bucket.stamp < IDLE_S:
            buckets.append(bucket)
        else:
            bucket.active = False
            bucket.seen = -1
    active.buckets = buckets
    quotas = []
    for quota in active.quotas:
        if quota.pending or wall - quota.touched < IDLE_S:
            quotas.append(quota)
        else:
            quota.active = False
    active.quotas = quotas
    slots = []
    for slot in active.inflight:
        if slot.count or mono - slot.touched < IDLE_S:
            slots.append(slot)
        else:  # (its last report, a count of 0, goes stale for the others)
            slot.active = False
            slot.others = 0
    active.inflight = slots

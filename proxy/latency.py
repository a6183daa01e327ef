"""Observed latency: a cost per node for the choice, recent quantiles per pool for the timers.

Per node, a **peak EWMA** (as Finagle and Linkerd balance): a slower answer than the estimate
replaces it at once, a faster one pulls it down with a weight that grows with the time since
the last sample, and without samples the estimate decays toward zero (time constant
`latency_decay`), so a node that was slow once is tried again later. Failures and attempts
cut short (a hedge won, the attempt timed out) count as samples of at least the time they
took, so a hung node that answers nothing never looks fast. The choice compares
`cost × (in flight + 1) / weight` of two nodes (proxy/select.py).

Per pool and method (or `batch` for sub-batches), a **latency window**: a log-bucket histogram
of recent attempt times (older samples halved away), from which the hedge delay (a
quantile) and the derived attempt timeout (a multiple of p99) are read. Both are recomputed
every `REFRESH` samples, never per request.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from typing import Any

BUCKETS_PER_DOUBLING = 8
FLOOR_S = 50e-6  # the first bucket's upper bound
N_BUCKETS = 20 * BUCKETS_PER_DOUBLING + 1  # up to FLOOR_S · 2^20 ≈ 52 s, then one overflow
REFRESH = 128  # samples between recomputations of the window's quantiles
KEEP = 4096  # samples a window holds before halving its counts (recent ones weigh more)
MIN_SAMPLES = 64  # fewer: no quantile is trusted (no hedging, timeouts at the ceiling)
_UPPER = [FLOOR_S * 2 ** (i / BUCKETS_PER_DOUBLING) for i in range(N_BUCKETS)]


def observe(node: Any, ms: float, now: float, tau: float) -> None:
    """Record one attempt of `ms` milliseconds on `node` (fields `cost`, `cost_at`)."""
    cost = node.cost
    if cost is None or ms >= cost:
        node.cost = ms
    else:
        w = math.exp((node.cost_at - now) / tau)
        node.cost = cost * w + ms * (1.0 - w)
    node.cost_at = now


def observe_many(node: Any, ms: list[float], now: float, tau: float) -> None:
    """`observe` of each of `ms` in order, all at `now` (answers folded in together,
    proxy/inprocbooks.py): after the first, a sample decays nothing (no time passed), so
    only a slower one than the estimate counts, and it replaces it."""
    observe(node, ms[0], now, tau)
    if len(ms) > 1:
        peak = max(ms[1:])
        if peak >= node.cost:
            node.cost = peak


def current(node: Any, now: float, tau: float) -> float | None:
    """The node's cost estimate at `now` (ms), decayed since its last sample."""
    cost = node.cost
    if cost is None:
        return None
    return cost * math.exp((node.cost_at - now) / tau)


def bucket(seconds: float) -> int:
    """The bucket of `seconds`: the first whose upper bound is not below it (a time exactly
    on a bound is in that bound's bucket), the last for anything longer."""
    i = bisect_left(_UPPER, seconds)
    return i if i < N_BUCKETS else N_BUCKETS - 1


class LatencyWindow:
    """Recent attempt times of one pool and method; quantiles read from cached values."""

    __slots__ = ("counts", "hedge_q", "n", "p99", "since", "total", "want")

    def __init__(self, hedge_quantile: float) -> None:
        self.counts = [0] * N_BUCKETS
        self.total = 0  # samples counted (after halvings)
        self.n = 0  # samples since the last refresh
        self.since = 0  # samples ever seen (for the first refreshes)
        self.want = hedge_quantile
        self.hedge_q: float | None = None  # seconds; None until MIN_SAMPLES
        self.p99: float | None = None

    def add(self, seconds: float) -> None:
        # (`bucket` and `_counted` inline: one sample per answer from a node)
        i = bisect_left(_UPPER, seconds)
        self.counts[i if i < N_BUCKETS else N_BUCKETS - 1] += 1
        self.total += 1
        n = self.n = self.n + 1
        if n >= REFRESH or (self.since < MIN_SAMPLES and self.since + n >= MIN_SAMPLES):
            self.refresh()

    def add_many(self, samples: list[float], ordered: list[float] | None = None) -> None:
        """`add` for each of `samples`, the quantiles refreshed once after them when due
        (`ordered`: `sorted(samples)` when the caller has it)."""
        counts = self.counts
        # Sorted, the samples of the first bucket (<= FLOOR_S) are counted by one bisect: an
        # in-process answer's samples (a few µs) are all there, and `bucket` per sample was
        # most of the fold's cost (proxy/inprocbooks.py); the others as `add` counts them.
        if ordered is None:
            ordered = sorted(samples)
        low = bisect_right(ordered, FLOOR_S)
        counts[0] += low
        for seconds in ordered[low:]:
            counts[bucket(seconds)] += 1
        self._counted(len(samples))

    def _counted(self, n: int) -> None:
        """`n` samples were added: the quantiles refreshed when due."""
        self.total += n
        self.n += n
        if self.n >= REFRESH or (self.since < MIN_SAMPLES and self.since + self.n >= MIN_SAMPLES):
            self.refresh()

    def refresh(self) -> None:
        self.since += self.n
        self.n = 0
        if self.total >= MIN_SAMPLES:
            self.hedge_q = self.quantile(self.want)
            self.p99 = self.quantile(0.99)
        if self.total > KEEP:
            self.counts = [c >> 1 for c in self.counts]
            self.total = sum(self.counts)

    def quantile(self, q: float) -> float:
        """The upper bound of the bucket holding quantile `q` (seconds)."""
        rank = max(1, math.ceil(q * self.total))
        seen = 0
        for i, count in enumerate(self.counts):
            seen += count
            if seen >= rank:
                return _UPPER[i]
        return _UPPER[-1]

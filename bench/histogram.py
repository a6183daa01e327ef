"""A mergeable latency histogram with bounded relative error (HDR-histogram style).

Recording must cost next to nothing inside the load generator's hot loop, and histograms from
several worker processes must merge exactly; a list of every sample would do neither at
100k req/s. Values (nanoseconds) below 2*SUB_BUCKETS are stored exactly; larger values fall
in buckets whose width is 1/SUB_BUCKETS of their magnitude, so any percentile read back is
within 1/SUB_BUCKETS (0.8 %) of the true sample, and never above the recorded maximum.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

SUB_BITS = 7
SUB_BUCKETS = 1 << SUB_BITS  # buckets per power of two (precision 1/128)
_EXACT_LIMIT = 2 * SUB_BUCKETS  # values below this are their own bucket


def bucket_index(value: int) -> int:
    """Index of the bucket holding `value` (a non-negative int)."""
    if value < _EXACT_LIMIT:
        return value
    shift = value.bit_length() - SUB_BITS - 1
    return shift * SUB_BUCKETS + (value >> shift)


def bucket_upper(index: int) -> int:
    """The largest value that lands in bucket `index`."""
    if index < _EXACT_LIMIT:
        return index
    shift = index // SUB_BUCKETS - 1
    mantissa = index - shift * SUB_BUCKETS
    return ((mantissa + 1) << shift) - 1


def percentile_of_sorted(samples: list[int], pct: float) -> int:
    """Nearest-rank percentile of already sorted samples: the smallest sample such that at
    least `pct` percent of all samples are less than or equal to it."""
    if not samples:
        raise ValueError("no samples")
    if not 0 <= pct <= 100:
        raise ValueError(f"percentile {pct} outside 0..100")
    rank = max(1, math.ceil(pct / 100 * len(samples)))
    return samples[rank - 1]


class Histogram:
    """Counts of latencies (ns) per bucket, plus exact count, sum, min and max."""

    __slots__ = ("buckets", "count", "max", "min", "total")

    def __init__(self) -> None:
        self.buckets: dict[int, int] = {}
        self.count = 0
        self.total = 0
        self.min: int | None = None
        self.max = 0

    def record(self, value: int) -> None:
        if value < 0:
            value = 0
        idx = value if value < _EXACT_LIMIT else bucket_index(value)
        buckets = self.buckets
        buckets[idx] = buckets.get(idx, 0) + 1
        self.count += 1
        self.total += value
        if value > self.max:
            self.max = value
        if self.min is None or value < self.min:
            self.min = value

    def record_many(self, values: Iterable[int]) -> None:
        for v in values:
            self.record(v)

    def merge(self, other: Histogram) -> None:
        """Add `other`'s samples to this histogram (exact: bucket counts add)."""
        for idx, n in other.buckets.items():
            self.buckets[idx] = self.buckets.get(idx, 0) + n
        self.count += other.count
        self.total += other.total
        self.max = max(self.max, other.max)
        if other.min is not None and (self.min is None or other.min < self.min):
            self.min = other.min

    def percentile(self, pct: float) -> int:
        """Nearest-rank percentile (same definition as `percentile_of_sorted`), reported as
        the upper edge of the bucket holding that rank, clamped to [min, max]."""
        if not 0 <= pct <= 100:
            raise ValueError(f"percentile {pct} outside 0..100")
        if self.count == 0:
            return 0
        rank = max(1, math.ceil(pct / 100 * self.count))
        seen = 0
        for idx in sorted(self.buckets):
            seen += self.buckets[idx]
            if seen >= rank:
                value = min(bucket_upper(idx), self.max)
                return max(value, self.min or 0)
        return self.max

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A plain, picklable/JSON-able form (used to ship histograms between processes)."""
        return {
            "buckets": [[k, v] for k, v in self.buckets.items()],
            "count": self.count,
            "total": self.total,
            "min": self.min,
            "max": self.max,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Histogram:
        h = cls()
        h.buckets = {int(k): int(v) for k, v in data["buckets"]}
        h.count = int(data["count"])
        h.total = int(data["total"])
        h.min = None if data["min"] is None else int(data["min"])
        h.max = int(data["max"])
        return h

"""Latency percentiles: exact nearest-rank maths, bounded error for large values, merging."""

from __future__ import annotations

import random

import pytest

from bench.histogram import SUB_BUCKETS, Histogram, bucket_index, bucket_upper, percentile_of_sorted


def test_nearest_rank_on_known_samples() -> None:
    samples = list(range(1, 101))
    assert percentile_of_sorted(samples, 50) == 50
    assert percentile_of_sorted(samples, 90) == 90
    assert percentile_of_sorted(samples, 99) == 99
    assert percentile_of_sorted(samples, 100) == 100
    assert percentile_of_sorted(samples, 0) == 1
    assert percentile_of_sorted([7, 9, 30, 31], 50) == 9
    assert percentile_of_sorted([7, 9, 30, 31], 51) == 30
    with pytest.raises(ValueError):
        percentile_of_sorted([], 50)


def test_small_values_are_exact() -> None:
    rng = random.Random(1)
    samples = [rng.randrange(0, 2 * SUB_BUCKETS) for _ in range(999)]
    h = Histogram()
    h.record_many(samples)
    ordered = sorted(samples)
    for pct in (0, 1, 25, 50, 90, 99, 99.9, 100):
        assert h.percentile(pct) == percentile_of_sorted(ordered, pct)
    assert (h.count, h.min, h.max, h.total) == (999, ordered[0], ordered[-1], sum(samples))


def test_large_values_within_bucket_precision() -> None:
    rng = random.Random(2)
    samples = [int(rng.lognormvariate(14, 1.5)) for _ in range(5000)]  # ~1 ms ± a lot, in ns
    h = Histogram()
    h.record_many(samples)
    ordered = sorted(samples)
    for pct in (50, 90, 99, 100):
        true = percentile_of_sorted(ordered, pct)
        got = h.percentile(pct)
        assert true <= got <= true * (1 + 1 / SUB_BUCKETS), (pct, true, got)
    assert h.percentile(100) == max(samples)


def test_bucket_edges() -> None:
    for value in (0, 1, 255, 256, 257, 1000, 10**6, 10**9 + 7, 2**40):
        idx = bucket_index(value)
        assert bucket_upper(idx) >= value
        assert bucket_index(bucket_upper(idx)) == idx
        assert bucket_index(bucket_upper(idx) + 1) == idx + 1


def test_merge_equals_recording_everything() -> None:
    rng = random.Random(3)
    a_samples = [rng.randrange(10**3, 10**8) for _ in range(2000)]
    b_samples = [rng.randrange(10**5, 10**9) for _ in range(1000)]
    a, b, both = Histogram(), Histogram(), Histogram()
    a.record_many(a_samples)
    b.record_many(b_samples)
    both.record_many(a_samples + b_samples)
    a.merge(Histogram.from_dict(b.to_dict()))  # as shipped between processes
    assert a.buckets == both.buckets
    assert (a.count, a.min, a.max, a.total) == (both.count, both.min, both.max, both.total)
    assert [a.percentile(p) for p in (50, 90, 99)] == [both.percentile(p) for p in (50, 90, 99)]


def test_empty_and_bad_percentile() -> None:
    h = Histogram()
    assert h.percentile(99) == 0
    assert h.mean == 0
    with pytest.raises(ValueError):
        h.percentile(101)

"""The event loop's histogram (chainstate/histogram.py): samples folded in together."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry

from chainstate.histogram import DEFAULT_BUCKETS, LoopHistogram


def test_samples_observed_together_count_as_one_at_a_time() -> None:
    """`observe_all` (the proxy tells an in-process node its answers' times per fold) gives
    the buckets and sum `observe` gives one sample at a time, samples on a bound and above
    every bound included."""
    rng = random.Random(13)
    samples = [rng.uniform(0.0, 0.02) for _ in range(200)]
    samples += [rng.choice(DEFAULT_BUCKETS) for _ in range(40)]  # exactly on a bound
    samples += [rng.uniform(11, 20) for _ in range(5)]  # above every bound (+Inf)
    rng.shuffle(samples)
    one = LoopHistogram("one", "one", {}, CollectorRegistry())
    many = LoopHistogram("many", "many", {}, CollectorRegistry())
    for s in samples:
        one.observe(s)
    for chunk in (samples[:1], [], samples[1:64], samples[64:]):
        many.observe_all(chunk)
    assert many.counts == one.counts and sum(one.counts) == len(samples)
    assert many.total == pytest.approx(one.total)
    first = LoopHistogram("first", "first", {}, CollectorRegistry())
    first.observe_all([3e-6] * 64)  # the common fold: every sample in the first bucket
    assert first.counts[:2] == [64, 0]

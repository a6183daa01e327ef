"""A Prometheus histogram for one event loop: a list of bucket counts, no lock.

prometheus-client's `Histogram.observe` takes a lock and walks the buckets in Python on every
observation; on a data port answering one read in about 10 µs that was 3-6 % of the process's
CPU (a py-spy profile of the state node under `bench suite state`). Observations here are one
`bisect` and two additions, made on the event loop's thread only; the exposition (`_bucket`,
`_sum`, `_count`) is built when scraped. The proxy's hot metrics (proxy/metrics.py) do the
same for their labelled families.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

# prometheus-client's default buckets, so dashboards keep their `le` values.
DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)


def count_sorted(counts: list[int], bounds: list[float], ordered: list[float]) -> None:
    """Add sorted samples to bucket counts (`counts[i]`: samples <= `bounds[i]` and above the
    bound before; the last: above every bound): each bucket's count is the distance between
    the positions of its bounds, a few bisects in C instead of a Python step per sample
    (`bisect_left` per sample gives the same counts)."""
    n = len(ordered)
    before = 0
    for i, bound in enumerate(bounds):
        at = bisect_right(ordered, bound, before)  # the samples <= bound: buckets <= i
        counts[i] += at - before
        before = at
        if at == n:
            return
    counts[-1] += n - before  # above every bound (+Inf)


class LoopHistogram(Collector):
    """One histogram with fixed label values, registered in `registry`."""

    def __init__(
        self,
        name: str,
        doc: str,
        labels: dict[str, str],
        registry: CollectorRegistry,
        buckets: tuple[float, ...] = DEFAULT_BUCKETS,
    ) -> None:
        self.name = name
        self.doc = doc
        self.labels = labels
        self.bounds = list(buckets)
        self.counts = [0] * (len(buckets) + 1)  # the last one: above every bound (+Inf)
        self.total = 0.0
        registry.register(self)

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.total += seconds

    def observe_all(self, samples: list[float]) -> None:
        """`observe` of each of `samples` (the same counts; the same sum to float rounding,
        as the proxy's own histograms fold theirs, proxy/metrics.py): sorted, each bucket's
        count is the distance between the positions of its bounds, a few bisects in C
        instead of a Python step per sample (the proxy folds its in-process answers' counts
        in per 64, proxy/inprocbooks.py; they all sit in the first bucket or two)."""
        if len(samples) < 2:  # (one call's time, as the proxy's batch books tell it: no sort)
            if samples:
                seconds = samples[0]
                self.counts[bisect_left(self.bounds, seconds)] += 1
                self.total += seconds
            return
        count_sorted(self.counts, self.bounds, sorted(samples))
        self.total += sum(samples)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.doc, labels=list(self.labels))
        running = 0
        buckets = []
        edges = [*(repr(float(bound)) for bound in self.bounds), "+Inf"]
        for edge, count in zip(edges, self.counts, strict=True):
            running += count
            buckets.append((edge, running))
        family.add_metric(list(self.labels.values()), buckets, self.total)
        yield family

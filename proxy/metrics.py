"""Prometheus metrics of one proxy app (its own CollectorRegistry, no globals).

The metrics every request touches (items answered, attempts, and the two latency
histograms) are plain counters in dicts keyed by their label values, turned into metric
families at scrape time: prometheus-client's own children take a lock and walk the buckets
in Python on every observation (measured: about 5 % of the proxy's CPU under load), which a
single-threaded event loop does not need. The exposition is the same (`_total`, `_bucket`,
`_sum`, `_count`). Rarer events (retries, errors, client ids, mirrors) keep prometheus-client's
Counter. Node state (in-flight, head, health) is read at scrape time by a collector too.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from chainstate.histogram import count_sorted
from proxy.breaker import STATE_VALUE
from proxy.model import Pool
from proxy.sharedcache import tier_metrics

if TYPE_CHECKING:
    from proxy.reads import Reads

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
OTHER = "other"


def client_label(client_id: str) -> str:
    """The metric label of a `client-id` value: never the value itself (clients put API keys
    there, and /metrics is read by more people than the keys are meant for), but the first
    8 bytes of its BLAKE2b hash, so an operator can still tell one client's series by
    hashing the id they know. Worked out at scrape time, not per request."""
    if client_id == OTHER:
        return OTHER
    return "h" + hashlib.blake2b(client_id.encode(), digest_size=8).hexdigest()


MAX_CLIENT_ID_LEN = 64


class _NodeCollector(Collector):
    def __init__(
        self,
        pools: Callable[[], dict[str, Pool]],
        client_inflight: Callable[[], int],
        pool_limit: Callable[[Pool], int] | None = None,
    ):
        self._pools = pools
        self._client_inflight = client_inflight
        self._pool_limit = pool_limit

    def collect(self) -> Iterator[Any]:
        labels = ["pool", "node", "kind"]
        inflight = GaugeMetricFamily(
            "chainstate_proxy_upstream_inflight", "requests in flight to a node", labels=labels
        )
        head = GaugeMetricFamily("chainstate_proxy_node_head", "observed node head", labels=labels)
        healthy = GaugeMetricFamily(
            "chainstate_proxy_node_healthy",
            "1 when the health poll finds the node alive",
            labels=labels,
        )
        routable = GaugeMetricFamily(
            "chainstate_proxy_node_routable",
            "1 when the node gets traffic (enabled, healthy, breaker and checker allow it)",
            labels=labels,
        )
        breaker = GaugeMetricFamily(
            "chainstate_proxy_node_breaker_state",
            "the node's breaker: 0 closed, 1 half-open, 2 open",
            labels=labels,
        )
        transitions = CounterMetricFamily(
            "chainstate_proxy_node_breaker_transitions",
            "breaker transitions of the node, by the state entered",
            labels=[*labels, "state"],
        )
        diverged = GaugeMetricFamily(
            "chainstate_proxy_node_diverged",
            "1 while the consistency checker says the node diverged (no traffic unless the "
            "entry sets ignore_checker)",
            labels=labels,
        )
        pool_inflight = GaugeMetricFamily(
            "chainstate_proxy_pool_inflight", "client requests in flight per pool", labels=["pool"]
        )
        pool_limit = GaugeMetricFamily(
            "chainstate_proxy_pool_inflight_limit",
            "admission limit of client requests in flight per pool (0: none)",
            labels=["pool"],
        )
        for pool in self._pools().values():
            pool_inflight.add_metric([pool.id], pool.inflight)
            if self._pool_limit is not None:
                pool_limit.add_metric([pool.id], self._pool_limit(pool))
            for node in (*pool.readers, *pool.fulls, *pool.writers.values()):
                lv = [pool.id, node.key, node.entry.kind]
                inflight.add_metric(lv, node.inflight)
                healthy.add_metric(lv, 1 if node.healthy else 0)
                if node.head is not None:
                    head.add_metric(lv, node.head)
                routable.add_metric(
                    lv, 1 if node.entry.enabled and node.healthy and not node.blocked else 0
                )
                breaker.add_metric(lv, STATE_VALUE[node.breaker.state])
                for state, count in node.breaker.transitions.items():
                    transitions.add_metric([*lv, state], count)
                diverged.add_metric(lv, 1 if node.diverged is not None else 0)
        yield inflight
        yield head
        yield healthy
        yield routable
        yield breaker
        yield transitions
        yield diverged
        yield pool_inflight
        yield pool_limit
        yield GaugeMetricFamily(
            "chainstate_proxy_inflight",
            "client requests being answered",
            value=self._client_inflight(),
        )


class _StoreCollector(Collector):
    """`chainstate_proxy_config_store_available`: 0 while the config store is unreachable
    and the proxy serves its last known configuration (read at scrape time)."""

    def __init__(self, available: Callable[[], bool]) -> None:
        self._available = available

    def collect(self) -> Iterator[Any]:
        yield GaugeMetricFamily(
            "chainstate_proxy_config_store_available",
            "1 while the config store answers; 0: serving the last known configuration",
            value=1 if self._available() else 0,
        )


class _ReadCollector(Collector):
    """The read path's figures (proxy/reads.py), read at scrape time: cache lookups, stores,
    evictions and size, coalesced reads, answers from the pinned head, and the chain the
    proxy follows per pool (head, confirmed head, reorgs)."""

    def __init__(self, reads: Reads) -> None:
        self._reads = reads

    def collect(self) -> Iterator[Any]:
        cache = self._reads.cache
        pool = ["pool"]
        lookups = CounterMetricFamily(
            "chainstate_proxy_cache_lookups", "cache lookups by outcome", labels=["pool", "outcome"]
        )
        stores = CounterMetricFamily("chainstate_proxy_cache_stores", "answers cached", labels=pool)
        evictions = CounterMetricFamily(
            "chainstate_proxy_cache_evictions",
            "cache entries removed: size (least recently used), reorg (block dropped), flush",
            labels=["pool", "reason"],
        )
        coalesced = CounterMetricFamily(
            "chainstate_proxy_coalesced",
            "reads that shared an identical read's answer",
            labels=pool,
        )
        local = CounterMetricFamily(
            "chainstate_proxy_head_answers",
            "eth_blockNumber answered from the request's pinned head",
            labels=pool,
        )
        entries = GaugeMetricFamily("chainstate_proxy_cache_entries", "entries held", labels=pool)
        size = GaugeMetricFamily(
            "chainstate_proxy_cache_bytes", "bytes held (answers, keys, overhead)", labels=pool
        )
        for pool_id, st in list(cache.stats.items()):
            lookups.add_metric([pool_id, "hit"], st.hits)
            lookups.add_metric([pool_id, "miss"], st.misses)
            stores.add_metric([pool_id], st.stores)
            evictions.add_metric([pool_id, "size"], st.evicted)
            evictions.add_metric([pool_id, "reorg"], st.dropped)
            evictions.add_metric([pool_id, "flush"], st.flushed)
            coalesced.add_metric([pool_id], st.coalesced)
            local.add_metric([pool_id], st.local)
            entries.add_metric([pool_id], st.entries)
            size.add_metric([pool_id], st.bytes)
        yield from (lookups, stores, evictions, coalesced, local, entries, size)
        yield GaugeMetricFamily(
            "chainstate_proxy_cache_max_bytes", "the cache's byte budget", value=cache.max_bytes
        )
        yield from tier_metrics(cache.tier, cache.stats)
        yield from self._chain()

    def _chain(self) -> Iterator[Any]:
        head = GaugeMetricFamily(
            "chainstate_proxy_known_head", "head of the chain the proxy follows", labels=["pool"]
        )
        confirmed = GaugeMetricFamily(
            "chainstate_proxy_confirmed_head", "the checker's confirmed head", labels=["pool"]
        )
        reorgs = CounterMetricFamily(
            "chainstate_proxy_reorgs", "reorgs seen (known blocks replaced)", labels=["pool"]
        )
        for pool_id, view in list(self._reads.heads.views.items()):
            if view.tip is not None:
                head.add_metric([pool_id], view.tip)
            if view.confirmed is not None:
                confirmed.add_metric([pool_id], view.confirmed[0])
            reorgs.add_metric([pool_id], view.reorgs)
        yield from (head, confirmed, reorgs)


class _Histogram:
    """Bucket counts and sum of one label set (`le` buckets are made cumulative at scrape)."""

    __slots__ = ("counts", "total")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * (buckets + 1)  # the last one: above every bound (+Inf)
        self.total = 0.0


class HotMetrics(Collector):
    """Counters and histograms of the request path, keyed by label values."""

    def __init__(
        self,
        client_id_top_n: int = 100,
        buckets: tuple[float, ...] = LATENCY_BUCKETS,
        before: Callable[[], None] | None = None,
    ) -> None:
        self.before = before  # called first on every scrape (ProxyMetrics.settle)
        self.top_n = client_id_top_n
        self.clients: dict[str, int] = {}  # client-id → requests ("other" not counted in top_n)
        self.bounds = list(buckets)
        self.requests: dict[tuple[str, str, str, str], int] = {}  # chain, method, node, outcome
        self.attempts: dict[tuple[str, str, str], int] = {}  # chain, node, outcome
        self.latency: dict[tuple[str, str], _Histogram] = {}  # chain, shape
        self.upstream_latency: dict[tuple[str], _Histogram] = {}  # node

    def histogram(self, table: dict[Any, _Histogram], key: Any) -> _Histogram:
        hist = table.get(key)
        if hist is None:
            hist = table[key] = _Histogram(len(self.bounds))
        return hist

    def collect(self) -> Iterator[Any]:
        if self.before is not None:
            self.before()
        requests = CounterMetricFamily(
            "chainstate_proxy_requests",
            "request items answered, by chain, method, node and outcome",
            labels=["chain", "method", "node", "outcome"],
        )
        for labels, value in list(self.requests.items()):
            requests.add_metric(list(labels), value)
        yield requests
        attempts = CounterMetricFamily(
            "chainstate_proxy_upstream_attempts",
            "upstream attempts (every try and retry), by node and outcome",
            labels=["chain", "node", "outcome"],
        )
        for labels, value in list(self.attempts.items()):
            attempts.add_metric(list(labels), value)
        yield attempts
        clients = CounterMetricFamily(
            "chainstate_proxy_client_requests",
            f"client requests by client-id header, as client_label hashes (first {self.top_n} "
            "ids, rest 'other')",
            labels=["client_id"],
        )
        for label, value in list(self.clients.items()):
            clients.add_metric([client_label(label)], value)
        yield clients
        yield self._family(
            "chainstate_proxy_request_seconds",
            "time to answer a client request (single or batch)",
            ["chain", "shape"],
            self.latency,
        )
        yield self._family(
            "chainstate_proxy_upstream_seconds",
            "time of one upstream attempt",
            ["node"],
            self.upstream_latency,
        )

    def _family(
        self, name: str, doc: str, labels: list[str], table: dict[Any, _Histogram]
    ) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, doc, labels=labels)
        edges = [*(repr(float(b)) for b in self.bounds), "+Inf"]
        for key, hist in list(table.items()):
            running = 0
            buckets = []
            for edge, count in zip(edges, hist.counts, strict=True):
                running += count
                buckets.append((edge, running))
            family.add_metric(list(key), buckets, hist.total)
        return family


class ProxyMetrics:
    def __init__(self, client_id_top_n: int = 100) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._folds: list[Callable[[], None]] = []
        self.hot = HotMetrics(client_id_top_n, before=self.settle)
        r.register(self.hot)
        self._requests = self.hot.requests
        self._attempts = self.hot.attempts
        self.retries = Counter(
            "chainstate_proxy_retries",
            "items sent again to another node, by reason",
            ["chain", "reason"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "chainstate_proxy_upstream_errors",
            "upstream attempts without a usable answer, by node and kind",
            ["node", "kind"],
            registry=r,
        )
        self.mirrors = Counter(
            "chainstate_proxy_mirror_copies",
            "mirror copies by outcome (sent, failed, dropped)",
            ["outcome"],
            registry=r,
        )
        self.hedges = Counter(
            "chainstate_proxy_hedges",
            "second attempts joining a slow first one, by trigger: hedge (past the hedge "
            "quantile, within the hedge budget) or timeout (past the attempt timeout)",
            ["chain", "trigger"],
            registry=r,
        )
        self.refusals = Counter(
            "chainstate_proxy_refused",
            "client requests refused with 503 because their pool was over its in-flight limit",
            ["chain"],
            registry=r,
        )
        self._children: dict[tuple[Any, ...], Any] = {}

    def watch_nodes(
        self,
        pools: Callable[[], dict[str, Pool]],
        client_inflight: Callable[[], int],
        pool_limit: Callable[[Pool], int] | None = None,
    ) -> None:
        self.registry.register(_NodeCollector(pools, client_inflight, pool_limit))

    def watch_reads(self, reads: Reads) -> None:
        """Export the read path's figures (cache, coalescing, heads)."""
        self.registry.register(_ReadCollector(reads))

    def watch_store(self, available: Callable[[], bool]) -> None:
        """Export the config store's reachability, e.g. `lambda: store.available`."""
        self.registry.register(_StoreCollector(available))

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def request(self, chain: str, method: str, node: str, outcome: str, n: int = 1) -> None:
        key = (chain, method, node, outcome)
        requests = self._requests
        requests[key] = requests.get(key, 0) + n

    def observe(self, chain: str, shape: str, seconds: float) -> None:
        hot = self.hot
        hist = hot.latency.get((chain, shape)) or hot.histogram(hot.latency, (chain, shape))
        hist.counts[bisect_left(hot.bounds, seconds)] += 1
        hist.total += seconds

    def attempt(self, chain: str, node: str, outcome: str, seconds: float) -> None:
        key = (chain, node, outcome)
        attempts = self._attempts
        attempts[key] = attempts.get(key, 0) + 1
        hot = self.hot
        table = hot.upstream_latency
        hist = table.get((node,)) or hot.histogram(table, (node,))
        hist.counts[bisect_left(hot.bounds, seconds)] += 1
        hist.total += seconds

    def attempts_ok(
        self, chain: str, node: str, samples: list[float], ordered: list[float] | None = None
    ) -> None:
        """`attempt(chain, node, "ok", s)` for each of `samples` (folded in together;
        `ordered`: `sorted(samples)` when the caller has it)."""
        key = (chain, node, "ok")
        attempts = self._attempts
        attempts[key] = attempts.get(key, 0) + len(samples)
        hot = self.hot
        table = hot.upstream_latency
        self._observe_all(table.get((node,)) or hot.histogram(table, (node,)), samples, ordered)

    def observe_all(self, chain: str, shape: str, samples: list[float]) -> None:
        """`observe(chain, shape, s)` for each of `samples` (folded in together)."""
        hot = self.hot
        self._observe_all(
            hot.latency.get((chain, shape)) or hot.histogram(hot.latency, (chain, shape)), samples
        )

    def _observe_all(
        self, hist: Any, samples: list[float], ordered: list[float] | None = None
    ) -> None:
        """Sorted, each bucket's count is the distance between the positions of its bounds
        (`bisect_left` per sample gives the same counts): a few bisects in C per fold
        instead of a Python step per sample, and in-process samples all sit in the first
        bucket or two (proxy/inprocbooks.py folds thousands a second)."""
        count_sorted(hist.counts, self.hot.bounds, sorted(samples) if ordered is None else ordered)
        hist.total += sum(samples)

    def on_read(self, fold: Callable[[], None]) -> None:
        """Call `fold` before the figures are read (a scrape, `settle`): for books kept
        outside these tables for a while (proxy/inprocbooks.py), so what is read is exact."""
        self._folds.append(fold)

    def settle(self) -> None:
        """Fold in what is kept aside (`on_read`): before reading metrics or node figures."""
        for fold in self._folds:
            fold()

    def retry(self, chain: str, reason: str) -> None:
        self._child(self.retries, chain, reason).inc()

    def upstream_error(self, node: str, kind: str) -> None:
        self._child(self.upstream_errors, node, kind).inc()

    def hedge(self, chain: str, trigger: str) -> None:
        self._child(self.hedges, chain, trigger).inc()

    def refused(self, chain: str) -> None:
        self._child(self.refusals, chain).inc()

    def client(self, client_id: str | None) -> None:
        """Count a request for `client_id`; ids past the first `client_id_top_n` → "other"."""
        if not client_id:
            return
        label = client_id[:MAX_CLIENT_ID_LEN]
        clients = self.hot.clients
        if label not in clients and len(clients) - (OTHER in clients) >= self.hot.top_n:
            label = OTHER
        clients[label] = clients.get(label, 0) + 1

    def mirror(self, outcome: str) -> None:
        self._child(self.mirrors, outcome).inc()

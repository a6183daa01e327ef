"""Prometheus metrics of one proxy app (its own CollectorRegistry, no globals).

Label children are cached in dicts so the hot path does one dict lookup per increment.
Node state (in-flight, head, health) is read at scrape time by a collector instead of being
updated on every request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from proxy.model import Pool

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
OTHER = "other"
MAX_CLIENT_ID_LEN = 64


class _NodeCollector(Collector):
    def __init__(self, pools: Callable[[], dict[str, Pool]], client_inflight: Callable[[], int]):
        self._pools = pools
        self._client_inflight = client_inflight

    def collect(self) -> Iterator[Any]:
        labels = ["pool", "node", "kind"]
        inflight = GaugeMetricFamily(
            "chainstate_proxy_upstream_inflight", "requests in flight to a node", labels=labels
        )
        head = GaugeMetricFamily("chainstate_proxy_node_head", "observed node head", labels=labels)
        healthy = GaugeMetricFamily(
            "chainstate_proxy_node_healthy", "1 when the node is in rotation", labels=labels
        )
        for pool in self._pools().values():
            for node in (*pool.readers, *pool.writers.values()):
                lv = [pool.id, node.key, node.entry.kind]
                inflight.add_metric(lv, node.inflight)
                healthy.add_metric(lv, 1 if node.healthy else 0)
                if node.head is not None:
                    head.add_metric(lv, node.head)
        yield inflight
        yield head
        yield healthy
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


class ProxyMetrics:
    def __init__(self, client_id_top_n: int = 100) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "chainstate_proxy_requests",
            "request items answered, by chain, method, node and outcome",
            ["chain", "method", "node", "outcome"],
            registry=r,
        )
        self.latency = Histogram(
            "chainstate_proxy_request_seconds",
            "time to answer a client request (single or batch)",
            ["chain", "shape"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.attempts = Counter(
            "chainstate_proxy_upstream_attempts",
            "upstream attempts (every try and retry), by node and outcome",
            ["chain", "node", "outcome"],
            registry=r,
        )
        self.upstream_latency = Histogram(
            "chainstate_proxy_upstream_seconds",
            "time of one upstream attempt",
            ["node"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
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
        self.clients = Counter(
            "chainstate_proxy_client_requests",
            f"client requests by client-id header (first {client_id_top_n} ids, rest 'other')",
            ["client_id"],
            registry=r,
        )
        self.mirrors = Counter(
            "chainstate_proxy_mirror_copies",
            "mirror copies by outcome (sent, failed, dropped)",
            ["outcome"],
            registry=r,
        )
        self._top_n = client_id_top_n
        self._children: dict[tuple[Any, ...], Any] = {}
        self._clients: dict[str, Any] = {}

    def watch_nodes(
        self, pools: Callable[[], dict[str, Pool]], client_inflight: Callable[[], int]
    ) -> None:
        self.registry.register(_NodeCollector(pools, client_inflight))

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
        self._child(self.requests, chain, method, node, outcome).inc(n)

    def observe(self, chain: str, shape: str, seconds: float) -> None:
        self._child(self.latency, chain, shape).observe(seconds)

    def attempt(self, chain: str, node: str, outcome: str, seconds: float) -> None:
        self._child(self.attempts, chain, node, outcome).inc()
        self._child(self.upstream_latency, node).observe(seconds)

    def retry(self, chain: str, reason: str) -> None:
        self._child(self.retries, chain, reason).inc()

    def upstream_error(self, node: str, kind: str) -> None:
        self._child(self.upstream_errors, node, kind).inc()

    def client(self, client_id: str | None) -> None:
        """Count a request for `client_id`; ids past the first `client_id_top_n` → "other"."""
        if not client_id:
            return
        label = client_id[:MAX_CLIENT_ID_LEN]
        child = self._clients.get(label)
        if child is None:
            if len(self._clients) >= self._top_n:
                child = self._child(self.clients, OTHER)
            else:
                child = self._clients[label] = self.clients.labels(label)
        child.inc()

    def mirror(self, outcome: str) -> None:
        self._child(self.mirrors, outcome).inc()

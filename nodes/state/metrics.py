"""Prometheus metrics of one state node (its own registry: several nodes share a process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from chainstate.histogram import LoopHistogram


class StateMetrics:
    def __init__(self, key: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"node": key}
        self.head = Gauge(
            "chainstate_state_head", "Highest block held", ["node"], registry=self.registry
        ).labels(**labels)
        self.earliest = Gauge(
            "chainstate_state_earliest", "Lowest block answerable", ["node"], registry=self.registry
        ).labels(**labels)
        self.source_head = Gauge(
            "chainstate_state_source_head", "Head reported by the source", ["node"],
            registry=self.registry,
        ).labels(**labels)  # fmt: skip
        self.applied = Counter(
            "chainstate_state_blocks_applied", "Blocks applied", ["node"], registry=self.registry
        ).labels(**labels)
        self.rollbacks = Counter(
            "chainstate_state_blocks_rolled_back", "Blocks rolled back by reorgs", ["node"],
            registry=self.registry,
        ).labels(**labels)  # fmt: skip
        self._errors = Counter(
            "chainstate_state_ingest_errors", "Ingest errors by kind", ["node", "kind"],
            registry=self.registry,
        )  # fmt: skip
        self._key = key
        self.apply_seconds = Histogram(
            "chainstate_state_apply_seconds", "Time to check and commit one block", ["node"],
            registry=self.registry,
        ).labels(**labels)  # fmt: skip
        # Observed on every request: no lock, no per-observation bucket walk.
        self.request_seconds = LoopHistogram(
            "chainstate_state_request_seconds", "Time to answer one JSON-RPC body", labels,
            self.registry,
        )  # fmt: skip

    def error(self, kind: str) -> None:
        self._errors.labels(node=self._key, kind=kind).inc()

"""Admission control: refuse at once what a pool's nodes cannot answer in time.

A pool admits at most `limit` client requests in flight. With `max_pool_inflight` = 0 (the
default) the limit is derived from what the pool's routable nodes can take: each node has
`upstream_connections` connections, and a request waiting for one should not wait longer than
`admission_wait` seconds, so a node answering in `L` seconds takes
`connections × (1 + admission_wait / L)` requests in flight (Little's law: the connections
busy, plus what they drain within `admission_wait`). `L` is the node's observed latency
(EWMA); a node without one counts as answering in `admission_wait`.

Over the limit a request is answered at once: HTTP 503, `Retry-After`, and a JSON-RPC error
-32005 ("limit exceeded", EIP-1474) saying why — instead of queueing into the client's
timeout, growing the proxy's memory and timing out attempts that make a merely saturated
node look dead. A pool with no routable node has no limit here (the choice answers why no
node can take the request).
"""

from __future__ import annotations

import math

from chainstate.jsonrpc import SERVER_BUSY, JsonRpcError
from proxy.model import Pool

LIMIT_EXCEEDED = SERVER_BUSY  # -32005
REFRESH_S = 0.1  # a pool's limit is recomputed at most this often
MIN_LATENCY_S = 0.001  # latencies below count as this (the limit stays finite)


class Overloaded(JsonRpcError):
    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(LIMIT_EXCEEDED, message)
        self.retry_after = retry_after
        self.header = b"Retry-After: %d\r\n" % retry_after


class Admission:
    def __init__(self, wait: float, fixed: int, connections: int) -> None:
        self.wait = wait
        self.fixed = fixed  # max_pool_inflight; 0: derived
        self.connections = connections
        self.retry_after = max(1, math.ceil(wait))
        self.refused = 0
        self.inflight = 0  # client requests in flight in this process, every pool's

    def enter(self, pool: Pool) -> None:
        """A client request takes its place among the pool's requests in flight: the one
        place these counts go up (`leave` is the one place they go down)."""
        pool.inflight += 1
        self.inflight += 1

    def leave(self, pool: Pool) -> None:
        """The request `enter` counted is answered (or gave up)."""
        pool.inflight -= 1
        self.inflight -= 1

    def check(self, pool: Pool, now: float) -> Overloaded | None:
        """None when `pool` may take one more request now, else the refusal."""
        limit = self.limit(pool, now)
        if not limit or pool.inflight < limit:
            return None
        self.refused += 1
        how = (
            f"max_pool_inflight={self.fixed}"
            if self.fixed
            else f"what its nodes answer within admission_wait={self.wait:g}s"
        )
        return Overloaded(
            f"pool {pool.id} is overloaded: {pool.inflight} requests in flight, limit {limit} "
            f"({how}); retry after {self.retry_after}s",
            self.retry_after,
        )

    def limit(self, pool: Pool, now: float) -> int:
        """The pool's in-flight limit (0: none), recomputed at most every REFRESH_S (kept
        in the pool: `Pool.admit_limit`, as of `Pool.admit_at`)."""
        if self.fixed:
            return self.fixed
        if now - pool.admit_at < REFRESH_S:
            return pool.admit_limit
        pool.admit_limit = limit = self.derive(pool)
        pool.admit_at = now
        return limit

    def derive(self, pool: Pool) -> int:
        total = 0.0
        for node in pool.readers:
            if not (node.entry.enabled and node.healthy) or node.blocked or node.weight <= 0:
                continue
            latency = self.wait if node.latency_ms is None else node.latency_ms / 1000
            total += self.connections * (1 + self.wait / max(latency, MIN_LATENCY_S))
        return int(total)

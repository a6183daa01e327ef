"""Proxy settings: every user-facing limit is a named field with a documented default.

Read from the `[proxy]` section of the TOML config (plus `[[proxy.nodes]]` and
`[[proxy.writers]]` seed entries, `[[proxy.checkers]]`). docs/proxy.md lists every field.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from chainstate.config import ConfigError, resolve_path, section
from proxy.adminguard import exposure_error
from proxy.cache import DEFAULT_METHODS
from proxy.methods import METHODS
from proxy.model import normalize_pool

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8663


@dataclass(frozen=True, slots=True)
class SeedNode:
    """A node from the config file, written to the store when absent (see docs/config-store.md)."""

    chain: str
    key: str
    url: str
    kind: str = "state"
    weight: int = 1
    enabled: bool = True


@dataclass(frozen=True, slots=True)
class SeedWriter:
    chain: str
    key: str
    url: str
    leader: bool = False


@dataclass(frozen=True, slots=True)
class CheckerSource:
    """A consistency checker whose verdicts on a pool's replicas the proxy follows
    (`[[proxy.checkers]]`, proxy/verdicts.py), and whose confirmed head the pool's
    `safe`/`finalized` resolve to (proxy/heads.py)."""

    chain: str  # a pool id: `1337`, or a versioned pool such as `1337-blue`
    url: str


@dataclass(slots=True)
class ProxySettings:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    # Admin API on its own listener when admin_port is set (admin_host defaults to host).
    admin_host: str | None = None
    admin_port: int | None = None
    # When set, every admin call needs `Authorization: Bearer <admin_token>` (else HTTP 401).
    admin_token: str | None = None
    # Host names the admin API answers to besides localhost, IP literals and the listen
    # hosts (a Host header naming anything else is refused: DNS rebinding).
    admin_hosts: tuple[str, ...] = ()
    # A tokenless admin API on an address other than loopback refuses to start unless set.
    insecure_admin: bool = False
    # File store path (None: in memory). `chainstate proxy --store` overrides it.
    store_path: str | None = None
    max_body_bytes: int = 10 * 1024 * 1024  # larger request bodies → HTTP 413
    max_head_bytes: int = 64 * 1024  # larger request line + headers → HTTP 431
    client_idle_timeout: float = 60.0  # seconds a keep-alive client connection may sit idle
    client_read_timeout: float = 30.0  # seconds to send a whole request once begun, else 408
    max_client_connections: int = 0  # open client connections; 0: 3/4 of the fd limit
    shutdown_timeout: float = 10.0  # seconds a stop waits for requests in flight
    # µs the loop keeps polling after a client's request arrives instead of sleeping: less
    # latency at low concurrency on VMs, paid for with a core spinning after every answer
    # (chainstate/busypoll.py). Off by default: a proxy should not burn CPU its host did not
    # ask it to; a latency-bound deployment turns it on (docs/http-server.md).
    busy_poll_us: int = 0
    max_batch_items: int = 1000  # longer batches → -32600
    state_window: int = 128  # blocks behind the head still routed to `state` nodes
    head_poll_interval: float = 1.0  # seconds between eth_blockNumber polls of each node
    # Seconds a poll may take before it counts as a failure: as long as a request may take
    # (upstream_timeout), so a slow node is not taken for a dead one.
    poll_timeout: float = 10.0
    unhealthy_after: int = 3  # consecutive failed health polls that take a node out
    upstream_timeout: float = 10.0  # seconds one upstream attempt may take: the ceiling
    max_attempts: int = 3  # rounds of attempts per request item (first try + retries)
    # Failsafe routing (docs/proxy.md "Failsafe routing").
    latency_decay: float = 5.0  # seconds: time constant of a node's peak-EWMA latency cost
    hedge_quantile: float = 0.95  # hedge an attempt slower than this quantile of recent ones
    hedge_budget: float = 0.1  # hedges per first attempt at most (0: never hedge)
    hedge_min_delay: float = 0.005  # seconds: never hedge sooner than this
    attempt_timeout_factor: float = 4.0  # attempt timeout = this × the recent p99 ...
    attempt_timeout_min: float = 0.5  # ... but at least this many seconds (upstream_timeout max)
    breaker_failures: int = 5  # consecutive failures or timeouts that open a node's breaker
    breaker_cooldown: float = 2.0  # seconds an open breaker waits before a probe (doubles)
    breaker_cooldown_max: float = 30.0  # seconds: the longest wait between probes
    admission_wait: float = 1.0  # seconds a request may wait for a node connection; beyond, 503
    max_pool_inflight: int = 0  # client requests in flight per pool; 0: derived (admission)
    checker_poll_interval: float = 0.5  # seconds between reads of each checker's verdicts
    max_buffered_bytes: int = 64 * 1024 * 1024  # upstream answer bytes held at once
    max_answer_bytes: int = 64 * 1024 * 1024  # one upstream answer; larger → -32603 too_large
    upstream_connections: int = 512  # pooled keep-alive upstream connections (all nodes)
    upstream_keepalive: float = 30.0  # seconds an idle upstream connection is kept
    extra_methods: tuple[str, ...] = ()  # methods allowed beyond the spec's set
    mirror_queue_size: int = 1000  # queued mirror copies; more are dropped (and counted)
    mirror_workers: int = 4  # concurrent mirror senders
    mirror_timeout: float = 5.0  # seconds for one mirror copy
    client_id_top_n: int = 100  # distinct client-id labels in metrics; later ones → "other"
    known_hashes: int = 4096  # recent block hashes remembered for routing by hash
    admin_apply_timeout: float = 5.0  # seconds an admin write waits to see its change applied
    max_weight: int = 1_000_000  # largest node weight accepted by the admin API
    # Read path (docs/proxy.md "One head per request, coalescing, cache"):
    cache_max_bytes: int = 64 * 1024 * 1024  # answers kept in memory; 0: no cache
    cache_pools: tuple[str, ...] = ("*",)  # pools whose answers are cached ("*": every pool)
    cache_methods: tuple[str, ...] = DEFAULT_METHODS  # methods cached and coalesced
    coalesce: bool = True  # identical reads in flight share one upstream call
    # The response cache's shared tier in Redis (docs/proxy.md "The shared cache tier"):
    cache_tier_url: str | None = None  # redis://host:port[/db]; None: each proxy's cache alone
    cache_tier_prefix: str = "chainstate:cache:"  # prefix of the tier's Redis keys and channel
    cache_tier_timeout: float = 0.1  # seconds a lookup may take; then the node is asked
    cache_tier_ttl: int = 86400  # seconds a shared entry lives after its last write
    cache_tier_failures: int = 3  # consecutive failures that turn the tier off
    cache_tier_retry: float = 1.0  # seconds between probes of Redis while the tier is off
    cache_tier_queue: int = 10000  # answers waiting to be written; more are not written
    cache_tier_connections: int = 32  # Redis connections of this proxy at most
    head_history: int = 256  # recent block hashes kept per pool (pinning, reorg detection)
    nodes: tuple[SeedNode, ...] = ()
    writers: tuple[SeedWriter, ...] = ()
    checkers: tuple[CheckerSource, ...] = ()

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ProxySettings:
        """Settings from a loaded config (`chainstate.config.load_config`); {} gives defaults."""
        sect = section(config, "proxy")
        known = {f.name for f in fields(cls)} - {"nodes", "writers", "checkers", "store_path"}
        values: dict[str, Any] = {}
        for name, value in sect.items():
            if name in ("nodes", "writers", "checkers", "store") or isinstance(value, dict):
                continue  # sub-tables ([proxy.tracing], ...) belong to the modules they name
            if name not in known:
                raise ConfigError(f"[proxy] unknown setting {name!r}")
            values[name] = value
        if "extra_methods" in values:
            extra = values["extra_methods"]
            if not isinstance(extra, list) or not all(isinstance(m, str) for m in extra):
                raise ConfigError("[proxy] extra_methods must be a list of method names")
            values["extra_methods"] = tuple(extra)
        for name in ("cache_pools", "cache_methods", "admin_hosts"):
            if name in values:
                listed = values[name]
                if not isinstance(listed, list) or not all(isinstance(m, str) for m in listed):
                    raise ConfigError(f"[proxy] {name} must be a list of strings")
                values[name] = tuple(listed)
        if "store" in sect:
            values["store_path"] = str(resolve_path(config, sect["store"]))
        elif "data_dir" in config:
            values["store_path"] = str(
                resolve_path(config, config["data_dir"]) / "proxy-store.json"
            )
        values["nodes"] = tuple(_seeds(sect.get("nodes", []), "nodes", SeedNode, "chain"))
        values["writers"] = tuple(_seeds(sect.get("writers", []), "writers", SeedWriter, "chain"))
        values["checkers"] = tuple(_checkers(sect.get("checkers", [])))
        try:
            settings = cls(**values)
        except TypeError as exc:
            raise ConfigError(f"[proxy] {exc}") from None
        settings.validate()
        return settings

    def validate(self) -> None:
        positive = (
            "max_body_bytes",
            "max_head_bytes",
            "client_idle_timeout",
            "client_read_timeout",
            "shutdown_timeout",
            "max_batch_items",
            "head_poll_interval",
            "poll_timeout",
            "unhealthy_after",
            "upstream_timeout",
            "max_attempts",
            "upstream_connections",
            "mirror_queue_size",
            "mirror_workers",
            "mirror_timeout",
            "known_hashes",
            "admin_apply_timeout",
            "max_weight",
            "head_history",
            "latency_decay",
            "hedge_min_delay",
            "attempt_timeout_factor",
            "attempt_timeout_min",
            "breaker_failures",
            "breaker_cooldown",
            "breaker_cooldown_max",
            "admission_wait",
            "checker_poll_interval",
            "max_buffered_bytes",
            "max_answer_bytes",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"[proxy] {name} must be a positive number, got {value!r}")
        for name in ("port", "admin_port"):
            value = getattr(self, name)
            if value is None and name == "admin_port":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
                raise ConfigError(f"[proxy] {name} must be a TCP port (1-65535), got {value!r}")
        if self.admin_port == self.port and (self.admin_host or self.host) == self.host:
            raise ConfigError(
                "[proxy] admin_port is the data port; leave it unset to serve the admin API "
                "on the data port, or give it a port of its own"
            )
        _check_token(self.admin_token)
        if not isinstance(self.insecure_admin, bool):
            raise ConfigError("[proxy] insecure_admin must be true or false")
        if not isinstance(self.state_window, int) or self.state_window < 0:
            raise ConfigError("[proxy] state_window must be an integer >= 0")
        if (
            isinstance(self.max_client_connections, bool)
            or not isinstance(self.max_client_connections, int)
            or self.max_client_connections < 0
        ):
            raise ConfigError("[proxy] max_client_connections must be an integer >= 0 (0: auto)")
        if self.client_id_top_n < 0:
            raise ConfigError("[proxy] client_id_top_n must be >= 0")
        self._validate_reads()

    def check_exposure(self) -> None:
        """Refuse to start a tokenless admin API off loopback (proxy/adminguard.py); called
        by whatever starts a proxy, once the command line has had its say."""
        exposed = exposure_error(self)
        if exposed is not None:
            raise ConfigError(f"[proxy] {exposed}")

    def _validate_reads(self) -> None:
        size = self.cache_max_bytes
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ConfigError("[proxy] cache_max_bytes must be an integer >= 0 (0: no cache)")
        if not isinstance(self.coalesce, bool):
            raise ConfigError("[proxy] coalesce must be true or false")
        for method in self.cache_methods:
            spec = METHODS.get(method)
            if spec is None or spec.writer or spec.block not in ("number", "ctx", "id", "hash"):
                raise ConfigError(
                    f"[proxy] cache_methods: {method!r} is not a read at a block the proxy "
                    "can name by hash; allowed: " + ", ".join(sorted(_cacheable(METHODS)))
                )
        for pool in self.cache_pools:
            if pool != "*" and normalize_pool(pool) != pool:
                raise ConfigError(f"[proxy] cache_pools: {pool!r} is not a pool id (or '*')")
        if not 0 < self.hedge_quantile < 1:
            raise ConfigError("[proxy] hedge_quantile must be between 0 and 1 (e.g. 0.95)")
        if not 0 <= self.hedge_budget <= 1:
            raise ConfigError("[proxy] hedge_budget must be between 0 (no hedging) and 1")
        self._validate_tier()
        for name, zero in (("max_pool_inflight", "derived"), ("busy_poll_us", "off")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"[proxy] {name} must be an integer >= 0 (0: {zero})")

    def _validate_tier(self) -> None:
        url = self.cache_tier_url
        if url is not None and (
            not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://"))
        ):
            raise ConfigError("[proxy] cache_tier_url must be redis://host:port[/db] (or unset)")
        if not isinstance(self.cache_tier_prefix, str) or not self.cache_tier_prefix:
            raise ConfigError("[proxy] cache_tier_prefix must be a non-empty string")
        for name in ("cache_tier_timeout", "cache_tier_retry"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"[proxy] {name} must be a positive number, got {value!r}")
        for name in (
            "cache_tier_ttl",
            "cache_tier_failures",
            "cache_tier_queue",
            "cache_tier_connections",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"[proxy] {name} must be a positive integer, got {value!r}")

    def default_store_path(self) -> Path:
        return Path(".chainstate") / "proxy-store.json"


def _check_token(token: Any) -> None:
    """An empty token (`--admin-token "$TOKEN"` with TOKEN unset) would lock the admin API
    for good; spaces or control characters cannot travel in an Authorization header."""
    if token is None:
        return
    if not isinstance(token, str) or not token:
        raise ConfigError("[proxy] admin_token is empty (is the variable that should hold it set?)")
    if not all("!" <= ch <= "~" for ch in token):
        raise ConfigError(
            "[proxy] admin_token must be printable ASCII without spaces (it travels as "
            "'Authorization: Bearer <token>')"
        )


def _items(value: Any, what: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ConfigError(f"[[proxy.{what}]] must be a list of tables")
    return value


def _seeds(value: Any, what: str, cls: Any, id_field: str) -> list[Any]:
    """`[[proxy.<what>]]` tables as `cls` entries (`id_field`, a chain or pool id, as text)."""
    out = []
    for item in _items(value, what):
        try:
            out.append(cls(**{**item, id_field: str(item.get(id_field, ""))}))
        except TypeError as exc:
            raise ConfigError(f"[[proxy.{what}]] {exc}") from None
    return out


def _cacheable(methods: dict[str, Any]) -> list[str]:
    return [
        m
        for m, spec in methods.items()
        if not spec.writer and spec.block in ("number", "ctx", "id", "hash")
    ]


def _checkers(value: Any) -> list[CheckerSource]:
    from proxy.model import EntryError, check_url

    out = []
    for source in _seeds(value, "checkers", CheckerSource, "chain"):
        try:
            check_url(source.url)
        except EntryError as exc:
            raise ConfigError(f"[[proxy.checkers]] {exc}") from None
        pool = normalize_pool(source.chain)
        if pool is None:
            raise ConfigError(f"[[proxy.checkers]] chain {source.chain!r} is not a pool id")
        out.append(CheckerSource(pool, source.url))
    return out

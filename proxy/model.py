"""Pools, nodes and the entries the admin API and the store hold.

One validation path for every entry: the admin API (HTTP 400 with the reason) and the store
watcher (a bad stored value is logged and ignored) both go through `*.from_obj`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from proxy.breaker import HALF_OPEN, OPEN, Breaker, BreakerSettings
from proxy.latency import LatencyWindow
from proxy.tenancy.nodebudget import NodeBudget

# `full`: a full or archive execution client (geth, reth, ...) answering what only a state
# trie can (eth_getProof); it gets no other traffic unless a method route sends it there.
KINDS = ("state", "archive", "full")
KINDS_TEXT = '"state", "archive" or "full"'
URL_SCHEMES = ("http://", "https://", "inproc://")
_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_METHOD = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
_DEC_CHAIN = re.compile(r"^(0|[1-9][0-9]{0,19})$")
_HEX_CHAIN = re.compile(r"^0[xX][0-9a-fA-F]{1,16}$")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$")
MAX_CHAIN_ID = 2**64 - 1
EWMA = 0.2  # weight of the newest sample in latency_ms
DEFAULT_BREAKER = BreakerSettings()


class EntryError(ValueError):
    """An entry that cannot be used; the message says which field and why."""


def normalize_chain(raw: str) -> str | None:
    """Decimal chain id for `raw` (decimal or 0x-hex), or None when it is not a chain id."""
    if _DEC_CHAIN.match(raw):
        return raw if int(raw) <= MAX_CHAIN_ID else None
    if _HEX_CHAIN.match(raw):
        return str(int(raw, 16))
    return None


def normalize_pool(raw: str) -> str | None:
    """A pool id: a chain id (hex normalized) optionally followed by `-version`."""
    chain, sep, version = raw.partition("-")
    norm = normalize_chain(chain)
    if norm is None:
        return None
    if not sep:
        return norm
    return f"{norm}-{version}" if _VERSION.match(version) else None


def check_version(value: Any) -> str:
    if not isinstance(value, str) or not _VERSION.match(value):
        raise EntryError("version must be 1-32 letters, digits, '.', '_' or '-'")
    return value


def check_key(value: Any, what: str = "key") -> str:
    if not isinstance(value, str) or not _KEY.match(value):
        raise EntryError(f"{what} must be 1-64 letters, digits, '.', '_' or '-' (got {value!r})")
    return value


def check_method(value: Any) -> str:
    if not isinstance(value, str) or not _METHOD.match(value):
        raise EntryError(f"method must be a JSON-RPC method name (got {value!r})")
    return value


def check_url(value: Any) -> str:
    if not isinstance(value, str) or not value.startswith(URL_SCHEMES) or len(value) > 2048:
        raise EntryError("url must start with http://, https:// or inproc://")
    if any(c.isspace() for c in value):
        raise EntryError("url must not contain whitespace")
    try:
        parts = urlsplit(value)
        port = parts.port  # ValueError when out of range or not a number
        host = parts.hostname
    except ValueError as exc:
        raise EntryError(f"invalid url {value!r}: {exc}") from None
    if not host:
        raise EntryError("url has no host or name")
    if parts.scheme == "inproc" and port is not None:
        raise EntryError("an inproc:// url names a node, not a host and port")
    return value


def check_weight(value: Any, max_weight: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= max_weight:
        raise EntryError(f"weight must be an integer from 0 to {max_weight}")
    return value


def _object(obj: Any, allowed: set[str], what: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise EntryError(f"{what} must be a JSON object")
    extra = set(obj) - allowed
    if extra:
        raise EntryError(f"{what}: unknown field(s) {sorted(extra)}; allowed {sorted(allowed)}")
    return obj


@dataclass(frozen=True, slots=True)
class NodeEntry:
    key: str
    url: str
    kind: str = "state"
    weight: int = 1
    enabled: bool = True
    # Route to the node even while the consistency checker says it diverged (the operator's
    # override; docs/proxy.md "Lying replicas").
    ignore_checker: bool = False
    budget: float = 0.0  # requests per second the node may be sent (0: no budget)

    FIELDS = frozenset({"key", "url", "kind", "weight", "enabled", "ignore_checker", "budget"})

    @classmethod
    def from_obj(cls, obj: Any, max_weight: int = 1_000_000) -> NodeEntry:
        o = _object(obj, set(cls.FIELDS), "node")
        if "key" not in o or "url" not in o:
            raise EntryError('node needs "key" and "url"')
        kind = o.get("kind", "state")
        if kind not in KINDS:
            raise EntryError(f"kind must be {KINDS_TEXT} (got {kind!r})")
        enabled = o.get("enabled", True)
        ignore = o.get("ignore_checker", False)
        if not isinstance(enabled, bool) or not isinstance(ignore, bool):
            raise EntryError("enabled and ignore_checker must be true or false")
        budget = o.get("budget", 0)
        if isinstance(budget, bool) or not isinstance(budget, int | float) or not budget >= 0:
            raise EntryError("budget must be a number of requests per second, 0 or more")
        return cls(
            key=check_key(o["key"]),
            url=check_url(o["url"]),
            kind=kind,
            weight=check_weight(o.get("weight", 1), max_weight),
            enabled=enabled,
            ignore_checker=ignore,
            budget=float(budget),
        )

    def to_obj(self) -> dict[str, Any]:
        obj = {
            "key": self.key,
            "url": self.url,
            "kind": self.kind,
            "weight": self.weight,
            "enabled": self.enabled,
        }
        if self.ignore_checker:  # stored (and shown) only when set
            obj["ignore_checker"] = True
        if self.budget:
            obj["budget"] = self.budget
        return obj


@dataclass(frozen=True, slots=True)
class WriterEntry:
    key: str
    url: str

    @classmethod
    def from_obj(cls, obj: Any) -> WriterEntry:
        o = _object(obj, {"key", "url"}, "writer")
        if "key" not in o or "url" not in o:
            raise EntryError('writer needs "key" and "url"')
        return cls(key=check_key(o["key"]), url=check_url(o["url"]))

    def to_obj(self) -> dict[str, Any]:
        return {"key": self.key, "url": self.url}


@dataclass(frozen=True, slots=True)
class RouteRule:
    """Pins `method` to a node kind, or to named nodes."""

    method: str
    kind: str | None = None
    nodes: tuple[str, ...] | None = None

    @classmethod
    def from_obj(cls, obj: Any) -> RouteRule:
        o = _object(obj, {"method", "kind", "nodes"}, "route rule")
        method = check_method(o.get("method"))
        if ("kind" in o) == ("nodes" in o):
            raise EntryError('route rule needs exactly one of "kind" or "nodes"')
        if "kind" in o:
            if o["kind"] not in KINDS:
                raise EntryError(f"kind must be {KINDS_TEXT} (got {o['kind']!r})")
            return cls(method=method, kind=o["kind"])
        nodes = o["nodes"]
        if not isinstance(nodes, list) or not nodes:
            raise EntryError("nodes must be a non-empty list of node keys")
        return cls(method=method, nodes=tuple(check_key(k, "node key") for k in nodes))

    def to_obj(self) -> dict[str, Any]:
        if self.kind is not None:
            return {"method": self.method, "kind": self.kind}
        return {"method": self.method, "nodes": list(self.nodes or ())}

    def matches(self, node: Node) -> bool:
        if self.kind is not None:
            return node.entry.kind == self.kind
        return node.entry.key in (self.nodes or ())


def mirror_id(url: str) -> str:
    """Store key of a mirror target: stable per URL, safe in a key path."""
    return hashlib.sha256(url.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class MirrorEntry:
    url: str
    methods: frozenset[str] | None = None  # None: every method

    @property
    def id(self) -> str:
        return mirror_id(self.url)

    @classmethod
    def from_obj(cls, obj: Any) -> MirrorEntry:
        o = _object(obj, {"url", "methods"}, "mirror")
        url = check_url(o.get("url"))
        methods = o.get("methods")
        if methods is None:
            return cls(url=url)
        if not isinstance(methods, list) or not methods:
            raise EntryError("methods must be a non-empty list of method names")
        return cls(url=url, methods=frozenset(check_method(m) for m in methods))

    def to_obj(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"id": self.id, "url": self.url}
        if self.methods is not None:
            obj["methods"] = sorted(self.methods)
        return obj

    def wants(self, method: str) -> bool:
        return self.methods is None or method in self.methods


@dataclass(eq=False, slots=True)
class Node:
    """A node of a pool: its entry plus what the proxy observed about it.

    Whether it gets traffic: `entry.enabled`, `healthy` (the health poll: alive, head known)
    and not `blocked` (its breaker is open or probing, or the checker says it diverged and
    the entry does not say `ignore_checker`)."""

    entry: NodeEntry
    local: bool = False
    # Bumped when head, earliest, healthy, blocked or diverged changes (`WATCHED`): shared by
    # the readers of one pool (`Pool.rebuild`), whose cached routes check it (proxy/routes.py).
    changes: list[int] = field(default_factory=lambda: [0], repr=False, kw_only=True)
    head: int | None = None
    earliest: int | None = None
    healthy: bool = True
    fails: int = 0  # consecutive failed health polls
    latency_ms: float | None = None  # EWMA of answers (polls and requests), shown
    inflight: int = 0
    weight_override: int | None = None
    last_error: str | None = None  # why the last health poll failed (None after a success)
    breaker_settings: BreakerSettings = DEFAULT_BREAKER
    cost: float | None = None  # peak-EWMA latency estimate (ms), proxy/latency.py
    cost_at: float = 0.0  # monotonic time of its last sample
    diverged: dict[str, Any] | None = None  # the checker's verdict, proxy/verdicts.py
    blocked: bool = False
    breaker: Breaker = field(init=False)
    # its upstream budget and rate-limit backoff (proxy/tenancy/nodebudget.py)
    budget: NodeBudget = field(init=False)

    def __post_init__(self) -> None:
        self.breaker = Breaker(self.breaker_settings, self.update_blocked)
        self.budget = NodeBudget(self.entry.budget, self.update_blocked)

    def take_entry(self, entry: NodeEntry) -> None:
        """A changed entry of the same endpoint: what was observed is kept; its budget and
        `ignore_checker` may have changed."""
        if entry.budget != self.entry.budget:
            self.budget.retune(entry.budget)
        self.entry = entry
        self.update_blocked()

    def update_blocked(self) -> None:
        """Recompute `blocked` (after a breaker transition, a checker verdict, a backoff or
        a budget spent)."""
        state = self.breaker.state
        ejected = state is OPEN or (state is HALF_OPEN and self.breaker.probing)
        self.blocked = ejected or self.distrusted or self.budget.out

    @property
    def ejected(self) -> bool:
        """Out of rotation by its breaker alone (open, or half-open with a probe out): tried
        anyway when every node is out. Never a node the checker distrusts, nor one backed off
        or over its upstream budget (it would answer a rate limit)."""
        return self.blocked and not self.distrusted and not self.budget.out

    @property
    def distrusted(self) -> bool:
        """The checker says it diverged and the operator did not override it."""
        return self.diverged is not None and not self.entry.ignore_checker

    @property
    def key(self) -> str:
        return self.entry.key

    @property
    def weight(self) -> int:
        return self.entry.weight if self.weight_override is None else self.weight_override

    def observe_latency(self, ms: float) -> None:
        prev = self.latency_ms
        self.latency_ms = ms if prev is None else prev + EWMA * (ms - prev)

    def observe_latencies(self, seconds: list[float]) -> None:
        """`observe_latency(s * 1000)` for each of `seconds` in order (folded answers: one
        call for them, no list of ms made first)."""
        if not seconds:
            return
        prev = self.latency_ms
        start = 0
        if prev is None:
            prev, start = seconds[0] * 1000.0, 1
        for s in seconds[start:] if start else seconds:
            prev += EWMA * (s * 1000.0 - prev)  # (a float: no int to convert each time)
        self.latency_ms = prev

    def succeeded(self) -> bool:
        """Record an answer; True when this brought the node back into rotation."""
        came_back = not self.healthy
        self.fails = 0
        self.healthy = True
        return came_back

    def failed(self, unhealthy_after: int) -> bool:
        """Record a failure; True when this one took the node out of rotation."""
        self.fails += 1
        taken_out = self.healthy and self.fails >= unhealthy_after
        if taken_out:
            self.healthy = False
        return taken_out

    def serves(self, height: int) -> bool:
        """False only when what we observed says the node does not hold `height`."""
        if self.head is not None and height > self.head:
            return False
        return not (self.earliest is not None and height < self.earliest)

    def to_obj(self) -> dict[str, Any]:
        obj = self.entry.to_obj()
        obj["weight"] = self.weight
        obj.update(
            head=self.head,
            earliest=self.earliest,
            healthy=self.healthy,
            latency_ms=None if self.latency_ms is None else round(self.latency_ms, 3),
            inflight=self.inflight,
            local=self.local,
        )
        return obj

    def failsafe_obj(self, cost_ms: float | None) -> dict[str, Any]:
        """What the failsafe parts observed (getAllNodes): breaker, checker verdict, cost."""
        return {
            "routable": self.entry.enabled and self.healthy and not self.blocked,
            "last_error": self.last_error,  # why the health poll took it out, if it did
            "breaker": self.breaker.to_obj(),
            "diverged": self.diverged,
            "ignore_checker": self.entry.ignore_checker,
            "cost_ms": None if cost_ms is None else round(cost_ms, 3),
            "upstream_budget": self.budget.to_obj(),
        }


WATCHED = ("head", "earliest", "healthy", "blocked", "diverged")  # what routes depend on


def _watched(slot: Any) -> property:
    """A Node field that bumps `Node.changes` when its value changes (a data descriptor in
    front of the slot; reading it costs ~50 ns more than a plain slot). Every assignment goes
    through it, so no setter can forget to tell the routes cache (proxy/routes.py)."""
    get, put = slot.__get__, slot.__set__

    def assign(node: Node, value: Any) -> None:
        try:
            same = get(node) == value
        except AttributeError:  # the first assignment, in __init__
            same = False
        put(node, value)
        if not same:
            node.changes[0] += 1

    return property(get, assign)


for _name in WATCHED:
    setattr(Node, _name, _watched(Node.__dict__[_name]))


@dataclass(slots=True)
class Pool:
    """One node pool (a chain id, or a versioned pool such as `1337-blue`)."""

    id: str
    nodes: dict[str, Node] = field(default_factory=dict)  # persisted entries
    local: dict[str, Node] = field(default_factory=dict)  # addLocalNode (memory only)
    weights: dict[str, int] = field(default_factory=dict)
    routes: dict[str, list[RouteRule]] = field(default_factory=dict)
    mirrors: dict[str, MirrorEntry] = field(default_factory=dict)
    writers: dict[str, Node] = field(default_factory=dict)  # entries of kind "writer"
    leader: str | None = None
    readers: list[Node] = field(default_factory=list)  # nodes + local, rebuilt on change
    fulls: list[Node] = field(default_factory=list)  # the `full` ones among them, kept apart
    # Recent attempt times by method ("batch" for sub-batches): hedge delays and derived
    # attempt timeouts (proxy/latency.py). Bounded by the served method set.
    latency: dict[str, LatencyWindow] = field(default_factory=dict)
    inflight: int = 0  # client requests being answered from this pool (admission control)
    # Its in-flight limit and when it was worked out (`Admission.limit`): kept in the pool
    # that every request holds, no lookup by its id per request.
    admit_limit: int = field(default=0, compare=False, repr=False)
    admit_at: float = field(default=float("-inf"), compare=False, repr=False)
    hedge: Any = None  # the pool's hedge budget (proxy/hedge.py), made on first use
    verdicts: dict[str, Any] | None = None  # the checker's last report (proxy/verdicts.py)
    # The readers' shared `Node.changes` (set by `rebuild`): one int tells the routes cache
    # whether a reader's head, earliest, health, breaker or verdict changed.
    changes: list[int] = field(default_factory=lambda: [0], repr=False)

    def rebuild(self) -> None:
        for node in (*self.nodes.values(), *self.local.values()):
            node.weight_override = self.weights.get(node.key)
            node.changes = self.changes
        every = [*self.nodes.values(), *self.local.values()]
        self.readers = [n for n in every if n.entry.kind != "full"]
        self.fulls = [n for n in every if n.entry.kind == "full"]

    def find(self, key: str) -> Node | None:
        return self.nodes.get(key) or self.local.get(key)

    @property
    def empty(self) -> bool:
        return not (
            self.nodes or self.local or self.weights or self.routes or self.mirrors
        ) and not (self.writers or self.leader)

    def head(self) -> int | None:
        """The highest head among healthy enabled nodes (the chain head as the pool sees it)."""
        heads = [n.head for n in self.readers if n.head is not None and n.healthy]
        return max(heads) if heads else None

    def leader_node(self) -> Node | None:
        return self.writers.get(self.leader) if self.leader else None

"""Projects, keys, limits and rules as stored under `tenancy/` in the config store.

One validation path, as for the routing entries: the admin API (HTTP 400 with the reason) and
the store watcher (a bad stored value is logged and ignored) both go through `*.from_obj`.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any

from proxy.model import EntryError, normalize_pool

_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,47}$")
_METHOD_PATTERN = re.compile(r"^[A-Za-z0-9_*?]{1,64}$")
_ORIGIN = re.compile(r"^(\*|https?://(\*\.)?[A-Za-z0-9.-]+(:[0-9]{1,5})?)$")
MAX_LIST = 256  # entries of one rule list (methods, origins, networks, chains)

# The limits a project, a key or a pool's anonymous clients may carry; 0 or absent: none.
RATE_LIMITS = ("requests_per_second", "items_per_second")
QUOTAS = ("daily_items", "monthly_items")
LIMIT_FIELDS = (*RATE_LIMITS, "burst_seconds", "concurrent", *QUOTAS)
RULE_FIELDS = (
    "chains",
    "methods_allowed",
    "methods_denied",
    "origins",
    "ips",
    "max_logs_range",
    "max_batch",
)


@dataclass(frozen=True, slots=True)
class Limits:
    """Rates are per second, shared by every proxy of a fleet (with Redis); a bucket holds
    `burst_seconds` of its rate. `concurrent`: requests in flight on one proxy. Quotas count
    request items (a batch of 10 counts 10) per UTC day and calendar month."""

    requests_per_second: float = 0.0
    items_per_second: float = 0.0
    burst_seconds: float = 1.0
    concurrent: int = 0
    daily_items: int = 0
    monthly_items: int = 0

    @classmethod
    def from_obj(cls, obj: Any) -> Limits:
        if obj is None:
            return cls()
        if not isinstance(obj, dict):
            raise EntryError("limits must be an object")
        unknown = sorted(set(obj) - set(LIMIT_FIELDS))
        if unknown:
            raise EntryError(f"unknown limits {unknown}; known: {list(LIMIT_FIELDS)}")
        values: dict[str, Any] = {}
        for name, value in obj.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise EntryError(f"limits.{name} must be a number >= 0 (0: no limit)")
            if name in ("concurrent", *QUOTAS):
                if value != int(value):
                    raise EntryError(f"limits.{name} must be an integer")
                value = int(value)
            values[name] = value
        if values.get("burst_seconds", 1.0) <= 0:
            raise EntryError("limits.burst_seconds must be > 0")
        return cls(**values)

    def to_obj(self) -> dict[str, Any]:
        default = Limits()
        return {
            n: getattr(self, n) for n in LIMIT_FIELDS if getattr(self, n) != getattr(default, n)
        }

    @property
    def empty(self) -> bool:
        return not (
            self.requests_per_second
            or self.items_per_second
            or self.concurrent
            or self.daily_items
            or self.monthly_items
        )


@dataclass(frozen=True, slots=True)
class Rules:
    """What a project's or key's requests may do; empty lists allow everything."""

    chains: tuple[str, ...] = ()  # pool ids ("1337", "1-blue"); empty: every chain
    methods_allowed: tuple[str, ...] = ()  # names or patterns (`eth_*`); empty: every method
    methods_denied: tuple[str, ...] = ()  # names or patterns; a denial wins over an allowance
    origins: tuple[str, ...] = ()  # browser origins (`https://app.example`, `*`); empty: any
    ips: tuple[str, ...] = ()  # client networks (`203.0.113.0/24`); empty: any address
    max_logs_range: int = 0  # blocks one eth_getLogs may span; 0: the proxy's own limits
    max_batch: int = 0  # items of one batch; 0: max_batch_items

    @classmethod
    def from_obj(cls, obj: Any) -> Rules:
        if obj is None:
            return cls()
        if not isinstance(obj, dict):
            raise EntryError("rules must be an object")
        unknown = sorted(set(obj) - set(RULE_FIELDS))
        if unknown:
            raise EntryError(f"unknown rules {unknown}; known: {list(RULE_FIELDS)}")
        values: dict[str, Any] = {}
        for name in ("max_logs_range", "max_batch"):
            if name in obj:
                value = obj[name]
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise EntryError(f"rules.{name} must be an integer >= 0 (0: no limit)")
                values[name] = value
        values["chains"] = tuple(_chain(c) for c in _strings(obj, "chains"))
        for name in ("methods_allowed", "methods_denied"):
            values[name] = tuple(_method_pattern(m) for m in _strings(obj, name))
        values["origins"] = tuple(_origin(o) for o in _strings(obj, "origins"))
        values["ips"] = tuple(_network(n) for n in _strings(obj, "ips"))
        return cls(**values)

    def to_obj(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in RULE_FIELDS:
            value = getattr(self, name)
            if value:
                out[name] = list(value) if isinstance(value, tuple) else value
        return out


@dataclass(frozen=True, slots=True)
class Project:
    id: str
    name: str = ""
    limits: Limits = field(default_factory=Limits)
    rules: Rules = field(default_factory=Rules)
    created: int = 0  # unix seconds

    @classmethod
    def from_obj(cls, obj: Any) -> Project:
        if not isinstance(obj, dict):
            raise EntryError("a project must be an object")
        unknown = sorted(set(obj) - {"id", "name", "limits", "rules", "created"})
        if unknown:
            raise EntryError(f"unknown project fields {unknown}")
        return cls(
            id=check_id(obj.get("id"), "project id"),
            name=_name(obj.get("name", "")),
            limits=Limits.from_obj(obj.get("limits")),
            rules=Rules.from_obj(obj.get("rules")),
            created=_int(obj.get("created", 0), "created"),
        )

    def to_obj(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "name": self.name, "created": self.created}
        if self.limits != Limits():
            out["limits"] = self.limits.to_obj()
        if self.rules != Rules():
            out["rules"] = self.rules.to_obj()
        return out


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """A key as stored: never the key itself, only its hash and first characters."""

    id: str
    project: str
    hash: str  # hex sha256 of the whole key
    prefix: str  # the key's first characters, to recognize it in a list
    name: str = ""
    limits: Limits = field(default_factory=Limits)
    rules: Rules = field(default_factory=Rules)
    created: int = 0
    revoked: int = 0  # unix seconds of the revocation; 0: in use

    @classmethod
    def from_obj(cls, obj: Any) -> KeyRecord:
        if not isinstance(obj, dict):
            raise EntryError("a key must be an object")
        known = {"id", "project", "hash", "prefix", "name", "limits", "rules", "created"}
        unknown = sorted(set(obj) - known - {"revoked"})
        if unknown:
            raise EntryError(f"unknown key fields {unknown}")
        digest = obj.get("hash")
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise EntryError("key hash must be 64 lower-case hex digits")
        prefix = obj.get("prefix", "")
        if not isinstance(prefix, str) or len(prefix) > 16:
            raise EntryError("key prefix must be a short string")
        return cls(
            id=check_id(obj.get("id"), "key id"),
            project=check_id(obj.get("project"), "project id"),
            hash=digest,
            prefix=prefix,
            name=_name(obj.get("name", "")),
            limits=Limits.from_obj(obj.get("limits")),
            rules=Rules.from_obj(obj.get("rules")),
            created=_int(obj.get("created", 0), "created"),
            revoked=_int(obj.get("revoked", 0), "revoked"),
        )

    def to_obj(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "project": self.project,
            "hash": self.hash,
            "prefix": self.prefix,
            "name": self.name,
            "created": self.created,
        }
        if self.limits != Limits():
            out["limits"] = self.limits.to_obj()
        if self.rules != Rules():
            out["rules"] = self.rules.to_obj()
        if self.revoked:
            out["revoked"] = self.revoked
        return out

    def shown(self) -> dict[str, Any]:
        """As the admin API lists it: without the hash."""
        out = self.to_obj()
        del out["hash"]
        out["revoked"] = bool(self.revoked)
        if self.revoked:
            out["revoked_at"] = self.revoked
        return out


@dataclass(frozen=True, slots=True)
class PoolAccess:
    """Who may use a pool without a key, and how much (`tenancy/pools/{poolId}`)."""

    anonymous: bool = True
    limits: Limits = field(default_factory=Limits)  # per client address
    rules: Rules = field(default_factory=Rules)

    @classmethod
    def from_obj(cls, obj: Any) -> PoolAccess:
        if not isinstance(obj, dict):
            raise EntryError("pool access must be an object")
        unknown = sorted(set(obj) - {"anonymous", "limits", "rules"})
        if unknown:
            raise EntryError(f"unknown pool access fields {unknown}")
        anonymous = obj.get("anonymous", True)
        if not isinstance(anonymous, bool):
            raise EntryError("anonymous must be true or false")
        rules = Rules.from_obj(obj.get("rules"))
        if rules.chains:
            raise EntryError("a pool's rules cannot name chains (they apply to the pool)")
        return cls(anonymous, Limits.from_obj(obj.get("limits")), rules)

    def to_obj(self) -> dict[str, Any]:
        out: dict[str, Any] = {"anonymous": self.anonymous}
        if self.limits != Limits():
            out["limits"] = self.limits.to_obj()
        if self.rules != Rules():
            out["rules"] = self.rules.to_obj()
        return out


def check_id(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _ID.match(value):
        raise EntryError(
            f"{what} must be 1-48 of lower-case letters, digits, '_' or '-' (got {value!r})"
        )
    return value


def _name(value: Any) -> str:
    if not isinstance(value, str) or len(value) > 200:
        raise EntryError("name must be a string of at most 200 characters")
    return value


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise EntryError(f"{what} must be an integer >= 0")
    return value


def _strings(obj: dict[str, Any], name: str) -> list[str]:
    value = obj.get(name, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise EntryError(f"rules.{name} must be a list of strings")
    if len(value) > MAX_LIST:
        raise EntryError(f"rules.{name} has more than {MAX_LIST} entries")
    return value


def _chain(value: str) -> str:
    pool = normalize_pool(value)
    if pool is None:
        raise EntryError(f"rules.chains: {value!r} is not a chain or pool id")
    return pool


def _method_pattern(value: str) -> str:
    if not _METHOD_PATTERN.match(value):
        raise EntryError(
            f"method rule {value!r} must be a method name or a pattern with * and ? "
            "(e.g. eth_getBalance, debug_*)"
        )
    return value


def _origin(value: str) -> str:
    if not _ORIGIN.match(value):
        raise EntryError(
            f"origin {value!r} must be '*' or scheme://host[:port] (a leading '*.' allows "
            "subdomains), e.g. https://app.example"
        )
    return value.lower()


def _network(value: str) -> str:
    try:
        return str(ipaddress.ip_network(value, strict=False))
    except ValueError:
        raise EntryError(f"rules.ips: {value!r} is not an IP address or network") from None

"""Rules compiled once per subject (a key with its project, or a pool's anonymous clients).

Every list of a key and of its project applies: a request passes when it passes both
(`Policy.of` merges them: allow-lists must each match, denials add up, maximums take the
smaller). Method names are matched against shell-style patterns (`eth_*`, `debug_trace?*`).
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
from collections.abc import Iterable
from typing import Any

from chainstate.blockref import MAX_HEIGHT
from proxy.tenancy.model import Rules

MAX_CACHED_METHODS = 1024  # method names whose verdict a policy remembers
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def _patterns(patterns: Iterable[str]) -> re.Pattern[str] | None:
    listed = list(patterns)
    if not listed:
        return None
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in listed))


class MethodRule:
    """Allowed (every list must match) and denied (any list) method names."""

    __slots__ = ("allowed", "denied", "verdicts")

    def __init__(self, allowed: list[re.Pattern[str]], denied: re.Pattern[str] | None) -> None:
        self.allowed = allowed
        self.denied = denied
        self.verdicts: dict[str, bool] = {}

    def allows(self, method: str) -> bool:
        verdict = self.verdicts.get(method)
        if verdict is None:
            verdict = not (self.denied is not None and self.denied.match(method)) and all(
                a.match(method) for a in self.allowed
            )
            if len(self.verdicts) >= MAX_CACHED_METHODS:
                self.verdicts.clear()
            self.verdicts[method] = verdict
        return verdict


class Origins:
    """Allowed browser origins: exact ones, `*.domain` suffixes, or any (`*`)."""

    __slots__ = ("any", "exact", "suffixes")

    def __init__(self, listed: Iterable[str]) -> None:
        self.exact: set[str] = set()
        self.suffixes: list[tuple[str, str]] = []  # (scheme://, .domain[:port])
        self.any = False
        for origin in listed:
            if origin == "*":
                self.any = True
            elif "://*." in origin:
                scheme, _, rest = origin.partition("*")
                self.suffixes.append((scheme, rest))
            else:
                self.exact.add(origin)

    def allows(self, origin: str) -> bool:
        origin = origin.lower()
        if self.any or origin in self.exact:
            return True
        return any(origin.startswith(s) and origin.endswith(r) for s, r in self.suffixes)


class Policy:
    """The merged rules of one subject, ready for the checks of `Gate.admit`."""

    __slots__ = (
        "chains",
        "max_batch",
        "max_logs_range",
        "methods",
        "needs_items",
        "networks",
        "origins",
    )

    def __init__(self, *rules: Rules) -> None:
        chains: frozenset[str] | None = None
        allowed: list[re.Pattern[str]] = []
        denied: list[str] = []
        self.origins: list[Origins] = []
        self.networks: list[tuple[IpNetwork, ...]] = []
        self.max_logs_range = 0
        self.max_batch = 0
        for r in rules:
            if r.chains:
                listed = frozenset(r.chains)
                chains = listed if chains is None else chains & listed
            pattern = _patterns(r.methods_allowed)
            if pattern is not None:
                allowed.append(pattern)
            denied.extend(r.methods_denied)
            if r.origins:
                self.origins.append(Origins(r.origins))
            if r.ips:
                self.networks.append(tuple(ipaddress.ip_network(n) for n in r.ips))
            self.max_logs_range = _smaller(self.max_logs_range, r.max_logs_range)
            self.max_batch = _smaller(self.max_batch, r.max_batch)
        self.chains = chains
        denied_re = _patterns(denied)
        self.methods = MethodRule(allowed, denied_re) if allowed or denied_re else None
        # The body must be read for these (its items, methods, eth_getLogs ranges)
        self.needs_items = bool(self.methods or self.max_logs_range or self.max_batch)

    def allows_chain(self, pool_id: str) -> bool:
        return self.chains is None or pool_id in self.chains

    def allows_origin(self, origin: str | None) -> bool:
        """Requests without an Origin (servers, scripts) are not a browser's: not checked."""
        return origin is None or all(o.allows(origin) for o in self.origins)

    def allows_address(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return all(any(ip in net for net in nets) for nets in self.networks)

    def item_refusal(self, obj: Any, head: int | None) -> str | None:
        """Why one request object is refused, or None."""
        if not isinstance(obj, dict):
            return None  # the engine answers an invalid item as such
        method = obj.get("method")
        if not isinstance(method, str):
            return None
        if self.methods is not None and not self.methods.allows(method):
            return f"method {method[:64]} is not allowed for this key"
        if self.max_logs_range and method == "eth_getLogs":
            span = logs_span(obj.get("params"), head)
            if span is not None and span > self.max_logs_range:
                return (
                    f"eth_getLogs spans {span} blocks, more than max_logs_range="
                    f"{self.max_logs_range}"
                )
        return None


def _smaller(a: int, b: int) -> int:
    if not a:
        return b
    return min(a, b) if b else a


def logs_span(params: Any, head: int | None) -> int | None:
    """Blocks an eth_getLogs filter spans (both ends counted); None when it names a block
    hash or its ends cannot be read (the engine answers those)."""
    if not isinstance(params, list) or not params or not isinstance(params[0], dict):
        return None
    flt = params[0]
    if "blockHash" in flt:
        return 1
    lo = _height(flt.get("fromBlock", "latest"), head)
    hi = _height(flt.get("toBlock", "latest"), head)
    if lo is None or hi is None:
        return None
    return max(0, hi - lo) + 1


def _height(value: Any, head: int | None) -> int | None:
    if value == "earliest":
        return 0
    if value in ("latest", "safe", "finalized", "pending"):
        return head
    if isinstance(value, str) and value[:2] in ("0x", "0X") and 2 < len(value) <= 18:
        try:
            height = int(value, 16)
        except ValueError:
            return None
        return height if height <= MAX_HEIGHT else None
    return None

"""Steps 2 and 3 of routing: the node kind a block needs, then the node among the eligible.

Rules (DESIGN.md): `Contains`, tags and no block → `state`; a height among the last
`state_window` blocks up to the pool head (head - height < state_window, the blocks a state
node with that window holds) → `state`, older → `archive`; `earliest` → `archive`; a block hash the
proxy has not seen → `archive`. When no node of the wanted kind is eligible the other kind
is tried (an archive node holds recent blocks too; a state node answers -39006 when it
lacks the block, which is retried). Method routes override the kind. Eligible nodes are
enabled, healthy (the health poll), not blocked (an open breaker, a half-open one already
probing, a checker verdict the entry does not override, a rate-limit backoff or a spent
upstream budget: proxy/tenancy/nodebudget.py), weight > 0, head ≥ height, and
not already tried for this item. Among them the choice is latency-aware "power of two
choices": two different nodes drawn by weight (without replacement), the one with the lower
`cost × (in flight + 1) / weight` wins (cost: the node's peak-EWMA latency,
proxy/latency.py). When no node is known to hold the height (heads are polled, so they lag),
the choice is made again without that condition rather than refusing the item; when every
otherwise eligible node has its breaker open, they are tried anyway (failing open beats
refusing everything; not a node backed off or over its budget: it would answer a rate limit).

Writer methods go to the pool's Leader write node. So does a state read at the `pending`
block (`MethodSpec.pending`) when the pool has a Leader: pending state (the next nonce once a
transaction is in the mempool) exists only in the Leader's execution client. Without a Leader
the state node answers `pending` as `latest`, as before.
"""

from __future__ import annotations

import random
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, NamedTuple

from cachetools import LRUCache

from chainstate.blockref import BlockRef
from chainstate.jsonrpc import INTERNAL_ERROR, JsonRpcError
from proxy import latency
from proxy.methods import MethodSpec
from proxy.model import Node, Pool, RouteRule

UNKNOWN_COST_MS = 1.0  # the cost of a node without latency samples yet (it gets tried soon)
NO_NODE = INTERNAL_ERROR  # JSON-RPC code answered when no node can take an item
POOL_HEAD: Any = object()  # `head` argument default: ask the pool (its head may be None)


class NoEligibleNode(JsonRpcError):
    def __init__(self, message: str) -> None:
        super().__init__(NO_NODE, message)


class Need(NamedTuple):
    """What an item needs: a node kind, and the height it must hold (None: any). `rule`
    names the rule that decided; `reason` says it in words (formatted only when asked for:
    nothing is formatted on the request path)."""

    kind: str
    height: int | None
    rule: str
    tag: str | None = None
    head: int | None = None
    window: int = 0

    @property
    def reason(self) -> str:
        rule = self.rule
        if rule == "window":
            return (
                f"block {self.height} among the last {self.window} up to head {self.head} → state"
            )
        if rule == "old":
            return (
                f"block {self.height} older than the last {self.window} up to head {self.head} "
                "→ archive"
            )
        if rule == "tag":
            return f"tag {self.tag} → state"
        if rule == "head_unknown":
            return f"block {self.height}, head unknown yet → state"
        return _RULES[rule]


_RULES = {
    "retry": "retry after BlockNotFound prefers archive",
    "none": "no block named → state",
    "contains": "blockCtx Contains → state",
    "earliest": "earliest → archive",
    "hash": "unknown block hash → archive",
}


class Reason:
    """Why candidates were chosen, formatted when shown (`str()`)."""

    __slots__ = ("need", "note", "rules")

    def __init__(self, need: Need, note: str = "", rules: list[RouteRule] | None = None) -> None:
        self.need = need
        self.note = note  # "fallback", then "+anyway" / "+ejected" as the choice widened
        self.rules = rules

    def __str__(self) -> str:
        need = self.need
        text = need.reason
        if self.rules:
            shown = ", ".join(str(r.to_obj()) for r in self.rules)
            text = f"method route {shown}; {text}"
        elif self.note.startswith("fallback"):
            other = "state" if need.kind == "archive" else "archive"
            text = f"{text}; no eligible {need.kind} node, falling back to {other}"
        if "anyway" in self.note:
            text = f"{text}; no node is known to hold block {need.height} yet, trying anyway"
        if "ejected" in self.note:
            text = f"{text}; every eligible node has its breaker open, trying them anyway"
        return text


_NO_BLOCK = Need("state", None, "none")
_CONTAINS = Need("state", None, "contains")


@dataclass(frozen=True, slots=True)
class Choice:
    node: Node
    reason: str


class Selector:
    def __init__(
        self,
        state_window: int,
        known_hashes: int,
        rng: random.Random | None = None,
        latency_decay: float = 5.0,
    ):
        self.state_window = state_window
        self.hashes: LRUCache[str, int] = LRUCache(maxsize=known_hashes)
        self.rng = rng or random.Random()
        self.tau = latency_decay

    def remember_hash(self, block_hash: str, height: int) -> None:
        self.hashes[block_hash.lower()] = height

    def need(
        self,
        pool: Pool,
        ref: BlockRef | None,
        prefer_archive: bool = False,
        head: Any = POOL_HEAD,
    ) -> Need:
        """Step 2: the kind and height an item targets (`head`: the pool's head when the
        caller has it already, e.g. once per batch)."""
        if prefer_archive:
            height = None if ref is None else self._height(ref)
            return Need("archive", height, "retry")
        if ref is None:
            return _NO_BLOCK
        if ref.contains:
            return _CONTAINS
        if ref.tag == "earliest":
            return Need("archive", 0, "earliest")
        if ref.tag is not None:
            return Need("state", None, "tag", tag=ref.tag)
        height = self._height(ref)
        if height is None:
            return Need("archive", None, "hash")
        if head is POOL_HEAD:
            head = pool.head()
        if head is None:
            return Need("state", height, "head_unknown")
        window = self.state_window
        if head - height < window:
            return Need("state", height, "window", None, head, window)
        return Need("archive", height, "old", None, head, window)

    def breakpoints(self, pool: Pool, head: int | None) -> list[int]:
        """The heights at which the nodes eligible for a height can change (the state window's
        lower end, each node's first held height and the one past its head), sorted: between
        two of them every height has the same candidates. Lets a batch choose once per range
        of heights instead of once per height."""
        points = set()
        if head is not None:
            points.add(head - self.state_window + 1)
        for node in pool.readers:
            if node.earliest is not None:
                points.add(node.earliest)
            if node.head is not None:
                points.add(node.head + 1)
        return sorted(points)

    def _height(self, ref: BlockRef) -> int | None:
        if ref.number is not None:
            return ref.number
        if ref.hash is not None:
            return self.hashes.get(ref.hash)
        if ref.tag == "earliest":
            return 0
        return None

    def choose(
        self,
        pool: Pool,
        method: str,
        spec: MethodSpec,
        ref: BlockRef | None,
        exclude: Collection[Node] = (),
        prefer_archive: bool = False,
    ) -> Choice:
        """Step 3: the node for one item, or NoEligibleNode saying why none fits."""
        nodes, reason = self.candidates(pool, method, spec, ref, exclude, prefer_archive)
        return Choice(self.pick(nodes), str(reason))

    def candidates(
        self,
        pool: Pool,
        method: str,
        spec: MethodSpec,
        ref: BlockRef | None,
        exclude: Collection[Node] = (),
        prefer_archive: bool = False,
        head: Any = POOL_HEAD,
    ) -> tuple[list[Node], Reason | str]:
        """The nodes eligible for one item and why (`pick` chooses among them), or
        NoEligibleNode saying why none fits."""
        if self.to_leader(pool, spec, ref):
            choice = self._leader(pool, method, exclude)
            return [choice.node], choice.reason
        rules = pool.routes.get(method)
        if spec.trie and not rules:
            return self._full(pool, method, ref, exclude)
        need = self.need(pool, ref, prefer_archive, head)
        found = self._among(pool, need, rules, exclude, need.height)
        if found is None:
            found = self._fallbacks(pool, need, rules, exclude)
        if found is None:
            why = need.reason
            if rules:
                why = "method route " + ", ".join(str(r.to_obj()) for r in rules)
            raise NoEligibleNode(self._none_msg(pool, method, need, why))
        return found

    def _fallbacks(
        self, pool: Pool, need: Need, rules: list[RouteRule] | None, exclude: Collection[Node]
    ) -> tuple[list[Node], Reason] | None:
        """The candidates when no node passed every condition: heads are polled, so a node
        may hold a block its last poll did not show yet (a node that really lacks it answers
        -39006 and the item moves on); and when every node is out only by its breaker, they
        are tried anyway."""
        height = need.height
        if height is not None:
            found = self._among(pool, need, rules, exclude, None)
            if found is not None:
                found[1].note += "+anyway"
                return found
        for at in (height, None) if height is not None else (None,):
            found = self._among(pool, need, rules, exclude, at, ejected=True)
            if found is not None:
                lagging = at is None and height is not None
                found[1].note += "+ejected+anyway" if lagging else "+ejected"
                return found
        return None

    def _among(
        self,
        pool: Pool,
        need: Need,
        rules: list[RouteRule] | None,
        exclude: Collection[Node],
        height: int | None,
        ejected: bool = False,
    ) -> tuple[list[Node], Reason] | None:
        """The candidates and the reason, or None. `ejected`: also nodes whose breaker alone
        keeps them out."""
        if rules:
            every = (*pool.readers, *pool.fulls) if pool.fulls else pool.readers
            usable = [n for n in every if self._usable(n, height, exclude, ejected)]
            picked = [n for n in usable if any(r.matches(n) for r in rules)]
            return (picked, Reason(need, "", rules)) if picked else None
        kind = need.kind
        same: list[Node] = []
        other: list[Node] = []
        for node in pool.readers:  # one pass: this runs for every item of every request
            entry = node.entry
            if not (entry.enabled and node.healthy) or node in exclude:
                continue
            if node.blocked and not (ejected and node.ejected):
                continue
            weight = entry.weight if node.weight_override is None else node.weight_override
            if weight <= 0 or (height is not None and not node.serves(height)):
                continue
            (same if entry.kind == kind else other).append(node)
        if same:
            return same, Reason(need)
        if other:
            return other, Reason(need, "fallback")
        return None

    @staticmethod
    def _usable(
        node: Node, height: int | None, exclude: Collection[Node], ejected: bool = False
    ) -> bool:
        if not (node.entry.enabled and node.healthy and node.weight > 0) or node in exclude:
            return False
        if node.blocked and not (ejected and node.ejected):
            return False
        return height is None or node.serves(height)

    def pick(self, nodes: list[Node]) -> Node:
        """Power of two choices: two different nodes drawn by weight, the cheaper wins
        (`cost × (in flight + 1) / weight`). A node's share is at most its chance of being
        drawn into the pair, which its weight sets."""
        n = len(nodes)
        if n == 1:
            picked = nodes[0]
        else:
            a, b = nodes if n == 2 else self._draw_two(nodes)
            now = time.monotonic()
            tau = self.tau
            ca = latency.current(a, now, tau)
            cb = latency.current(b, now, tau)
            wa, wb = a.weight, b.weight
            cost_a = (a.inflight + 1) * (UNKNOWN_COST_MS if ca is None else ca) / wa
            cost_b = (b.inflight + 1) * (UNKNOWN_COST_MS if cb is None else cb) / wb
            if cost_a == cost_b:  # (idle nodes with equal costs: the draw by weight decides)
                picked = a if self.rng.random() * (wa + wb) < wa else b
            else:
                picked = a if cost_a < cost_b else b
        budget = picked.budget
        if budget.rate:  # taken when chosen: the attempt may be sent a turn later
            budget.spend()
        return picked

    def _draw_two(self, nodes: list[Node]) -> tuple[Node, Node]:
        """Two different nodes, each drawn with a probability proportional to its weight."""
        weights = [node.weight for node in nodes]
        total = sum(weights)
        rnd = self.rng.random
        first = _index(weights, rnd() * total)
        second = _index(weights, rnd() * (total - weights[first]), skip=first)
        return nodes[first], nodes[second]

    def readable_head(self, pool: Pool) -> int | None:
        """The highest block a `latest` read can be answered at: the highest polled head among
        the usable state nodes (all usable readers when there is none); -1 while no head is
        known yet; None when the pool has no usable reader at all (nothing to wait for)."""
        usable = [n for n in pool.readers if self._usable(n, None, ())]
        if not usable:
            return None
        nodes = [n for n in usable if n.entry.kind == "state"] or usable
        return max((n.head for n in nodes if n.head is not None), default=-1)

    def cost(self, node: Node) -> float | None:
        """The node's latency estimate now (ms; None without samples), for getAllNodes."""
        return latency.current(node, time.monotonic(), self.tau)

    @staticmethod
    def to_leader(pool: Pool, spec: MethodSpec, ref: BlockRef | None) -> bool:
        """Whether the item goes to the Leader write node rather than a state/archive node:
        writer methods, `pending` reads (when the pool has a Leader), and what needs a state
        trie when the pool has no `full` node."""
        if spec.writer or (spec.trie and not pool.fulls):
            return True
        pending = spec.pending and ref is not None and ref.tag == "pending"
        return pending and pool.leader_node() is not None

    def _full(
        self, pool: Pool, method: str, ref: BlockRef | None, exclude: Collection[Node]
    ) -> tuple[list[Node], Reason | str]:
        """The pool's `full` nodes that may hold the block (head at or past it; every usable
        one when none is known to: heads are polled), for a method that needs a state trie."""
        height = None if ref is None else self._height(ref)
        for at in (height, None) if height is not None else (None,):
            found = [n for n in pool.fulls if self._usable(n, at, exclude)]
            if found:
                return found, f"{method} needs a state trie → a full node"
        found = [n for n in pool.fulls if self._usable(n, None, exclude, ejected=True)]
        if found:
            return found, f"{method} needs a state trie → a full node (breakers open)"
        states = ", ".join(
            f"{n.key}({'healthy' if n.healthy else 'unhealthy'}, head {n.head})" for n in pool.fulls
        )
        raise NoEligibleNode(
            f"no eligible full node for {method} in pool {pool.id} (it needs a state trie); "
            f"full nodes: {states}"
        )

    @staticmethod
    def _leader(pool: Pool, method: str, exclude: Collection[Node]) -> Choice:
        leader = pool.leader_node()
        if leader is None:
            raise NoEligibleNode(f"{method}: pool {pool.id} has no Leader write node")
        if leader in exclude:
            raise NoEligibleNode(f"{method}: the Leader write node {leader.key} did not answer")
        if not leader.healthy:
            why = f": {leader.last_error}" if leader.last_error else ""
            raise NoEligibleNode(
                f"{method}: the Leader write node {leader.key} ({leader.entry.url}) is "
                f"unhealthy{why}; switch the Leader: POST /{pool.id}/writers/switchLeader"
            )
        return Choice(leader, f"{method} goes to the Leader write node {leader.key}")

    @staticmethod
    def _none_msg(pool: Pool, method: str, need: Need, why: str) -> str:
        states = ", ".join(
            f"{n.key}({n.entry.kind}, {'enabled' if n.entry.enabled else 'disabled'}, "
            f"{'healthy' if n.healthy else 'unhealthy'}, head {n.head}, weight {n.weight}"
            f"{', rate limited or over its budget' if n.budget.out else ''})"
            for n in pool.readers
        )
        at = "" if need.height is None else f" at block {need.height}"
        return (
            f"no eligible node for {method}{at} in pool {pool.id} ({why}); "
            f"nodes: {states or 'none'}"
        )


def _index(weights: list[int], point: float, skip: int = -1) -> int:
    """The index whose weight interval holds `point` (cumulative, leaving out `skip`)."""
    last = -1
    for i, weight in enumerate(weights):
        if i == skip:
            continue
        last = i
        point -= weight
        if point < 0:
            return i
    return last  # (rounding at the very end)

"""The selector's candidates per (method, block class), kept while nothing they depend on
changes: one cache for every first attempt (proxy/choose.py, proxy/kept.py).

Why: the candidates of an item (`Selector.candidates`: the kind its block needs, then every
reader's health, breaker, head and weight) cost as much Python as the rest of the first
attempt's choice at c=1, and are the same for every item that names the same method and a
block of the same class while no reader changes. A block height's class is its range between
the selector's breakpoints (every height of a range has the same candidates); a tag, no
block or `Contains` is its own class; a block hash (its height is looked up per item) and
`pending` (the Leader, when there is one) are not kept. Writers are not kept either (the
Leader is chosen by the selector each time).

A pool's entry is dropped when its readers list is rebuilt (every config change: nodes,
weights, routes, Leader) or a reader's head, earliest block, health, breaker (`blocked`) or
checker verdict changed, or when a node (un)registered in process (the registry's
`version`). Those changes are pushed, not pulled: every assignment of one of those fields
bumps the pool's `changes` counter (proxy/model.py `WATCHED`), so a request checks one int
instead of a tuple over every reader. A readers list whose nodes do not share the pool's
counter (assembled without `Pool.rebuild`) falls back to comparing `signature`. The pick
among the candidates (latency costs, in flight) is still made per request; a list kept here
is never changed by its users (`Group` copies to narrow).
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

from chainstate.blockref import BlockRef
from chainstate.inproc import InprocRegistry
from proxy.methods import MethodSpec
from proxy.model import Node, Pool
from proxy.select import NoEligibleNode, Selector

MAX_ROUTES = 4096  # cached candidate lists per pool (methods × block classes); then cleared
UNCACHED: Any = object()  # a block class the cache does not key (a block hash, `pending`)
CONTAINS: Any = object()  # the class of a blockCtx `Contains` (not `True`: `True == 1`)


class PoolRoutes:
    """One pool's candidates per (method, block class), valid for one `signature` of its
    readers and one `version` of the in-process registry."""

    __slots__ = (
        "changes",
        "changes_at",
        "general",
        "kept",
        "one",
        "paths",
        "points",
        "readers",
        "signature",
        "table",
        "version",
    )

    def __init__(
        self,
        readers: list[Node],
        changes: list[int] | None,
        signature: tuple[Any, ...] | None,
        points: list[int],
        version: int,
    ) -> None:
        self.readers = readers
        # the readers' shared change counter and its value now (None: compare `signature`)
        self.changes = changes
        self.changes_at = -1 if changes is None else changes[0]
        self.signature = signature
        self.points = points  # the selector's breakpoints at the pool head of `signature`
        self.version = version
        self.table: dict[tuple[str, Any], list[Node] | None] = {}
        # (method, number of params) → {the block param's text → its KeptRoute}: the route
        # of a plain read found once per text (proxy/kept.py); a batch of one method looks
        # its texts up in one dict
        self.kept: dict[tuple[str, int], dict[str, KeptRoute]] = {}
        # (method, number of params, block text) of request objects no kept route takes
        # whatever their other params (a tag, pinned per request): not worked out again
        self.general: set[tuple[str, int, str]] = set()
        # reader → its in-process synchronous path (transport.NodePath), for readers that
        # have one; None until looked up (proxy/kept.py `paths`)
        self.paths: dict[Node, Any] | None = None
        self.one: Any = None  # the path every reader answers through, when they share one


class KeptRoute:
    """The route of a plain read found once for its method, number of params and block text
    (the last param: a height, or a blockCtx `Contains`), valid while the pool's candidates
    are kept. Its other params are still checked per request where the node does not check
    them, and the read path's only per-request input, whether the height's hash is known
    (`height`; None: the read path never plans it), is looked up per request."""

    __slots__ = ("checked", "checks", "height", "method", "nodes", "ref", "spec", "tagged")

    def __init__(
        self,
        method: str,
        spec: MethodSpec,
        ref: BlockRef | None,
        nodes: list[Node],
        height: int | None,
        checked: bool = False,
        tagged: bool = False,
    ) -> None:
        self.method = method
        self.spec = spec
        self.ref = ref
        self.nodes = nodes  # the first attempt's candidates (not empty; one list per class)
        self.height = height  # a pinned read when its hash is known (proxy/reads.py `_plan`)
        # Made for one item whose params the method table checked (not kept: a block hash,
        # a tag, no block); a kept route's items are checked per request (`checks`) or by
        # an in-process node.
        self.checked = checked
        self.tagged = tagged  # reads at a tag or at the node's head (no block named)
        # (index, check, name) of every param but the block (the method table's checks)
        self.checks = tuple(
            (index, check, spec.params[index])
            for index, check in spec.checks
            if index != spec.block_at
        )


def signature(readers: list[Node]) -> tuple[Any, ...]:
    """What the candidates depend on that changes without a rebuild of the readers list:
    heads, health, breakers (`blocked`) and checker verdicts."""
    return tuple([(n.head, n.earliest, n.healthy, n.blocked, n.diverged) for n in readers])


def block_class(points: list[int], ref: BlockRef | None) -> Any:
    """The class of `ref` among the breakpoints `points` (UNCACHED: not kept)."""
    if ref is None:
        return None
    if ref.tag is not None:
        return UNCACHED if ref.tag == "pending" else ref.tag
    if ref.contains:
        return CONTAINS
    if ref.number is not None:
        return bisect_right(points, ref.number)
    return UNCACHED  # a block hash: its height is looked up per item


class RouteCache:
    """`routes(pool)`, then `candidates(pool, routes, method, spec, ref)` per item."""

    def __init__(self, selector: Selector, registry: InprocRegistry | None = None) -> None:
        self.selector = selector
        # the in-process registry: a node (un)registered there starts the routes afresh
        self.registry = registry
        self.kept: dict[str, PoolRoutes] = {}  # pool id → its cached candidates

    def routes(self, pool: Pool) -> PoolRoutes:
        """The pool's cached candidates, started afresh when its readers list was rebuilt,
        a reader's head, health, breaker or verdict changed, or a node (un)registered in
        process."""
        readers = pool.readers
        registry = self.registry
        version = 0 if registry is None else registry.version
        routes = self.kept.get(pool.id)
        if routes is not None and routes.readers is readers and routes.version == version:
            changes = routes.changes
            if changes is not None:
                if changes[0] == routes.changes_at:
                    return routes
            elif routes.signature == signature(readers):
                return routes
        shared = pool.changes
        if all(node.changes is shared for node in readers):
            changes, sig = shared, None
        else:  # nodes not adopted by `Pool.rebuild`: pull their state per request
            changes, sig = None, signature(readers)
        points = self.selector.breakpoints(pool, pool.head())
        routes = self.kept[pool.id] = PoolRoutes(readers, changes, sig, points, version)
        return routes

    def candidates(
        self, pool: Pool, routes: PoolRoutes, method: str, spec: MethodSpec, ref: BlockRef | None
    ) -> tuple[list[Node] | None, Any]:
        """The selector's candidates for one item on its first attempt (no node excluded;
        None when no node is eligible: the selector says why when asked), from the cache
        when its block class is kept, and the class (UNCACHED: not kept)."""
        # (the Leader and `full` nodes are not readers: their changes are not followed here)
        cls = UNCACHED if spec.writer or spec.trie else block_class(routes.points, ref)
        table = routes.table
        if cls is not UNCACHED:
            key = (method, cls)
            found = table.get(key, UNCACHED)
            if found is not UNCACHED:
                return found, cls
        try:
            nodes: list[Node] | None = self.selector.candidates(pool, method, spec, ref)[0]
        except NoEligibleNode:
            nodes = None
        if cls is not UNCACHED:
            if len(table) >= MAX_ROUTES:
                table.clear()
            table[key] = nodes
        return nodes, cls

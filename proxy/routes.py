"""The selector's candidates per (method, block class), kept while nothing they depend on
changes: one cache for the engine's first attempts over HTTP and the in-process path.

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
checker verdict changed, or when the caller's own `version` changed (the in-process
registry's). Those changes are pushed, not pulled: every assignment of one of those fields
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
from proxy.methods import MethodSpec
from proxy.model import Node, Pool
from proxy.select import NoEligibleNode, Selector

MAX_ROUTES = 4096  # cached candidate lists per pool (methods × block classes); then cleared
UNCACHED: Any = object()  # a block class the cache does not key (a block hash, `pending`)
CONTAINS: Any = object()  # the class of a blockCtx `Contains` (not `True`: `True == 1`)


class PoolRoutes:
    """One pool's candidates per (method, block class), valid for one `signature` of its
    readers and one caller `version`."""

    __slots__ = (
        "changes",
        "changes_at",
        "heights",
        "one",
        "paths",
        "points",
        "quick",
        "readers",
        "seen",
        "shared",
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
        # (method, number of params) → {the block param's text → (the method, the candidates
        # found for it, False: its params are not checked again, whether it reads at a
        # tag)}: the in-process path's shortcut (`InprocPath._item` returns it as it is; a
        # batch of one method looks its texts up in one dict, proxy/inprocpath.py)
        self.seen: dict[tuple[str, int], dict[str, tuple[str, list[Node], bool, bool]]] = {}
        # the same for the texts that do not read at a tag: the routes a batch may take
        # without a look at its tags (`InprocPath._keyed`)
        self.heights: dict[tuple[str, int], dict[str, tuple[str, list[Node], bool, bool]]] = {}
        # (method, id of the candidates, tagged) → the one `seen` value for them: items of
        # one route share one object, so a batch compares them by identity
        self.shared: dict[tuple[str, int, bool], tuple[str, list[Node], bool, bool]] = {}
        self.paths: dict[Node, Any] | None = None  # what the caller keeps per reader, if any
        self.one: Any = None  # what the caller keeps when every reader shares one of those
        # (method, number of params, the block param's text) → the route of a plain single
        # request whose first write needs no Ctx or Item (`Engine._quick`)
        self.quick: dict[tuple[str, int, str], QuickRoute] = {}


class QuickRoute:
    """What the engine's general path decides for a single request object whose block is
    its last param, a height (or a blockCtx `Contains`): the same for every such request
    with the same method, number of params and block text while the pool's candidates are
    kept (`Engine._quick`). Its other params are still checked per request, and the
    read path's only per-request input, whether the height's hash is known (`height`; None:
    the read path never plans it), is looked up per request."""

    __slots__ = ("checks", "height", "method", "nodes", "ref", "spec")

    def __init__(
        self,
        method: str,
        spec: MethodSpec,
        ref: BlockRef,
        nodes: list[Node],
        height: int | None,
    ) -> None:
        self.method = method
        self.spec = spec
        self.ref = ref
        self.nodes = nodes  # the first attempt's candidates (not empty)
        self.height = height  # a pinned read when its hash is known (proxy/reads.py `_plan`)
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

    def __init__(self, selector: Selector) -> None:
        self.selector = selector
        self.kept: dict[str, PoolRoutes] = {}  # pool id → its cached candidates

    def routes(self, pool: Pool, version: int = 0) -> PoolRoutes:
        """The pool's cached candidates, started afresh when its readers list was rebuilt,
        a reader's head, health, breaker or verdict changed, or `version` did."""
        readers = pool.readers
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

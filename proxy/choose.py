"""Step 3: the node for each item — the one place the request path picks a node.

The selector (proxy/select.py) says which nodes are eligible for an item and picks among
them; the route cache (proxy/routes.py) keeps a first attempt's candidates per method and
block class. Here they are put together for every way an item is sent: a first attempt
(items with the same candidates share one pick, so a batch becomes as few sub-batches as
the rules allow), a kept route (a single request written before any object is made, or an
in-process answer), a retry (away from the nodes tried) and a hedge's second node.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from itertools import repeat
from typing import Any

from proxy.metrics import ProxyMetrics
from proxy.model import Node, Pool
from proxy.request import BATCH, Ctx, Group, Item, Row, Rows, heights
from proxy.routes import PoolRoutes, RouteCache
from proxy.ryw import to_leader
from proxy.select import NoEligibleNode, Reason, Selector

Found = tuple[Node, list[Node]] | NoEligibleNode  # (the node, its candidates), or why none


def _one_per_class(numbers: list[int | None], points: list[int]) -> list[int]:
    """A row's index for each class of heights among `numbers` (the breakpoints `points`),
    and every row without a height. The heights' set is made with one C loop: when the
    lowest and the highest are in one class, one row stands for all; else a row per
    height, then the class of each height."""
    heights = set(numbers)
    apart: list[int] = []
    if None in heights:
        heights.discard(None)
        apart = [i for i, n in enumerate(numbers) if n is None]
    if not heights:
        return apart
    low, high = min(heights), max(heights)  # type: ignore[type-var]
    if bisect_right(points, low) == bisect_right(points, high):  # (classes are ranges)
        return [numbers.index(low), *apart]
    at = dict(zip(numbers, range(len(numbers)), strict=True))  # height → a row
    at.pop(None, None)
    classes = map(bisect_right, repeat(points), at)
    return [*dict(zip(classes, at.values(), strict=True)).values(), *apart]


def _lookups(rows: list[Row], points: list[int]) -> list[tuple[str, Any, Any, str | None]]:
    """(method, spec, block ref, block text) of the rows whose candidates decide a batch's
    node: one row per class of heights when the rows are of one method at plain heights
    (proxy/routes.py), else every row. A batch's columns are read as they are, no `Row`
    made (which would parse the row's object, which no candidate depends on); when every
    row names a plain height, the lowest and the highest (`Rows.bounds`, found once per
    batch) in one class let the first row stand for all."""
    if type(rows) is Rows:
        method, spec = rows.method, rows.spec
        span = None if spec.writer or spec.trie else rows.bounds()
        if span is not None and bisect_right(points, span[0]) == bisect_right(points, span[1]):
            entries = rows.entries  # (rows read from their bytes: no whole column made)
            text, ref = (rows.texts[0], rows.refs[0]) if entries is None else entries[0][:2]
            return [(method, spec, ref, text)]
        refs, texts = rows.refs, rows.texts
        if spec.writer or spec.trie:
            return list(zip(repeat(method), repeat(spec), refs, texts))
        numbers = rows.heights
        if numbers is None:
            return list(zip(repeat(method), repeat(spec), refs, texts))
        return [(method, spec, refs[i], texts[i]) for i in _one_per_class(numbers, points)]
    numbers = heights(rows)
    spec = None if numbers is None else rows[0].spec
    if spec is not None and not (spec.writer or spec.trie):
        rows = [rows[i] for i in _one_per_class(numbers, points)]  # type: ignore[arg-type]
    return [(row.method, row.spec, row.ref, row.block) for row in rows]


class Chooser:
    def __init__(self, selector: Selector, routes: RouteCache, metrics: ProxyMetrics) -> None:
        self.selector = selector
        self.routes = routes
        self.metrics = metrics
        # The node among a kept route's candidates (not empty): the selector's pick itself,
        # bound here (no layer of its own: it is called once per request on the fast paths).
        self.kept: Callable[[list[Node]], Node] = selector.pick

    # ---- first attempts ------------------------------------------------------------------

    def groups(
        self,
        ctx: Ctx,
        pending: list[Item],
        attempt: int,
        refuse: Callable[[Item, NoEligibleNode], None],
    ) -> dict[Node, Group]:
        """A node for every pending item, grouped by node (`refuse(item, why)` for an item no
        node may take). On the first attempt, items with the same eligible nodes go to one
        node picked once; a retried item is chosen alone, away from the nodes it tried."""
        groups: dict[Node, Group] = {}
        pool = ctx.pool
        routes = self.routes.routes(pool) if attempt == 1 else None
        picked: dict[tuple[Node, ...], tuple[Node, list[Node]]] = {}
        # Items naming their block the same way with the same method have the same node
        # within a request: looked up once.
        chosen: dict[tuple[str, str | None, bool], Found] = {}
        batch = len(pending) > 1
        for it in pending:
            if routes is None:
                self.metrics.retry(ctx.chain, it.reason)
                found = self.retry(pool, it)
            else:
                key = it.route_key()
                found = None if key is None else chosen.get(key)  # type: ignore[assignment]
                if found is None:
                    found = self.first(pool, routes, it, picked)
                    if key is not None:
                        chosen[key] = found
            if type(found) is NoEligibleNode:
                refuse(it, found)
                continue
            node, cands = found  # type: ignore[misc]
            it.tried.append(node)
            group = groups.get(node)
            if group is None:
                lkey = BATCH if batch else it.method
                groups[node] = Group(node, [it], cands, lkey, attempt)
            else:
                group.add(it, cands)
        return groups

    def first_group(self, ctx: Ctx, it: Item, chosen: Node | None = None) -> Group | NoEligibleNode:
        """`groups` for the one item of a single request on its first attempt. `chosen`:
        picked already among the same candidates (`kept`)."""
        pool = ctx.pool
        found = self.first(pool, self.routes.routes(pool), it, None, chosen)
        if type(found) is NoEligibleNode:
            return found
        node, cands = found  # type: ignore[misc]
        it.tried.append(node)
        return Group(node, [it], cands, it.method)

    def first(
        self,
        pool: Pool,
        routes: PoolRoutes,
        it: Item,
        picked: dict[tuple[Node, ...], tuple[Node, list[Node]]] | None,
        chosen: Node | None = None,
    ) -> Found:
        """The node for an item on its first attempt (one pick per set of eligible nodes in
        `picked`; None: a single item), with the eligible nodes. Nodes off the chain the
        read path follows are avoided."""
        avoid = () if it.plan is None else it.plan.avoid
        nodes = None
        if not avoid:
            nodes = self.routes.candidates(pool, routes, it.method, it.spec, it.ref)[0]
        if nodes is None:  # none eligible (the selector says why), or some to avoid
            try:
                nodes, _ = self.selector.candidates(pool, it.method, it.spec, it.ref, avoid)
            except NoEligibleNode as exc:
                return exc
        if len(nodes) == 1:
            node = nodes[0]
            if node.budget.rate and chosen is None:  # (`Selector.pick` takes it in a choice)
                node.budget.spend()
            return node, nodes
        if picked is None:
            return chosen or self.selector.pick(nodes), nodes
        ids = tuple(nodes)
        found = picked.get(ids)
        if found is None:
            found = picked[ids] = (self.selector.pick(nodes), nodes)
        return found

    def one_node(self, pool: Pool, rows: list[Row]) -> tuple[Node, list[Node]] | None:
        """The node every row goes to on its first attempt, with the eligible nodes, or
        None when they do not all have the same eligible nodes, or none is eligible."""
        routes = self.routes.routes(pool)
        candidates = self.routes.candidates
        seen: set[tuple[str, str | None]] = set()  # (method, block text) looked up already
        first: list[Node] | None = None
        for method, spec, ref, block in _lookups(rows, routes.points):
            if block is not None or ref is None:
                key = (method, block)
                if key in seen:
                    continue
                seen.add(key)
            nodes = candidates(pool, routes, method, spec, ref)[0]
            if nodes is None:
                return None
            if first is None:
                first = nodes
            elif nodes is not first and nodes != first:
                return None
        assert first is not None
        return self.kept(first), first

    # ---- retries and hedges --------------------------------------------------------------

    def retry(self, pool: Pool, it: Item) -> Found:
        """The node for a retried item, away from the nodes it tried. An item pinned to a
        block by hash goes to another node that may hold it; when none is left, it is asked
        by height of the nodes that did not know the hash (a reorg the proxy has not seen
        yet: the nodes' chain answers; not cached). Asking a node that is behind by height
        first could answer from a block a reorg dropped."""
        found = self._away(pool, it)
        plan = it.plan
        # No reader left that may hold the transaction: the Leader's client may (pending).
        if type(found) is NoEligibleNode and it.spec.mempool and to_leader(pool, it):
            found = self._away(pool, it)
        if type(found) is NoEligibleNode and plan is not None and plan.missing:
            missing = plan.missing
            if plan.unpin() is not None:
                it.obj = plan.obj
                it.tried = [n for n in it.tried if n not in missing]
                found = self._away(pool, it)
        return found

    def _away(self, pool: Pool, it: Item) -> Found:
        avoid = () if it.plan is None else it.plan.avoid
        try:
            nodes, _ = self.selector.candidates(
                pool,
                it.method,
                it.spec,
                it.ref,
                [*it.tried, *avoid] if avoid else it.tried,
                it.prefer_archive,
            )
        except NoEligibleNode as exc:
            return exc
        return self.selector.pick(nodes), nodes

    def second(self, pool: Pool, group: Group) -> Node | None:
        """A second node for a slow attempt of `group` (a hedge): an eligible one no item of
        it tried, or None. A group with one candidate (the only node of its kind) gets the
        next node that holds what it reads (`_next`: another kind, as a retry would go)."""
        if len(group.cands) == 1:
            return self._next(pool, group)
        tried = {id(n) for it in group.items for n in it.tried}
        others = [
            n
            for n in group.cands
            if id(n) not in tried and n.entry.enabled and n.healthy and not n.blocked
        ]
        return self.selector.pick(others) if others else None

    def _next(self, pool: Pool, group: Group) -> Node | None:
        """The node a retry of every item of `group` would go to, when one is known to hold
        each item's block (not one tried only because its head lags, or its breaker is open)
        and the items are reads a reader answers (never the Leader's: writes, `pending`).
        Called only once an attempt is late: never on the way of an answer in time."""
        if group.node not in pool.readers:
            return None
        common: list[Node] | None = None
        seen: set[tuple[str, str | None]] = set()  # rows' (method, block text) asked already
        for it in group.items:
            for method, spec, ref, exclude, archive, block in _targets(it):
                if block is not None:
                    if (method, block) in seen:
                        continue
                    seen.add((method, block))
                if spec is None or self.selector.to_leader(pool, spec, ref):
                    return None
                try:
                    nodes, why = self.selector.candidates(pool, method, spec, ref, exclude, archive)
                except NoEligibleNode:
                    return None
                if isinstance(why, Reason) and "+" in why.note:
                    return None  # not known to hold the block, or ejected: no rescue
                common = nodes if common is None else [n for n in common if n in nodes]
                if not common:
                    return None
        return self.selector.pick(common) if common else None


def _targets(it: Any) -> list[tuple[str, Any, Any, list[Node], bool, str | None]]:
    """(method, spec, block ref, nodes to avoid, prefer archive, block text) of an entry of a
    group: an Item, or the rows sent as one body (`Rounds.plain`: an entry with `rows`)."""
    rows = getattr(it, "rows", None)
    if rows is not None:
        return [(r.method, r.spec, r.ref, it.tried, False, r.block) for r in rows]
    spec = getattr(it, "spec", None)
    if spec is None:
        return [("", None, None, it.tried, False, None)]
    plan = it.plan
    avoid = () if plan is None else plan.avoid
    exclude = [*it.tried, *avoid] if avoid else it.tried
    return [(it.method, spec, it.ref, exclude, it.prefer_archive, None)]

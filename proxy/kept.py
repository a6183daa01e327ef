"""Steps 1-3 for plain reads without per-item objects: kept routes, looked up by block text.

A plain read's route — its method table target, the read path's rule and its candidates —
is the same for every request with the same method, number of params and block text while
the pool's candidates are kept (proxy/routes.py), so it is found once (`KeptRoute`) and
looked up by that text from then on: a single request's in one lookup, a batch of one method
with C loops over its items. The node is then picked by proxy/choose.py as for any item.
What is not such a read (a tag the read path pins per request, a block hash, a writer, an
invalid item, ...) gets None here and takes the general steps (proxy/parse.py,
proxy/readpath.py).

Batches sent to nodes in this process are grouped here by the node picked (`Lanes`): one
pick per candidate list, as the general steps group a batch.
"""

from __future__ import annotations

from operator import attrgetter, itemgetter
from typing import Any, NamedTuple

import orjson

from chainstate.blockref import BlockRef
from chainstate.jsonrpc import (
    INTERNAL_ERROR,
    RETRYABLE_CODES,
    JsonRpcError,
    error_response,
    request_id,
)
from proxy.breaker import CLOSED
from proxy.choose import Chooser
from proxy.methods import LocalMethod, MethodSpec, MethodTable
from proxy.model import Node, Pool
from proxy.outcome import UpstreamError
from proxy.reads import Reads
from proxy.request import maker
from proxy.routes import MAX_ROUTES, UNCACHED, KeptRoute, PoolRoutes, RouteCache
from proxy.transport import InprocTransport, NodePath
from proxy.upstream import Upstream

CALL = "eth_call"  # never a plain read: an in-process node answers it as a future
# Methods whose answer is about the head the read path pins per request (proxy/reads.py)
HEADLESS = frozenset(("eth_blockNumber", "getLatestBlock"))
_PINNED_TAGS = frozenset(("latest", "safe", "finalized"))
_METHOD, _PARAMS, _ID, _LAST = (
    itemgetter("method"),
    itemgetter("params"),
    itemgetter("id"),
    itemgetter(-1),
)
_NODES = attrgetter("nodes")
_ID_TYPES = frozenset((int, str))


class Lane(NamedTuple):
    """The items of a batch picked on one node with a synchronous path in process."""

    node: Node
    path: NodePath
    positions: list[int]  # their places in the batch


class Counted(NamedTuple):
    """A lane of a batch answered by one call shared with other lanes: its count alone."""

    node: Node
    path: NodePath
    count: int


make_lane, make_counted = maker(Lane), maker(Counted)


class Lanes(NamedTuple):
    """A batch's items grouped by the node picked for them (`KeptRoutes.lanes`)."""

    lanes: list[Lane]
    checked: bool  # every item's params checked here (else the node alone checks some)
    tagged: bool  # an item reads at a tag or at the node's head
    method: str | None  # the method of every item (None: several)


make_lanes = maker(Lanes)


class KeptRoutes:
    def __init__(
        self,
        methods: MethodTable,
        cache: RouteCache,
        chooser: Chooser,
        reads: Reads | None,
        upstream: Upstream,
    ) -> None:
        self.methods = methods
        self.cache = cache
        self.chooser = chooser
        self.reads = reads
        self.upstream = upstream
        self._pools = cache.kept  # (pool id → its PoolRoutes: `routes`' lookup, inline)

    def routes(self, pool: Pool) -> PoolRoutes:
        """The pool's routes (`RouteCache.routes`: its check of the kept ones inline, one
        call less per request)."""
        routes = self._pools.get(pool.id)
        registry = self.cache.registry
        if (
            routes is None
            or routes.readers is not pool.readers
            or (registry is not None and routes.version != registry.version)
            or routes.changes is None
            or routes.changes[0] != routes.changes_at
        ):
            routes = self.cache.routes(pool)
        return routes

    # ---- one request object --------------------------------------------------------------

    def single(self, pool: Pool, routes: PoolRoutes, payload: Any) -> KeptRoute | None:
        """The kept route of a request object that is a plain read (an int or string id, a
        list of params none null, the last a block text of a height or `Contains`), found
        now when it is the first with its text; None for any other body, before anything is
        picked or counted. Its other params are not checked here (`check`)."""
        if type(payload) is not dict:
            return None
        try:  # (subscripts, not `get` calls: a try costs nothing until it raises)
            method, rid, params = payload["method"], payload["id"], payload["params"]
            route = routes.kept[(method, len(params))][params[-1]]
        except (KeyError, TypeError, IndexError):  # not kept yet, or not such an object
            return self.learn(pool, routes, payload)
        if type(rid) is not int and type(rid) is not str:
            return None  # (a null id, a float: the general steps')
        return route

    def learn(self, pool: Pool, routes: PoolRoutes, payload: Any) -> KeptRoute | None:
        """The route of a request object as the general steps find it (the method table's
        target, the read path's rule, the route cache's candidates), kept when every such
        request goes the same way: a read at a height or `Contains` named by its last
        param, with eligible nodes. None (not kept): anything else."""
        if type(payload) is not dict or payload.get("jsonrpc") != "2.0":
            return None
        method, rid, params = payload.get("method"), payload.get("id"), payload.get("params")
        if type(method) is not str or (type(rid) is not int and type(rid) is not str):
            return None  # (a notification, a float id, a bad envelope: the general steps')
        if type(params) is not list or not params or None in params:
            return None
        text = params[-1]
        if type(text) is not str:
            return None
        general = (method, len(params), text)
        if general in routes.general:  # (its method table target worked out once)
            return None
        try:
            spec, ref = self.methods.target(method, params)
        except Exception:  # an invalid item, a diverted method: the general steps'
            return None
        if ref is None or spec.writer or spec.block is None or spec.block_at != len(params) - 1:
            return None
        if ref.tag is not None:  # pinned per request: so is every object with this text
            if len(routes.general) >= MAX_ROUTES:
                routes.general.clear()
            routes.general.add(general)
            return None
        if ref.hash is not None or spec.block == "logs":
            return None  # a hash looked up per request, a range by its oldest block
        nodes, cls = self.cache.candidates(pool, routes, method, spec, ref)
        if not nodes or cls is UNCACHED:
            return None
        reads = self.reads
        planned = reads is not None and method in reads.methods and not ref.contains
        route = KeptRoute(method, spec, ref, nodes, ref.number if planned else None)
        texts = routes.kept.get((method, len(params)))
        if texts is None:
            texts = routes.kept[(method, len(params))] = {}
        elif len(texts) >= MAX_ROUTES:
            texts.clear()
        texts[text] = route
        return route

    # ---- in-process paths ----------------------------------------------------------------

    def paths(self, routes: PoolRoutes) -> dict[Node, NodePath]:
        """Each reader's synchronous path in process, kept with the pool's routes (empty:
        no reader has one); and `routes.one`, the path every reader answers through when
        they are all one node in process (under one or more entries) that checks items
        for its caller (`NodePath.keyed`)."""
        paths = routes.paths
        if paths is not None:
            return paths
        paths = {}
        for node in routes.readers:
            try:
                transport = self.upstream.transport(node.entry.url)
            except UpstreamError:  # (a URL no transport serves: its attempts say so)
                continue
            if type(transport) is InprocTransport and transport.path is not None:
                paths[node] = transport.path
        routes.paths = paths
        one = next(iter(paths.values()), None)
        if (
            one is None
            or one.keyed is None
            or len(paths) != len(routes.readers)
            or any(path != one for path in paths.values())
        ):
            one = None
        routes.one = one
        return paths

    @staticmethod
    def usable(routes: PoolRoutes, node: Node) -> NodePath | None:
        """The node's synchronous path, when it has one and nothing about it needs the
        general steps' books: not failed lately, its breaker closed with no failure counted.
        (Health need not be read: a change of it starts the routes afresh, and candidates
        are healthy nodes.)"""
        breaker = node.breaker
        if node.fails or breaker.failures or breaker.state is not CLOSED:
            return None
        return routes.paths.get(node)  # type: ignore[union-attr]

    # ---- a batch -------------------------------------------------------------------------

    def seen_all(self, routes: PoolRoutes, items: list[Any]) -> list[KeptRoute] | None:
        """The kept route of every item of a batch of one method and one number of params,
        looked up with C loops (no Python step per item); None when the items are not all
        request objects with an int or string id and a block text kept before."""
        try:
            methods = set(map(_METHOD, items))
            params = list(map(_PARAMS, items))
            sizes = set(map(len, params))
            if len(methods) != 1 or len(sizes) != 1:
                return None
            texts = routes.kept.get((methods.pop(), sizes.pop()))
            if texts is None:
                return None
            hits = list(map(texts.__getitem__, map(_LAST, params)))  # (not kept: KeyError)
            if not set(map(type, map(_ID, items))) <= _ID_TYPES:
                return None
        except (KeyError, TypeError, IndexError):  # (not a dict, no id, no params, unhashable)
            return None
        return hits

    def lanes(
        self, pool: Pool, routes: PoolRoutes, items: list[Any], seen: list[KeptRoute] | None
    ) -> Lanes | None:
        """Steps 1-3 for every item of a batch, as the general steps' first attempt makes
        them: the lanes of items per node picked (one pick per candidate list), or None when
        the body is not for the in-process paths. `seen`: every item's kept route, found
        already (`seen_all`; None: item by item)."""
        routed = seen
        if routed is None:
            routed = []
            for item in items:
                one = self.item(pool, routes, item)
                if one is None:
                    return None
                routed.append(one)
        nodes_of = candidates_of(routed)
        first = routed[0]
        if nodes_of.count(nodes_of[0]) == len(nodes_of) and (
            seen is not None or _one_method(routed)
        ):  # one candidate list, one method: one pick
            node = self.chooser.kept(first.nodes)
            path = self.usable(routes, node)
            if path is None:
                return None
            checked = seen is None and all(r.checked for r in routed)
            tagged = first.tagged if seen is not None else any(r.tagged for r in routed)
            lane = make_lane((node, path, list(range(len(items)))))
            return make_lanes(([lane], checked, tagged, first.method))
        return self._grouped(routes, routed)

    def _grouped(self, routes: PoolRoutes, routed: list[KeptRoute]) -> Lanes | None:
        """`lanes` for items of several routes, item by item."""
        kept = self.chooser.kept
        # id of a candidate list → (the list, kept alive while its id is a key; the positions
        # of the lane of the node picked from it)
        picked: dict[int, tuple[list[Node], list[int]]] = {}
        lanes: dict[Node, Lane] = {}
        checked, tagged, first, mixed = True, False, None, False
        last: list[Node] | None = None  # the candidates of the item before
        positions: list[int] = []  # the positions of the lane picked from `last`
        for pos, one in enumerate(routed):
            method = one.method
            if method != first:
                if first is None:
                    first = method
                else:
                    mixed = True
            if not one.checked:
                checked = False
            if one.tagged:
                tagged = True
            nodes = one.nodes
            if nodes is not last:  # (items of one range in a row: one lookup for them)
                slot = picked.get(id(nodes))
                if slot is None:
                    node = kept(nodes)
                    lane = lanes.get(node)
                    if lane is None:
                        path = self.usable(routes, node)
                        if path is None:
                            return None
                        lane = lanes[node] = make_lane((node, path, []))
                    slot = picked[id(nodes)] = (nodes, lane.positions)
                last, positions = nodes, slot[1]
            positions.append(pos)
        return make_lanes((list(lanes.values()), checked, tagged, None if mixed else first))

    def two(
        self, routes: PoolRoutes, nodes_of: list[list[Node]], rest: int
    ) -> list[Counted] | None:
        """The two lanes of a batch of one method whose items have two candidate lists
        (`nodes_of`: each item's; `rest`: the items not on the first one's), counted with C
        loops instead of `_grouped`'s item by item (one pick per list in the order they
        come): one lane when both picks are one node; None unless the two nodes picked are
        two entries answering through one synchronous path (one call then answers every
        item, and each lane's count is all its books need)."""
        first = nodes_of[0]
        second = next(filter(first.__ne__, nodes_of))
        if nodes_of.count(second) != rest:  # a third list
            return None
        kept = self.chooser.kept
        a, b = kept(first), kept(second)
        one = self.usable(routes, a)
        if one is None:
            return None
        if a is b:  # both lists picked one node: one lane, one attempt
            return [make_counted((a, one, len(nodes_of)))]
        two = self.usable(routes, b)
        if two is None or one.items is not two.items or one.answered is not two.answered:
            return None  # (nodes in process that are not one: `_grouped` picks again)
        return [make_counted((a, one, len(nodes_of) - rest)), make_counted((b, two, rest))]

    def item(self, pool: Pool, routes: PoolRoutes, item: Any) -> KeptRoute | None:
        """Steps 1-3 for one item of a batch: its kept route (found now when it is the
        first of its text), or a route made for it alone (a block hash, `earliest`, no
        block: its params checked here), or None when it is not for the in-process paths."""
        if type(item) is not dict:
            return None
        method = item.get("method")
        rid = item.get("id")  # None: a notification (or a null id), the general steps'
        if type(method) is not str or (type(rid) is not int and type(rid) is not str):
            return None
        if method == CALL:  # never a plain read (a future's: the general steps')
            return None
        params = item.get("params")
        if type(params) is list and params and type(params[-1]) is str:
            texts = routes.kept.get((method, len(params)))
            if texts is not None:
                found = texts.get(params[-1])
                if found is not None:
                    return found
        target = self.plain_read(method, params)
        if target is None:
            return None
        spec, ref = target
        if self.reads is not None and _pinned(method, ref):
            return None  # answered at the head the read path pins for the request
        if ref is not None and ref.tag is None and ref.hash is None:
            kept = self.learn(pool, routes, item)  # (a height or Contains: kept from now)
            if kept is not None:
                return kept
        nodes = self.cache.candidates(pool, routes, method, spec, ref)[0]
        if nodes is None:
            return None
        tagged = ref is None or ref.tag is not None
        return KeptRoute(method, spec, ref, nodes, None, checked=True, tagged=tagged)

    def plain_read(self, method: str, params: Any) -> tuple[MethodSpec, BlockRef | None] | None:
        """(spec, block ref) of a read with valid params. The rest of the envelope
        (`jsonrpc`, the params' type) is checked once, by the node: it declines an item
        that fails, and the general steps answer the body."""
        try:
            spec, ref = self.methods.target(method, params)
        except (JsonRpcError, LocalMethod):  # LocalMethod: filters, diverted elsewhere
            return None
        # (the Leader, `full` nodes and the Leader after a reader: the general steps')
        return None if spec.writer or spec.trie or spec.mempool else (spec, ref)


def candidates_of(routed: list[KeptRoute]) -> list[list[Node]]:
    """Each route's candidate list (one list object per method and block class)."""
    return list(map(_NODES, routed))


def _one_method(routed: list[KeptRoute]) -> bool:
    method = routed[0].method
    return all(r.method == method for r in routed)


def _pinned(method: str, ref: BlockRef | None) -> bool:
    """Whether the read path pins the item's block per request: `latest` (a block param
    left out too), `safe`, `finalized`, and the methods answered about the head. Answered
    by a node, such an item would be read at the node's own head, which may be above or
    below the one the proxy answered before (`latest` never goes backwards)."""
    if ref is None:
        return method in HEADLESS
    return ref.tag in _PINNED_TAGS


def retried(answers: list[Any], errors: list[int]) -> bool:
    """Whether an error answer (at the positions `errors`) has a code the rounds retry on
    another node, or is no JSON-RPC error object: the general steps' then."""
    for i in errors:
        error = answers[i].get("error")
        if type(error) is not dict or error.get("code") in RETRYABLE_CODES:
            return True
    return False


def too_large(payload: Any, size: int, limit: int) -> bytes:
    """The answer to a body whose answer made in process is over max_answer_bytes: -32603
    for each item (as the rounds answer `too_large`), never asked again: every node would
    make the same answer."""
    msg = f"answer of {size} bytes, more than max_answer_bytes ({limit}): not retried"
    if type(payload) is list:
        return orjson.dumps(
            [error_response(request_id(it), INTERNAL_ERROR, msg) for it in payload if _asks(it)]
        )
    return orjson.dumps(error_response(request_id(payload), INTERNAL_ERROR, msg))


def _asks(item: Any) -> bool:
    """Whether an item of a batch gets an answer (anything but a notification)."""
    return type(item) is not dict or "id" in item

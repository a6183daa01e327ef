"""The proxy's synchronous path to state nodes in its own process (`chainstate up`).

Why: in process a state node answers a plain read in a few µs without awaiting
(`answer_items`), but the engine's path around it costs more than the read itself: a task per
request, five coroutines, a deadline, and a second parse of the body in the node (py-spy
under `bench run` at `chainstate up`'s proxy: the engine took twice the node's time, and the
proxy answered half of what the node's own port did; bench/README.md "Issues 14/15: what
remained").

Here a body whose items are all valid reads (a request object or a batch, every item with an
int or string id) is parsed once, routed by the engine's selector with its rules (the same
candidates, one pick per set of eligible nodes as the engine's batches do), and answered from
the parsed items by in-process nodes that have a synchronous path, counted in the same metrics
and node latencies (kept per answer in lists and folded in per 64 answers, 50 ms, or before a
read: proxy/inprocbooks.py). Anything else returns None *before anything is counted* (an answer
is booked only once kept, the node's own count too: `items_answered`), and the
engine answers the body as usual (parse, choose, forward, classify, retry unchanged): a parse
error or an invalid item, a notification, an id orjson may change, a writer method, a pool with
mirrors, tracing or the access log on, a node that is not in process, has failed lately or
declines the items (not plain reads: eth_call, headers, …), a retryable answer (-39006 goes to
another node: the engine's job), or an exception.

The route is the costly part in Python (the selector's candidates took as long as the node's
read), so each pool's candidates are kept per (method, block class) while nothing they depend
on changes (proxy/routes.py, the cache the engine's first attempts use too): the readers list
(rebuilt on every config change: nodes, weights, routes, Leader), each reader's head,
earliest block, health, breaker and checker verdict, and the in-process registry's version.
The pick among the candidates (latency costs, in flight) is still made per body. An item
whose block param is a text seen before takes its candidates without the method table's
param checks: the node checks the params itself, and an error answer to such an item sends
the body to the engine (`_item`).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Awaitable
from operator import itemgetter
from time import perf_counter  # (one attribute lookup less than `time.perf_counter`)
from typing import Any

import orjson

from chainstate.blockref import BlockRef
from chainstate.httpserver import Headers, Response
from chainstate.inproc import (
    AnswerChecked,
    AnswerItems,
    AnswerKeyed,
    InprocRegistry,
    ItemsAnswered,
)
from chainstate.jsonrpc import RETRYABLE_CODES, JsonRpcError
from proxy.books import access_log
from proxy.breaker import CLOSED
from proxy.engine import Engine
from proxy.face import public
from proxy.inprocbooks import InprocBooks
from proxy.inproccalls import calls
from proxy.methods import LocalMethod, MethodSpec
from proxy.model import Node, Pool
from proxy.request import BATCH
from proxy.routes import MAX_ROUTES, PoolRoutes, RouteCache
from proxy.routes import UNCACHED as _UNCACHED

# a reader's synchronous path for parsed items, what counts its answers on the node, its
# path for items of one method checked here (`_answer`), and its path for items of one method
# it checks itself, keyed by their block texts (`_keyed`)
Path = tuple[AnswerItems, ItemsAnswered | None, AnswerChecked | None, AnswerKeyed | None]
# (node, its synchronous path, positions of the items it answers)
Group = tuple[Node, Path, list[int]]
# (node, its path, latency key, the items it answered, positions of its error answers among
# them, the time it took, the method of every item or None): booked once the answers are kept
Attempt = tuple[Node, Path, str, list[Any], list[int], float, str | None]
# (node, its path, the number of items of its group): a group answered by a shared call
Counted = tuple[Node, Path, int]
# a batch of one method answered by one call on entries of one node (`_shared`): (the
# method, the call's time, each entry's node, path and number of items)
Shared = tuple[str, float, list[Counted]]
Answered = tuple[Any, list[Attempt] | Shared]  # (the answer to send, its books)
# Request objects with this text are not parsed here: an eth_call is never a plain read, and
# the engine sends it to the node's future (proxy/upstream.py `send_now`) without parsing it
# twice. Batches are not searched (the search is as long as the body: ~2 µs of a 10-item
# batch, py-spy): a batch whose first item is an eth_call goes to proxy/inproccalls.py (the
# node's future, or the engine); an eth_call item elsewhere is not routed (`_item`: so no
# route is kept for one and neither `_keyed` nor `_seen_all` finds one), the node is not
# asked, and the engine answers the batch.
_CALL = b'"eth_call"'
_OPEN = ord("[")  # a batch's first byte
# The access logger's own memo of `isEnabledFor` (level → bool; logging empties it in place
# whenever a level or `logging.disable` changes, and refills it on the next call): a False
# in it is `isEnabledFor`'s answer without its Python call (~0.8k instructions). Anything
# else (True, not yet known) asks `isEnabledFor`.
_ACCESS_INFO: dict[int, bool] = getattr(access_log, "_cache", {})
_INFO = logging.INFO  # (a module global: no attribute of `logging` to look up per body)


class InprocPath:
    """`answer(chain_id, body, headers)`: (200, body) at once, or None for the engine."""

    def __init__(self, engine: Engine, registry: InprocRegistry) -> None:
        self.engine = engine
        self.registry = registry
        self.max_batch = engine.settings.max_batch_items
        # (0 in the settings: no limit, here the largest size, so one compare decides)
        self.max_answer = engine.settings.max_answer_bytes or sys.maxsize
        self._routes = RouteCache(engine.selector)  # each pool's cached candidates
        self._kept = self._routes.kept  # (pool id → its PoolRoutes, read by `answer`)
        self.books = InprocBooks(engine.attempts, engine.metrics)  # folded per 64 answers

    def answer(
        self, chain: str, pool: Pool, body: bytes, headers: Headers
    ) -> Response | Awaitable[Response] | None:
        """`chain` and `pool`: the body's, as `Engine.resolve` found them; the answer (bytes:
        a 200, as the lean server takes it), an awaitable of it (a batch of eth_calls given
        to the node's future: proxy/inproccalls.py, admitted there as it waits) or None. Not
        admitted otherwise: an answer made here never waits (nothing is awaited between
        taking a place among the pool's requests in flight and giving it back), so the
        admission limit would protect nothing; a body left to the engine is admitted by the
        caller then. The caller serves no body over
        `max_body_bytes` (the lean server's limit) and has no tracer (`create_server`)."""
        engine = self.engine
        if pool.mirrors:
            return None
        if _ACCESS_INFO.get(_INFO) is not False and access_log.isEnabledFor(_INFO):
            return None
        # (a single eth_call is no plain read: the engine gives it to the node.) `partition`
        # takes its one argument without `find`'s argument parsing, `body[0]` (an int) no
        # slice: ~0.7k instructions less per body (`in`, `startswith`: slower still)
        if body and body[0] != _OPEN and body.partition(_CALL)[1]:
            return None
        # The pool's candidates (proxy/routes.py), started afresh also when a node
        # (un)registered in process (the registry's version), with each reader's `Path`:
        # `RouteCache.routes`' check of the kept routes, inline (one call less; keep the two
        # alike)
        routes = self._kept.get(pool.id)
        if (
            routes is None
            or routes.readers is not pool.readers
            or routes.version != self.registry.version
            or routes.changes is None
            or routes.changes[0] != routes.changes_at
        ):
            routes = self._routes.routes(pool, self.registry.version)
        if routes.paths is None:
            self._find_paths(routes)
        if not routes.paths:
            return None
        started = perf_counter()
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        if type(payload) is dict:
            return self._single(chain, pool, routes, payload, headers, started)
        if type(payload) is not list or not 0 < len(payload) <= self.max_batch:
            return None
        first = payload[0]
        if type(first) is dict and first.get("method") == "eth_call":
            return calls(self, chain, pool, routes, payload, body, headers, started)
        answered = self._batch(pool, routes, payload)
        if answered is None:
            return None
        out = orjson.dumps(answered[0])
        if len(out) > self.max_answer:
            return None  # the engine answers it as too large: nothing was counted yet
        done = answered[1]
        if type(done) is tuple:  # one call of one method (`_shared`): one call books it all
            self.books.shared(chain, pool, *done, perf_counter() - started)
        else:
            self._book(chain, pool, done)
            self.books.request(chain, "batch", perf_counter() - started)
        client = headers.raw.get(b"client-id")  # (as `_single`: no `get` call, no decode)
        if client:
            engine.metrics.client(client.decode("latin-1"))
        return 200, out

    def _find_paths(self, routes: PoolRoutes) -> None:
        """Each reader's synchronous `Path`, kept with the pool's fresh routes; and
        `routes.one`, the path every reader answers through when they are all one node in
        process (under one or more entries) that checks items for its caller (`_keyed`)."""
        registry = self.registry
        paths: dict[Node, Path] = {}
        for node in routes.readers:
            url = node.entry.url
            answer_items = registry.resolve_items(url)
            if answer_items is not None:
                answered, checked = registry.resolve_answered(url), registry.resolve_checked(url)
                paths[node] = (answer_items, answered, checked, registry.resolve_keyed(url))
        routes.paths = paths
        one = next(iter(paths.values()), None)
        if (
            one is None
            or one[3] is None
            or len(paths) != len(routes.readers)
            or any(path != one for path in paths.values())
        ):
            one = None
        routes.one = one

    def _item(
        self, pool: Pool, routes: PoolRoutes, item: Any
    ) -> tuple[str, list[Node], bool, bool] | None:
        """Steps 1-2 for one item: (method, its candidates, whether its params were checked
        here, whether it reads at a tag: `latest`, or a blockCtx without block_id), or None
        when the item is not for this path.

        Its params are checked by the method table (`_target`), except when its block param
        (the last) is a text seen before with as many params: then the candidates found
        for it then are taken as they are. The node checks the params anyway; an error
        answer to such an item sends the body to the engine, which answers it as before."""
        if type(item) is not dict:
            return None
        method = item.get("method")
        rid = item.get("id")  # None: a notification (or a null id), the engine's
        if type(method) is not str or (type(rid) is not int and type(rid) is not str):
            return None
        if method == "eth_call":  # never a plain read: no route kept for it (see `_CALL`)
            return None
        params = item.get("params")
        key = None
        if type(params) is list and params and type(params[-1]) is str:
            key = (method, len(params))
            texts = routes.seen.get(key)
            if texts is not None:
                seen = texts.get(params[-1])
                if seen is not None:  # (method, candidates, False, tagged), as built below
                    return seen
        target = self._target(method, params)
        if target is None:
            return None
        spec, ref = target
        if self.engine.reads is not None and _pinned(method, ref):
            return None  # answered at the head the engine pins for the request (monotonic)
        found, cls = self._routes.candidates(pool, routes, method, spec, ref)
        if found is None:
            return None
        tagged = ref is None or ref.tag is not None
        if key is not None and cls is not _UNCACHED and spec.block_at == key[1] - 1:
            texts = routes.seen.get(key)  # (keys: the methods of the table, one length each)
            if texts is None:
                texts = routes.seen[key] = {}
            elif len(texts) >= MAX_ROUTES:
                texts.clear()
                routes.heights.pop(key, None)
            shared = routes.shared
            route = shared.get((method, id(found), tagged))
            if route is None:
                if len(shared) >= MAX_ROUTES:
                    shared.clear()
                route = shared[(method, id(found), tagged)] = (method, found, False, tagged)
            texts[params[-1]] = route  # type: ignore[index]
            if not tagged:
                heights = routes.heights.get(key)
                if heights is None:
                    heights = routes.heights[key] = {}
                heights[params[-1]] = route  # type: ignore[index]
        return method, found, True, tagged

    def _single(
        self,
        chain: str,
        pool: Pool,
        routes: PoolRoutes,
        item: Any,
        headers: Headers,
        started: float,
    ) -> bytes | None:
        """The answer of one request object, booked; or None. The common single (a block
        text seen before with as many params: its kept route, `PoolRoutes.seen`) is routed
        here without `_item`, with no pick when one node is the candidate, and the node's
        state checked inline as `_path` does (bench/README.md "Issues 14/15, session 9")."""
        try:  # (no type checks first: a try costs nothing until it raises)
            params = item["params"]
            routed = routes.seen[(item["method"], len(params))][params[-1]]
        except (KeyError, TypeError, IndexError):  # not seen, or not such an item: `_item`
            routed = self._item(pool, routes, item)
            if routed is None:
                return None
        else:
            # A kept route is taken for what its key matches, whatever the types (params a
            # text as long, say): its params are left for the node to check (`checked` is
            # False), which declines or answers an error, and the body goes to the engine.
            rid = item.get("id")  # None: a notification (or a null id), the engine's
            if type(rid) is not int and type(rid) is not str:
                return None
        method, nodes, checked, _ = routed
        node = nodes[0] if len(nodes) == 1 else self.engine.chooser.kept(nodes)
        # `_path`, inline; `healthy` need not be read (a property, ~0.1 µs): a change of it
        # starts the pool's routes afresh (`RouteCache.routes`), and candidates are healthy nodes
        breaker = node.breaker
        if node.fails or breaker.failures or breaker.state is not CLOSED:
            return None
        path = routes.paths.get(node)  # type: ignore[union-attr]
        if path is None:
            return None
        errors: list[int] = []  # (the node tells which answers are errors)
        t0 = perf_counter()
        try:
            # the item is a dict (`answer`'s `payload`) of `method`, a text, with an int or
            # string id (checked above or in `_item`): the node's path for checked items,
            # when it has one, skips its own checks of those (~2k instructions less)
            got = path[0]([item], errors) if path[2] is None else path[2](method, [item], errors)
        except Exception:  # the engine sends it again and counts the failure
            return None
        elapsed = perf_counter() - t0
        if got is None or (errors and (not checked or _retried(got, errors))):
            return None  # the engine's: params only the node checked, or retried elsewhere
        if errors:
            self._public([item], got, errors)
        out = orjson.dumps(got[0])
        if len(out) > self.max_answer:
            return None  # the engine answers it as too large: nothing was counted yet
        if not errors:  # (the node's own count, `items_answered`, folded in by the books)
            self.books.single(chain, pool, node, path[1], method, elapsed, perf_counter() - started)
        else:
            self._book(chain, pool, [(node, path, method, [item], [0], elapsed, method)])
            self.books.request(chain, "single", perf_counter() - started)
        client = headers.raw.get(b"client-id")  # (`get`, its call and decode: ~1k more)
        if client:
            self.engine.metrics.client(client.decode("latin-1"))
        return out  # (bytes: the lean server's 200, no status tuple to build and unpack)

    def _batch(self, pool: Pool, routes: PoolRoutes, items: list[Any]) -> Answered | None:
        """The answers of a batch in its order and their books, or None."""
        if routes.one is not None:
            keyed = self._keyed(pool, routes, items)
            if keyed is not _GENERAL:
                return keyed  # type: ignore[no-any-return]
        seen = _seen_all(routes, items)
        if seen is not None:
            rest = len(seen) - seen.count(seen[0])
            if rest:  # several routes: two on one node in process are counted, not grouped
                tally = self._tally(routes, seen, rest)
                if tally is not None:
                    return self._shared(tally, items, seen[0][0])
        return self._grouped(pool, routes, items, seen)

    def _keyed(self, pool: Pool, routes: PoolRoutes, items: list[Any]) -> Any:
        """`_batch` when every reader is one node in process (`routes.one`) and the first
        item's method and number of params have kept routes: the node checks the items while
        it answers them and gives each one's kept route (`AnswerKeyed`), in the loop it
        makes anyway, instead of `_seen_all`'s six passes before the call (~30k
        instructions of a 10-item batch, bench/README.md "Issue 15, session 12"). Then the
        same choice as `_batch`'s from those routes: one route, one pick; two, `_tally`;
        else `_grouped`, which calls the node again (these answers are dropped, nothing was
        counted). The answers or None as `_batch`; _GENERAL when an item is not such (a
        block text not seen yet, another method, …; or the node declines): `_batch`'s own
        path decides then."""
        for node in routes.readers:  # (`_path`'s checks: a node that failed lately is not
            breaker = node.breaker  # called here, whichever entry the picks would take)
            if node.fails or breaker.failures or breaker.state is not CLOSED:
                return _GENERAL
        first = items[0]
        try:
            method = first["method"]
            size = len(first["params"])
            texts = routes.heights[(method, size)]
        except (KeyError, TypeError):  # (not a dict, no params, no kept route, unhashable)
            return _GENERAL
        seen: list[Any] = []
        errors: list[int] = []  # (the node tells which answers are errors)
        t0 = perf_counter()
        try:
            got = routes.one[3](method, size, texts, items, errors, seen)
        except Exception:  # the engine sends it again and counts the failure
            return None
        elapsed = perf_counter() - t0
        if got is None:
            return _GENERAL
        if errors:
            return None  # (params only the node checked: the engine's, as `_batch`'s)
        route = seen[0]
        rest = len(seen) - seen.count(route)
        if rest:  # several routes: two on one node in process are counted, not grouped
            tally = self._tally(routes, seen, rest)
            if tally is None:
                return self._grouped(pool, routes, items, seen)
            return got, (method, elapsed, tally)
        node = self.engine.chooser.kept(route[1])  # one route: one pick (`_route`)
        path = self._path(routes, node)
        if path is None:
            return None
        return got, [(node, path, BATCH, items, errors, elapsed, method)]

    def _grouped(
        self, pool: Pool, routes: PoolRoutes, items: list[Any], seen: list[Any] | None
    ) -> Answered | None:
        """`_batch`'s answers from `_route`'s groups (`seen`: `_seen_all`'s routes or None)."""
        routed = self._route(pool, routes, items, seen)
        if routed is None:
            return None
        groups, checked, tagged, method = routed
        if len(groups) > 1:
            if tagged and self.engine.reads is not None:
                return None  # `latest` on several nodes: the engine pins one head (docs/proxy.md)
            if _one_path(groups):
                return self._shared(_counts(groups), items, method, groups)
        answers: list[Any] = [None] * len(items)
        done: list[Attempt] = []
        for node, path, positions in groups:
            sent = items if len(groups) == 1 else [items[i] for i in positions]
            errors: list[int] = []  # (the node tells which answers are errors)
            t0 = time.perf_counter()
            try:
                got = _answer(path, sent, errors, method)
            except Exception:  # the engine sends it again and counts the failure
                return None
            elapsed = time.perf_counter() - t0
            if got is None or (errors and (not checked or _retried(got, errors))):
                return None  # (an item whose params the node alone checked: the engine's)
            if errors:
                self._public(sent, got, errors)
            done.append((node, path, BATCH, sent, errors, elapsed, method))
            if len(groups) == 1:
                answers = got  # type: ignore[assignment]
            else:
                for i, answer in zip(positions, got, strict=True):  # type: ignore[arg-type]
                    answers[i] = answer
        return answers, done

    def _shared(
        self,
        counted: list[Counted],
        items: list[Any],
        method: str | None,
        groups: list[Group] | None = None,
    ) -> Answered | None:
        """The answers of a batch whose groups were picked on node entries that share one
        synchronous path (one node entered under several kinds, e.g. as a state and an
        archive node): one call for every item, in the client's order, instead of one per
        group and a merge. Booked as the engine books its calls, one attempt per group
        (`counted`: each group's node, path and number of items), each with the group's
        share (by items) of the call's time. `groups` (their positions) are needed when the
        items have several methods (`method` None), for the count per method. An error
        answer leaves the body to the engine (nothing is counted yet): the groups' books
        would need each error's group."""
        path = counted[0][1]
        errors: list[int] = []
        t0 = perf_counter()
        try:
            got = _answer(path, items, errors, method)
        except Exception:  # the engine sends it again and counts the failure
            return None
        elapsed = perf_counter() - t0
        if got is None or errors:
            return None
        if method is not None:  # (each group's count is all the books need: `_book`)
            return got, (method, elapsed, counted)
        share = elapsed / len(items)
        done: list[Attempt] = []
        for node, own, positions in groups or ():
            sent = [items[i] for i in positions]
            done.append((node, own, BATCH, sent, [], share * len(positions), method))
        return got, done

    def _tally(self, routes: PoolRoutes, seen: list[Any], rest: int) -> list[Counted] | None:
        """The two groups of a batch of one method whose items have exactly two kept routes
        (`_seen_all`; `rest` items not on the first item's route), counted with C loops
        instead of `_group`'s item-by-item positions (no dict: they cost more than the loop
        they save). One pick per candidate list in the order they come (as `_group`): one
        group when both picks are one node; None unless the two nodes picked are two entries
        answering through one synchronous path (then `_shared` makes one call and needs
        only each group's count) and neither route reads at a tag when the proxy pins heads:
        then `_group` and `_batch` decide."""
        first = seen[0]
        second = next(filter(first.__ne__, seen))  # (C compares; routes are shared objects)
        if seen.count(second) != rest:  # a third route
            return None
        if (first[3] or second[3]) and self.engine.reads is not None:
            return None  # a tag on two nodes: the engine pins one head (docs/proxy.md)
        if first[1] is second[1]:
            return None  # one candidate list, one pick: one group
        pick = self.engine.chooser.kept
        a, b = pick(first[1]), pick(second[1])
        one = self._path(routes, a)
        if one is None:
            return None
        if a is b:  # both lists picked one node: one group, one attempt (as `_batch`'s)
            return [(a, one, len(seen))]
        two = self._path(routes, b)
        if two is None or one[0] is not two[0] or one[1] is not two[1]:
            return None  # (nodes in process that are not one: `_group` picks again)
        return [(a, one, len(seen) - rest), (b, two, rest)]

    def _book(self, chain: str, pool: Pool, done: list[Attempt]) -> None:
        """The books of answers kept (none before: a body the engine answers after all is
        counted by the engine alone): the attempts, the requests per method and outcome,
        and the node's own count of what it answered. (`_shared`'s one call of one method
        is booked by `InprocBooks.shared` in `answer`, with the request.)"""
        request = self.engine.metrics.request
        for node, path, lkey, sent, errors, elapsed, method in done:
            self.books.attempt(chain, pool, node, lkey, elapsed)
            if method is not None and not errors:  # one method, no error: one count
                request(chain, method, node.key, "ok", len(sent))
            else:
                self._count(chain, node, sent, errors)
            if path[1] is not None:
                path[1]([elapsed])  # the node's own count (`items_answered`)

    def _count(self, chain: str, node: Node, sent: list[Any], errors: list[int]) -> None:
        """The requests `node` answered, per method and outcome."""
        request = self.engine.metrics.request
        counts: dict[tuple[str, str], int] = {}
        failed = set(errors)
        for i, item in enumerate(sent):
            key = (item["method"], "error" if i in failed else "ok")
            counts[key] = counts.get(key, 0) + 1
        for (name, outcome), n in counts.items():
            request(chain, name, node.key, outcome, n)

    def _route(
        self, pool: Pool, routes: PoolRoutes, items: list[Any], seen: list[Any] | None = None
    ) -> tuple[list[Group], bool, bool, str | None] | None:
        """Steps 1-3 for every item of a batch, as the engine's first attempt makes them:
        the groups of items per chosen node (one pick per candidate list, as the engine's
        batches do), whether every item's params were checked here, whether an item reads
        at a tag, and the method of every item (None: several); or None when the body is
        not for this path. The common batch (every block text seen before, one route for
        all: one method, one range of heights) is routed without a Python step per item."""
        routed = seen  # (`_seen_all`'s, found by the caller; None: item by item)
        if routed is None:
            routed = []
            item_route = self._item
            for item in items:
                one = item_route(pool, routes, item)
                if one is None:
                    return None
                routed.append(one)
        first = routed[0]
        if routed.count(first) == len(routed):  # one route for every item: one pick
            method, nodes, checked, tagged = first
            node = self.engine.chooser.kept(nodes)
            path = self._path(routes, node)
            if path is None:
                return None
            return [(node, path, list(range(len(items))))], checked, tagged, method
        return self._group(routes, routed)

    def _group(
        self, routes: PoolRoutes, routed: list[tuple[str, list[Node], bool, bool]]
    ) -> tuple[list[Group], bool, bool, str | None] | None:
        """`_route`'s answer for items of several routes, item by item."""
        pick = self.engine.chooser.kept
        # id of a candidate list → (the list, kept alive while its id is a key; the positions
        # of the group of the node picked from it)
        picked: dict[int, tuple[list[Node], list[int]]] = {}
        groups: dict[Node, Group] = {}
        checked, tagged, first, mixed = True, False, None, False
        last: list[Node] | None = None  # the candidates of the item before
        before: Any = None  # the route of the item before (seen routes are shared objects)
        positions: list[int] = []  # the positions of the group picked from `last`
        for pos, one in enumerate(routed):
            if one is before:
                positions.append(pos)
                continue
            before = one
            method, nodes, params_checked, at_tag = one
            if method != first:
                if first is None:
                    first = method
                else:
                    mixed = True
            if not params_checked:
                checked = False
            if at_tag:
                tagged = True
            if nodes is not last:  # (items of one range in a row: one lookup for them)
                slot = picked.get(id(nodes))
                if slot is None:
                    node = pick(nodes)
                    group = groups.get(node)
                    if group is None:
                        path = self._path(routes, node)
                        if path is None:
                            return None
                        group = groups[node] = (node, path, [])
                    slot = picked[id(nodes)] = (nodes, group[2])
                last, positions = nodes, slot[1]
            positions.append(pos)
        return list(groups.values()), checked, tagged, None if mixed else first

    def _target(self, method: str, params: Any) -> tuple[MethodSpec, BlockRef | None] | None:
        """Step 1 for one item: (spec, block ref) of a read with valid params. The rest of
        the envelope (`jsonrpc`, the params' type) is checked once, by the node: it declines
        an item that fails (`answer_items` gives None), and the engine answers the body."""
        try:
            spec, ref = self.engine.methods.target(method, params)
        except (JsonRpcError, LocalMethod):  # LocalMethod: filters, the engine diverts them
            return None
        # (the Leader, `full` nodes and the Leader after a reader: the engine's)
        return None if spec.writer or spec.trie or spec.mempool else (spec, ref)

    def _public(self, items: list[Any], answers: list[Any], errors: list[int]) -> None:
        """The error answers (at `errors`) to `items` as a client of the standard API sees
        them (proxy/face.py). Final errors only: retried ones went to the engine."""
        specs = self.engine.methods.specs
        for i in errors:
            spec = specs.get(items[i].get("method"))
            if spec is not None:
                public(spec, answers[i])

    @staticmethod
    def _path(routes: PoolRoutes, node: Node) -> Path | None:
        """The node's synchronous path, when it has one and nothing about it needs the
        engine's books: not failed lately, its breaker closed with no failure counted."""
        breaker = node.breaker
        if node.fails or not node.healthy or breaker.failures or breaker.state is not CLOSED:
            return None
        return routes.paths.get(node)  # type: ignore[union-attr]


_METHOD, _PARAMS, _ID, _LAST = (
    itemgetter("method"),
    itemgetter("params"),
    itemgetter("id"),
    itemgetter(-1),
)
_ID_TYPES = frozenset((int, str))
_GENERAL: Any = object()  # `_keyed`: not for it, `_batch`'s own path decides


def _seen_all(routes: PoolRoutes, items: list[Any]) -> list[Any] | None:
    """The kept route (`PoolRoutes.seen`) of every item of a batch of one method and one
    number of params, looked up with C loops (no Python step per item); None when the
    items are not all such request objects with an int or string id and a block text seen
    before: then `_item` takes each item."""
    try:
        methods = set(map(_METHOD, items))
        params = list(map(_PARAMS, items))
        sizes = set(map(len, params))
        if len(methods) != 1 or len(sizes) != 1:
            return None
        texts = routes.seen.get((methods.pop(), sizes.pop()))
        if texts is None:
            return None
        hits = list(map(texts.__getitem__, map(_LAST, params)))  # (a text not seen: KeyError)
        if not set(map(type, map(_ID, items))) <= _ID_TYPES:
            return None
    except (KeyError, TypeError, IndexError):  # (not a dict, no id, no params, unhashable)
        return None
    return hits


# Methods whose answer is about the head the engine pins per request (proxy/reads.py)
HEADLESS = frozenset(("eth_blockNumber", "getLatestBlock"))
_PINNED_TAGS = frozenset(("latest", "safe", "finalized"))


def _pinned(method: str, ref: BlockRef | None) -> bool:
    """Whether the engine pins the item's block per request: `latest` (a block param left
    out too), `safe`, `finalized`, and the methods answered about the head. Answered here,
    such an item would be read at the node's own head, which may be above or below the one
    the proxy answered before (`latest` never goes backwards: proxy/heads.py)."""
    if ref is None:
        return method in HEADLESS
    return ref.tag in _PINNED_TAGS


def _one_path(groups: list[Group]) -> bool:
    """Whether every group's node answers through the same synchronous path (the same
    in-process node under several entries)."""
    first = groups[0][1]
    return all(path[0] is first[0] and path[1] is first[1] for _, path, _ in groups)


def _counts(groups: list[Group]) -> list[Counted]:
    """Each group's node, path and number of items (`InprocPath._shared`'s books)."""
    return [(node, path, len(positions)) for node, path, positions in groups]


def _answer(path: Path, items: list[Any], errors: list[int], method: str | None) -> Any:
    """The node's answers to `items` (a batch's, or a group's), through its path for checked
    items when they have one method (`method`): every item of a batch answered here is a
    request object with an int or string id (`_seen_all`, `_item`), so the node need not check
    that again nor look the method up per item (~5 µs of a 10-item batch; bench/README.md
    "Issues 14/15, session 10"). Items of several methods: its path for parsed items."""
    checked = path[2]
    if method is None or checked is None:
        return path[0](items, errors)
    return checked(method, items, errors)


def _retried(answers: list[Any], errors: list[int]) -> bool:
    """Whether an error answer (at the positions `errors`) has a code the engine retries on
    another node, or is no JSON-RPC error object: the engine's then."""
    for i in errors:
        error = answers[i].get("error")
        if type(error) is not dict or error.get("code") in RETRYABLE_CODES:
            return True
    return False

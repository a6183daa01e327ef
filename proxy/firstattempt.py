"""The first attempt of a single request, run synchronously from the data listener's
callback until a step needs to wait.

At c=1 every µs before the request reaches the node is the client's, so a request object is
parsed, checked, planned and chosen for here without a task, and its first attempt goes
through the node's transport now when the transport can take it now:

- an in-process node answers a plain read synchronously (`_now`): the answer is classified,
  written and booked right here;
- a plain-http node with an idle connection is written to now, and, for a plain read whose
  route is kept (proxy/kept.py), before any of the request's objects is made (they are made
  after the write); its answer comes to a callback that classifies it and answers the client
  from there;
- an in-process node's future of parsed items (`Attempts.send_now`) the same way.

An answer that needs another attempt (or none came in time) goes on in a task, in the
retry loop from the round reached (proxy/rounds.py). Anything else is handed to
`Pipeline.run` as a coroutine.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from time import perf_counter
from typing import Any

import orjson

from chainstate.httpserver import Headers, Request
from chainstate.inproc import is_inproc
from proxy.attempts import Attempts, Landed
from proxy.books import access_log
from proxy.breaker import CLOSED
from proxy.face import public as face_public
from proxy.inprocbooks import InprocBooks, Took
from proxy.kept import CALL, KeptRoutes, retried, too_large
from proxy.methods import LocalMethod
from proxy.model import Node, Pool
from proxy.outcome import UpstreamError
from proxy.parse import MIN_BLOCK
from proxy.pipeline import Pipeline
from proxy.request import Admitted, Answer, Ctx, Group, Item
from proxy.routes import KeptRoute, PoolRoutes
from proxy.select import NoEligibleNode
from proxy.transport import HttpTransport

_MIN_BLOCK = MIN_BLOCK.encode()  # (the header's key in `Headers.raw`)
_INFO = logging.INFO  # (an answer made now keeps no access log line: the general steps do)
# The rest of a request as a coroutine, from `Pipeline.run` (chain id, body, headers,
# admitted, early): the handler of bodies the synchronous start does not take.
Run = Callable[..., Awaitable[Answer]]


class FirstAttempt:
    def __init__(
        self,
        pipeline: Pipeline,
        kept: KeptRoutes,
        attempts: Attempts,
        books: InprocBooks,
        max_answer: int,
        admit: Callable[[str, tuple[str, Pool] | None], Admitted | Answer],
        leave: Callable[[Pool], None],
        run: Run,
    ) -> None:
        self.pipeline = pipeline
        self.kept = kept
        self.chooser = kept.chooser
        self.attempts = attempts
        self.upstream = kept.upstream
        self.transports = kept.upstream.transports  # node URL → its transport, once made
        self.pools = kept.cache.kept  # pool id → its routes (`KeptRoutes.routes`)
        self.registry = kept.cache.registry
        self.budget = kept.upstream.budget  # answer bytes held by the process
        self.reads = kept.reads
        self.books = books  # the books of answers an in-process node gave now
        # (0 in the settings: no limit, here the largest size, so one compare decides)
        self.max_answer = max_answer or sys.maxsize
        self.admit = admit  # a place among the pool's requests in flight (proxy/admission.py)
        self.leave = leave  # the request is no longer in flight
        self.run = run  # the whole pipeline as a coroutine, for a body not taken here

    def start(
        self,
        chain_id: str,
        found: tuple[str, Pool] | None,
        payload: dict[str, Any],
        request: Request,
        started: float,
        tally: Any = None,
    ) -> Answer | Awaitable[Answer] | bytes | None:
        """A request object's steps (`payload`: its body parsed), from parse on: its answer
        now (bytes: a 200), None when its first attempt went out (the answer then goes to
        `request.answer_early`, or a task given to `request.answer_later`), or the rest of
        its steps as a coroutine. `tally`: the client's usage tally (`Ctx.tally`), if any."""
        route = node = None
        pipeline = self.pipeline
        if found is not None:
            chain, pool = found
            kept = self.kept
            # The pool's routes (`KeptRoutes.routes`' check of the kept ones, inline)
            routes = self.pools.get(pool.id)
            registry = self.registry
            if (
                routes is None
                or routes.readers is not pool.readers
                or (registry is not None and routes.version != registry.version)
                or routes.changes is None
                or routes.changes[0] != routes.changes_at
            ):
                routes = kept.routes(pool)
            if not pool.mirrors:
                # Steps 1-3 by the request's kept route (`KeptRoutes.single`, inline: a call
                # less per request): its block text looked up, the node picked.
                try:  # (subscripts: a try costs nothing until it raises)
                    params = payload["params"]
                    route = routes.kept[(payload["method"], len(params))][params[-1]]
                except (KeyError, TypeError, IndexError):  # not kept yet, or no plain read
                    route = kept.learn(pool, routes, payload)
                else:
                    rid = payload.get("id")
                    if type(rid) is not int and type(rid) is not str:
                        route = None  # (a notification, a null or float id: the general's)
                if route is not None:
                    nodes = route.nodes
                    if len(nodes) == 1:
                        node = nodes[0]
                        if node.budget.rate:  # (`Selector.pick` takes it when it chooses)
                            node.budget.spend()
                    else:
                        node = self.chooser.kept(nodes)
                paths = routes.paths
                if paths is None:
                    paths = kept.paths(routes)
                budget = self.budget  # (over it, admission answers 503: no answer made now)
                if (
                    paths
                    and not access_log.isEnabledFor(_INFO)
                    and (budget is None or budget.used <= budget.limit)
                ):  # a node in process
                    headers = request.headers
                    out = self._inproc(chain, pool, routes, route, node, payload, headers, started)
                    if out is not None:
                        return out
            if route is not None and not self._checked(pool, route, payload):
                route = node = None
        admitted = self.admit(chain_id, found)
        if type(admitted) is tuple:
            return admitted
        body, headers = request.body, request.headers
        chosen = None
        if route is not None:
            # Step 4 now when the node's transport can take it now: an idle plain-http
            # connection (`_connection`, inline), no hedge or attempt timeout due.
            taken = None
            if node.breaker.state is CLOSED:  # type: ignore[union-attr]
                if len(route.nodes) > 1:
                    taken = self.attempts.connection_now(
                        admitted.pool,
                        node,  # type: ignore[arg-type]
                        route.method,
                        route.nodes,
                    )
                else:  # one candidate: no race due until it is late (`Attempts.sent_now`)
                    transport = self.transports.get(node.entry.url)  # type: ignore[union-attr]
                    if type(transport) is HttpTransport:
                        conn = transport.pool.take()
                        taken = None if conn is None else (transport.pool, conn)
            if taken is not None:  # written: the request's objects come after the write
                taken[1].transport.write(taken[0].request(body))
                # (the attempt's clock starts once the node has the bytes: at c=1 a clock
                # read before the write is the client's wait, and the write is not the node's)
                sent = time.perf_counter()
                # The request's objects as `_first` makes them, and the answer's wait
                # (`Attempts.sent_now`): made here, a call less per request.
                ctx = Ctx(admitted.chain, admitted.pool, request.answer_early, tally)
                method = route.method
                ctx.methods.append(method)
                item = Item(0, payload, payload["id"], method, route.spec, route.ref, False)
                item.tried.append(node)  # type: ignore[arg-type]
                group = Group(node, [item], route.nodes, method)  # type: ignore[arg-type]
                landed = _Then(self, ctx, item, body, [None], started, request)
                self.attempts.sent_now(ctx, group, taken, sent, landed, body)
                client = headers.raw.get(b"client-id")  # (no `get` call, no decode)
                if client:
                    pipeline.metrics.client(client.decode("latin-1"))
                return None
            chosen = node  # (picked already: the general steps go on with it)
        elif headers.raw.get(_MIN_BLOCK) is not None:  # (checked and kept by `Pipeline.run`)
            return self.run(chain_id, body, headers, admitted, request.answer_early, tally=tally)
        ctx = Ctx(admitted.chain, admitted.pool, request.answer_early, tally)
        try:
            first = pipeline.item(ctx, payload, body)
        except LocalMethod:  # raised only once a divert handler is set
            first = self._diverted(ctx, body, headers)  # type: ignore[assignment]
        except BaseException:
            self._leave(ctx)
            raise
        if type(first) is tuple:  # answered at once: invalid, or a ready result
            result = self._done(ctx, first, started, headers)
            if first[0] == 200 and first[1]:
                result = first[1]  # (a 200's bytes: the server writes them with no render call)
        elif type(first) is Item:
            result = self._first(ctx, first, body, started, request, chosen)
        else:
            result = first  # type: ignore[assignment]
        # Counted once the node has the request (at c=1 every µs before the write is the
        # client's): the same count as `Pipeline.run` makes first.
        client = headers.raw.get(b"client-id")  # (no `get` call, no decode)
        if client:
            pipeline.metrics.client(client.decode("latin-1"))
        return result

    def _inproc(
        self,
        chain: str,
        pool: Pool,
        routes: PoolRoutes,
        route: KeptRoute | None,
        node: Node | None,
        payload: dict[str, Any],
        headers: Headers,
        started: float,
    ) -> bytes | None:
        """Steps 3-7 for a plain read an in-process node answers synchronously (its
        transport finishes synchronously): its answer, booked; or None, nothing counted
        (the general steps take the body). `route`, `node`: its kept route and the node
        picked, if it has one (else a route is made for it: a block hash, a blockCtx...).
        Not admitted: nothing waits between taking a place among the pool's requests in
        flight and giving it back, so the limit would protect nothing."""
        kept = self.kept
        if route is None:
            route = kept.item(pool, routes, payload)
            if route is None:
                return None
            node = self.chooser.kept(route.nodes)
        method = route.method
        if method == CALL:
            return None  # (no plain read: the node answers it as a future)
        # `KeptRoutes.usable`, inline: no failure lately, the breaker closed with none counted
        breaker = node.breaker  # type: ignore[union-attr]
        if node.fails or breaker.failures or breaker.state is not CLOSED:  # type: ignore[union-attr]
            return None
        path = routes.paths.get(node)  # type: ignore[union-attr, arg-type]
        if path is None:
            return None
        errors: list[int] = []  # (the node tells which answers are errors)
        t0 = perf_counter()
        try:
            # the item is a dict of `method` with an int or string id: the node's path for
            # checked items skips its own checks of those (`NodePath.answer`, inline)
            checked = path.checked
            if checked is None:
                got = path.items([payload], errors)
            else:
                got = checked(method, [payload], errors)
        except Exception:  # the general steps send it again and count the failure
            return None
        elapsed = perf_counter() - t0
        if got is None or (errors and (not route.checked or retried(got, errors))):
            return None  # the general steps': params only the node checked, or a retry
        if errors:
            face_public(route.spec, got[0])
        out = orjson.dumps(got[0])
        if len(out) > self.max_answer:  # final (every node would make the same): not asked again
            return too_large(payload, len(out), self.max_answer)
        seconds = perf_counter() - started
        if not errors:  # (the node's own count, `items_answered`, folded in by the books)
            self.books.single(chain, pool, node, path.answered, method, elapsed, seconds)  # type: ignore[arg-type]
        else:
            self.books.took(
                chain, pool, [Took(node, path, method, [payload], [0], elapsed, method)]
            )  # type: ignore[arg-type]
            self.books.request(chain, "single", seconds)
        client = headers.raw.get(b"client-id")  # (no `get` call, no decode)
        if client:
            self.pipeline.metrics.client(client.decode("latin-1"))
        return out

    def _checked(self, pool: Pool, route: KeptRoute, payload: dict[str, Any]) -> bool:
        """Whether a request object taking its kept route (found by its block text alone)
        is a valid one for a node that checks nothing (its other params pass the method
        table's checks), and one the read path leaves as it is (no hash known for its
        height: else it is pinned by hash and maybe cached)."""
        if payload.get("jsonrpc") != "2.0":
            return False
        params = payload["params"]
        try:
            for index, check, name in route.checks:
                check(params[index] if index < len(params) else None, name)
        except Exception:  # the general steps answer it (the same error)
            return False
        height = route.height
        if height is not None:
            view = self.reads.heads.views.get(pool.id)  # type: ignore[union-attr]
            return view is None or view.hashes.get(height) is None
        return True

    def _first(
        self,
        ctx: Ctx,
        item: Item,
        body: bytes,
        started: float,
        request: Request,
        chosen: Node | None = None,
    ) -> Answer | Awaitable[Answer] | None:
        """Steps 3-4 of a checked request object: its node chosen and its first attempt
        sent now (None), when nothing needs a task; else the rest of the steps as a
        coroutine (or the answer, when no node is eligible). An item the read path planned
        goes the same way in a pool with in-process readers when it waits for no identical
        read: it is sent pinned as planned, and its answer lands in the read path. (Over HTTP
        alone, planned items keep the task: choosing them at once moved the weighted shares,
        tests/proxy/test_failsafe.py.) `chosen`: the node picked for its kept route."""
        plan = item.plan
        pipeline = self.pipeline
        if ctx.early is None or (
            plan is not None and (plan.flight is not None or not _has_inproc(ctx.pool))
        ):
            return self._finish(ctx, pipeline.sent(ctx, item, body), started, request.headers)
        answers: list[Any] = [None]
        pinned = False
        if plan is not None:  # what `ReadPath.follow` does for an item that leads its read
            sent = item.obj
            item.obj, item.ref = plan.obj, plan.ref
            pinned = plan.obj is not sent
        group = self.chooser.first_group(ctx, item, chosen)
        if type(group) is NoEligibleNode:  # answered as the rounds give it up
            pipeline.answers.give_up(ctx, item, answers, group)
            answer = pipeline.answers.single(ctx, item, body, None, answers)
            self._land(item, None, answers)
            return self._done(ctx, answer, started, request.headers)
        assert type(group) is Group
        if pinned:  # written only for a node that takes bytes (in process: the objects)
            written = None
            if not is_inproc(group.node.entry.url):
                written = pipeline.pinned_body(ctx, item, answers)
                if type(written) is tuple:
                    return self._done(ctx, written, started, request.headers)
            body = written  # type: ignore[assignment]  (None: another attempt, a sub-batch)
        landed = _Then(self, ctx, item, body, answers, started, request)
        if self.attempts.send_now(ctx, group, body, landed):
            return None
        resumed = self._resume(ctx, item, body, answers, 1, [item], {group.node: group})
        return self._finish(ctx, resumed, started, request.headers)

    def _land(self, item: Item, out: bytes | None, answers: list[Any]) -> None:
        """A planned item's final answer handed to the read path."""
        readpath = self.pipeline.readpath
        if readpath is not None:
            readpath.land(item, out, answers)

    async def _resume(
        self,
        ctx: Ctx,
        item: Item,
        body: bytes,
        answers: list[Any],
        attempt: int,
        pending: list[Item],
        chosen: dict[Node, Group] | None = None,
    ) -> tuple[int, bytes]:
        """The rounds of a single request from `attempt` on, and its answer."""
        pipeline = self.pipeline
        route = pipeline.rounds.route if item.plan is None else pipeline.readpath.route  # type: ignore[union-attr]
        out = await route(ctx, pending, body, answers, True, attempt, chosen)
        return pipeline.answers.single(ctx, item, body, out, answers)

    async def _finish(
        self, ctx: Ctx, step: Awaitable[tuple[int, bytes]], started: float, headers: Any
    ) -> Answer:
        """The rest of a request this start began, in a task: its answer, then its books."""
        try:
            answer = await step
        except BaseException:
            self._leave(ctx)
            raise
        return self._done(ctx, answer, started, headers)

    async def _diverted(self, ctx: Ctx, body: bytes, headers: Mapping[str, str]) -> Answer:
        try:
            return await self.pipeline.divert(ctx.pool.id, body, headers)  # type: ignore[misc]
        finally:
            self._leave(ctx)

    def _done(
        self, ctx: Ctx, answer: tuple[int, bytes], started: float, headers: Mapping[str, str]
    ) -> tuple[int, bytes]:
        if ctx.reserved:  # (`_leave` and `Pipeline.release`, inline)
            self.budget.release(ctx)  # type: ignore[union-attr]
        self.leave(ctx.pool)
        return self.pipeline.books.close(ctx, "single", 1, answer, started, headers)

    def _leave(self, ctx: Ctx) -> None:
        """The request is no longer in flight (what `Engine.handle` does on its way out)."""
        if ctx.reserved:
            self.pipeline.release(ctx)
        self.leave(ctx.pool)


class _Then(Landed):
    """What a first attempt sent now does with its outcome after the attempt's books
    (`then`): the answer and the books, or the rest of the steps in a task given to the
    request's `answer_later`. The attempt's books (`Landed`) are kept in the same object:
    one object per first attempt, and no bound method of another between the two."""

    __slots__ = ("answers", "began", "body", "first", "item", "request")

    def __init__(
        self,
        first: FirstAttempt,
        ctx: Ctx,
        item: Item,
        body: bytes,
        answers: list[Any],
        began: float,
        request: Request,
    ) -> None:
        self.first = first
        self.ctx = ctx
        self.item = item
        self.body = body
        self.answers = answers
        self.began = began  # the request's start (`Landed.started`: the attempt's)
        self.request = request  # (its headers and `answer_later` read only when needed)

    def then(self, node: Node, raw: bytes | None, exc: UpstreamError | None) -> None:
        first, ctx, item, answers = self.first, self.ctx, self.item, self.answers
        pipeline = first.pipeline
        try:  # step 5: the answer, or the rest of the steps (another attempt) as a coroutine
            if raw is None and exc is None:  # not sent after all (a closed idle connection)
                step = first._resume(ctx, item, self.body, answers, 1, [item], {node: self.group})
            else:
                classifier = pipeline.rounds.classifier
                if exc is not None:
                    pending, out = classifier.failed(ctx, [item], exc, answers), None
                else:
                    pending, out = classifier.raw(ctx, self.group, node, raw, answers, True)
                if pending:
                    step = first._resume(ctx, item, self.body, answers, 2, pending)
                else:
                    if item.plan is not None:  # (an item the read path left alone: nothing to land)
                        first._land(item, out, answers)
                    step = pipeline.answers.single(ctx, item, self.body, out, answers)
        except Exception as error:  # answered as a failed handler's task is
            first._land(item, None, answers)
            step = _reraise(error)
        if type(step) is not tuple:
            request = self.request
            request.answer_later(first._finish(ctx, step, self.began, request.headers))  # type: ignore[arg-type]
            return
        respond = ctx.early  # None when written from the node connection's callback
        ctx.early = None
        result = first._done(ctx, step, self.began, self.request.headers)  # type: ignore[arg-type]
        if respond is not None:
            respond(result)


async def _reraise(error: Exception) -> Any:
    raise error


def _has_inproc(pool: Pool) -> bool:
    """Whether a reader of `pool` is a node in this process (`inproc://`)."""
    return any(is_inproc(node.entry.url) for node in pool.readers)

"""The pipeline's steps for a single request, run synchronously from the data listener's
callback until one needs to wait.

At c=1 every µs before the request is written to the node is the client's, so a request
object is parsed, checked, planned and chosen for here without a task, and its first attempt
is sent now when the node's transport can take it now (`Attempts.send_now`: an idle
plain-http connection, or an in-process node's future; nothing to hedge or time out early;
nothing the read path waits for). The node's answer then comes to a callback that classifies
it and answers the client from there; an answer that needs another attempt (or none came in
time) goes on in a task, in the retry loop from the round reached (proxy/rounds.py). A plain
read whose route is kept (`kept_route`) is written before any of the request's objects is
made: they are made after the write. Anything else is handed to `Pipeline.run` as a
coroutine.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson

from chainstate.inproc import is_inproc
from proxy.attempts import Attempts
from proxy.breaker import CLOSED
from proxy.choose import Chooser
from proxy.methods import LocalMethod, MethodTable
from proxy.model import Node, Pool
from proxy.outcome import UpstreamError
from proxy.parse import MIN_BLOCK
from proxy.pipeline import Pipeline
from proxy.reads import Reads
from proxy.request import Admitted, Answer, Ctx, Group, Item
from proxy.routes import MAX_ROUTES, UNCACHED, PoolRoutes, QuickRoute, RouteCache
from proxy.select import NoEligibleNode
from proxy.upstream import Upstream

# The rest of a request as a coroutine, from `Pipeline.run` (chain id, body, headers,
# admitted, early): the handler of bodies the synchronous start does not take.
Run = Callable[..., Awaitable[Answer]]


class FirstAttempt:
    def __init__(
        self,
        pipeline: Pipeline,
        chooser: Chooser,
        attempts: Attempts,
        routes: RouteCache,
        methods: MethodTable,
        reads: Reads | None,
        upstream: Upstream,
        leave: Callable[[Pool], None],
        run: Run,
    ) -> None:
        self.pipeline = pipeline
        self.chooser = chooser
        self.attempts = attempts
        self.routes = routes
        self.methods = methods
        self.reads = reads
        self.upstream = upstream
        self.leave = leave  # the request is no longer in flight (proxy/admission.py)
        self.run = run  # the whole pipeline as a coroutine, for a body not taken here

    def start(
        self,
        chain_id: str,
        body: bytes,
        payload: Any,
        headers: Mapping[str, str],
        admitted: Admitted,
        answer: Callable[[Answer], Any],
        later: Callable[[Awaitable[Answer]], Any],
        started: float,
    ) -> Answer | Awaitable[Answer] | None:
        """A request object's steps (`payload`: `body` parsed), from parse on; None when
        its first attempt went out (the answer then goes to `answer`, or a task given to
        `later`)."""
        pool = admitted.pool
        pipeline = self.pipeline
        quick = None if pool.mirrors or pipeline.gates else self.kept_route(pool, payload)
        chosen = None
        if quick is not None:
            route, node, taken = quick
            if taken is not None:  # written: the request's objects come after the write
                sent = time.perf_counter()
                taken[1].transport.write(taken[0].request(body))
                self._sent_first(
                    admitted,
                    payload,
                    body,
                    route,
                    node,
                    taken,
                    sent,
                    started,
                    headers,
                    answer,
                    later,
                )
                pipeline.metrics.client(headers.get("client-id"))
                return None
            chosen = node  # (picked already: the general steps go on with it)
        elif headers.get(MIN_BLOCK) is not None:  # (checked and kept by `Pipeline.run`)
            return self.run(chain_id, body, headers, admitted, answer)
        ctx = Ctx(admitted.chain, pool, answer)
        try:
            first = pipeline.item(ctx, payload, body, headers)
        except LocalMethod:  # raised only once a divert handler is set
            first = self._diverted(ctx, body, headers)  # type: ignore[assignment]
        except BaseException:
            self._leave(ctx)
            raise
        if type(first) is tuple:  # answered at once: invalid, or a ready result
            result = self._done(ctx, first, started, headers)
        elif type(first) is Item:
            result = self._first(ctx, first, body, started, headers, later, chosen)
        else:
            result = first  # type: ignore[assignment]
        # Counted once the node has the request (at c=1 every µs before the write is the
        # client's): the same count as `Pipeline.run` makes first.
        pipeline.metrics.client(headers.get("client-id"))
        return result

    def _first(
        self,
        ctx: Ctx,
        item: Item,
        body: bytes,
        started: float,
        headers: Mapping[str, str],
        later: Callable[[Awaitable[Answer]], Any],
        chosen: Node | None = None,
    ) -> Answer | Awaitable[Answer] | None:
        """Steps 3-4 of a checked request object: its node chosen and its first attempt
        sent now (None), when nothing needs a task; else the rest of the steps as a
        coroutine (or the answer, when no node is eligible). An item the read path planned
        goes the same way in a pool with in-process readers when it waits for no identical
        read: it is sent pinned as planned, and its answer lands in the read path. (Over HTTP
        alone, planned items keep the task: choosing them at once moved the weighted shares,
        tests/proxy/test_failsafe.py.) `chosen`: the node `kept_route` picked for it."""
        plan = item.plan
        pipeline = self.pipeline
        if ctx.early is None or (
            plan is not None and (plan.flight is not None or not _has_inproc(ctx.pool))
        ):
            return self._finish(ctx, pipeline.sent(ctx, item, body), started, headers)
        if plan is not None:  # what `ReadPath.follow` does for an item that leads its read
            sent = item.obj
            item.obj, item.ref = plan.obj, plan.ref
            if plan.obj is not sent:
                body = orjson.dumps(plan.obj)
        answers: list[Any] = [None]
        group = self.chooser.first_group(ctx, item, chosen)
        if type(group) is NoEligibleNode:  # answered as the rounds give it up
            pipeline.answers.give_up(ctx, item, answers, group)
            answer = pipeline.answers.single(ctx, item, body, None, answers)
            self._land(item, None, answers)
            return self._done(ctx, answer, started, headers)
        assert type(group) is Group
        then = self._then(ctx, item, group, body, answers, started, headers, later)
        if self.attempts.send_now(ctx, group, body, then):
            return None
        resumed = self._resume(ctx, item, body, answers, 1, [item], {group.node: group})
        return self._finish(ctx, resumed, started, headers)

    def _then(
        self,
        ctx: Ctx,
        item: Item,
        group: Group,
        body: bytes,
        answers: list[Any],
        started: float,
        headers: Mapping[str, str],
        later: Callable[[Awaitable[Answer]], Any],
    ) -> Callable[[Node, bytes | None, UpstreamError | None], None]:
        """What a first attempt sent now does with its outcome: the answer and the books,
        or the rest of the steps in a task given to `later`."""

        def then(node: Node, raw: bytes | None, exc: UpstreamError | None) -> None:
            try:
                step = self._landed(ctx, item, group, body, answers, node, raw, exc)
            except Exception as error:  # answered as a failed handler's task is
                self._land(item, None, answers)
                step = _reraise(error)
            if type(step) is not tuple:
                later(self._finish(ctx, step, started, headers))  # type: ignore[arg-type]
                return
            respond = ctx.early  # None when written from the node connection's callback
            ctx.early = None
            result = self._done(ctx, step, started, headers)  # type: ignore[arg-type]
            if respond is not None:
                respond(result)

        return then

    def _landed(
        self,
        ctx: Ctx,
        item: Item,
        group: Group,
        body: bytes,
        answers: list[Any],
        node: Node,
        raw: bytes | None,
        exc: UpstreamError | None,
    ) -> tuple[int, bytes] | Awaitable[tuple[int, bytes]]:
        """Step 5 of a first attempt sent now: the answer, or the rest of the steps
        (another attempt) as a coroutine."""
        classifier = self.pipeline.rounds.classifier
        if exc is not None:
            pending, out = classifier.failed(ctx, [item], exc, answers), None
        elif raw is not None:
            pending, out = classifier.raw(ctx, group, node, raw, answers, True)
        else:  # not sent after all (a closed idle connection): the usual way, same node
            return self._resume(ctx, item, body, answers, 1, [item], {node: group})
        if pending:
            return self._resume(ctx, item, body, answers, 2, pending)
        self._land(item, out, answers)
        return self.pipeline.answers.single(ctx, item, body, out, answers)

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
        self._leave(ctx)
        return self.pipeline.books.close(ctx, "single", 1, answer, started, headers)

    def _leave(self, ctx: Ctx) -> None:
        """The request is no longer in flight (what `Engine.handle` does on its way out)."""
        self.pipeline.release(ctx)
        self.leave(ctx.pool)

    # ---- the first write before any object -----------------------------------------------

    def kept_route(self, pool: Pool, payload: Any) -> tuple[QuickRoute, Node, Any] | None:
        """A request object whose first attempt the general steps would write to its node at
        once, unchanged, with nothing planned: (its kept route, the node picked, an idle
        connection to it, or None when the attempt needs a task after all: the node picked
        stays its choice); None for any other body, before anything is picked or counted.
        A plain read needs none of the request's objects to know where its bytes go, and
        at c=1 everything made before the write is on the client's wait."""
        if type(payload) is not dict:
            return None
        try:  # (subscripts, not four `get` calls: a try costs nothing until it raises)
            if payload["jsonrpc"] != "2.0":
                return None
            method, rid, params = payload["method"], payload["id"], payload["params"]
        except KeyError:  # (a notification, a bad envelope: the general steps')
            return None
        if type(method) is not str or (type(rid) is not int and type(rid) is not str):
            return None  # (a notification, a float id, a bad envelope: the general steps')
        if type(params) is not list or not params or None in params:
            return None
        text = params[-1]
        if type(text) is not str:
            return None
        routes = self.routes.routes(pool)
        route = routes.quick.get((method, len(params), text))
        if route is None:
            route = self._keep_route(pool, routes, method, params)
            if route is None:
                return None
        try:
            for index, check, name in route.checks:  # what `MethodTable.target` checks
                check(params[index] if index < len(params) else None, name)
        except Exception:  # the general steps answer it (the same error)
            return None
        height = route.height
        if height is not None:  # the read path pins a height whose hash it knows
            view = self.reads.heads.views.get(pool.id)  # type: ignore[union-attr]
            if view is not None and view.hashes.get(height) is not None:
                return None
        nodes = route.nodes
        node = self.chooser.kept(nodes)
        if node.breaker.state is not CLOSED:
            return route, node, None
        if len(nodes) > 1:
            taken = self.attempts.connection_now(pool, node, method, len(nodes))
            return route, node, taken
        # One candidate (no race due: `connection_now`'s answer without its calls)
        transport = self.upstream.http(node.entry.url)
        conn = None if transport is None else transport.pool.take()
        return route, node, None if conn is None else (transport.pool, conn)  # type: ignore[union-attr]

    def _keep_route(
        self, pool: Pool, routes: PoolRoutes, method: str, params: list[Any]
    ) -> QuickRoute | None:
        """The route of a request object as the general steps find it (the method table's
        target, the read path's rule, the route cache's candidates), kept in `routes` when
        every such request goes the same way: a read at a height or `Contains` named by its
        last param, with eligible nodes. None (not kept): anything else."""
        try:
            spec, ref = self.methods.target(method, params)
        except Exception:  # an invalid item, a diverted method: the general steps'
            return None
        if ref is None or spec.writer or spec.block is None or spec.block_at != len(params) - 1:
            return None
        if ref.tag is not None or ref.hash is not None or spec.block == "logs":
            return None  # a tag is pinned per request, a hash looked up per request
        nodes, cls = self.routes.candidates(pool, routes, method, spec, ref)
        if not nodes or cls is UNCACHED:
            return None
        reads = self.reads
        planned = reads is not None and method in reads.methods and not ref.contains
        if planned and ref.number is None:
            return None
        route = QuickRoute(method, spec, ref, nodes, ref.number if planned else None)
        quick = routes.quick
        if len(quick) >= MAX_ROUTES:
            quick.clear()
        quick[(method, len(params), params[-1])] = route
        return route

    def _sent_first(
        self,
        admitted: Admitted,
        payload: dict[str, Any],
        body: bytes,
        route: QuickRoute,
        node: Node,
        taken: Any,
        sent: float,
        started: float,
        headers: Mapping[str, str],
        answer: Callable[[Answer], Any],
        later: Callable[[Awaitable[Answer]], Any],
    ) -> None:
        """After `start` wrote the client's bytes (at `sent`) to the node `kept_route`
        picked, on its connection: the request's objects as `_first` makes them, and the
        answer's wait (`Attempts.sent_now`)."""
        ctx = Ctx(admitted.chain, admitted.pool, answer)
        method = route.method
        ctx.methods.append(method)
        item = Item(0, payload, payload["id"], method, route.spec, route.ref, False)
        item.tried.append(node)
        group = Group(node, [item], route.nodes, method)
        then = self._then(ctx, item, group, body, [None], started, headers, later)
        self.attempts.sent_now(ctx, group, taken, sent, then)


async def _reraise(error: Exception) -> Any:
    raise error


def _has_inproc(pool: Pool) -> bool:
    """Whether a reader of `pool` is a node in this process (`inproc://`)."""
    return any(is_inproc(node.entry.url) for node in pool.readers)

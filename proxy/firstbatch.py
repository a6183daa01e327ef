"""The first attempt of a batch, without a task where its nodes' transports allow.

The data listener's batches go through the pipeline's steps (proxy/pipeline.py) in a task,
unless the nodes are in this process: then

- a batch of plain reads is answered by the nodes' synchronous paths (the in-process
  transport finishing synchronously): its items routed by their kept routes
  (proxy/kept.py: one pick per candidate list), sent to each node picked as parsed items,
  their answers classified (an error the node gave on params it alone checked, or one that
  asks for another node, hands the body to the general steps before anything is counted),
  dumped in the client's order and booked (proxy/inprocbooks.py);
- a batch of eth_calls at heights goes as parsed items to the node's future (the transport's
  `later_now`, through `Attempts.send_now`), and its answer is classified by the rounds'
  own steps (`Rounds.plain_answered_now`), which go on with the items left.

A batch the pipeline's whole-batch cache holds (its bytes at the request's `latest`) is
answered from it now by the pipeline's own cached-batch step (`Pipeline.cached_now`).
A batch to nodes over HTTP whose answers are not cached takes the pipeline's own steps
without a task until one must wait (`_over_http`: `Pipeline.batch_plan`, `Rounds.
plain_start`, `Attempts.send_now`, and from the node connection's callback `Rounds.
plain_landed`): a task, its coroutine and its deadline cost about as much as reading a
hundred items. Anything else returns the whole pipeline as a coroutine.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable
from itertools import repeat
from operator import attrgetter, itemgetter
from time import perf_counter
from typing import Any

import orjson

from chainstate.httpserver import Headers, Request, Response
from proxy import outcome
from proxy.attempts import Attempts, Landed, LandedThen
from proxy.books import access_log
from proxy.breaker import CLOSED
from proxy.face import public
from proxy.inprocbooks import InprocBooks, Took, make_took
from proxy.kept import CALL, Counted, KeptRoutes, Lanes, make_counted, retried, too_large
from proxy.methods import LocalMethod, MethodTable
from proxy.model import Node, Pool
from proxy.outcome import UpstreamError
from proxy.parse import MIN_BLOCK
from proxy.pipeline import BatchPlan, Pipeline
from proxy.reads import Reads
from proxy.request import BATCH, Admitted, Answer, Ctx, Group, Row, items_of
from proxy.rounds import PlainStep
from proxy.routes import PoolRoutes

_METHOD, _JSONRPC, _ID, _PARAMS = (
    itemgetter("method"),
    itemgetter("jsonrpc"),
    itemgetter("id"),
    itemgetter("params"),
)
_LAST = itemgetter(-1)
_ID_TYPES = frozenset((int, str))
_LIST = {list}
_GENERAL: Any = object()  # `_keyed`: not for it, `_now`'s own way decides
_NODES = attrgetter("nodes")  # a kept route's candidates
_INFO = logging.INFO
_MIN_BLOCK = MIN_BLOCK.encode()  # (the header's key in `Headers.raw`)
# (the answers to send, their books: the calls made, or one call shared by lanes)
Answered = tuple[list[Any], list[Took] | tuple[str, float, list[Counted]]]


def _parsed_batch(body: bytes) -> list[Any] | None:
    """`body` parsed when it is a JSON array, else None (the pipeline answers the rest)."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return payload if type(payload) is list else None


class FirstBatch:
    def __init__(
        self,
        pipeline: Pipeline,
        kept: KeptRoutes,
        attempts: Attempts,
        methods: MethodTable,
        reads: Reads | None,
        books: InprocBooks,
        max_batch: int,
        max_answer: int,
        admit: Callable[[str, tuple[str, Pool] | None], Admitted | Answer],
        leave: Callable[[Pool], None],
        run: Callable[..., Awaitable[Answer]],
    ) -> None:
        self.pipeline = pipeline
        self.kept = kept
        self.attempts = attempts
        self.methods = methods
        self.reads = reads
        self.books = books
        self.max_batch = max_batch
        # (0 in the settings: no limit, here the largest size, so one compare decides)
        self.max_answer = max_answer or sys.maxsize
        self.admit = admit
        self.leave = leave
        self.run = run  # the whole pipeline as a coroutine (`Engine.handle`)
        self.budget = kept.upstream.budget  # answer bytes held by the process

    def start(
        self,
        chain_id: str,
        found: tuple[str, Pool] | None,
        payload: list[Any] | None,
        request: Request,
        started: float,
        tally: Any = None,
    ) -> Response | Awaitable[Response] | None:
        """A batch body's first attempt (`payload`: its body parsed, or None when it starts
        with `[` and was not parsed yet): its answer now, or an awaitable of it. `tally`:
        the client's usage tally (`Ctx.tally`), if any.

        A body is parsed here only for the nodes in process; otherwise the pipeline's
        whole-batch cache may answer it from its bytes, without the parse (a dapp polling
        the same batch every block): here, without a task (`Pipeline.cached_now`), and the
        pipeline parses it on a miss."""
        body, headers = request.body, request.headers
        parsed: list[Any] | None = payload  # (None once a node in process was given it)
        ctx: Any = None  # the request's, when the whole-batch cache was asked (a miss)
        plainly = False  # nodes over HTTP, nothing cached: `_over_http` may send it now
        if found is not None:
            chain, pool = found
            budget = self.budget  # (over it, admission answers 503: no answer made here)
            if not (
                pool.mirrors
                or access_log.isEnabledFor(_INFO)
                or (budget is not None and budget.used > budget.limit)
            ):
                routes = self.kept.routes(pool)
                if routes.paths is None:
                    self.kept.paths(routes)
                if routes.paths:
                    if payload is None:
                        payload = _parsed_batch(body)
                    if payload is not None and 0 < len(payload) <= self.max_batch:
                        parsed = None
                        first = payload[0]
                        if type(first) is dict and first.get("method") == CALL:
                            called = self._calls(
                                chain, pool, routes, payload, body, headers, started, tally
                            )
                            if called is not None:
                                return called
                        else:
                            out = self._now(chain, pool, routes, payload, headers, started)
                            if out is not None:
                                return out
                ctx = self.pipeline.cached_now(chain, pool, body, headers, started, tally)
                if type(ctx) is tuple:
                    return ctx
                plainly = ctx is None and not routes.paths and payload is None
        admitted = self.admit(chain_id, found)
        if type(admitted) is tuple:
            return admitted
        if plainly:
            out = self._over_http(admitted, request, started, tally)
            if out is not _GENERAL:
                return out
        early = request.answer_early
        return self.run(chain_id, body, headers, admitted, early, parsed, tally, ctx)

    # ---- a batch's first attempt over HTTP -----------------------------------------------

    def _over_http(
        self, admitted: Admitted, request: Request, started: float, tally: Any
    ) -> Response | Awaitable[Response] | None:
        """The pipeline's steps for a batch body to nodes over HTTP whose answers are not
        cached, without a task until a step must wait (as proxy/firstattempt.py takes a
        single request): parsed and planned (`Pipeline.batch_plan`); rows that go as one
        body to one node (`Rounds.plain_start`) written now to an idle connection
        (`Attempts.send_now`), their answer classified from the connection's callback
        (`_BatchThen`) and written to the client (None returned); anything else goes on
        from the step reached in a task (its coroutine returned). `_GENERAL`: nothing
        done here (a header or body the general steps answer)."""
        pipeline = self.pipeline
        body, headers = request.body, request.headers
        if (
            len(body) > pipeline.max_body
            or headers.raw.get(_MIN_BLOCK) is not None
            or pipeline.books.tracer is not None
            or pipeline.readpath is None
        ):
            return _GENERAL
        try:
            payload = pipeline.parser.batch(body)
        except orjson.JSONDecodeError:
            return _GENERAL  # (the general steps answer it)
        ctx = Ctx(admitted.chain, admitted.pool, None, tally)
        client = headers.raw.get(b"client-id")  # (no `get` call, no decode)
        if client:
            pipeline.metrics.client(client.decode("latin-1"))
        try:
            try:
                plan = pipeline.batch_plan(ctx, payload, body)
            except LocalMethod:  # raised only once a divert handler is set
                return self._diverted(ctx, admitted, body, headers)
            if type(plan) is tuple:
                return self._closed(ctx, admitted, plan, started, headers)
            if not plan.lean or plan.waiting:  # type: ignore[union-attr]
                rest = pipeline.batch_rest(ctx, plan)  # type: ignore[arg-type]
                return self._later(ctx, admitted, rest, started, headers)
            rounds = pipeline.rounds
            answers, planned = plan.answers, plan.planned  # type: ignore[union-attr]
            step = rounds.plain_start(ctx, plan.plain, plan.sent, answers, planned)  # type: ignore[union-attr]
            if type(step) is not PlainStep:
                rest = pipeline.lean_rest(ctx, plan, step)  # type: ignore[arg-type]
                return self._later(ctx, admitted, rest, started, headers)
            landed = _BatchThen(self, ctx, admitted, plan, step, started, request)  # type: ignore[arg-type]
            if not self.attempts.send_now(ctx, step.group, step.data, landed):
                rest = pipeline.lean_rest(ctx, plan, rounds.plain_send(ctx, step))  # type: ignore[arg-type]
                return self._later(ctx, admitted, rest, started, headers)
        except BaseException:
            self._left(ctx, admitted)
            raise
        return None

    async def _later(
        self,
        ctx: Ctx,
        admitted: Admitted,
        rest: Awaitable[tuple[int, bytes]],
        started: float,
        headers: Headers,
    ) -> Response:
        """The rest of a batch `_over_http` began, in a task: its answer, then its books."""
        try:
            answer = await rest
        finally:
            self._left(ctx, admitted)
        return self.pipeline.books.close(ctx, "batch", 1, answer, started, headers)

    async def _diverted(
        self, ctx: Ctx, admitted: Admitted, body: bytes, headers: Headers
    ) -> Response:
        """A batch naming a method the divert handler answers (the proxy's filters and
        subscriptions): the whole body handed to it, as `Pipeline.run` hands it."""
        try:
            return await self.pipeline.divert(admitted.pool.id, body, headers)  # type: ignore[misc]
        finally:
            self._left(ctx, admitted)

    def _closed(
        self,
        ctx: Ctx,
        admitted: Admitted,
        answer: tuple[int, bytes],
        started: float,
        headers: Headers,
    ) -> Response:
        """A batch `_over_http` answered: its books, as `Pipeline.run` closes them."""
        self._left(ctx, admitted)
        return self.pipeline.books.close(ctx, "batch", 1, answer, started, headers)

    def _left(self, ctx: Ctx, admitted: Admitted) -> None:
        """The request is no longer in flight (what `Engine.handle` does on its way out)."""
        if ctx.reserved:
            self.pipeline.release(ctx)
        self.leave(admitted.pool)

    # ---- plain reads answered now --------------------------------------------------------

    def _now(
        self,
        chain: str,
        pool: Pool,
        routes: PoolRoutes,
        items: list[Any],
        headers: Headers,
        started: float,
    ) -> bytes | None:
        """The answer of a batch of plain reads the in-process nodes answer now, booked; or
        None (nothing counted: the general steps answer it). Steps 1-3 by the items' kept
        routes, step 4 by the nodes' synchronous paths (one call for the entries of one
        node), step 5 on the error answers the nodes point at."""
        answered = _GENERAL if routes.one is None else self._keyed(pool, routes, items)
        if answered is _GENERAL:
            kept = self.kept
            seen = kept.seen_all(routes, items)
            answered = None
            if seen is not None:
                nodes_of = list(map(_NODES, seen))
                rest = len(nodes_of) - nodes_of.count(nodes_of[0])
                if rest:  # several lists: two on one node in process are counted, not grouped
                    two = kept.two(routes, nodes_of, rest)
                    if two is not None:
                        answered = self._shared(two, items, seen[0].method)
            if answered is None:
                answered = self._grouped(pool, routes, items, seen)
        if answered is None:
            return None
        out = orjson.dumps(answered[0])
        if len(out) > self.max_answer:  # final (every node would make the same): not asked again
            return too_large(items, len(out), self.max_answer)
        done = answered[1]
        if type(done) is tuple:  # one call of one method (`_shared`): one call books it all
            self.books.shared(chain, pool, *done, perf_counter() - started)
        else:
            self.books.took(chain, pool, done)
            self.books.request(chain, "batch", perf_counter() - started)
        client = headers.raw.get(b"client-id")  # (no `get` call, no decode)
        if client:
            self.pipeline.metrics.client(client.decode("latin-1"))
        return out

    def _keyed(self, pool: Pool, routes: PoolRoutes, items: list[Any]) -> Any:
        """`_now`'s answers when every reader is one node in process (`routes.one`) and the
        first
        item's method and number of params have kept routes: the node checks the items while
        it answers them and gives each one's kept route (`NodePath.keyed`), in the loop it
        makes anyway, instead of `seen_all`'s passes before the call. Then the same choice
        as `_now`'s from those routes: one list, one pick; two, `KeptRoutes.two`; else
        `_grouped`, which calls the node again (these answers are dropped, nothing was
        counted). The answers and their books, or None (declined); _GENERAL when an item is
        not such (a block text not kept yet, another method, ...; or the node declines)."""
        for node in routes.readers:  # (`usable`'s checks: a node that failed lately is not
            breaker = node.breaker  # called here, whichever entry the picks would take)
            if node.fails or breaker.failures or breaker.state is not CLOSED:
                return _GENERAL
        first = items[0]
        try:
            method = first["method"]
            size = len(first["params"])
            texts = routes.kept[(method, size)]
        except (KeyError, TypeError):  # (not a dict, no params, no kept route, unhashable)
            return _GENERAL
        seen: list[Any] = []
        errors: list[int] = []  # (the node tells which answers are errors)
        t0 = perf_counter()
        try:
            got = routes.one.keyed(method, size, texts, items, errors, seen)
        except Exception:  # the general steps send it again and count the failure
            return None
        elapsed = perf_counter() - t0
        if got is None:
            return _GENERAL
        if errors:
            return None  # (params only the node checked: the general steps')
        nodes_of = list(map(_NODES, seen))
        rest = len(nodes_of) - nodes_of.count(nodes_of[0])
        if rest:  # several lists: two on one node in process are counted, not grouped
            two = self.kept.two(routes, nodes_of, rest)
            if two is None:
                return self._grouped(pool, routes, items, seen)
            return got, (method, elapsed, two)
        node = self.kept.chooser.kept(nodes_of[0])  # one list: one pick
        path = self.kept.usable(routes, node)
        if path is None:
            return None
        return got, [make_took((node, path, BATCH, items, errors, elapsed, method))]

    def _grouped(
        self, pool: Pool, routes: PoolRoutes, items: list[Any], seen: list[Any] | None
    ) -> Answered | None:
        """The answers and books of a batch from the lanes of its items (`seen`: their kept
        routes, or None: item by item)."""
        lanes = self.kept.lanes(pool, routes, items, seen)
        if lanes is None:
            return None
        if len(lanes.lanes) > 1:
            if lanes.tagged and self.reads is not None:
                return None  # a tag on several nodes: the read path pins one head
            if _one_path(lanes):
                counted = [make_counted((n, p, len(positions))) for n, p, positions in lanes.lanes]
                return self._shared(counted, items, lanes.method, lanes)
        return self._each(items, lanes)

    def _each(self, items: list[Any], lanes: Lanes) -> Answered | None:
        """The answers of each lane's node, one call per lane, merged in the client's
        order."""
        method, checked = lanes.method, lanes.checked
        answers: list[Any] = [None] * len(items)
        done: list[Took] = []
        one = len(lanes.lanes) == 1
        for node, path, positions in lanes.lanes:
            sent = items if one else [items[i] for i in positions]
            errors: list[int] = []  # (the node tells which answers are errors)
            t0 = perf_counter()
            try:
                got = path.answer(sent, errors, method)
            except Exception:  # the general steps send it again and count the failure
                return None
            elapsed = perf_counter() - t0
            if got is None or (errors and (not checked or retried(got, errors))):
                return None  # (an item whose params the node alone checked: the general's)
            if errors:
                self._public(sent, got, errors)
            done.append(make_took((node, path, BATCH, sent, errors, elapsed, method)))
            if one:
                answers = got
            else:
                for i, answer in zip(positions, got, strict=True):
                    answers[i] = answer
        return answers, done

    def _shared(
        self,
        counted: list[Counted],
        items: list[Any],
        method: str | None,
        lanes: Lanes | None = None,
    ) -> Answered | None:
        """The answers of a batch whose lanes were picked on node entries that share one
        synchronous path (one node entered under several kinds): one call for every item,
        in the client's order, instead of one per lane and a merge. Booked as one attempt
        per lane, each with its share (by items) of the call's time. `lanes` (their
        positions) are needed when the items have several methods (`method` None), for the
        count per method. An error answer leaves the body to the general steps (nothing is
        counted yet): the lanes' books would need each error's lane."""
        path = counted[0].path
        errors: list[int] = []
        t0 = perf_counter()
        try:
            got = path.answer(items, errors, method)
        except Exception:  # the general steps send it again and count the failure
            return None
        elapsed = perf_counter() - t0
        if got is None or errors:
            return None
        if method is not None:  # (each lane's count is all the books need)
            return got, (method, elapsed, counted)
        share = elapsed / len(items)
        done: list[Took] = []
        for node, own, positions in () if lanes is None else lanes.lanes:
            sent = [items[i] for i in positions]
            took = (node, own, BATCH, sent, [], share * len(positions), method)
            done.append(make_took(took))
        return got, done

    def _public(self, items: list[Any], answers: list[Any], errors: list[int]) -> None:
        """The error answers (at `errors`) as a client of the standard API sees them
        (proxy/face.py). Final errors only: retried ones went to the general steps."""
        specs = self.methods.specs
        for i in errors:
            spec = specs.get(items[i].get("method"))
            if spec is not None:
                public(spec, answers[i])

    # ---- eth_calls given to the node's future --------------------------------------------

    def _calls(
        self,
        chain: str,
        pool: Pool,
        routes: PoolRoutes,
        items: list[Any],
        body: bytes,
        headers: Headers,
        started: float,
        tally: Any = None,
    ) -> Response | Awaitable[Response] | None:
        """A batch of eth_calls the general steps would send as it is to one node, given
        to that node's future of answers: every item an eth_call request object with
        `"jsonrpc": "2.0"`, a unique int or string id and two params (no state override)
        at a height whose hash the proxy does not know (the read path leaves it alone:
        nothing pinned, cached or coalesced). The answer (a coroutine the server runs, a 503
        or a whole-batch cache hit at once) or None: the general steps' (nothing sent or
        counted)."""
        targets = self._targets(items)
        if targets is None:
            return None
        reads = self.reads
        if reads is not None:
            heads = reads.request(pool)
            key = reads.batch_key(heads, body)  # (the same bytes answered at this `latest`)
            if key is not None:
                found = reads.cache.get_batch(key)
                if found is not None:
                    return self._cached(chain, pool, found, headers, started)
            if CALL in reads.methods:
                hash_at = heads.hash_at
                for _, ref in targets:
                    if hash_at(ref.number) is not None:
                        return None  # pinned by hash, cached, coalesced: the general steps'
        rows = _rows(items, targets)
        found_node = self.kept.chooser.one_node(pool, rows)
        if found_node is None:
            return None
        node, cands = found_node
        if self.kept.usable(routes, node) is None:
            return None
        admitted = self.admit(chain, (chain, pool))
        if type(admitted) is tuple:
            return admitted  # (refused: as `Engine.admit` would answer it)
        ctx = Ctx(chain, pool, None, tally)
        group = Group(node, [_Held(item) for item in items], cands, BATCH)
        landed: list[Any] = []
        done = asyncio.get_running_loop().create_future()

        def then(node: Node, raw: bytes | None, exc: Any) -> None:
            landed.append((node, raw, exc))
            if not done.done():
                done.set_result(None)

        if not self.attempts.send_now(ctx, group, body, LandedThen(then)):  # declined: none counted
            self.leave(pool)
            return None
        return self._finish(ctx, admitted, rows, landed, done, headers, started)  # type: ignore[arg-type]

    def _targets(self, items: list[Any]) -> list[Any] | None:
        """Every item's (spec, block ref) when the batch is one `_calls` takes, else None."""
        n = len(items)
        if n < 2:
            return None  # (a lone item is a request object's answer: the general steps')
        try:
            if list(map(_METHOD, items)).count(CALL) != n:
                return None
            if list(map(_JSONRPC, items)).count("2.0") != n:
                return None
            rids = list(map(_ID, items))
            if not set(map(type, rids)) <= _ID_TYPES or len(set(rids)) != n:
                return None
            params = list(map(_PARAMS, items))
            if set(map(type, params)) != _LIST or set(map(len, params)) != {2}:
                return None
            if set(map(type, map(_LAST, params))) != {str}:
                return None
        except (KeyError, TypeError, IndexError):  # (not a dict, a key missing, unhashable)
            return None
        found_all = self.methods.known_targets(CALL, 2, params, list(map(_LAST, params)))
        known: list[Any]
        if found_all is not None:
            known = list(zip(repeat(found_all[0], n), found_all[1], strict=True))
        else:
            known = []
            for one in params:
                found = self.kept.plain_read(CALL, one)  # (learns the text for next time)
                if found is None:
                    return None
                known.append(found)
        for spec, ref in known:
            if ref is None or ref.number is None or ref.contains or spec.writer:
                return None  # a tag (the read path pins it) or a hash: the general steps'
        return known

    async def _finish(
        self,
        ctx: Ctx,
        admitted: Admitted,
        rows: list[Row],
        landed: list[Any],
        done: Any,
        headers: Headers,
        started: float,
    ) -> Response:
        """The answer once the node's future landed, with the request's books: the node's
        bytes when final, else the rounds go on with the items left."""
        pipeline = self.pipeline
        try:
            await done
            node, raw, exc = landed[0]
            if raw is not None and raw.find(b"-3900") < 0 and raw.find(b'"error"') < 0:
                # every item answered, none an error: counted by method
                pipeline.metrics.request(ctx.chain, CALL, node.key, "ok", len(rows))
                status, out = 200, raw
            else:
                status, out = await self._general(ctx, rows, node, raw, exc)
        finally:
            pipeline.release(ctx)
            self.leave(admitted.pool)
        pipeline.metrics.observe(ctx.chain, "batch", perf_counter() - started)
        client = headers.raw.get(b"client-id")
        if client:
            pipeline.metrics.client(client.decode("latin-1"))
        return status, out

    async def _general(
        self, ctx: Ctx, rows: list[Row], node: Node, raw: bytes | None, exc: Any
    ) -> tuple[int, bytes]:
        """The rounds' steps after the first attempt (`Rounds.plain`'s), and the answer."""
        answers: list[Any] = [None] * len(rows)
        tried = [node]  # (no hedge in process)
        rounds = self.pipeline.rounds
        if raw is None:  # failed, or timed out (booked by the attempt): retried or given up
            pending = rounds.classifier.failed(ctx, items_of(rows, tried), exc, answers)
            await rounds.go_on(ctx, pending, answers)
        else:
            out, pending = rounds.plain_answered_now(ctx, rows, node, tried, raw, True, answers)
            await rounds.go_on(ctx, pending, answers)
            if out is not None:
                return 200, out
        kept = [a for a in answers if a is not None]
        return (200, orjson.dumps(kept)) if kept else (204, b"")

    def _cached(
        self, chain: str, pool: Pool, found: Any, headers: Headers, started: float
    ) -> Response:
        """A whole batch answered from the cache, booked as the read path books it
        (admitted first: a pool over its limit refuses it all the same)."""
        admitted = self.admit(chain, (chain, pool))
        if type(admitted) is tuple:
            return admitted
        self.leave(pool)
        out, methods = found
        metrics = self.pipeline.metrics
        for method, n in methods:
            metrics.request(chain, method, "cache", "ok", n)
        metrics.observe(chain, "batch", perf_counter() - started)
        client = headers.raw.get(b"client-id")
        if client:
            metrics.client(client.decode("latin-1"))
        return 200, out


class _BatchThen(Landed):
    """What a batch's first attempt sent now (`FirstBatch._over_http`) does with its
    outcome after the attempt's books: the answer classified as `Rounds.plain` classifies
    it (`Rounds.plain_landed`), the read path's items landed, and the client answered from
    here; or the rest of the steps (another round, the attempt again when the idle
    connection closed before it was sent) in a task given to the request's
    `answer_later`. The attempt's books check a whole answer once, as `plain`'s do
    (`label`)."""

    __slots__ = ("admitted", "began", "first", "label", "plan", "request", "step")

    def __init__(
        self,
        first: FirstBatch,
        ctx: Ctx,
        admitted: Admitted,
        plan: BatchPlan,
        step: PlainStep,
        began: float,
        request: Request,
    ) -> None:
        self.first = first
        self.ctx = ctx
        self.admitted = admitted
        self.plan = plan
        self.step = step
        self.began = began
        self.request = request
        checked = step.checked
        self.label = outcome.answered if checked is None else checked.label

    def then(self, node: Node, raw: bytes | None, exc: UpstreamError | None) -> None:
        first, ctx, plan, step = self.first, self.ctx, self.plan, self.step
        pipeline = first.pipeline
        rounds = pipeline.rounds
        rest: Awaitable[tuple[int, bytes]] | None = None
        answer = None
        try:
            if raw is None and exc is None:  # not sent after all (a closed idle connection)
                rest = pipeline.lean_rest(ctx, plan, rounds.plain_send(ctx, step))
            else:
                out, pending = rounds.plain_landed(ctx, step, node, raw, exc)
                if pending:
                    rest = pipeline.lean_rest(ctx, plan, rounds.plain_rest(ctx, pending, step, out))
                else:
                    pipeline.land_planned(plan)
                    answer = pipeline.lean_answer(ctx, plan, out)
        except Exception as error:  # answered as a failed handler's task is
            pipeline.land_planned(plan)
            rest = _reraise(error)
        request, headers = self.request, self.request.headers
        if rest is not None:
            request.answer_later(first._later(ctx, self.admitted, rest, self.began, headers))
            return
        # (an answer: no item waits for an identical read in a batch `_over_http` sends)
        request.answer_early(first._closed(ctx, self.admitted, answer, self.began, headers))  # type: ignore[arg-type]


async def _reraise(error: Exception) -> Any:
    raise error


class _Held:
    """An item as `Attempts.send_now` sees it: its object and the nodes it tried (no Item
    is made unless the rounds go on with it)."""

    __slots__ = ("obj", "tried")

    def __init__(self, obj: Any) -> None:
        self.obj = obj
        self.tried: list[Node] = []


def _rows(items: list[Any], targets: list[Any]) -> list[Row]:
    """The eth_call items as rows (every one checked by `_targets`)."""
    return [
        Row(pos, item, item["id"], CALL, spec, ref, False, item["params"][-1])
        for pos, (item, (spec, ref)) in enumerate(zip(items, targets, strict=True))
    ]


def _one_path(lanes: Lanes) -> bool:
    """Whether every lane's node answers through the same synchronous path (the same
    in-process node under several entries)."""
    first = lanes.lanes[0].path
    return all(
        path.items is first.items and path.answered is first.answered for _, path, _ in lanes.lanes
    )

"""The one pipeline every client body takes: parse → plan → choose → send → classify →
retry/hedge → answer, then the books.

`Pipeline.run` is the whole sequence for a body, awaited (a batch, a request that waits, any
body when the synchronous start cannot finish it: proxy/firstattempt.py makes the same steps
without a task where none is needed and hands over the step it reached). Each step is a unit
of its own:

    parse       proxy/parse.py      request objects checked: Items, or a batch's Rows
    plan        proxy/readpath.py   heads, cache and coalescing (proxy/reads.py decides)
    choose      proxy/choose.py     the node per item (the one place nodes are picked)
    send        proxy/attempts.py   one attempt through the node's transport (+ hedging)
    classify    proxy/classify.py   the answer matched to its items, retry or final
    retry       proxy/rounds.py     the rounds, for single requests and batch items alike
    answer      proxy/answer.py     what the client sees (proxy/face.py, proxy/ryw.py)
    books       proxy/books.py      latency, span, access log
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from operator import attrgetter
from typing import Any

import orjson

from chainstate.httpserver import Headers
from chainstate.jsonrpc import INVALID_REQUEST, PARSE_ERROR, JsonRpcError, cut
from proxy import nesting
from proxy.answer import Answers
from proxy.books import Books, access_log
from proxy.methods import LocalMethod
from proxy.metrics import ProxyMetrics
from proxy.mirror import Mirrors
from proxy.model import Pool
from proxy.parse import MIN_BLOCK, NO_NODE_KEY, Parser, dumps_error, least, unique_ids
from proxy.readpath import ReadPath
from proxy.reads import MAX_KEYED_BYTES
from proxy.request import Admitted, Answer, Ctx, Item, Row, Rows, items_of, make_row
from proxy.rounds import Followed, Rounds
from proxy.upstream import Upstream

# Answers a whole client body the pipeline hands over: (pool id, body, headers) -> Answer.
Divert = Callable[[str, bytes, Mapping[str, str]], Awaitable[Answer]]
_MIN_BLOCK = MIN_BLOCK.encode()  # (the header's key in `Headers.raw`)


class Pipeline:
    def __init__(
        self,
        max_body: int,
        max_batch: int,
        parser: Parser,
        readpath: ReadPath | None,
        rounds: Rounds,
        answers: Answers,
        books: Books,
        mirrors: Mirrors,
        metrics: ProxyMetrics,
        upstream: Upstream,
    ) -> None:
        self.max_body = max_body
        self.max_batch = max_batch
        self.parser = parser
        self.readpath = readpath  # None: every item goes to a node
        self.rounds = rounds
        self.answers = answers
        self.books = books
        self.mirrors = mirrors
        self.metrics = metrics
        self.upstream = upstream
        self.divert: Divert | None = None

    # ---- the whole sequence --------------------------------------------------------------

    async def run(
        self,
        admitted: Admitted,
        body: bytes,
        headers: Mapping[str, str],
        span: Any,
        started: float,
        early: Callable[[bytes], Any] | None = None,
        parsed: list[Any] | None = None,
        tally: Any = None,
        ctx: Ctx | None = None,
    ) -> Answer:
        """Answers one admitted client body (its books closed); `early(body)` writes a
        single request's node answer to the client from the node connection's callback;
        `parsed`: the body's batch when the caller parsed it already (not parsed again);
        `tally`: the client's usage tally (`Ctx.tally`), if any; `ctx`: the request's, when
        `cached_now` made it (with that `tally`)."""
        if ctx is None:
            ctx = Ctx(admitted.chain, admitted.pool, None, tally)
        self.metrics.client(headers.get("client-id"))
        shape = "single"
        size = 1
        floor = headers.get(MIN_BLOCK)
        bad = None if floor is None else least(floor, ctx)
        try:
            if bad is not None:
                status, out = 200, dumps_error(None, bad)
            elif len(body) > self.max_body:
                msg = f"request body larger than max_body_bytes={self.max_body} bytes"
                status, out = 413, dumps_error(None, JsonRpcError(INVALID_REQUEST, msg))
            elif self.readpath is not None and body[:1] == b"[" and self.books.quiet():
                shape = "batch"
                status, out = await self.cached_batch(ctx, body, parsed)
            else:
                try:
                    payload = parsed
                    if payload is None:
                        batch = body[:1] == b"["
                        payload = self.parser.batch(body) if batch else orjson.loads(body)
                except orjson.JSONDecodeError as exc:
                    payload = None
                    msg = f"Parse error: {cut(str(exc))}"
                    status, out = 200, dumps_error(None, JsonRpcError(PARSE_ERROR, msg))
                else:
                    if isinstance(payload, list | Rows):
                        shape, size = "batch", len(payload)
                        status, out = await self.batch(ctx, payload, body)
                    else:
                        ctx.early = early
                        status, out = await self.single(ctx, payload, body)
        except LocalMethod:  # raised only once a divert handler is set
            assert self.divert is not None
            return await self.divert(admitted.pool.id, body, headers)
        finally:
            self.release(ctx)
        return self.books.close(ctx, shape, size, (status, out), started, headers, span)

    def release(self, ctx: Ctx) -> None:
        """The answer bytes the request held in the buffered-bytes budget, given back."""
        if ctx.reserved:
            self.upstream.budget.release(ctx)  # type: ignore[union-attr]

    # ---- a single request ----------------------------------------------------------------

    def item(self, ctx: Ctx, payload: Any, body: bytes) -> Item | tuple[int, bytes]:
        """Steps 1-2 of a request object, synchronous: its Item (planned by the read path,
        if at all), or its answer when it is invalid or the read path has it ready. Clears
        `ctx.early` when the answer will not be the node's bytes as they are."""
        item = self.parser.single(ctx, payload, body)
        if type(item) is not Item:
            return item  # type: ignore[return-value]
        if ctx.pool.mirrors:
            self.mirrors.offer_single(ctx.pool, item.method, body)
        spec = item.spec
        if item.notif or spec.writer or spec.mempool or type(item.rid) is orjson.Fragment:
            ctx.early = None  # the answer is not the node's bytes as they are
        if self.readpath is not None:
            ready = self.readpath.plan(ctx, item, len(body) <= MAX_KEYED_BYTES)
            if ready is not None:
                return ready
        return item

    async def single(self, ctx: Ctx, payload: Any, body: bytes) -> tuple[int, bytes]:
        """One request object: forwarded as the client's bytes, answered with the node's
        bytes unless the attempts ran out or the answer must change."""
        first = self.item(ctx, payload, body)
        if type(first) is tuple:
            return first
        return await self.sent(ctx, first, body)  # type: ignore[arg-type]

    async def sent(self, ctx: Ctx, item: Item, body: bytes) -> tuple[int, bytes]:
        """Steps 2-7 of a checked request object: the read it waits for, or its rounds."""
        answers: list[Any] = [None]
        plan = item.plan
        if plan is not None:
            readpath: ReadPath = self.readpath  # type: ignore[assignment]
            payload = item.obj
            shared = await readpath.follow(ctx, item, plan)
            if shared is not None:
                return 200, shared
            sent = body if item.obj is payload else self.pinned_body(ctx, item, answers)
            if type(sent) is tuple:
                return sent
            out = await readpath.route(ctx, [item], sent, answers, single=True)  # type: ignore[arg-type]
        else:
            out = await self.rounds.route(ctx, [item], body, answers, single=True)
        return self.answers.single(ctx, item, body, out, answers)

    def pinned_body(self, ctx: Ctx, item: Item, answers: list[Any]) -> bytes | tuple[int, bytes]:
        """The JSON of a single item the read path changed (its block pinned), or its
        answer when it is too deep to write again: -32602, handed to the reads waiting for
        it as none (proxy/nesting.py; the key checked its params, not other members)."""
        try:
            return orjson.dumps(item.obj)
        except TypeError:
            self.readpath.land(item, None, answers)  # type: ignore[union-attr]
            self.metrics.request(ctx.chain, item.method, NO_NODE_KEY, "invalid")
            return 200, dumps_error(item.rid, nesting.invalid())

    # ---- a batch -------------------------------------------------------------------------

    def cached_now(
        self, chain: str, pool: Pool, body: bytes, headers: Headers, started: float, tally: Any
    ) -> tuple[int, bytes] | Ctx | None:
        """`cached_batch`'s hit without a task (the synchronous start, proxy/firstbatch.py,
        which checked that nothing is mirrored, traced or logged per item): the answer of a
        batch body the whole-batch cache holds for its bytes at the request's `latest`,
        booked as `run` books it. Nothing waits, so the body is not admitted, as an
        in-process node's answer is not. Else nothing is counted and `run` takes the body:
        with the request's Ctx made here on a miss (its `latest` resolved once), or afresh
        (None: no read path, the pool's answers not cached, not a `[` body, an
        `x-min-block` that is not a height)."""
        readpath = self.readpath
        if readpath is None or body[:1] != b"[" or not readpath.reads.cache.enabled(pool.id):
            return None
        ctx = Ctx(chain, pool, None, tally)
        raw = headers.raw
        floor = raw.get(_MIN_BLOCK)
        if floor is not None and least(floor.decode("latin-1"), ctx) is not None:
            return None  # (`run` answers the bad header)
        out = readpath.batch_cached(ctx, body)[1]
        if out is None:
            return ctx
        client = raw.get(b"client-id")  # (as `run` counts it, without `Headers.get`'s call)
        if client:
            self.metrics.client(client.decode("latin-1"))
        return self.books.close(ctx, "batch", 1, (200, out), started, headers)

    async def cached_batch(
        self, ctx: Ctx, body: bytes, parsed: list[Any] | None = None
    ) -> tuple[int, bytes]:
        """A batch body answered as a whole from the cache when the same bytes were answered
        at the request's `latest` block before (a dapp polling the same batch every block);
        else parsed and answered item by item, and kept as a whole when every item's answer
        was the one of the block its key names."""
        readpath: ReadPath = self.readpath  # type: ignore[assignment]
        key, out = readpath.batch_cached(ctx, body)
        if out is not None:
            return 200, out
        try:
            payload = self.parser.batch(body) if parsed is None else parsed
        except orjson.JSONDecodeError as exc:
            msg = f"Parse error: {cut(str(exc))}"
            return 200, dumps_error(None, JsonRpcError(PARSE_ERROR, msg))
        if not isinstance(payload, list | Rows):
            return await self.single(ctx, payload, body)
        epoch = readpath.epoch(ctx)
        status, out = await self.batch(ctx, payload, body, key)
        readpath.store_batch(ctx, key, out, epoch)
        return status, out

    async def batch(
        self, ctx: Ctx, payload: list[Any] | Rows, body: bytes, key: Any = None
    ) -> tuple[int, bytes]:
        """A batch: every valid item through the steps, answers in the client's order
        (`payload`: parsed, or the rows read from its bytes, `Parser.batch`)."""
        plan = self.batch_plan(ctx, payload, body, key)
        if type(plan) is tuple:
            return plan
        return await self.batch_rest(ctx, plan)  # type: ignore[arg-type]

    def batch_plan(
        self, ctx: Ctx, payload: list[Any] | Rows, body: bytes, key: Any = None
    ) -> tuple[int, bytes] | BatchPlan:
        """A batch's steps up to its first attempt, without a task: the answer when it has
        no item to send (empty, too large), else its rows parsed and planned by the read
        path and, when they go as one body with no Item per row (`BatchPlan.lean`), that
        body; `batch_rest` (or the synchronous start's first attempt, proxy/firstbatch.py)
        goes on from there."""
        if not payload:
            return 200, dumps_error(
                None, JsonRpcError(INVALID_REQUEST, "Invalid Request: empty batch")
            )
        if len(payload) > self.max_batch:
            msg = f"batch has {len(payload)} items, more than max_batch_items={self.max_batch}"
            return 200, dumps_error(None, JsonRpcError(INVALID_REQUEST, msg))
        answers: list[Any] = [None] * len(payload)
        rows, exact, notified = self.parser.rows(ctx, payload, answers, body)
        if self.books.tracer is not None or access_log.isEnabledFor(logging.INFO):
            ctx.methods.extend(row.method for row in rows)  # for the span and the access log
        if rows and ctx.pool.mirrors:
            self.mirrors.offer_batch(ctx.pool, [(row.method, row.obj) for row in rows])
        ctx.own_ids = exact and unique_ids(rows)
        whole = len(rows) == len(payload) and ctx.own_ids
        readpath = self.readpath
        plain, planned, waiting, changed = rows, [], [], False
        lean = not (notified or self.books.tracer) and ctx.own_ids
        if readpath is not None and rows:
            in_rows = lean and key is None
            plain, planned, waiting, changed = readpath.plan_rows(ctx, rows, answers, in_rows)
        lean = lean and _lean(planned, key)
        followed = None
        if lean and waiting:
            followed = _followed(plain, planned, waiting, len(payload), whole and key is None)
        plan = BatchPlan(len(payload), body, key, answers, rows, planned, waiting, whole)
        plan.plain, plan.changed, plan.followed = plain, changed, followed
        if lean and (followed is not None or not waiting):
            # The rows go as one body without an Item per row; the items the read path
            # pinned go with their pinned objects, those waiting for an identical read in
            # flight are left out of it and their answers put in the node's (`Followed`).
            sent = body if whole and not changed else None
            if followed is not None:
                plain, sent = followed.rows, followed.rows.raw
            elif planned or changed:
                if planned:
                    plain = _pinned_rows(plain, planned)
                if whole and len(plain) == len(payload):  # every item sent, in order
                    sent = _written(plain)  # (pinned in the rows' bytes: `Rows.pins`)
            plan.lean, plan.plain, plan.sent = True, plain, sent
        return plan

    async def batch_rest(self, ctx: Ctx, plan: BatchPlan) -> tuple[int, bytes]:
        """A batch's steps from its first attempt on (`batch_plan` made the rest)."""
        answers, planned, waiting = plan.answers, plan.planned, plan.waiting
        if plan.lean:
            sending = self.rounds.plain(ctx, plan.plain, plan.sent, answers, planned, plan.followed)
            return await self.lean_rest(ctx, plan, sending)
        readpath = self.readpath
        whole, rows, n, key = plan.whole, plan.rows, plan.n, plan.key
        items = _merged(plan.plain, planned)
        sent = plan.body if whole else None
        route = self.rounds.route
        pinned = False
        if readpath is not None and rows:
            if whole and plan.changed:
                # Only blocks were pinned (every item goes, none waits): the pinned items
                # with the client's ids, in its order, are the body, and the node's answer
                # may still be the client's as it is.
                pinned = not waiting and len(items) == n
                sent = _dumps_or_none([it.obj for it in items]) if pinned else None
                pinned = sent is not None  # (else an item is too deep: `Rounds.sub_batch`)
            route = readpath.route
        if items:
            out = await route(ctx, items, sent, answers, single=False)
            if out is not None:
                if pinned:
                    done = [a for a in answers if a is not None]
                    readpath.keep(ctx, key, rows, n, done, items)  # type: ignore[union-attr]
                return (200, out) if out else (204, b"")
        if waiting:
            await readpath.wait(ctx, waiting, answers)  # type: ignore[union-attr]
        done = [a for a in answers if a is not None]
        if readpath is not None:
            readpath.keep(ctx, key, rows, n, done, [*items, *waiting])
        return (200, orjson.dumps(done)) if done else (204, b"")

    async def lean_rest(
        self, ctx: Ctx, plan: BatchPlan, sending: Awaitable[bytes | None]
    ) -> tuple[int, bytes]:
        """A lean batch's answer once `sending` (its rows' attempt and rounds) gave the
        node's bytes (or None, the answers placed): the planned items landed, and the
        items that waited for identical reads given theirs."""
        try:
            out = await sending
        finally:
            self.land_planned(plan)
        answer = self.lean_answer(ctx, plan, out)
        if answer is not None:
            return answer
        await self.readpath.wait(ctx, plan.waiting, plan.answers)  # type: ignore[union-attr]
        followed = plan.followed
        if followed is not None and followed.found is not None:
            return 200, followed.joined(plan.answers)
        return self.collected(ctx, plan)

    def land_planned(self, plan: BatchPlan) -> None:
        """The final answer of each item the read path planned, handed to it."""
        readpath = self.readpath
        for it in plan.planned:
            readpath.land(it, None, plan.answers)  # type: ignore[union-attr]

    def lean_answer(self, ctx: Ctx, plan: BatchPlan, out: bytes | None) -> tuple[int, bytes] | None:
        """A lean batch's answer once its rows were answered (`out`: the node's bytes when
        they are the whole answer), or None while items wait for identical reads."""
        if out is not None:
            return 200, out
        if plan.waiting:
            return None
        return self.collected(ctx, plan)

    def collected(self, ctx: Ctx, plan: BatchPlan) -> tuple[int, bytes]:
        """The batch's answers placed one by one, dumped in the client's order (and kept
        for the whole-batch cache when `keep` finds them cacheable)."""
        done = [a for a in plan.answers if a is not None]
        if self.readpath is not None:
            self.readpath.keep(ctx, plan.key, plan.rows, plan.n, done, [])
        return (200, orjson.dumps(done)) if done else (204, b"")


class BatchPlan:
    """A batch's steps up to its first attempt (`Pipeline.batch_plan`): its size, body and
    whole-batch cache key, where its answers go, its rows, the read path's Items (planned,
    waiting for identical reads), whether every row is the client's with its own id
    (`whole`), the rows left to send and whether the read path changed any, the items
    left out of the body (`Followed`), and, when the rows go as one body with no Item per
    row (`lean`), that body (`sent`: None when the rounds write it)."""

    __slots__ = (
        "answers",
        "body",
        "changed",
        "followed",
        "key",
        "lean",
        "n",
        "plain",
        "planned",
        "rows",
        "sent",
        "waiting",
        "whole",
    )

    def __init__(
        self,
        n: int,
        body: bytes,
        key: Any,
        answers: list[Any],
        rows: list[Row],
        planned: list[Item],
        waiting: list[Item],
        whole: bool,
    ) -> None:
        self.n = n
        self.body = body
        self.key = key
        self.answers = answers
        self.rows = rows
        self.planned = planned
        self.waiting = waiting
        self.whole = whole
        self.plain: list[Row] = rows
        self.changed = False
        self.followed: Followed | None = None
        self.lean = False
        self.sent: bytes | None = None


def _dumps_or_none(objs: list[Any]) -> bytes | None:
    """The JSON of `objs`, or None when one is too deep to write (proxy/nesting.py)."""
    try:
        return orjson.dumps(objs)
    except TypeError:
        return None


def _written(rows: list[Row]) -> bytes | None:
    """The JSON of the request objects of `rows`, in their order (the bytes they were
    read from when they were, with the pinned items written in: `Rows.pinned`); None when
    one is too deep to write."""
    if type(rows) is Rows and rows.raw is not None:
        return rows.raw
    return _dumps_or_none(_objs(rows))


def _followed(
    rows: list[Row], planned: list[Item], waiting: list[Item], n: int, whole: bool
) -> Followed | None:
    """The rows of a whole batch read from its bytes that go as one body while the
    `waiting` items wait for identical reads in flight (`Followed`), or None when the
    batch's rows are not such (then it takes the rounds item by item)."""
    source = rows.source if type(rows) is Rows else None
    if not whole or source is None or source.found is None or source.positions is not None:
        return None
    if len(rows) + len(planned) + len(waiting) != n or len(source) != n:
        return None
    return Followed(source.rids, source.pinned(planned, waiting), [it.pos for it in waiting])


def _lean(planned: list[Item], key: Any) -> bool:
    """Whether a batch's planned items may go with its plain rows (`Rounds.plain`): none
    is kept off some nodes, and the batch is not cached as a whole (`key`), which needs
    every item's answer."""
    if not planned:
        return True
    return key is None and not any(it.plan.avoid for it in planned)  # type: ignore[union-attr]


def _objs(rows: list[Row]) -> list[Any]:
    """The request objects of `rows`, in their order."""
    return rows.objs if type(rows) is Rows else [row.obj for row in rows]


def _pinned_rows(rows: list[Row], planned: list[Item]) -> list[Row]:
    """`rows` and the `planned` items as rows (their objects pinned), in the client's
    order."""
    source = rows.source if type(rows) is Rows else None
    if source is not None and len(rows) + len(planned) == len(source):
        return source.pinned(planned)  # (the parser's columns, the pinned items in place)
    both = [*rows, *map(make_row, map(_FIELDS, planned))]
    both.sort(key=_POS)
    return both


_FIELDS = attrgetter("pos", "obj", "rid", "method", "spec", "ref", "notif", "block")
_POS = attrgetter("pos")


def _merged(rows: list[Row], planned: list[Item]) -> list[Item]:
    """The items to send, in the client's order: `rows` made Items, and `planned`."""
    items = items_of(rows)
    if planned:
        items.extend(planned)
        items.sort(key=_position)
    return items


def _position(it: Item) -> int:
    return it.pos

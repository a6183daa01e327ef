"""Step 2: the read path's hooks in the pipeline (what proxy/reads.py decides, applied).

Before an item is routed, the read path may answer it at once (a cached answer, the pinned
head for `eth_blockNumber`), pin its block (one `latest` per request, named by hash where
the method takes one), or have it wait for an identical read in flight. After its attempts,
a planned item's final answer is stored and handed to the reads waiting for it (`land`). A
whole batch the client sent before at the same `latest` may be answered from the cache as
it is (`batch_cached`), and one whose every item was answered at a block that `latest`
determines is kept for next time (`keep`).
"""

from __future__ import annotations

from collections import Counter
from itertools import compress, count
from operator import attrgetter, not_
from typing import Any

import orjson

from chainstate.jsonrpc import JsonRpcError, error_response
from proxy.face import Face
from proxy.metrics import ProxyMetrics
from proxy.model import Node
from proxy.parse import NO_NODE_KEY
from proxy.reads import Plan, Reads
from proxy.request import Ctx, Group, Item, Row, Rows, heights, make_row
from proxy.rounds import Rounds

COALESCED = "coalesced"  # node label of items that shared an identical read's answer


class ReadPath:
    def __init__(self, reads: Reads, rounds: Rounds, face: Face, metrics: ProxyMetrics) -> None:
        self.reads = reads
        self.chain_heads = reads.heads  # (`Reads.request`'s, called without it: a frame less)
        self.rounds = rounds
        self.face = face
        self.metrics = metrics

    def heads(self, ctx: Ctx) -> Any:
        """The request's heads, made on first use (each tag is resolved once per request)."""
        heads = ctx.heads
        if heads is None:
            heads = ctx.heads = self.chain_heads.request(ctx.pool, ctx.least)
        return heads

    # ---- a single request ----------------------------------------------------------------

    def plan(self, ctx: Ctx, item: Item, keyed: bool = True) -> tuple[int, bytes] | None:
        """Plans a request object (`item.plan`), or gives its answer when the read path has
        it ready (cached, or the pinned head), or -32602 when its params are nested too deep
        to be keyed (proxy/nesting.py). `keyed=False`: the body is longer than the read
        path keys (MAX_KEYED_BYTES: neither cached nor coalesced)."""
        if item.notif:
            return None
        try:
            plan = self.reads.plan(
                self.heads(ctx), item.method, item.spec, item.ref, item.obj, keyed
            )
        except JsonRpcError as exc:  # params too deep to key (proxy/nesting.py)
            self.metrics.request(ctx.chain, item.method, NO_NODE_KEY, "invalid")
            return 200, orjson.dumps(error_response(item.rid, exc.code, exc.message, exc.data))
        if plan is None:
            return None
        if type(plan) is not Plan:  # a ready result: cached, or the pinned head
            self.metrics.request(ctx.chain, item.method, _source(plan), "ok")
            return 200, orjson.dumps({"jsonrpc": "2.0", "id": item.rid, "result": plan})
        item.plan = plan
        return None

    async def follow(self, ctx: Ctx, it: Item, plan: Plan) -> bytes | None:
        """A single read the read path planned: the answer of an identical read in flight
        (None when there is none, or its leader got none: `it` is then set up to be sent,
        its block pinned)."""
        reads = self.reads
        if plan.flight is not None:
            answer = reads.shared(ctx.pool, await plan.flight.wait(), it.rid)
            if answer is not None:
                self.face.answer(it.spec, answer, ctx.pool, it.ref)
                result = "error" if "error" in answer else "ok"
                self.metrics.request(ctx.chain, it.method, COALESCED, result)
                return orjson.dumps(answer)
            plan = reads.unfollow(plan)
        if type(it.rid) is orjson.Fragment:  # the id as the client wrote it
            plan.obj = {**plan.obj, "id": it.rid}
            if plan.fallback is not None:
                plan.fallback = {**plan.fallback, "id": it.rid}
        it.plan, it.obj, it.ref = plan, plan.obj, plan.ref
        return None

    def land(self, item: Item, out: bytes | None, answers: list[Any]) -> None:
        """A planned item's final answer handed to the read path (stored when it may be,
        shared with the reads waiting for it)."""
        plan = item.plan
        if plan is not None and (plan.lead or plan.store):
            self.reads.land(plan, out if out is not None else answers[item.pos])

    async def route(
        self,
        ctx: Ctx,
        items: list[Item],
        body: bytes | None,
        answers: list[Any],
        single: bool,
        first: int = 1,
        chosen: dict[Node, Group] | None = None,
    ) -> bytes | None:
        """`Rounds.route` for items the read path planned: whatever happens, each item's
        final answer is landed (None when there is none: the reads waiting for it then ask
        a node themselves)."""
        out = None
        try:
            out = await self.rounds.route(ctx, items, body, answers, single, first, chosen)
        finally:
            for it in items:
                self.land(it, out if single else None, answers)
        return out

    # ---- a batch -------------------------------------------------------------------------

    def plan_rows(
        self, ctx: Ctx, rows: list[Row], answers: list[Any], in_rows: bool = False
    ) -> tuple[list[Row], list[Item], list[Item], bool]:
        """The read path for every row of a batch: rows answered at once get their answer;
        (rows it does not touch; items it planned, to send; items waiting for an identical
        read in flight; whether any item changed or left, so the client's bytes can no
        longer go as they are). `in_rows`: the rows go as one body (`Rounds.plain`), so
        items of a batch read from its bytes may be pinned in the rows themselves
        (`Reads.pin_rows`: no Item each; then the rows left carry them, `Rows.pins`)."""
        heads = self.heads(ctx)
        numbers = heights(rows)
        if numbers is not None:  # one method at plain heights: decided for all rows at once
            # (a batch's columns name its method: no row made, whose object is parsed)
            first = rows if type(rows) is Rows else rows[0]
            known = self.reads.planned_at(heads, first.method, first.spec, numbers)
            if known is None:
                return rows, [], [], False
            if type(rows) is Rows:  # (its columns: no row made for those left alone)
                picked = list(compress(count(), known))
                if in_rows and rows.found is not None and rows.positions is None:
                    hashes = self.reads.pin_rows(heads, rows, picked)
                    if hashes is not None:
                        return rows.pin_by_hash(picked, hashes), [], [], True
                plain = rows.without(known, len(picked))
                # (rows read from their bytes: each an Item at once, most are planned)
                make = rows.__getitem__ if rows.found is None else rows.item
                rows = list(map(make, picked))  # type: ignore[arg-type]
            else:
                plain = list(compress(rows, map(not_, known)))
                rows = list(compress(rows, known))  # (planned one by one below)
        plan_of = self.reads.plan
        send: list[Item] = []
        waiting: list[Item] = []
        changed = False
        left: list[Row] = []  # rows the loop leaves as they are
        ready: dict[tuple[str, str], int] = {}  # (method, source) → items answered at once
        # (method, block text) pairs the read path leaves as they are: that depends on
        # nothing else within a request (the same method and block, the same heads), so
        # each pair is asked about once (a batch at random heights repeats a third of them).
        untouched: set[tuple[str, str | None]] = set()
        for row in rows:
            if row.notif:
                left.append(row)
                continue
            block = row.block
            pair = (row.method, block) if block is not None or row.ref is None else None
            if pair is not None and pair in untouched:
                left.append(_row(row))
                continue
            try:
                plan = plan_of(heads, row.method, row.spec, row.ref, row.obj)
            except JsonRpcError as exc:  # params too deep to key (proxy/nesting.py)
                self.metrics.request(ctx.chain, row.method, NO_NODE_KEY, "invalid")
                answers[row.pos] = error_response(row.rid, exc.code, exc.message)
                changed = True
                continue
            if plan is None:
                if pair is not None:
                    untouched.add(pair)
                left.append(_row(row))
                continue
            if type(plan) is not Plan:  # a ready result
                answers[row.pos] = {"jsonrpc": "2.0", "id": row.rid, "result": plan}
                counted = (row.method, _source(plan))
                ready[counted] = ready.get(counted, 0) + 1
                changed = True
                continue
            it = row if type(row) is Item else Item(*row)
            it.plan = plan
            if plan.obj is not it.obj:
                it.obj, it.ref, changed = plan.obj, plan.ref, True
            if plan.flight is not None:
                waiting.append(it)
                changed = True
            else:
                send.append(it)
        if numbers is None:
            plain = left
        elif left:  # (rare: a height whose hash is known, left as it is)
            plain = sorted([*plain, *left], key=_POS)
        for (method, source), n in ready.items():
            self.metrics.request(ctx.chain, method, source, "ok", n)
        return plain, send, waiting, changed

    async def wait(self, ctx: Ctx, waiting: list[Item], answers: list[Any]) -> None:
        """Batch items that share an identical read's answer; those whose leader got none
        are sent themselves."""
        reads = self.reads
        again = []
        for it in waiting:
            flight = it.plan.flight  # type: ignore[union-attr]
            answer = reads.shared(ctx.pool, await flight.wait(), it.rid)  # type: ignore[union-attr]
            if answer is None:
                it.plan = plan = reads.unfollow(it.plan)  # type: ignore[arg-type]
                it.obj, it.ref = plan.obj, plan.ref
                again.append(it)
                continue
            self.face.answer(it.spec, answer, ctx.pool, it.ref)
            result = "error" if "error" in answer else "ok"
            self.metrics.request(ctx.chain, it.method, COALESCED, result)
            answers[it.pos] = answer
        if again:
            await self.route(ctx, again, None, answers, single=False)

    def batch_cached(self, ctx: Ctx, body: bytes) -> tuple[Any, bytes | None]:
        """(The whole-batch cache key of `body` at the request's `latest`, or None; the
        answer kept under it, counted, or None)."""
        reads = self.reads
        key = None if ctx.pool.mirrors else reads.batch_key(self.heads(ctx), body)
        if key is None:
            return None, None
        found = reads.cache.get_batch(key)
        if found is None:
            return key, None
        out, methods = found
        for method, n in methods:
            self.metrics.request(ctx.chain, method, "cache", "ok", n)
        return key, out

    def epoch(self, ctx: Ctx) -> int:
        """The pool's cache epoch now (a flush starts a new one)."""
        return self.reads.cache.epochs.get(ctx.pool.id, 0)

    def store_batch(self, ctx: Ctx, key: Any, out: bytes, epoch: int) -> None:
        """Keeps a whole batch's answer when `keep` found it cacheable and the pool's cache
        was not flushed since `epoch`."""
        keep = ctx.keep
        if keep is not None and self.epoch(ctx) == epoch:
            self.reads.cache.put_batch(key, out, keep)

    @staticmethod
    def keep(
        ctx: Ctx, key: Any, rows: list[Row], size: int, out: list[Any], items: list[Item]
    ) -> None:
        """Sets what to cache of the whole batch (`key`: None when it is not cached), when
        every item was valid and answered at a block the request's `latest` determines,
        none asked by height after all (`items`: those planned)."""
        if key is not None and len(rows) == size and ctx.heads.mixed is False and _exact(items):
            # (rows of one method as columns: no row made, nor their objects parsed)
            one = type(rows) is Rows
            methods = [rows.method] * size if one else [row.method for row in rows]  # type: ignore[attr-defined]
            ctx.keep = _kept_as_a_whole(methods, out)


_POS = attrgetter("pos")
_FIELDS = attrgetter("pos", "obj", "rid", "method", "spec", "ref", "notif", "block")


def _row(row: Row | Item) -> Row:
    """A row the read path leaves as it is, as a `Row` (a batch read from its bytes gives
    its planned rows as Items)."""
    return make_row(_FIELDS(row)) if type(row) is Item else row  # type: ignore[return-value]


def _source(ready: Any) -> str:
    """The node label of a result answered without a node (metrics)."""
    return "cache" if type(ready) is orjson.Fragment else "head"


def _exact(items: list[Item]) -> bool:
    """No item of `items` was asked by height after all (its pinned hash unknown to the
    node): what the whole-batch cache needs."""
    return all(it.plan is None or it.plan.exact for it in items)


def _kept_as_a_whole(methods: list[str], out: list[Any]) -> tuple[tuple[str, int], ...] | None:
    """The items per method of a batch whose every item was answered at a block its
    `latest` determines may be cached as a whole, unless an item was a notification (no
    answer) or got an error: then None."""
    if len(out) != len(methods):
        return None
    for answer in out:
        if type(answer) is not dict or "result" not in answer:
            return None
    return tuple(Counter(methods).items())

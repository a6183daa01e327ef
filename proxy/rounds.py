"""Steps 3-6 in rounds: choose, send, classify, and retry what the outcomes say.

`Rounds.route` is the one retry loop, for single requests and batch items alike: each round
chooses a node per pending item (proxy/choose.py), sends one body per chosen node through
`Attempts.exchange` (proxy/attempts.py: hedging, deadlines and the node's books), classifies
every answer (proxy/classify.py) and keeps what asks for another attempt for the next round,
for at most `max_attempts` rounds; an item left then is given up (proxy/answer.py).

A body goes as the client's bytes when it can (a single request, or a batch whose ids tell the
answers apart, all for one node), and the node's bytes are then the answer as they came;
otherwise as a sub-batch per node with ids rewritten to positions (or the client's own ids
when they are unique). `plain` sends a batch's rows that need no `Item` as one body, making
Items only when the loop must go on with them.
"""

from __future__ import annotations

import asyncio
import re
from bisect import bisect_left
from collections.abc import Awaitable
from operator import attrgetter
from typing import Any

import orjson

from chainstate.jsonrpc import INVALID_PARAMS, error_response
from proxy import nesting, outcome
from proxy.answer import Answers
from proxy.attempts import OK, Attempts
from proxy.choose import Chooser
from proxy.classify import Classifier, in_order, loads, place, result_text, results_in_order
from proxy.model import Node
from proxy.outcome import UpstreamError
from proxy.parse import NO_NODE_KEY
from proxy.request import BATCH, Ctx, Group, Item, Row, Rows, items_of
from proxy.ryw import UNMINED_FIELDS


def _usable_single(raw: bytes) -> bool:
    """A second attempt's answer to a single request may win unless it asks for a retry."""
    return not outcome.of_raw(raw).retry


def _usable_batch(raw: bytes) -> bool:
    return True


class _Sent:
    """The rows `plain` sends as one body, as `Attempts.exchange` sees them: one entry
    whose nodes tried are every row's (a hedge adds its node here), and the rows (a lone
    node's second attempt goes where every row may go: `Chooser.second`)."""

    __slots__ = ("rows", "tried")

    def __init__(self, node: Node, rows: list[Row]) -> None:
        self.tried = [node]
        self.rows = rows


class _Checked:
    """A whole batch's answer checked once, as its attempt is booked: `label` runs
    `results_in_order` over it (a match is results only: `ok`, the label `outcome.answered`
    gives such an answer), and `plain_answered_now` reads the match back for the same bytes
    instead of matching them again (a hedge's answer, other bytes, is matched then)."""

    __slots__ = ("found", "raw", "rids")

    def __init__(self, rids: list[Any]) -> None:
        self.rids = rids
        self.raw: bytes | None = None  # the answer checked, and its match (or None)
        self.found: re.Match[bytes] | None = None

    def label(self, raw: bytes) -> str:
        found = self.found = results_in_order(self.rids, raw)
        self.raw = raw
        return OK if found is not None else outcome.answered(raw)


class Followed:
    """A whole batch read from its bytes (proxy/scan.py) whose `rows` go as one body while
    the items at `gaps` (positions, in order) wait for identical reads in flight: the
    node's answer is checked as the batch's whole answer (`results_in_order`, over all the
    client's ids) with an empty result standing in each gap's place, and the followers'
    answers are written into those places. The node's answer, once so checked, is what
    `orjson.dumps` would write of its items, so the joined bytes are those of the answers
    placed one by one and dumped, without decoding the node's."""

    __slots__ = ("at", "found", "gaps", "raw", "rids", "rows")

    def __init__(self, rids: list[Any], rows: Rows, gaps: list[int]) -> None:
        self.rids = rids  # the whole batch's ids
        self.rows = rows  # the rows sent (their body: `rows.raw`)
        self.gaps = gaps
        self.raw = b""  # the node's answer, once checked (`found`: the match)
        self.found: re.Match[bytes] | None = None
        self.at: list[int] = []  # where each gap's answer goes in `raw`

    def check(self, raw: bytes) -> re.Match[bytes] | None:
        """The match of the node's answer `raw` with the gaps filled, when it is the
        results of the rows sent, in order (then kept for `joined`); else None."""
        rids = self.rids
        first = rids[0]
        if raw[-1:] != b"]" or type(first) is not int:
            return None
        gaps, at, pieces, done = self.gaps, [], [], 0
        for k, pos in enumerate(gaps):
            following = pos + 1  # (the next item sent: its answer's start, or the end)
            while k + 1 < len(gaps) and gaps[k + 1] == following:
                following, k = following + 1, k + 1
            if following < len(rids):
                where = raw.find(_OPEN % rids[following], done)
                if where < 0:
                    return None
                piece = _EMPTY % rids[pos] + b","
            else:
                where, piece = len(raw) - 1, b"," + _EMPTY % rids[pos]
            at.append(where)
            pieces += (raw[done:where], piece)
            done = where
        found = results_in_order(rids, b"".join([*pieces, raw[done:]]))
        if found is not None:
            self.raw, self.found, self.at = raw, found, at
        return found

    def joined(self, answers: list[Any]) -> bytes:
        """The checked answer with each gap's answer written in (`answers`: by position)."""
        raw, at, pieces, done = self.raw, self.at, [], 0
        last = len(raw) - 1
        for where, pos in zip(at, self.gaps, strict=True):
            answer = answers[pos]
            if answer is None:  # (none: left out, as the answers' list leaves it out)
                continue
            text = orjson.dumps(answer)
            pieces += (raw[done:where], b"," + text if where == last else text + b",")
            done = where
        pieces.append(raw[done:])
        return b"".join(pieces)


_OPEN = b'{"jsonrpc":"2.0","id":%d,'  # (an answer's start, as `results_in_order` takes it)
_EMPTY = b'{"jsonrpc":"2.0","id":%d,"result":""}'


class PlainStep:
    """A batch's rows `Rounds.plain_start` made ready to go to one node as one body: the
    rows, the bytes, where their answers go, the read path's Items among them, the entry
    the attempt books (`_Sent`), its group, the check of a whole answer (`_Checked`, or
    None) and whether the bytes are the client's whole body."""

    __slots__ = (
        "answers",
        "checked",
        "data",
        "followed",
        "group",
        "planned",
        "rows",
        "sent",
        "whole",
    )

    def __init__(
        self,
        rows: list[Row],
        data: bytes,
        answers: list[Any],
        planned: list[Item] | None,
        followed: Followed | None,
        sent: _Sent,
        group: Group,
        checked: _Checked | None,
        whole: bool,
    ) -> None:
        self.rows = rows
        self.data = data
        self.answers = answers
        self.planned = planned
        self.followed = followed
        self.sent = sent
        self.group = group
        self.checked = checked
        self.whole = whole


async def _none() -> None:
    """`plain`'s answer for no rows."""
    return None


class Rounds:
    def __init__(
        self,
        rounds: int,
        chooser: Chooser,
        attempts: Attempts,
        classifier: Classifier,
        answers: Answers,
    ) -> None:
        self.rounds = rounds  # max_attempts
        self.chooser = chooser
        self.attempts = attempts
        self.classifier = classifier
        self.answers = answers

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
        """The rounds for the items of one client request. `body` is the client's bytes
        when they may go as they are to a round whose items all go to one node; the node's
        bytes are then returned when they are the whole answer as they are. Otherwise (None)
        the answers are in `answers`. `first`: the round to start with (the synchronous
        start made round 1); `chosen`: its groups, when they were chosen already."""
        pending = items
        sent = items[0].obj  # the object `body` holds, for a single request
        give_up = self.answers.give_up

        def refuse(it: Item, why: Any) -> None:
            give_up(ctx, it, answers, why)

        for attempt in range(first, self.rounds + 1):
            groups = chosen or self.chooser.groups(ctx, pending, attempt, refuse)
            chosen = None
            if not groups:
                return None
            if body is not None and len(groups) == 1:
                (group,) = groups.values()
                if single and group.items[0].obj is not sent:
                    sent = group.items[0].obj  # asked by height after all (`Chooser.retry`)
                    body = orjson.dumps(sent)
                pending, out = await self.raw(ctx, group, body, answers, single)
                if out is not None:
                    return out
                if not single:
                    body = None  # a batch's retry sends only the items it retries
            else:
                body = None
                sends = [self.sub_batch(ctx, group, answers) for group in groups.values()]
                loop = self.attempts.upstream.deadlines.loop
                pending = [it for retry in await _gather(sends, loop) for it in retry]
            if not pending:
                return None
        for it in pending:
            give_up(ctx, it, answers, None)
        return None

    async def go_on(self, ctx: Ctx, pending: list[Item], answers: list[Any]) -> None:
        """The rounds from the second on, for the items a first attempt left."""
        if pending:
            await self.route(ctx, pending, None, answers, single=False, first=2)

    async def raw(
        self, ctx: Ctx, group: Group, body: bytes, answers: list[Any], single: bool
    ) -> tuple[list[Item], bytes | None]:
        """Send the client's bytes unchanged to one node: `Classifier.raw`'s result."""
        items = group.items
        try:
            node, raw = await self.attempts.exchange(
                ctx, group, body, _usable_single if single else _usable_batch
            )
        except UpstreamError as exc:
            return self.classifier.failed(ctx, items, exc, answers), None
        return self.classifier.raw(ctx, group, node, raw, answers, single)

    async def sub_batch(self, ctx: Ctx, group: Group, answers: list[Any]) -> list[Item]:
        """Send one sub-batch with the client's ids when they tell the answers apart, else
        with ids rewritten to positions; returns the items to retry."""
        items = group.items
        if ctx.own_ids:
            sub = [it.obj for it in items]
            keys = [None if it.notif else it.rid for it in items]
        else:
            sub = [it.obj if it.notif else {**it.obj, "id": j} for j, it in enumerate(items)]
            keys = [None if it.notif else j for j, it in enumerate(items)]
        try:
            data = orjson.dumps(sub)
        except TypeError:  # items too deep to write again: -32602 (proxy/nesting.py)
            deep = set(nesting.deep(sub))
            for i in deep:
                self._refuse_deep(ctx, items[i], answers)
            group.items = [it for i, it in enumerate(items) if i not in deep]
            return await self.sub_batch(ctx, group, answers) if group.items else []
        try:
            node, raw = await self.attempts.exchange(ctx, group, data, _usable_batch)
        except UpstreamError as exc:
            return self.classifier.failed(ctx, items, exc, answers)
        return self.classifier.sub_batch(ctx, node, items, keys, raw, answers)

    async def plain(
        self,
        ctx: Ctx,
        rows: list[Row],
        body: bytes | None,
        answers: list[Any],
        planned: list[Item] | None = None,
        followed: Followed | None = None,
    ) -> bytes | None:
        """A batch's rows the read path does not touch, every one with its own id and an
        answer, sent as one body to one node with no `Item` per row: their answer, when it
        comes one per row in their order with nothing to retry or hide (`in_order`), is
        taken as it is; `body` (the client's bytes, when every row is here unchanged) is then
        the answer's. Anything else (rows for several nodes, none eligible, a failed
        attempt, an answer to match or classify row by row) goes on in the rounds with the
        Items made then, from the step reached. `planned`: the Items of rows the read path
        planned (their objects pinned), which go on as they are and get their answers
        placed (the read path lands them). `followed`: the batch's items left out of
        `body`, which is then these rows' bytes, not the client's (their answers are
        placed, and the node's bytes kept in `followed` when they can be joined)."""
        step = self.plain_start(ctx, rows, body, answers, planned, followed)
        if type(step) is not PlainStep:
            return await step  # type: ignore[misc]
        return await self.plain_send(ctx, step)

    def plain_start(
        self,
        ctx: Ctx,
        rows: list[Row],
        body: bytes | None,
        answers: list[Any],
        planned: list[Item] | None = None,
        followed: Followed | None = None,
    ) -> PlainStep | Awaitable[bytes | None]:
        """`plain`'s steps up to its attempt, without a task: the node the rows go to and
        the bytes it gets (`PlainStep`, for `plain_send`, or a first attempt sent now:
        proxy/firstbatch.py); or the rest of `plain` to await when they do not go to one
        node as one body (none, rows for several nodes, rows too deep to write again)."""
        if not rows:
            return _none()
        whole = body is not None and followed is None
        found = self.chooser.one_node(ctx.pool, rows)
        if found is None:
            items = _items(rows, planned, None)
            return self.route(ctx, items, body if whole else None, answers, False)
        data = body
        if data is None:
            try:
                data = orjson.dumps(rows.objs if type(rows) is Rows else [row.obj for row in rows])
            except TypeError:  # rows too deep to write again: -32602 (proxy/nesting.py)
                deep = set(nesting.deep([row.obj for row in rows]))
                for i in deep:
                    self._refuse_deep(ctx, rows[i], answers)
                rest = [row for i, row in enumerate(rows) if i not in deep]
                return self.plain(ctx, rest, None, answers, planned)
        node, cands = found
        sent = _Sent(node, rows)
        group = Group(node, [sent], cands, BATCH if len(rows) > 1 else rows[0].method)
        checked = None
        if whole:
            checked = _Checked(rows.rids if type(rows) is Rows else list(map(_RID, rows)))
        return PlainStep(rows, data, answers, planned, followed, sent, group, checked, whole)

    async def plain_send(self, ctx: Ctx, step: PlainStep) -> bytes | None:
        """`plain`'s attempt of what `plain_start` made ready, and what follows its answer."""
        label = None if step.checked is None else step.checked.label
        try:
            node, raw = await self.attempts.exchange(
                ctx, step.group, step.data, _usable_batch, label
            )
        except UpstreamError as exc:
            out, pending = self.plain_landed(ctx, step, step.group.node, None, exc)
        else:
            followed, answers, planned = step.followed, step.answers, step.planned
            if followed is not None and self._followed(ctx, node, followed, raw, answers, planned):
                return None
            out, pending = self.plain_landed(ctx, step, node, raw, None)
        await self.go_on(ctx, pending, step.answers)
        return out

    async def plain_rest(
        self, ctx: Ctx, pending: list[Item], step: PlainStep, out: bytes | None
    ) -> bytes | None:
        """`plain`'s rounds from the second on, for the Items its first attempt left
        (`plain_landed`), then its outcome."""
        await self.go_on(ctx, pending, step.answers)
        return out

    def plain_landed(
        self,
        ctx: Ctx,
        step: PlainStep,
        node: Node,
        raw: bytes | None,
        exc: UpstreamError | None,
    ) -> tuple[bytes | None, list[Item]]:
        """What `plain`'s attempt brought (`raw` from `node`, or the error `exc`),
        classified without a task: (the node's bytes when they are the whole answer as they
        are, else None with the answers placed; the Items the rounds go on with)."""
        if exc is not None:
            items = _items(step.rows, step.planned, step.sent.tried)
            return None, self.classifier.failed(ctx, items, exc, step.answers)
        return self.plain_answered_now(
            ctx,
            step.rows,
            node,
            step.sent.tried,
            raw,  # type: ignore[arg-type]
            step.whole,
            step.answers,
            step.planned,
            step.checked,
        )

    def _followed(
        self,
        ctx: Ctx,
        node: Node,
        followed: Followed,
        raw: bytes,
        answers: list[Any],
        planned: list[Item] | None,
    ) -> bool:
        """Whether `raw` answers the rows sent as `followed` checks it (then counted, and
        the pinned items' answers placed, for the read path)."""
        method = followed.rows.method
        if method in UNMINED_FIELDS:
            return False
        found = followed.check(raw)
        if found is None:
            return False
        self.classifier.ok_all(ctx, node, method, len(followed.rows))
        for it in planned or ():
            text = result_text(found, it.pos).decode("ascii")
            answers[it.pos] = {"jsonrpc": "2.0", "id": it.rid, "result": text}
        return True

    def _refuse_deep(self, ctx: Ctx, item: Item | Row, answers: list[Any]) -> None:
        """An item too deep to write again (proxy/nesting.py): -32602, with its own id."""
        self.answers.metrics.request(ctx.chain, item.method, NO_NODE_KEY, "invalid")
        if not item.notif:
            answers[item.pos] = error_response(item.rid, INVALID_PARAMS, nesting.MESSAGE)

    def plain_answered_now(
        self,
        ctx: Ctx,
        rows: list[Row],
        node: Node,
        tried: list[Node],
        raw: bytes,
        whole: bool,
        answers: list[Any],
        planned: list[Item] | None = None,
        checked: _Checked | None = None,
    ) -> tuple[bytes | None, list[Item]]:
        """`plain` once `node` answered `raw`, classified: (the node's bytes when they are the
        answer as they are and `whole` (they answer the client's body), else None with the
        answers placed; the Items the rounds go on with). `checked`: the answer's check made
        as its attempt was booked, if any."""
        classifier = self.classifier
        methods: list[str] | None = None  # (None: the rows' one method, `rows.method`)
        if type(rows) is Rows:  # (its ids kept as parsed, one method: asked about once)
            rids, taken = rows.rids, whole and rows.method not in UNMINED_FIELDS
        else:
            rids, methods = list(map(_RID, rows)), list(map(_METHOD, rows))
            taken = whole and UNMINED_FIELDS.keys().isdisjoint(methods)
        if taken:
            if checked is not None and checked.raw is raw:
                found = checked.found  # (matched as the attempt was booked)
            else:
                found = results_in_order(rids, raw)  # (the common answer: not decoded)
            if found is not None:
                if methods is None:
                    classifier.ok_all(ctx, node, rows.method, len(rids))  # type: ignore[attr-defined]
                else:
                    classifier.ok(ctx, node, methods)
                if planned:  # (their answers, for the read path)
                    _place_found(rows, planned, found, answers)
                return raw, []
        if methods is None:
            methods = [rows.method] * len(rows)  # type: ignore[attr-defined]
        parsed = loads(raw)
        if in_order(rids, methods, parsed, raw):
            classifier.count(ctx, node, methods, None, parsed, raw)
            if whole:
                if planned:  # (their answers, for the read path)
                    _place_planned(rows, planned, parsed, answers)
                return raw, []
            place([row.pos for row in rows], rids, parsed, answers)
            return None, []
        items = _items(rows, planned, tried)
        if not isinstance(parsed, list | dict):
            parsed = classifier.decode(ctx, node, items, raw)  # penalises the node
        pending = items if parsed is None else []
        if parsed is not None:
            pending = classifier.take(ctx, node, items, rids, parsed, answers)
        return None, pending


def _items(rows: list[Row], planned: list[Item] | None, tried: list[Node] | None) -> list[Item]:
    """`rows` as Items for the rounds, those the read path planned as their own Items (or,
    pinned in the rows' bytes, with their Plans made now: `Rows.plan_pins`)."""
    items = items_of(rows, tried)
    if type(rows) is Rows and rows.pins:
        rows.plan_pins(items)
    if planned:
        own = {it.pos: it for it in planned}
        for j, it in enumerate(items):
            mine = own.get(it.pos)
            if mine is not None:
                if tried:
                    mine.tried = list(tried)
                items[j] = mine
    return items


def _place_planned(
    rows: list[Row], planned: list[Item], parsed: list[Any], answers: list[Any]
) -> None:
    """The answers of the `planned` items among `rows` (`parsed`: one per row, in order)."""
    for it in planned:
        answer = parsed[_index(rows, it.pos)]
        answer["id"] = it.rid
        answers[it.pos] = answer


def _place_found(
    rows: list[Row], planned: list[Item], found: re.Match[bytes], answers: list[Any]
) -> None:
    """The answers of the `planned` items among `rows` from `results_in_order`'s match
    (`result_text`)."""
    for it in planned:
        text = result_text(found, _index(rows, it.pos)).decode("ascii")
        answers[it.pos] = {"jsonrpc": "2.0", "id": it.rid, "result": text}


def _index(rows: list[Row], pos: int) -> int:
    """The index among `rows` (in the client's order) of the row at `pos` in the batch:
    `pos` itself for a whole batch's columns, else found by bisection (which makes a `Row`
    per probe of columns)."""
    if type(rows) is Rows and rows.positions is None:
        return pos
    return bisect_left(rows, pos, key=_POS)


_POS = attrgetter("pos")
_RID, _METHOD = attrgetter("rid"), attrgetter("method")


async def _gather(coros: list[Any], loop: asyncio.AbstractEventLoop) -> list[Any]:
    """The sub-batches' results in order, each in a task of its own so that all start in
    the same loop turn and their writes reach the nodes together (awaiting the first in the
    current task sent it a turn ahead of the others: ~10 % more of the proxy's CPU per batch
    beside a node on the same core); no `asyncio.gather` (a future for all and a getpid()
    system call). When one fails or the request's task is cancelled, the others are
    cancelled."""
    if len(coros) == 1:
        return [await coros[0]]
    tasks = [loop.create_task(coro) for coro in coros]
    try:
        return [await task for task in tasks]
    except BaseException:
        for task in tasks:
            task.cancel()
        raise

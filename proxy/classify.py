"""Step 5: a node's answer matched to the items it was sent for, and each one classified.

An answer is final or asks for another attempt (proxy/outcome.py: -39006 and -39008 ask for
another node). A single request's bytes are only peeked at; a batch answer is taken as it is
when it answers every item in order with nothing to retry or rewrite (`in_order`), and
matched item by item (by position or by the client's own ids) otherwise. A transaction
lookup the state nodes do not hold goes to the Leader next (proxy/ryw.py). Returns the items
to retry; final answers land in the request's `answers` list.
"""

from __future__ import annotations

import re
from collections import Counter
from operator import itemgetter
from typing import Any

import orjson

from proxy import outcome
from proxy.answer import Answers
from proxy.attempts import Attempts
from proxy.face import Face
from proxy.metrics import ProxyMetrics
from proxy.model import Node
from proxy.outcome import BadResponse, UpstreamError
from proxy.request import Ctx, Group, Item
from proxy.ryw import (
    UNMINED_FIELDS,
    ReadYourWrites,
    hide_unreadable,
    not_held,
    not_held_raw,
    to_leader,
)


class Classifier:
    def __init__(
        self,
        attempts: Attempts,
        answers: Answers,
        face: Face,
        ryw: ReadYourWrites,
        metrics: ProxyMetrics,
        keep_answers: bool,
    ) -> None:
        self.attempts = attempts
        self.answers = answers
        self.face = face
        self.ryw = ryw
        self.metrics = metrics
        # The items' answers are wanted even when the node's bytes are the client's answer
        # (the read path stores and shares them).
        self.keep_answers = keep_answers

    def raw(
        self, ctx: Ctx, group: Group, node: Node, raw: bytes, answers: list[Any], single: bool
    ) -> tuple[list[Item], bytes | None]:
        """The client's bytes answered by `node`: (items to retry, and the node's bytes when
        they are the answer as they are: for a batch, every item answered, in order, no
        retryable error, no transaction to show as pending)."""
        items = group.items
        if single:
            it = items[0]
            # (bytes written early were peeked at then: their verdict is kept with them)
            result = ctx.verdict if ctx.written is raw else outcome.of_raw(raw)
            if not result.retry:
                if it.spec.mempool and not_held_raw(raw) and to_leader(ctx.pool, it):
                    it.retry_later(node, raw, outcome.NOT_HELD)
                    return [it], None
                self.metrics.request(ctx.chain, it.method, node.entry.key, result.name)
                return [], raw
            it.retry_later(node, raw, result)
            return [it], None
        parsed = self.decode(ctx, node, items, raw)
        if parsed is None:
            return [it for it in items if not it.notif], None
        if in_order(
            [it.rid for it in items if not it.notif], [it.method for it in items], parsed, raw
        ):
            self.count(
                ctx, node, [it.method for it in items], [it.notif for it in items], parsed, raw
            )
            if self.keep_answers:  # the answers to store and share
                fill(items, parsed, answers)
            return [], raw
        keys = [None if it.notif else it.rid for it in items]
        return self.take(ctx, node, items, keys, parsed, answers), None

    def sub_batch(
        self,
        ctx: Ctx,
        node: Node,
        items: list[Item],
        keys: list[Any],
        raw: bytes,
        answers: list[Any],
    ) -> list[Item]:
        """A sub-batch's answer (`keys`: what each item was sent with): the items to retry."""
        parsed = self.decode(ctx, node, items, raw)
        if parsed is None:
            return [it for it in items if not it.notif]
        rids = [it.rid for it in items if not it.notif]
        if ctx.own_ids and in_order(rids, [it.method for it in items], parsed, raw):
            # The common case needs no item matched by its id or classified on its own.
            self.count(
                ctx, node, [it.method for it in items], [it.notif for it in items], parsed, raw
            )
            fill(items, parsed, answers)
            return []
        return self.take(ctx, node, items, keys, parsed, answers)

    def failed(
        self, ctx: Ctx, items: list[Item], exc: UpstreamError, answers: list[Any]
    ) -> list[Item]:
        """A group whose attempt got no answer: the items to retry (all of them, unless the
        failure is final: then each is answered with it now)."""
        for it in items:
            it.failed(exc)
        if exc.outcome.retry:
            return items
        for it in items:
            self.answers.give_up(ctx, it, answers, None)
        return []

    def decode(self, ctx: Ctx, node: Node, items: list[Item], raw: bytes) -> Any:
        """A batch answer decoded, or None when it is not JSON-RPC (the node is penalised
        and every item retried)."""
        parsed = loads(raw)
        if isinstance(parsed, list | dict):
            return parsed
        why = f"{node.key} answered a batch with non-JSON-RPC"
        self.attempts.penalise(ctx, node, outcome.BAD_RESPONSE, why)
        bad = BadResponse(why)
        for it in items:
            it.failed(bad)
        return None

    def take(
        self,
        ctx: Ctx,
        node: Node,
        group: list[Item],
        keys: list[Any],
        parsed: Any,
        answers: list[Any],
    ) -> list[Item]:
        """Each item's answer (found by its key: its position in the sub-batch, or its own
        id) classified; the ones to retry are returned."""
        by_key = _by_key(keys, parsed)
        retry = []
        counts: dict[tuple[str, str], int] = {}  # (method, outcome) → answers: metrics
        readable: int | bool | None = False  # looked up once, when an answer needs it
        for it, key in zip(group, keys, strict=True):
            if it.notif:
                counted = (it.method, "ok")
                counts[counted] = counts.get(counted, 0) + 1
                continue
            answer = by_key.get(key)
            if answer is None:
                it.failed(BadResponse(f"{node.key} gave no answer for the item"))
                it.reason = outcome.MISSING.name
                retry.append(it)
                continue
            answer["id"] = it.rid
            result = outcome.of_answer(answer)
            if result.retry:
                it.retry_later(node, answer, result)
                retry.append(it)
                continue
            if it.spec.mempool and not_held(answer) and to_leader(ctx.pool, it):
                it.retry_later(node, answer, outcome.NOT_HELD)
                retry.append(it)
                continue
            if result is outcome.ERROR:
                self.face.answer(it.spec, answer, ctx.pool, None)  # (a -39006 is retried)
            counted = (it.method, result.name)
            counts[counted] = counts.get(counted, 0) + 1
            if it.method in UNMINED_FIELDS:
                if readable is False:
                    readable = self.ryw.readable(ctx.pool)
                hide_unreadable(it.method, answer, readable)  # type: ignore[arg-type]
            answers[it.pos] = answer
        for (method, name), n in counts.items():
            self.metrics.request(ctx.chain, method, node.key, name, n)
        return retry

    def count(
        self,
        ctx: Ctx,
        node: Node,
        methods: list[str],
        notifs: list[bool] | None,
        parsed: list[Any],
        raw: bytes,
    ) -> None:
        """Metrics of a batch answered as it is (`in_order`; `notifs`: which items are
        notifications, when any is): one increment per method and outcome."""
        if raw.find(b'"error"') < 0:  # every item ok: count by method alone
            self.ok(ctx, node, methods)
            return
        answered = iter(parsed)
        outcomes = [
            (method, "ok" if notif or "error" not in next(answered) else "error")
            for method, notif in zip(methods, notifs or [False] * len(methods), strict=True)
        ]
        for (method, result), n in Counter(outcomes).items():
            self.metrics.request(ctx.chain, method, node.key, result, n)

    def ok_all(self, ctx: Ctx, node: Node, method: str, n: int) -> None:
        """Metrics of a batch of `n` items of one method, every one answered with a result
        (one increment: no list of methods made and counted)."""
        self.metrics.request(ctx.chain, method, node.key, "ok", n)

    def ok(self, ctx: Ctx, node: Node, methods: list[str]) -> None:
        """Metrics of a batch whose every item got a result (one increment per method)."""
        n = len(methods)
        if n and methods.count(methods[0]) == n:  # (one method: no Counter)
            self.metrics.request(ctx.chain, methods[0], node.key, "ok", n)
            return
        for method, n in Counter(methods).items():
            self.metrics.request(ctx.chain, method, node.key, "ok", n)


def results_in_order(rids: list[Any], raw: bytes) -> re.Match[bytes] | None:
    """A node's answer to items sent with the client's ids (`rids`: int or str, no bool),
    checked without decoding it when the ids are `0..n-1` or `1..n` (n up to
    MAX_SHAPE_ITEMS): a match when it is one `{"jsonrpc":"2.0","id":ID,"result":"TEXT"}`
    per id, in their order, each TEXT printable ASCII with no escape (every quantity and
    data result), each TEXT its group; else None (then decoded: `in_order`). Such an
    answer is final as it is (no error, no transaction to show as pending), and one regular
    expression over its bytes costs about half of decoding it into objects and reading
    their ids back. An expression is made once per first id and size (8 ms for 100 items)
    and kept: at most 2 × MAX_SHAPE_ITEMS of them, so no client makes one per request
    (ids counted on across requests are decoded)."""
    n = len(rids)
    if not 0 < n <= MAX_SHAPE_ITEMS:
        return None
    first = rids[0]
    if (first != 0 and first != 1) or type(first) is not int:
        return None
    kept = _SHAPES.get((first, n))
    if kept is None:
        ids = list(range(first, first + n))
        if rids != ids:
            return None
        kept = _SHAPES[(first, n)] = (_shape(first, n), ids)
    elif rids != kept[1]:  # (the ids kept with it: no list of them made per answer)
        return None
    return kept[0].fullmatch(raw)


def _shape(first: int, n: int) -> re.Pattern[bytes]:
    """The expression `results_in_order` matches for ids `first` .. `first + n - 1`. The
    seams every item repeats (`,"result":"` and `"},{"jsonrpc":"2.0","id":`) are captured
    once and matched again by reference, which `_sre` compares in a tighter loop than one
    literal byte per step; `result_text` finds the result texts' groups among them."""
    out = [rb'\[\{"jsonrpc":"2\.0","id":%d(?P<r>,"result":")' % first + _TEXT]
    for i in range(first + 1, first + n):
        seam = rb'(?P<s>"\},\{"jsonrpc":"2\.0","id":)' if i == first + 1 else rb"(?P=s)"
        out.append(seam + rb"%d(?P=r)" % i + _TEXT)
    return re.compile(rb"".join(out) + rb'"\}\][ \t\r\n]*')


def result_text(found: re.Match[bytes], k: int) -> bytes:
    """The result text of item `k` (from 0) in `results_in_order`'s match: group 1 is the
    `,"result":"` seam, group 2 item 0's text, group 3 the seam between items."""
    return found.group(2 if k == 0 else k + 3)


# A JSON string with no escape, of printable ASCII: the result text as Python reads it.
# Possessive (`*+`): its closing quote is outside the class, and `_sre` matches the rest
# without a nested frame per item.
_TEXT = rb"([\x20\x21\x23-\x5b\x5d-\x7e]*+)"  # (its quotes are the seams')
MAX_SHAPE_ITEMS = 100  # larger batches' answers are decoded (no expression made for them)
# (first id, size) → the expression and its ids: bounded by both
_SHAPES: dict[tuple[int, int], tuple[re.Pattern[bytes], list[int]]] = {}


def in_order(rids: list[Any], methods: list[str], parsed: Any, raw: bytes) -> bool:
    """Whether a node's answer to items sent with the client's ids (`rids`: theirs, but
    notifications'; `methods`: every item's) is one answer per id in their order, none
    asking for another attempt (`-3900x`) and none a transaction to show as pending: every
    answer is then final as it is, with no item to match by id or classify alone."""
    if type(parsed) is not list or raw.find(b"-3900") >= 0 or len(parsed) != len(rids):
        return False
    try:
        ids = list(map(_ID, parsed))
    except (KeyError, TypeError):  # an answer without an id, or not an object
        return False
    return ids == rids and UNMINED_FIELDS.keys().isdisjoint(methods)


_ID = itemgetter("id")


def fill(items: list[Item], parsed: list[Any], answers: list[Any]) -> None:
    """Each item's answer in its place (`in_order`; notifications have none)."""
    sent = [it for it in items if not it.notif]
    place([it.pos for it in sent], [it.rid for it in sent], parsed, answers)


def place(positions: list[int], rids: list[Any], parsed: list[Any], answers: list[Any]) -> None:
    """The answers `parsed` (`in_order`: one per id of `rids`, in order) at their
    `positions`, each with the client's id as sent (a node's `1.0` equals the client's `1`
    but would not be written the same)."""
    for pos, rid, answer in zip(positions, rids, parsed, strict=True):
        answer["id"] = rid
        answers[pos] = answer


def loads(raw: bytes) -> Any:
    """A node's batch answer decoded (None: not JSON)."""
    try:
        return orjson.loads(raw) if raw else []
    except orjson.JSONDecodeError:
        return None


def _by_key(keys: list[Any], parsed: Any) -> dict[Any, Any]:
    """A sub-batch's answers by the key each item was sent with (None: a notification)."""
    if isinstance(parsed, dict):  # the node rejected the whole sub-batch with one error
        return {k: dict(parsed) for k in keys if k is not None}
    return {a.get("id"): a for a in parsed if type(a) is dict}

"""Step 1: a client body's request objects, checked against the method table.

A request object becomes an `Item` (or its answer at once: an invalid envelope, a method the
proxy does not serve, params that do not fit); a batch's valid objects become `Row`s, made with
C loops for the common batch (one method, int or string ids, the same number of params, a
block text the method table remembers) and item by item otherwise, with the same checks.
"""

from __future__ import annotations

import re
from operator import itemgetter
from typing import Any

import orjson

from chainstate.blockref import MAX_HEIGHT
from chainstate.jsonrpc import (
    INVALID_REQUEST,
    JsonRpcError,
    check_request,
    cut,
    error_response,
    exact_ids,
    request_id,
)
from proxy.methods import MethodTable
from proxy.metrics import ProxyMetrics
from proxy.request import Ctx, Item, Row, Rows, make_row
from proxy.scan import Scanner

NO_NODE_KEY = "-"  # node label of items no node answered
UNKNOWN_METHOD = "unknown"  # method label of items whose method is not served
MIN_BLOCK = "x-min-block"  # a client's highest block seen: `latest` is never below it

_METHOD, _JSONRPC, _ID, _PARAMS = (
    itemgetter("method"),
    itemgetter("jsonrpc"),
    itemgetter("id"),
    itemgetter("params"),
)
_LAST = itemgetter(-1)
_RID, _NOTIF = itemgetter(2), itemgetter(6)  # a Row's fields (proxy/request.py)
_ID_TYPES = frozenset((int, str))  # (a float id is read from the body: item by item)
_OWN_ID_TYPES = {str, int}  # ids a sub-batch may keep (exact types: not bool, not a float)
MAX_BATCH_ITEMS = 1000  # the max_batch_items setting's default (proxy/settings.py)
_HEIGHT_TEXT = re.compile(r"^(0x[0-9a-fA-F]{1,16}|[0-9]{1,19})$")


def dumps_error(rid: Any, exc: JsonRpcError) -> bytes:
    return orjson.dumps(error_response(rid, exc.code, exc.message, exc.data))


class Parser:
    """Request objects checked (`single`, `rows`), invalid ones counted and answered."""

    def __init__(
        self, methods: MethodTable, metrics: ProxyMetrics, max_batch: int = MAX_BATCH_ITEMS
    ) -> None:
        self.methods = methods
        self.metrics = metrics
        self.scanner = Scanner(methods, max_batch)

    def batch(self, body: bytes) -> list[Any] | Rows | Any:
        """A body that starts with `[` as the steps take it: the rows of the common batch
        read from its bytes (proxy/scan.py), else the body parsed (orjson.JSONDecodeError
        when it is not JSON)."""
        rows = self.scanner.scan(body)
        return orjson.loads(body) if rows is None else rows

    def single(self, ctx: Ctx, payload: Any, body: bytes) -> Item | tuple[int, bytes]:
        """A request object's Item, or its answer when it is invalid (LocalMethod for a
        method the events part answers)."""
        bad = check_request(payload)
        if bad is not None:
            self.metrics.request(ctx.chain, UNKNOWN_METHOD, NO_NODE_KEY, "invalid")
            return 200, dumps_error(exact_id(payload, body, request_id(payload)), bad)
        method = payload["method"]
        notif = "id" not in payload
        try:
            spec, ref = self.methods.target(method, payload.get("params"))
        except JsonRpcError as exc:
            label = method if method in self.methods.specs else UNKNOWN_METHOD
            self.metrics.request(ctx.chain, label, NO_NODE_KEY, "invalid")
            if notif:
                return 204, b""
            return 200, dumps_error(exact_id(payload, body, payload.get("id")), exc)
        ctx.methods.append(method)
        rid = payload.get("id")
        if type(rid) is float:  # as the client wrote it (`exact_id`: checked as a dict)
            rid = exact_ids(body)
        return Item(0, payload, rid, method, spec, ref, notif)

    def rows(
        self, ctx: Ctx, payload: list[Any] | Rows, answers: list[Any], body: bytes
    ) -> tuple[list[Row], bool, bool]:
        """Every item of a batch: the valid ones as `Row`s (invalid ones answered in
        `answers` at once), whether every id is as orjson read it (else they are read from
        `body`), and whether a valid item is a notification."""
        if type(payload) is Rows:  # (read from its bytes: checked as it was read)
            return payload, True, False
        rows = self.uniform_rows(payload)
        if rows is not None:
            return rows, True, False
        rows = []
        notified = False
        target = self.methods.target
        rids: list[Any] | None = None
        for pos, obj in enumerate(payload):
            bad = check_request(obj)
            rid = obj.get("id") if type(obj) is dict else None
            if type(rid) is float:  # as written in the body, not as a float
                rids = rids or exact_ids(body)
                rid = rids[pos]
            if bad is not None:
                self.metrics.request(ctx.chain, UNKNOWN_METHOD, NO_NODE_KEY, "invalid")
                if type(rid) is not orjson.Fragment:
                    rid = request_id(obj)
                answers[pos] = error_response(rid, bad.code, bad.message)
                continue
            method = obj["method"]
            notif = "id" not in obj
            params = obj.get("params")
            try:
                spec, ref = target(method, params)
            except JsonRpcError as exc:
                label = method if method in self.methods.specs else UNKNOWN_METHOD
                self.metrics.request(ctx.chain, label, NO_NODE_KEY, "invalid")
                if not notif:
                    answers[pos] = error_response(rid, exc.code, exc.message, exc.data)
                continue
            block = None
            at = spec.block_at
            if at >= 0 and type(params) is list and at < len(params):
                text = params[at]
                block = text if type(text) is str else None
            rows.append(make_row((pos, obj, rid, method, spec, ref, notif, block)))
            notified = notified or notif
        return rows, rids is None, notified

    def uniform_rows(self, payload: list[Any]) -> Rows | None:
        """`rows`' rows made with C loops over the items (no Python step per item), for the
        common batch: request objects of one method, each with `"jsonrpc": "2.0"`, an int or
        string id and a list of as many params, none null, whose block text (the last
        param) the method table remembers (`MethodTable.known_targets`); None for any other
        batch (then item by item, with the same checks and rows)."""
        try:
            methods = list(map(_METHOD, payload))
            method = methods[0]
            n = len(payload)
            if type(method) is not str or methods.count(method) != n:
                return None
            if list(map(_JSONRPC, payload)).count("2.0") != n:
                return None
            rids = list(map(_ID, payload))
            params = list(map(_PARAMS, payload))
            sizes = set(map(len, params))
            if not set(map(type, rids)) <= _ID_TYPES or set(map(type, params)) != {list}:
                return None
            if len(sizes) != 1:
                return None
            texts = list(map(_LAST, params))  # (only texts are remembered: no type check)
        except (TypeError, KeyError, IndexError):  # (not a dict, a key missing, no params)
            return None
        # (a null param: `known_targets` declines it; a block text never names `Contains`)
        known = self.methods.known_targets(method, sizes.pop(), params, texts)
        if known is None:
            return None
        spec, refs, heights = known
        return Rows(payload, rids, method, spec, refs, texts, heights)


def least(text: str, ctx: Ctx) -> JsonRpcError | None:
    """Reads the client's `x-min-block` header (a decimal or 0x height) into `ctx.least`;
    the error to answer when it is not one."""
    value = -1
    if _HEIGHT_TEXT.match(text):
        value = int(text, 16) if text[:2] == "0x" else int(text, 10)
    if not 0 <= value <= MAX_HEIGHT:
        msg = (
            f"invalid {MIN_BLOCK} header {cut(text)!r}: expected a block height (0x hex or decimal)"
        )
        return JsonRpcError(INVALID_REQUEST, msg)
    ctx.least = value
    return None


def exact_id(payload: Any, body: bytes, rid: Any) -> Any:
    """`rid`, or the id as the client wrote it when orjson's float would change it."""
    return exact_ids(body) if type(payload) is dict and type(payload.get("id")) is float else rid


def unique_ids(rows: list[Row]) -> bool:
    """Whether the answers of `rows` can be told apart by their ids: every id a string or
    an integer, no two the same (notifications have none and get no answer)."""
    if type(rows) is Rows:  # (int or string ids, no notification: checked as parsed)
        if rows.found is not None:
            return True  # (read from its bytes: the expression matched the ids first..n-1)
        rids = rows.rids
        first = rids[0] if rids else None
        if type(first) is int and rids == list(range(first, first + len(rids))):
            return True  # (the usual ids, 0..n-1: no set made)
        return len(set(rids)) == len(rows)
    if True in map(_NOTIF, rows):
        ids = [row.rid for row in rows if not row.notif]
    else:  # (C loops: no Python step per row)
        ids = list(map(_RID, rows))
    return _OWN_ID_TYPES.issuperset(map(type, ids)) and len(set(ids)) == len(ids)

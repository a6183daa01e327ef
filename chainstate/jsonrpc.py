"""JSON-RPC 2.0 envelopes, error codes and a small method dispatcher shared by every server.

The proxy, the state node, the writer and the checker all speak JSON-RPC; this module is the
one place that knows how a body is parsed, how an error looks and how a batch is answered.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

log = logging.getLogger(__name__)

# JSON-RPC 2.0 standard codes
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# Server-defined codes used across chainstate
SERVER_BUSY = -32005  # a limit was hit (batch length, body size, rate)

# State node codes (spec: "Errors")
EVM_REVERT = -39000
GAS_EXHAUSTED = -39001
BALANCE_EXHAUSTED = -39002
NONCE_ERROR = -39003
EVM_FAILED = -39004
DATABASE_FAILED = -39005
BLOCK_NOT_FOUND = -39006
INVALID_BLOCK_ID = -39007
UNSUPPORTED_PRECOMPILE = -39008

# Codes the proxy retries on another node (spec rule 1 of "Errors").
RETRYABLE_CODES = frozenset({BLOCK_NOT_FOUND, UNSUPPORTED_PRECOMPILE})
# `data.reason` of an EVM_FAILED answer to a call stopped at the EVM's time limit by its own
# cost (it ran the whole limit): final, another node would spend the same (docs/proxy.md).
TIME_LIMIT = "time_limit"


class JsonRpcError(Exception):
    """An error to answer as a JSON-RPC error object."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_obj(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            err["data"] = self.data
        return err


def error_response(req_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": req_id, "error": JsonRpcError(code, message, data).to_obj()}


def result_response(req_id: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": req_id, "result": result}


MAX_ECHO = 120  # characters of client input quoted in an error message


def cut(text: str, limit: int = MAX_ECHO) -> str:
    """Client input quoted in an error message: at most `limit` characters of it."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)


class _Written(str):
    """A number id as the body writes it (the stdlib parser's hooks keep its text)."""


def _number_text(text: str) -> _Written:
    return _Written(text)


def _int_or_text(text: str) -> int | _Written:
    if len(text) < 19 or -(2**63) <= int(text) < 2**64:  # what orjson keeps as an int
        return int(text)
    return _Written(text)


def _written_ids(body: bytes) -> list[Any] | None:
    """The ids of a request object or batch (None where an item is not an object), the
    numbers orjson cannot hold as written kept as their text (`_Written`)."""
    try:
        doc = json.loads(body, parse_float=_number_text, parse_int=_int_or_text)
    except (ValueError, RecursionError):
        return None
    if isinstance(doc, list):
        return [it.get("id") if isinstance(it, dict) else None for it in doc]
    return [doc.get("id") if isinstance(doc, dict) else None]


def exact_ids(body: bytes) -> Any:
    """The id of a request object, or the ids of a batch (None where an item is not an
    object), exactly as `body` writes them: numbers orjson cannot hold as written
    (18446744073709551616, 1e-400, 1.50) come back as `orjson.Fragment`s of their text, which
    `orjson.dumps` writes unchanged. For when orjson read an id as a float."""
    ids = _written_ids(body)
    if ids is None:
        return None
    exact = [orjson.Fragment(i.encode()) if type(i) is _Written else i for i in ids]
    return exact if body.lstrip()[:1] == b"[" else exact[0]


# An id that may be a number orjson changes: a fraction, an exponent, or 19+ digits (past
# 64 bits: -9223372036854775809 has 19).
_INEXACT_ID = re.compile(rb'"id"\s*:\s*-?(?:[0-9]{19}|[0-9]+[.eE])')


def may_change_ids(body: bytes) -> bool:
    """Whether an id of `body` may be a number orjson changes (see `restore_ids`)."""
    return _INEXACT_ID.search(body) is not None


def restore_ids(body: bytes, answer: bytes) -> bytes:
    """`answer` (a JSON-RPC server's answer to `body`) with every id its JSON parser changed
    (orjson reads 18446744073709551616 or 1e-400 as a float) written back as `body` has it.
    Answers are in the order of their requests, so equal floats are given back in order.
    Cheap when no id needs it: one scan of `body`."""
    if not may_change_ids(body):
        return answer
    ids = _written_ids(body)
    waiting: dict[float, deque[_Written]] = {}
    for rid in ids or ():
        if type(rid) is _Written:
            waiting.setdefault(float(rid), deque()).append(rid)
    if not waiting:
        return answer
    try:
        parsed = orjson.loads(answer)
    except orjson.JSONDecodeError:
        return answer
    for item in parsed if isinstance(parsed, list) else [parsed]:
        rid = item.get("id") if isinstance(item, dict) else None
        if type(rid) is float and waiting.get(rid):
            item["id"] = orjson.Fragment(waiting[rid].popleft().encode())
    return orjson.dumps(parsed)


def parse_body(body: bytes) -> Any:
    """Decode a request body; raises JsonRpcError(-32700) on malformed JSON."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise JsonRpcError(PARSE_ERROR, f"Parse error: {exc}") from None


_ID_TYPES = (str, int, float)  # tuples, not `str | int | float`: built once, checked faster
# Exact types as JSON parsers make them (bool is not int here): one set lookup per check.
_ID_EXACT = frozenset({str, int, float, type(None)})
_PARAMS_EXACT = frozenset({list, dict})


def request_id(item: Any) -> Any:
    """The id to echo for an item, or None when it has no usable id."""
    if isinstance(item, dict):
        rid = item.get("id")
        if rid is None or (isinstance(rid, _ID_TYPES) and not isinstance(rid, bool)):
            return rid
    return None


def is_notification(item: dict[str, Any]) -> bool:
    return "id" not in item


_NO_PARAMS: list[Any] = []  # the default of an absent "params" in the check (never changed)


def check_request(item: Any) -> JsonRpcError | None:
    """Validate the envelope of one request object (not its params), as a JSON parser made
    it (exact types: a bool is not a number here). A valid one passes one expression; the
    error of an invalid one is worked out apart."""
    if (
        type(item) is dict
        and item.get("jsonrpc") == "2.0"
        and type(item.get("method")) is str
        and item["method"]
        and type(item.get("id")) in _ID_EXACT
        and type(item.get("params", _NO_PARAMS)) in _PARAMS_EXACT
    ):
        return None
    return _request_error(item)


def _request_error(item: Any) -> JsonRpcError:
    if type(item) is not dict:
        return JsonRpcError(INVALID_REQUEST, "Invalid Request: expected a JSON object")
    if item.get("jsonrpc") != "2.0":
        return JsonRpcError(INVALID_REQUEST, 'Invalid Request: "jsonrpc" must be "2.0"')
    method = item.get("method")
    if type(method) is not str or not method:
        return JsonRpcError(INVALID_REQUEST, 'Invalid Request: "method" must be a non-empty string')
    if type(item.get("id")) not in _ID_EXACT:
        msg = 'Invalid Request: "id" must be a string, number or null'
        return JsonRpcError(INVALID_REQUEST, msg)
    return JsonRpcError(INVALID_REQUEST, 'Invalid Request: "params" must be an array or object')


Handler = Callable[[Any], Awaitable[Any]]


# The answer bytes one batch may make on a node (more items are answered -32005 unrun), and
# how many of its items run at once. Below the proxy's max_answer_bytes (64 MiB), so a batch
# answer a node makes fits what the proxy takes from it.
BATCH_ANSWER_BYTES = 32 * 1024 * 1024
BATCH_WINDOW = 16


class Dispatcher:
    """Answers JSON-RPC bodies (single or batch) by calling registered async method handlers.

    A handler takes the request's `params` (list or dict) and returns the result, or raises
    JsonRpcError. Unexpected exceptions become -32603 without leaking internals.
    """

    def __init__(
        self,
        name: str = "jsonrpc",
        max_batch: int = 1000,
        error_code: int | None = None,
        batch_answer_bytes: int = BATCH_ANSWER_BYTES,
    ) -> None:
        """`error_code`, when set, replaces the code of every error answered (the checker
        answers every error as -39005); the message still says what went wrong.
        `batch_answer_bytes`: the answer bytes a batch may make (below)."""
        self.name = name
        self.max_batch = max_batch
        self.error_code = error_code
        self.batch_answer_bytes = batch_answer_bytes
        self._methods: dict[str, Handler] = {}

    def register(self, method: str, handler: Handler) -> None:
        self._methods[method] = handler

    def update(self, methods: dict[str, Handler]) -> None:
        self._methods.update(methods)

    @property
    def methods(self) -> list[str]:
        return sorted(self._methods)

    async def call(self, method: str, params: Any) -> Any:
        handler = self._methods.get(method)
        if handler is None:
            raise JsonRpcError(METHOD_NOT_FOUND, f"Method not found: {cut(method)}")
        return await handler(params)

    def error(self, rid: Any, exc: JsonRpcError) -> dict[str, Any]:
        err = exc.to_obj()
        if self.error_code is not None:
            err["code"] = self.error_code
        return {"jsonrpc": "2.0", "id": rid, "error": err}

    async def handle_item(self, item: Any) -> dict[str, Any] | None:
        bad = check_request(item)
        if bad is not None:
            return self.error(request_id(item), bad)
        rid = item.get("id")
        try:
            result = await self.call(item["method"], item.get("params", []))
            response = result_response(rid, result)
        except JsonRpcError as exc:
            response = self.error(rid, exc)
        except Exception:
            log.exception("%s: internal error in %s", self.name, item.get("method"))
            response = self.error(rid, JsonRpcError(INTERNAL_ERROR, "Internal error"))
        return None if is_notification(item) else response

    async def handle_body(self, body: bytes) -> bytes:
        """Answer a raw body; returns b"" when nothing is to be sent (only notifications)."""
        try:
            payload = parse_body(body)
        except JsonRpcError as exc:
            return dumps(self.error(None, exc))
        if isinstance(payload, list):
            if not payload:
                empty = JsonRpcError(INVALID_REQUEST, "Invalid Request: empty batch")
                return dumps(self.error(None, empty))
            if len(payload) > self.max_batch:
                msg = f"batch too large: {len(payload)} items, at most {self.max_batch}"
                return dumps(self.error(None, JsonRpcError(INVALID_REQUEST, msg)))
            out = [a for a in await self.handle_items(payload) if a is not None]
            return dumps(out) if out else b""
        answer = await self.handle_item(payload)
        return dumps(answer) if answer is not None else b""

    async def handle_items(self, payload: list[Any]) -> list[Any]:
        """The answers of a batch's items (None for notifications; each made JSON once, as
        an `orjson.Fragment`), their bytes counted as they are made: items run in order, at
        most BATCH_WINDOW at once, and once the answers made pass `batch_answer_bytes` the
        items not started yet are answered -32005 saying so (a batch of large answers, e.g.
        eth_getLogs over big logs, cannot make gigabytes; what it holds at most is the
        budget plus the items in flight)."""
        parts: list[Any] = [None] * len(payload)
        spent = 0
        window = BATCH_WINDOW  # 1 once an answer was large: large ones are made one by one
        large = self.batch_answer_bytes // BATCH_WINDOW
        running: set[asyncio.Task[None]] = set()

        async def one(i: int, item: Any) -> None:
            nonlocal spent, window
            answer = await self.handle_item(item)
            if answer is not None:
                part = dumps(answer)
                parts[i] = orjson.Fragment(part)
                spent += len(part)
                if len(part) > large:
                    window = 1

        try:
            for i, item in enumerate(payload):
                while len(running) >= window:
                    _, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                if spent > self.batch_answer_bytes:
                    if not (isinstance(item, dict) and is_notification(item)):
                        parts[i] = self.error(request_id(item), self._spent())
                    continue
                task = asyncio.ensure_future(one(i, item))
                running.add(task)
                await asyncio.sleep(0)  # an item answered without waiting is counted now
                running = {t for t in running if not t.done()}
            if running:
                await asyncio.gather(*running)
        finally:
            for task in running:
                task.cancel()
        return parts

    def _spent(self) -> JsonRpcError:
        return JsonRpcError(
            SERVER_BUSY,
            f"the answers of this batch passed {self.batch_answer_bytes} bytes "
            "(batch_answer_bytes): this item was not run; ask for it in another request",
        )


def params_list(params: Any, names: list[str]) -> list[Any]:
    """Positional view of params; a dict is mapped through `names`. Missing trailing → None."""
    if isinstance(params, dict):
        return [params.get(n) for n in names]
    if not isinstance(params, list):
        raise JsonRpcError(INVALID_PARAMS, "params must be an array or object")
    if len(params) > len(names):
        raise JsonRpcError(INVALID_PARAMS, f"too many params: expected at most {len(names)}")
    return list(params) + [None] * (len(names) - len(params))

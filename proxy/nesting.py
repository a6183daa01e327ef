"""Request items nested deeper than the proxy can encode again: refused as -32602.

orjson reads JSON up to 1024 levels deep but writes at most 254, and the proxy writes a
client's params again (cache keys, sub-batches, retries). An item nested deeper would fail
there with an exception (an HTTP 500 and a traceback per request), so it is answered here,
before any other step, with -32602 and its own id; the other items of a batch are answered
as usual (sent back to the engine as one sub-batch, answers put back in order).

Cost on the common path: a body needs at least 255 opening brackets to be that deep, so a
body shorter than 510 bytes is never looked at, and a longer one costs two `bytes.count`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson

from chainstate.jsonrpc import INVALID_PARAMS, error_response, request_id

MAX_DEPTH = 254  # containers orjson writes nested (its limit; one more raises TypeError)
MESSAGE = f"invalid params: nested deeper than {MAX_DEPTH} levels"

Handle = Callable[[str, bytes, Mapping[str, str]], Awaitable[Any]]


def may_be_deep(body: bytes) -> bool:
    """Cheap test on the raw body: False when it cannot hold anything too deep."""
    return len(body) > 2 * MAX_DEPTH and body.count(b"[") + body.count(b"{") > MAX_DEPTH


def too_deep(value: Any) -> bool:
    """Whether `value` (a parsed item or body) cannot be written back by orjson."""
    try:
        orjson.dumps(value)
    except TypeError:
        return True
    return False


async def answer(chain: str, payload: Any, headers: Mapping[str, str], handle: Handle) -> Any:
    """The answer to a body some item of which is too deep: (status, body)."""
    if not isinstance(payload, list):
        return 200, orjson.dumps(error_response(request_id(payload), INVALID_PARAMS, MESSAGE))
    answers: list[Any] = [None] * len(payload)
    rest: list[int] = []
    for i, item in enumerate(payload):
        if too_deep(item):
            answers[i] = error_response(request_id(item), INVALID_PARAMS, MESSAGE)
        else:
            rest.append(i)
    if rest:
        sub = [_positioned(payload[i], j) for j, i in enumerate(rest)]
        status, out = (await handle(chain, orjson.dumps(sub), headers))[:2]
        if status != 200 and not out:
            out = b"[]"
        got = orjson.loads(out) if out else []
        by_id = {a.get("id"): a for a in (got if isinstance(got, list) else [got])}
        for j, i in enumerate(rest):
            item = payload[i]
            if isinstance(item, dict) and "id" not in item:
                continue  # a notification
            found = by_id.get(j) or by_id.get(None)
            if found is not None:
                answers[i] = {**found, "id": request_id(item)}
    out_items = [a for a in answers if a is not None]
    return (200, orjson.dumps(out_items)) if out_items else (204, b"")


def _positioned(item: Any, position: int) -> Any:
    """The item with its id replaced by its position in the sub-batch (ids may repeat)."""
    if isinstance(item, dict) and "id" in item:
        return {**item, "id": position}
    return item

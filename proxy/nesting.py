"""Request items nested deeper than the proxy can write again: refused as -32602.

orjson reads JSON up to 1024 levels deep but writes at most 254, and the proxy writes a
client's items again where it must: the read path's cache and coalescing key (every read it
plans), a sub-batch, a batch whose items changed. Nothing scans a body for its depth (that
would cost every large body a pass): where such a write fails, the items that cannot be
written are answered -32602 with their own ids and the others go on as usual. An item the
proxy forwards as the client's bytes goes to its node as it is, and the node answers it.
"""

from __future__ import annotations

from typing import Any

import orjson

from chainstate.jsonrpc import INVALID_PARAMS, JsonRpcError

# Containers nested in one request object, itself counted: orjson writes 254, and a batch
# (a list of items) adds one.
MAX_DEPTH = 253
MESSAGE = f"invalid params: a request object nested deeper than {MAX_DEPTH} levels"


def invalid() -> JsonRpcError:
    return JsonRpcError(INVALID_PARAMS, MESSAGE)


def too_deep(item: Any) -> bool:
    """Whether a parsed request object cannot be written back by orjson in a batch."""
    try:
        orjson.dumps([item])
    except TypeError:
        return True
    return False


def key(params: Any) -> bytes:
    """The JSON of an item's params as the read path keys them, written two levels down,
    as a batch holds them (so an item that passes here can be sent again, its block
    pinned); -32602 when they are too deep."""
    try:
        return orjson.dumps([[params]])
    except TypeError:
        raise invalid() from None


def deep(objs: list[Any]) -> list[int]:
    """The positions in `objs` of the items too deep to write: what a failed write of
    them all (TypeError) blames. Raises that TypeError again when none is (another cause)."""
    found = [i for i, obj in enumerate(objs) if too_deep(obj)]
    if not found:
        orjson.dumps(objs)  # (raises what the caller's write raised)
    return found

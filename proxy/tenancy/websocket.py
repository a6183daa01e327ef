"""Tenancy on a WebSocket connection: the upgrade checks the credential and the rules that do
not depend on a message (`Gate.upgrade`); then every message the client sends (a request, a
batch, an eth_subscribe) is admitted as a request of the same key would be (`Gate.admit`:
rates, items, quotas, in-flight, method rules), and a refused one is answered on the
connection with the refusal's JSON-RPC error under the message's id. The connection stays
open: a client over its rate gets -32005 for the messages it sends too fast, as it gets 429s
over HTTP. Notifications the proxy pushes (subscriptions) are not requests and count nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson

from proxy.model import Pool
from proxy.tenancy.gate import Gate

SessionAnswer = Callable[[bytes, Any], Awaitable[bytes]]


def message_gate(
    gate: Gate, pool: Pool, path_key: str | None, raw: Mapping[bytes, bytes], conn: Any
) -> Callable[[SessionAnswer], SessionAnswer]:
    """What answers each message of one connection (`EventService.websocket`'s `wrap`):
    admitted by the gate with the upgrade's credential, headers and client address."""

    def wrap(answer: SessionAnswer) -> SessionAnswer:
        async def admitted(data: bytes, session: Any) -> bytes:
            verdict = gate.admit(pool, path_key, raw, data, conn)
            if verdict is None:
                return await answer(data, session)
            if type(verdict) is tuple:
                return refusal(verdict[1], data)
            try:
                out = await answer(data, session)
            except BaseException:
                verdict.finish((500, b""))  # type: ignore[union-attr]  (its place in flight back)
                raise
            verdict.finish((200, out) if out else (204, b""))  # type: ignore[union-attr]
            return out

        return admitted

    return wrap


def refusal(error_body: bytes, data: bytes) -> bytes:
    """The gate's refusal (a JSON-RPC error with id null) under the id of the message it
    refused, so a client matching answers by id sees which; a batch is refused whole, by one
    error with id null, as over HTTP."""
    try:
        message = orjson.loads(data)
    except orjson.JSONDecodeError:
        return error_body
    if not isinstance(message, dict) or "id" not in message:
        return error_body if not isinstance(message, dict) else b""  # (a notification: none)
    answer = orjson.loads(error_body)
    answer["id"] = message["id"]
    return orjson.dumps(answer)

"""Serving a JSON-RPC data port: `POST /` on the lean server, the rest on aiohttp.

The state node, the write nodes and the checker each answer raw JSON-RPC bodies with a
`handle_body(bytes) -> bytes` coroutine. `RpcServer` serves it on `chainstate.httpserver`
(`POST /`) and hands every other request (`/health`, `/metrics`, …) to the component's aiohttp
application, which also keeps a `POST /` route of its own (`rpc_handler`) for connections
already handed to it. Both paths answer an oversize body the same way: HTTP 413 with a
JSON-RPC -32600 error naming the limit, for Content-Length and chunked bodies alike.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

from aiohttp import web

from chainstate.config import section
from chainstate.httpserver import (
    HttpServer,
    Request,
    Response,
    Router,
    ServerLimits,
    error_body,
)
from chainstate.jsonrpc import INTERNAL_ERROR, INVALID_REQUEST, may_change_ids, restore_ids
from chainstate.runner import start_server

log = logging.getLogger(__name__)

JSON = "application/json"
DEFAULT_MAX_BODY = 10 * 1024 * 1024
BodyHandler = Callable[[bytes], Awaitable[bytes]]
# A node's answer computed without awaiting, with every id as the client wrote it, or None
# when it needs `handle_body` (the state node's plain reads: the server then writes it at once,
# no task, no scan of the body for ids orjson may have changed).
AnswerNow = Callable[[bytes], bytes | None]
# The same, or the future of the answer when it comes without a task either (the state
# node's eth_calls: the server writes it from the future's callback).
AnswerSoon = Callable[[bytes], "bytes | asyncio.Future[bytes] | None"]


def too_large(limits: ServerLimits) -> bytes:
    """The body of the 413 answer (the lean server's own words, for aiohttp's path too)."""
    return error_body(
        INVALID_REQUEST,
        f"request body larger than {limits.body_limit_name}={limits.max_body} bytes",
    )


async def read_body(request: web.Request, limits: ServerLimits) -> bytes | web.Response:
    """The body of an aiohttp request, or the answer to give instead: 413 when it is larger
    than the limit (checked before reading for Content-Length, while reading for chunked
    bodies), 400 (and one quiet log line) when the client went away during the upload."""
    if request.content_length is not None and request.content_length > limits.max_body:
        return web.Response(status=413, body=too_large(limits), content_type=JSON)
    chunks = []
    size = 0
    try:
        async for chunk in request.content.iter_any():
            size += len(chunk)
            if size > limits.max_body:
                return web.Response(status=413, body=too_large(limits), content_type=JSON)
            chunks.append(chunk)
    except ConnectionError as exc:
        log.info("client closed the connection during a request body: %s", exc)
        return web.Response(status=400)
    return b"".join(chunks)


def rpc_handler(
    handle_body: BodyHandler, max_body: int = DEFAULT_MAX_BODY
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """An aiohttp handler answering POST bodies with `handle_body` (raw bytes in and out)."""
    limits = ServerLimits(max_body=max_body)

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await read_body(request, limits)
        if isinstance(body, web.Response):
            return body
        answer = restore_ids(body, await handle_body(body))
        if not answer:
            return web.Response(status=204)
        return web.Response(body=answer, content_type=JSON)

    return handler


def node_limits(config: dict[str, Any]) -> ServerLimits:
    """The limits of a node's data port: the config's `[http]` table (docs/http-server.md)."""
    return ServerLimits.from_section(section(config, "http"))


def rpc_route(handle_body: BodyHandler, answer_now: AnswerNow | AnswerSoon | None = None) -> Router:
    """`POST /` answered on the lean server, at once by `answer_now` when it can (its ids are
    exact already; a future of the answer is written from its callback), else by
    `handle_body`, whose ids come back as the client wrote them (`restore_ids`). Everything
    else goes on to the fallback."""

    async def restored(body: bytes) -> bytes:
        return restore_ids(body, await handle_body(body))

    def handler(request: Request) -> Response | Awaitable[Response] | None:
        body = request.body  # (the answer's bytes: 200, 204 when empty)
        if answer_now is not None:
            answer = answer_now(body)
            if answer is not None:
                if answer.__class__ is bytes:
                    return answer
                _answer_when_done(request, answer)  # type: ignore[arg-type]
                return None  # (answered from the callback)
        return restored(body) if may_change_ids(body) else handle_body(body)

    def route(method: bytes, path: bytes) -> Any:
        return handler if method == b"POST" and path == b"/" else None

    return route


def _answer_when_done(request: Request, answer: asyncio.Future[bytes]) -> None:
    """Answer `request` from `answer`'s callback. A function of its own: a closure over the
    request in the route's handler would make a cell for every request, futures or not."""
    answer.add_done_callback(lambda done: request.answer_early(_settled(done)))


def _settled(done: asyncio.Future[bytes]) -> Response:
    """The answer a future gave, or a 500 when it failed (logged)."""
    if not done.cancelled():
        exc = done.exception()
        if exc is None:
            return done.result()
        log.error("request handler failed", exc_info=exc)
    return 500, error_body(INTERNAL_ERROR, "internal error")


async def serve_rpc(
    stack: AsyncExitStack,
    handle_body: BodyHandler,
    app: web.Application,
    host: str,
    port: int,
    *,
    name: str,
    limits: ServerLimits | None = None,
    answer_now: AnswerNow | AnswerSoon | None = None,
) -> HttpServer:
    """Serve `handle_body` (and `answer_now`) on `POST /` and `app` for every other request
    on host:port; stopped (gracefully) when `stack` closes."""
    route = rpc_route(handle_body, answer_now)
    # (`rpc_route` gives a method and path the same handler for good: kept heads keep it)
    server = HttpServer(route, limits=limits, fallback=app, name=name, kept_routes=True)
    return await start_server(stack, server, host, port)

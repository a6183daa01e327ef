"""Serving a JSON-RPC data port: `POST /` on the lean server, the rest on aiohttp.

The state node, the write nodes and the checker each answer raw JSON-RPC bodies with a
`handle_body(bytes) -> bytes` coroutine. `RpcServer` serves it on `chainstate.httpserver`
(`POST /`) and hands every other request (`/health`, `/metrics`, …) to the component's aiohttp
application, which also keeps a `POST /` route of its own (`rpc_handler`) for connections
already handed to it. Both paths answer an oversize body the same way: HTTP 413 with a
JSON-RPC -32600 error naming the limit, for Content-Length and chunked bodies alike.
"""

from __future__ import annotations

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
from chainstate.jsonrpc import INVALID_REQUEST
from chainstate.runner import start_server

log = logging.getLogger(__name__)

JSON = "application/json"
DEFAULT_MAX_BODY = 10 * 1024 * 1024
BodyHandler = Callable[[bytes], Awaitable[bytes]]


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
        answer = await handle_body(body)
        if not answer:
            return web.Response(status=204)
        return web.Response(body=answer, content_type=JSON)

    return handler


def node_limits(config: dict[str, Any]) -> ServerLimits:
    """The limits of a node's data port: the config's `[http]` table (docs/http-server.md)."""
    return ServerLimits.from_section(section(config, "http"))


def rpc_route(handle_body: BodyHandler) -> Router:
    """`POST /` answered by `handle_body` on the lean server; everything else goes on."""

    def handler(request: Request) -> Awaitable[Response]:
        return handle_body(request.body)  # bytes: 200, or 204 when empty

    def route(method: bytes, path: bytes) -> Any:
        return handler if method == b"POST" and path == b"/" else None

    return route


async def serve_rpc(
    stack: AsyncExitStack,
    handle_body: BodyHandler,
    app: web.Application,
    host: str,
    port: int,
    *,
    name: str,
    limits: ServerLimits | None = None,
) -> HttpServer:
    """Serve `handle_body` on `POST /` and `app` for every other request on host:port;
    stopped (gracefully) when `stack` closes."""
    server = HttpServer(rpc_route(handle_body), limits=limits, fallback=app, name=name)
    return await start_server(stack, server, host, port)

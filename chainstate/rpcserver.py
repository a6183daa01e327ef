"""aiohttp glue shared by the JSON-RPC servers (state node, writer, checker)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from chainstate.jsonrpc import PARSE_ERROR, dumps, error_response

JSON = "application/json"
DEFAULT_MAX_BODY = 10 * 1024 * 1024


def rpc_handler(
    handle_body: Callable[[bytes], Awaitable[bytes]], max_body: int = DEFAULT_MAX_BODY
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """An aiohttp handler answering POST bodies with `handle_body` (raw bytes in and out)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.content_length is not None and request.content_length > max_body:
            body = dumps(error_response(None, PARSE_ERROR, f"body larger than {max_body} bytes"))
            return web.Response(status=413, body=body, content_type=JSON)
        answer = await handle_body(await request.read())
        if not answer:
            return web.Response(status=204)
        return web.Response(body=answer, content_type=JSON)

    return handler

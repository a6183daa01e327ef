"""A node's JSON-RPC data port (`serve_rpc`): the lean `POST /`, aiohttp for the rest, and the
same answers on both paths (413 with -32600 for oversize bodies, ids byte-exact)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import aiohttp
import orjson
import pytest
from aiohttp import web

from chainstate.config import ConfigError
from chainstate.httpserver import HttpServer, ServerLimits
from chainstate.jsonrpc import Dispatcher
from chainstate.rpcserver import node_limits, rpc_handler, serve_rpc

ODD_IDS = (b"18446744073709551616", b"1e-400", b"1.50", b"-9223372036854775809", b'"x"', b"7")


def node_app(dispatcher: Dispatcher, max_body: int) -> web.Application:
    """What a node's make_app() looks like: POST / (aiohttp's path), /health."""

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/", rpc_handler(dispatcher.handle_body, max_body))
    app.router.add_get("/health", health)
    return app


@pytest.fixture
async def node() -> AsyncIterator[str]:
    dispatcher = Dispatcher("test")

    async def echo(params):
        return params

    dispatcher.register("echo", echo)
    async with AsyncExitStack() as stack:
        server: HttpServer = await serve_rpc(
            stack,
            dispatcher.handle_body,
            node_app(dispatcher, 1000),
            "127.0.0.1",
            0,
            name="test node",
            limits=ServerLimits(max_body=1000),
        )
        yield f"http://127.0.0.1:{server.port}"


def request(rid: bytes) -> bytes:
    return b'{"jsonrpc":"2.0","id":%s,"method":"echo","params":[1]}' % rid


async def post(session: aiohttp.ClientSession, url: str, body: bytes | object) -> tuple[int, bytes]:
    async with session.post(url, data=body) as resp:
        return resp.status, await resp.read()


async def test_ids_come_back_byte_exact_on_both_paths(node: str) -> None:
    async with aiohttp.ClientSession() as lean, aiohttp.ClientSession() as handed:
        async with handed.get(f"{node}/health") as resp:  # this connection now is aiohttp's
            assert resp.status == 200
        for session in (lean, handed):
            for rid in ODD_IDS:
                status, raw = await post(session, node, request(rid))
                assert status == 200 and b'"id":' + rid + b"," in raw, raw
            batch = b"[" + b",".join(request(rid) for rid in ODD_IDS) + b"]"
            status, raw = await post(session, node, batch)
            assert status == 200
            for rid in ODD_IDS:
                assert b'"id":' + rid + b"," in raw, raw
            status, raw = await post(session, node, b'{"jsonrpc":"2.0","id":1e-400,"method":"x"}')
            assert b'"id":1e-400,' in raw and b"-32601" in raw


async def chunks(data: bytes):
    for i in range(0, len(data), 300):
        yield data[i : i + 300]


async def test_oversize_bodies_are_413_with_the_same_error_on_both_paths(node: str) -> None:
    big = b"[" + b",".join([request(b"1")] * 40) + b"]"  # > 1000 bytes
    async with aiohttp.ClientSession() as lean, aiohttp.ClientSession() as handed:
        async with handed.get(f"{node}/health") as resp:
            assert resp.status == 200
        answers = []
        for session in (lean, handed):
            for body in (big, chunks(big)):  # Content-Length, then chunked
                status, raw = await post(session, node, body)
                assert status == 413, (status, raw)
                answers.append(orjson.loads(raw))
    assert all(a == answers[0] for a in answers)
    assert answers[0]["error"]["code"] == -32600 and answers[0]["id"] is None
    assert "max_body_bytes=1000" in answers[0]["error"]["message"]


def test_node_limits_come_from_the_http_table() -> None:
    limits = node_limits({"http": {"max_body_bytes": 5000, "idle_timeout": 2.5}})
    assert (limits.max_body, limits.idle_timeout) == (5000, 2.5)
    assert node_limits({}) == ServerLimits()
    assert node_limits({"http": {"busy_poll_us": 250}}).busy_poll == 250e-6
    assert node_limits({"http": {"busy_poll_us": 0}}).busy_poll == 0
    bads = ({"max_body_bytes": 0}, {"idle_timeout": "x"}, {"nope": 1}, {"busy_poll_us": -1})
    for bad in (*bads, {"busy_poll_us": True}):
        with pytest.raises(ConfigError, match=r"\[http\]"):
            node_limits({"http": bad})


async def test_aborted_uploads_log_one_quiet_line_on_both_paths(node: str, caplog) -> None:
    caplog.set_level(logging.INFO)
    port = int(node.rsplit(":", 1)[1])
    for handed in (False, True):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        if handed:  # aiohttp serves this connection from here on
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            await reader.readuntil(b'"ok"}')
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 900\r\n\r\npartial")
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.transport.abort()
        await asyncio.sleep(0.2)
    lines = [r for r in caplog.records if r.levelno >= logging.INFO and r.name.startswith("c")]
    assert len(lines) == 2 and all("during a request" in r.getMessage() for r in lines)
    assert not any(r.exc_info for r in caplog.records)


async def test_an_answer_given_at_once_gets_exact_ids_too() -> None:
    """`answer_now` (the state node's plain reads, no task) answers only bodies whose ids
    orjson keeps exact; a body with an id orjson changes goes to `handle_body`, and the data
    port writes its ids back as the client sent them. Either way the client sees its ids."""
    dispatcher = Dispatcher("test")
    calls = {"now": 0}

    async def fast(_params):
        return "now"

    dispatcher.update({"fast": fast})

    def now(body: bytes) -> bytes | None:
        payload = orjson.loads(body)
        if not isinstance(payload, dict) or type(payload.get("id")) is float:
            return None  # the contract: ids exact, or not answered now
        calls["now"] += 1
        return orjson.dumps({"jsonrpc": "2.0", "id": payload.get("id"), "result": "now"})

    async with AsyncExitStack() as stack, aiohttp.ClientSession() as session:
        server = await serve_rpc(
            stack, dispatcher.handle_body, web.Application(), "127.0.0.1", 0, name="t",
            answer_now=now,
        )  # fmt: skip
        url = f"http://127.0.0.1:{server.port}"
        for rid in ODD_IDS:
            body = b'{"jsonrpc":"2.0","id":%s,"method":"fast","params":[]}' % rid
            status, raw = await post(session, url, body)
            assert status == 200 and raw == b'{"jsonrpc":"2.0","id":%s,"result":"now"}' % rid
    assert calls["now"] == 2  # the int and the string ids

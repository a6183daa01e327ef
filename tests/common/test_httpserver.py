"""The lean HTTP/1.1 server on a real socket: every edge case its docstring promises."""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from chainstate.busypoll import BusyPoll
from chainstate.httpserver import HttpServer, Request, Response, ServerLimits
from tests.conftest import raw_post

CHUNKED = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"


class Client:
    """A raw connection: write bytes, read whole HTTP answers (Content-Length framed)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> Client:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def answer(self, within: float = 5.0) -> tuple[int, dict[str, str], bytes]:
        """(status, headers with lower-case names, body) of the next answer."""
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), within)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        body = await asyncio.wait_for(self.reader.readexactly(length), within) if length else b""
        return status, headers, body

    async def closed(self, within: float = 5.0) -> bool:
        """True when the server closed the connection (EOF) within `timeout`."""
        try:
            return await asyncio.wait_for(self.reader.read(1), within) == b""
        except (ConnectionError, TimeoutError):
            return False

    def close(self) -> None:
        self.writer.close()


async def echo(request: Request) -> Response:
    """Answers the request body (and a `delay` query makes it wait first)."""
    if request.query.startswith(b"delay="):
        await asyncio.sleep(float(request.query[6:]))
    if request.body == b"boom":
        raise RuntimeError("handler bug")
    return 200, request.body


def sync_echo(request: Request) -> Response:
    return 200, request.body


def bytes_echo(request: Request) -> Response:
    return request.body  # (bytes: a 200, or a 204 when empty)


def head_echo(request: Request) -> Response:
    return 200, request.body, b""  # (no extra head lines: the general formatting path)


def headers_echo(request: Request) -> Response:
    """The request as the handler sees it: its length and X-Id headers, path and body."""
    seen = {
        "length": request.headers.get("content-length"),
        "id": request.headers.get("x-id"),
        "path": request.path.decode(),
        "body": request.body.decode(),
    }
    return 200, orjson.dumps(seen)


def route(method: bytes, path: bytes) -> Any:
    if method == b"POST" and path == b"/headers":
        return headers_echo
    if method == b"POST" and path == b"/":
        return echo
    if method == b"POST" and path == b"/sync":
        return sync_echo
    if method == b"POST" and path == b"/bytes":
        return bytes_echo
    if method == b"POST" and path == b"/head":
        return head_echo
    return None


def fallback_app() -> web.Application:
    async def hello(request: web.Request) -> web.Response:
        return web.json_response({"from": "aiohttp", "path": request.path})

    async def post_echo(request: web.Request) -> web.Response:
        return web.Response(body=await request.read(), content_type="application/json")

    async def ws(request: web.Request) -> web.WebSocketResponse:
        sock = web.WebSocketResponse()
        await sock.prepare(request)
        async for msg in sock:
            await sock.send_str("echo:" + msg.data)
        return sock

    app = web.Application()
    app.router.add_get("/hello", hello)
    app.router.add_get("/ws", ws)
    app.router.add_post("/", post_echo)
    return app


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Any]]:
    servers: list[HttpServer] = []

    async def start(
        fallback: web.Application | None = None,
        router: Any = route,
        kept_routes: bool = False,
        **limits: Any,
    ) -> HttpServer:
        server = HttpServer(
            router, limits=ServerLimits(**limits), fallback=fallback, kept_routes=kept_routes
        )
        await server.start("127.0.0.1", 0)
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.close()


async def test_keep_alive_and_pipelining_answer_in_order(serve) -> None:
    server = await serve()
    client = await Client.open(server.port)
    # The first request is the slowest: answers still come back in request order.
    slow = b"POST /?delay=0.2 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\none"
    await client.send(
        slow
        + raw_post(b"two")
        + b"POST /sync HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nthree"
    )
    bodies = [(await client.answer())[2] for _ in range(3)]
    assert bodies == [b"one", b"two", b"three"]
    await client.send(raw_post(b"four"))  # still open: keep-alive
    status, headers, body = await client.answer()
    assert (status, body) == (200, b"four")
    assert headers["content-type"] == "application/json" and "date" in headers
    client.close()


async def test_the_common_answers_head_carries_the_date_of_the_second(serve) -> None:
    """A body's kept whole head is dropped when the Date changes: the same answer (read by
    a kept head, answered at once) carries the new Date line."""
    server = await serve()
    server._sweeper.cancel()  # (its once-a-second clock would set the real Date)
    client = await Client.open(server.port)
    for date in (b"Date: Sun, 29 Nov 2026 12:00:00 GMT", b"Date: Sun, 29 Nov 2026 12:00:01 GMT"):
        server.set_date(date + b"\r\n")
        for _ in range(2):
            await client.send(raw_post(b"same"))
            head = await asyncio.wait_for(client.reader.readuntil(b"\r\n\r\n"), 5)
            assert date + b"\r\n" in head and await client.reader.readexactly(4) == b"same"
    client.close()


async def test_answers_of_every_size_have_the_same_head_as_a_status_and_body(serve) -> None:
    """A handler's bytes and its `(200, body)` (the common answers: their head from prebuilt
    parts for bodies under 2 KiB) give the same answer bytes as `(200, body, b"")` (formatted
    in full; the Date line aside), at every body size across the prebuilt range's edge, and
    for HTTP/1.0 with keep-alive."""
    server = await serve()
    client = await Client.open(server.port)

    async def raw(path: bytes, body: bytes, version: bytes = b"1.1", extra: bytes = b"") -> bytes:
        await client.send(
            b"POST %b HTTP/%b\r\nHost: x\r\n%bContent-Length: %d\r\n\r\n%b"
            % (path, version, extra, len(body), body)
        )
        head = await asyncio.wait_for(client.reader.readuntil(b"\r\n\r\n"), 5)
        lines = [line for line in head.split(b"\r\n") if not line.startswith(b"Date: ")]
        length = next((int(line[15:]) for line in lines if line.startswith(b"Content-Length")), 0)
        return b"\r\n".join(lines) + await client.reader.readexactly(length)

    for size in [*range(1, 80), *range(2000, 2100), 700, 1024, 2047, 2048, 5000]:
        body = b"x" * size
        ours = await raw(b"/head", body)
        assert ours.startswith(b"HTTP/1.1 200 OK\r\n"), size
        assert ours.endswith(b"Content-Length: %d\r\n\r\n" % size + body), size
        assert await raw(b"/bytes", body) == ours, size
        assert await raw(b"/sync", body) == ours, size
    keep = b"Connection: keep-alive\r\n"
    ours = await raw(b"/head", b"{}", b"1.0", keep)
    assert await raw(b"/bytes", b"{}", b"1.0", keep) == ours
    assert await raw(b"/sync", b"{}", b"1.0", keep) == ours
    client.close()


async def test_chunked_body_and_expect_continue(serve) -> None:
    server = await serve()
    client = await Client.open(server.port)
    await client.send(CHUNKED + b"4\r\n[1,2\r\n3\r\n,3]\r\n0\r\n\r\n")
    assert (await client.answer())[2] == b"[1,2,3]"
    # Expect: 100-continue: the body is sent only after the interim answer.
    await client.send(
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n"
    )
    interim = await asyncio.wait_for(client.reader.readuntil(b"\r\n\r\n"), 5)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    await client.send(b"{}")
    assert (await client.answer())[:1] == (200,)
    client.close()


async def test_http10_closes_unless_keep_alive(serve) -> None:
    server = await serve()
    client = await Client.open(server.port)
    await client.send(b"POST / HTTP/1.0\r\nContent-Length: 2\r\n\r\nok")
    status, headers, body = await client.answer()
    assert (status, body, headers["connection"]) == (200, b"ok", "close")
    assert await client.closed()
    client = await Client.open(server.port)
    await client.send(b"POST / HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\na")
    status, headers, body = await client.answer()
    assert headers["connection"] == "keep-alive"
    await client.send(b"POST / HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\nb")
    assert (await client.answer())[2] == b"b"
    client.close()


@pytest.mark.parametrize("chunked", [False, True])
async def test_oversize_body_is_413_with_a_jsonrpc_error(serve, chunked: bool) -> None:
    server = await serve(max_body=100, body_limit_name="max_body_bytes")
    client = await Client.open(server.port)
    if chunked:
        await client.send(CHUNKED + b"64\r\n" + b"x" * 100 + b"\r\n" + b"1\r\nx\r\n")
    else:  # refused on the declared length, before any of the body is read
        await client.send(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
    status, headers, body = await client.answer()
    answer = orjson.loads(body)
    assert status == 413 and headers["connection"] == "close"
    assert answer["error"]["code"] == -32600 and answer["id"] is None
    assert "max_body_bytes=100" in answer["error"]["message"]
    assert await client.closed()
    client.close()


async def test_a_declared_length_is_refused_exactly_past_the_limit(serve) -> None:
    """The declared length is compared with the limit only when it has as many digits (a
    shorter one is under it): 101 with a limit of 100 is refused before the body is read,
    100 and a zero-padded 99 are read and answered."""
    server = await serve(max_body=100, body_limit_name="max_body_bytes")
    for declared, body in ((b"100", b"x" * 100), (b"00099", b"x" * 99)):
        client = await Client.open(server.port)
        await client.send(
            b"POST /sync HTTP/1.1\r\nHost: x\r\nContent-Length: %b\r\n\r\n%b" % (declared, body)
        )
        status, _, answer = await client.answer()
        assert (status, answer) == (200, body), declared
        client.close()
    client = await Client.open(server.port)
    await client.send(b"POST /sync HTTP/1.1\r\nHost: x\r\nContent-Length: 101\r\n\r\n")
    status, _, answer = await client.answer()
    assert status == 413 and b"max_body_bytes=100" in answer
    client.close()


async def test_oversize_head_is_431(serve) -> None:
    server = await serve(max_head=1024)
    client = await Client.open(server.port)
    await client.send(b"POST / HTTP/1.1\r\nHost: x\r\n")
    for _ in range(10):
        await client.send(b"X-Filler: " + b"y" * 200 + b"\r\n")
    status, _, body = await client.answer()
    assert status == 431 and b"-32600" in body
    client.close()


async def test_http11_without_host_is_400(serve) -> None:
    server = await serve()
    client = await Client.open(server.port)
    await client.send(b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
    status, _, body = await client.answer()
    assert status == 400 and b"Host" in body


async def test_malformed_request_is_400_and_a_handler_bug_500(serve) -> None:
    server = await serve()
    client = await Client.open(server.port)
    await client.send(raw_post(b"boom"))
    status, _, body = await client.answer()
    assert status == 500 and orjson.loads(body)["error"]["code"] == -32603
    await client.send(raw_post(b"after"))  # the connection survives a handler bug
    assert (await client.answer())[2] == b"after"
    await client.send(b"NOT HTTP AT ALL\r\n\r\n")
    status, _, body = await client.answer()
    assert status == 400 and orjson.loads(body)["error"]["code"] == -32600
    assert await client.closed()


async def test_unknown_path_without_fallback_is_404(serve) -> None:
    server = await serve()
    client = await Client.open(server.port)
    await client.send(b"GET /" + b"z" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    status, _, body = await client.answer()
    message = orjson.loads(body)["error"]["message"]
    assert status == 404 and len(message) < 300  # the echoed path is cut


async def test_slow_client_gets_408_and_others_are_served(serve) -> None:
    server = await serve(read_timeout=0.3)
    slow = await Client.open(server.port)
    await slow.send(
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc"
    )  # 7 bytes missing
    fast = await Client.open(server.port)
    await fast.send(raw_post(b"hi"))
    assert (await fast.answer())[2] == b"hi"
    status, _, body = await slow.answer(within=5)  # the sweep runs once a second
    assert status == 408 and b"read_timeout" in body
    assert await slow.closed()


async def test_idle_connections_are_closed(serve) -> None:
    server = await serve(idle_timeout=0.3)
    client = await Client.open(server.port)
    await client.send(raw_post(b"x"))
    await client.answer()
    assert await client.closed(within=5)


async def test_connection_cap_closes_idle_ones_for_new_clients(serve) -> None:
    server = await serve(max_connections=4)
    idle = [await Client.open(server.port) for _ in range(4)]
    for client in idle:  # each has had a request, and now waits
        await client.send(raw_post(b"x"))
        await client.answer()
    late = [await Client.open(server.port) for _ in range(3)]
    for client in late:
        await client.send(raw_post(b"new"))
        assert (await client.answer())[2] == b"new"
    closed = [await c.closed(within=0.5) for c in idle]
    assert sum(closed) == 3  # the three longest idle made room
    assert len(server.conns) <= 4


async def test_connection_cap_with_every_connection_busy_is_503(serve) -> None:
    server = await serve(max_connections=2)
    busy = [await Client.open(server.port) for _ in range(2)]
    for client in busy:
        await client.send(b"POST /?delay=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nb")
    await asyncio.sleep(0.1)
    extra = await Client.open(server.port)
    status, headers, _ = await extra.answer()
    assert status == 503 and headers["connection"] == "close"
    for client in busy:  # the busy ones are still answered
        assert (await client.answer())[2] == b"b"


async def test_half_closed_client_still_gets_its_answers(serve) -> None:
    server = await serve()
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(
        b"POST /?delay=0.1 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\na" + raw_post(b"b")
    )
    sock.shutdown(socket.SHUT_WR)
    sock.settimeout(5)
    received = b""
    while chunk := await asyncio.to_thread(sock.recv, 65536):
        received += chunk
    sock.close()
    assert received.count(b"HTTP/1.1 200 OK") == 2 and received.endswith(b"b")


async def test_graceful_close_finishes_requests_in_flight(serve) -> None:
    server = await serve(shutdown_timeout=5)
    port = server.port
    idle = await Client.open(port)
    await idle.send(raw_post(b"x"))
    await idle.answer()
    busy = await Client.open(server.port)
    await busy.send(b"POST /?delay=0.3 HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nlast")
    await asyncio.sleep(0.05)
    closing = asyncio.create_task(server.close())
    status, headers, body = await busy.answer()
    assert (status, body, headers["connection"]) == (200, b"last", "close")
    assert await idle.closed()
    await closing
    with pytest.raises(OSError):  # no longer accepting
        await Client.open(port)


async def test_aborted_upload_logs_one_quiet_line(serve, caplog) -> None:
    server = await serve()
    caplog.set_level(logging.INFO, logger="chainstate.httpserver")
    client = await Client.open(server.port)
    await client.send(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\npartial")
    client.writer.transport.abort()
    await asyncio.sleep(0.2)
    lines = [r for r in caplog.records if r.name == "chainstate.httpserver"]
    assert len(lines) == 1 and "during a request" in lines[0].getMessage()
    assert lines[0].levelno == logging.INFO and lines[0].exc_info is None


async def test_other_requests_go_to_the_fallback_app_in_order(serve) -> None:
    server = await serve(fallback=fallback_app())
    client = await Client.open(server.port)
    # A lean request still in flight, then one for aiohttp, then a data request (which
    # aiohttp answers too, once it owns the connection): answers keep the request order.
    await client.send(
        b"POST /?delay=0.2 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nfirst"
        b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n" + raw_post(b"[3]")
    )
    assert (await client.answer())[2] == b"first"
    status, _, body = await client.answer()
    assert status == 200 and orjson.loads(body) == {"from": "aiohttp", "path": "/hello"}
    assert (await client.answer())[2] == b"[3]"
    # A chunked upload to aiohttp is passed on whole.
    await client.send(CHUNKED + b"2\r\n[4\r\n1\r\n]\r\n0\r\n\r\n")
    assert (await client.answer())[2] == b"[4]"
    client.close()


async def test_websocket_upgrade_is_handed_to_the_fallback(serve) -> None:
    server = await serve(fallback=fallback_app())
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(f"http://127.0.0.1:{server.port}/ws") as ws,
    ):
        await ws.send_str("ping")
        assert (await ws.receive(timeout=5)).data == "echo:ping"
    assert not server.conns and not server.shims  # the connection went to aiohttp for good


async def test_nothing_after_a_connection_close_request_is_read(serve) -> None:
    server = await serve()
    client = await Client.open(server.port)
    await client.send(raw_post(b"last", b"Connection: close\r\n") + raw_post(b"ignored"))
    _, headers, body = await client.answer()
    assert (body, headers["connection"]) == (b"last", "close")
    assert await client.closed()


async def test_graceful_close_lets_a_request_being_sent_finish(serve) -> None:
    server = await serve(shutdown_timeout=5)
    client = await Client.open(server.port)
    await client.send(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhal")
    await asyncio.sleep(0.05)
    closing = asyncio.create_task(server.close())
    await asyncio.sleep(0.05)
    await client.send(b"f.")
    status, headers, body = await client.answer()
    assert (status, body, headers["connection"]) == (200, b"half.", "close")
    await closing


H2C = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQ\r\n"


async def test_upgrades_are_the_fallbacks_or_refused(serve) -> None:
    server = await serve()
    client = await Client.open(server.port)
    await client.send(raw_post(b"one", H2C))
    status, _, body = await client.answer()
    assert status == 400 and b"upgrade" in body
    # With a fallback, aiohttp answers it in HTTP/1.1, body included.
    server = await serve(fallback=fallback_app())
    client = await Client.open(server.port)
    await client.send(raw_post(b"[1]", H2C))
    assert (await client.answer())[2] == b"[1]"


SERVE_WITH_FEW_FDS = """
import asyncio, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
from chainstate.httpserver import HttpServer

async def main():
    server = HttpServer(lambda method, path: lambda request: (200, b"ok"))
    await server.start("127.0.0.1", 0)
    print(server.port, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_idle_connections_past_the_fd_limit_do_not_lock_new_clients_out() -> None:
    """The report: with 1024 descriptors, 1,500 idle connections left 0 of 29 new clients
    answered. Here 256 descriptors (default cap: 192 connections) and 300 idle ones."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SERVE_WITH_FEW_FDS, stdout=asyncio.subprocess.PIPE
    )
    try:
        port = int(await asyncio.wait_for(proc.stdout.readline(), 15))  # type: ignore[union-attr]
        idle = [await Client.open(port) for _ in range(300)]
        for client in idle[-50:]:  # the newest had a request (the oldest were closed to make room)
            await client.send(raw_post(b"x"))
            await client.answer()
        for _ in range(29):
            client = await Client.open(port)
            await client.send(raw_post(b"new"))
            assert (await client.answer())[:1] == (200,)
            client.close()
        for client in idle:
            client.close()
    finally:
        proc.kill()
        await proc.wait()


async def _cpu_while_waiting(seconds: float) -> float:
    """CPU seconds this process used while its loop waited `seconds` for nothing (a bound
    from above only: a loaded machine gives a process less CPU, never more)."""
    start = time.process_time()
    await asyncio.sleep(seconds)
    return time.process_time() - start


# Turns a polling loop makes at least in a window of 0.3 s. The loop records its own turns, so
# a loaded machine that preempts it lowers the count but cannot make it sleep: idle, ~100k
# turns in 0.3 s on the project's VM, ~10k with ten CPU hogs beside it; a loop that sleeps
# between turns makes a few.
MANY_TURNS = 100


async def _window_closed(poll: BusyPoll) -> None:
    """Until the loop stopped polling by itself (bounded: its window and a loaded machine's
    delays are far below it)."""
    for _ in range(500):
        if not poll.spinning:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("still polling 10 s after its last request or answer")


async def _asleep(poll: BusyPoll) -> bool:
    """Whether the loop makes no polling turn, and spends next to no CPU, for 0.2 s."""
    turns = poll.turns
    return await _cpu_while_waiting(0.2) < 0.05 and poll.turns == turns and not poll.spinning


async def test_busy_poll_keeps_the_loop_polling_for_its_window_after_a_request(serve) -> None:
    """With `busy_poll` the loop does not sleep for that long after a request's bytes: it
    keeps turning (polling without blocking, so bytes from another core are seen without a
    wake-up) until the window has passed, then stops by itself and sleeps; without it the
    loop sleeps at once; a close stops it at its next turn. The loop's own record of its
    turns is asserted, not the CPU it got, which a loaded machine takes away."""
    idle = await serve()
    client = await Client.open(idle.port)
    await client.send(raw_post(b"ping"))
    assert (await client.answer())[2] == b"ping"
    assert idle.poll is None and await _cpu_while_waiting(0.2) < 0.05  # no polling by default
    client.close()

    server = await serve(busy_poll=0.6)
    poll = server.poll
    assert poll is not None and poll.turns == 0  # (nothing to poll for before a request)
    client = await Client.open(server.port)
    sent = time.perf_counter()
    await client.send(raw_post(b"ping"))
    assert (await client.answer())[2] == b"ping"
    turns = poll.turns
    await _window_closed(poll)
    assert poll.stopped - sent >= 0.6  # polled through its window
    assert poll.turns - turns >= MANY_TURNS  # turning, not sleeping, after the answer too
    assert await _asleep(poll)  # the window closed: asleep again

    long = await serve(busy_poll=60.0)  # (a window no delay of a loaded machine closes)
    assert long.poll is not None
    client = await Client.open(long.port)
    await client.send(raw_post(b"again"))
    assert (await client.answer())[2] == b"again"
    assert long.poll.spinning
    await long.close()
    await asyncio.sleep(0)  # (the turn scheduled before the close runs first)
    assert await _asleep(long.poll)  # a close ends the polling at once


async def test_busy_poll_window_starts_again_when_an_answer_goes_out(serve) -> None:
    """An answer written later (a proxy's, once its node answered) opens the window again:
    the client's next request comes after the answer, so that is when polling pays."""
    server = await serve(busy_poll=0.3)
    poll = server.poll
    assert poll is not None
    client = await Client.open(server.port)
    post = b"POST /?delay=0.45 HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nslow"
    sent = time.perf_counter()
    await client.send(post)  # the request's window closes at 0.3 s, the answer is at 0.45 s
    assert (await client.answer())[2] == b"slow"
    turns = poll.turns
    await _window_closed(poll)
    assert poll.stopped - sent >= 0.45 + 0.3  # polling again for a window after the answer
    assert poll.turns - turns >= MANY_TURNS
    assert await _asleep(poll)  # and asleep once that window closed


# ---- the client's usual head, read without llhttp (`_Connection._plain`) -----------------


def headed(body: bytes, before: bytes = b"", after: bytes = b"X-Id: aaaa\r\n") -> bytes:
    """A request to /headers with header lines before and after its Content-Length."""
    return b"POST /headers HTTP/1.1\r\nHost: x\r\n%bContent-Length: %d\r\n%b\r\n%b" % (
        before,
        len(body),
        after,
        body,
    )


def seen(body: bytes, length: int | None = None, rid: str | None = "aaaa") -> dict[str, Any]:
    size = str(len(body) if length is None else length)
    return {"length": size, "id": rid, "path": "/headers", "body": body.decode()}


class CountingParser:
    """A connection's llhttp parser that counts what it is fed."""

    def __init__(self, parser: Any) -> None:
        self.parser = parser
        self.fed = 0

    def feed_data(self, data: bytes) -> None:
        self.fed += 1
        self.parser.feed_data(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.parser, name)


async def test_requests_with_the_same_head_but_their_length_skip_llhttp(serve) -> None:
    """Bodies of 1, 9, 10, 100 and 0 bytes behind one head, one connection: each read as
    llhttp reads it (the length's digits change in number too), the later ones without it."""
    server = await serve()
    client = await Client.open(server.port)
    await client.send(headed(b"1"))
    assert orjson.loads((await client.answer())[2]) == seen(b"1")
    (conn,) = server.conns
    parser = conn.parser = CountingParser(conn.parser)
    for body in (b"2" * 9, b"3" * 10, b"4" * 100, b"", b"5" * 12):
        await client.send(headed(body))
        status, _, answer = await client.answer()
        assert (status, orjson.loads(answer)) == (200, seen(body))
    assert parser.fed == 0  # the shortcut read them all
    client.close()


async def test_a_kept_head_does_not_read_requests_whose_other_headers_differ(serve) -> None:
    """X-Id changes (after the length, then before it) in requests of the same size: each
    handler sees its own request's headers."""
    server = await serve()
    client = await Client.open(server.port)
    for _ in range(2):
        await client.send(headed(b"{}"))
        assert orjson.loads((await client.answer())[2]) == seen(b"{}")
    await client.send(headed(b"{}", after=b"X-Id: bbbb\r\n"))
    assert orjson.loads((await client.answer())[2]) == seen(b"{}", rid="bbbb")
    for rid in (b"cccc", b"dddd"):
        await client.send(headed(b"{}", before=b"X-Id: %b\r\n" % rid, after=b""))
        assert orjson.loads((await client.answer())[2]) == seen(b"{}", rid=rid.decode())
    client.close()


async def test_pipelined_requests_behind_a_kept_head_are_answered_in_order(serve) -> None:
    """Three requests with the kept head and a chunked one in one write, then a split one."""
    server = await serve()
    client = await Client.open(server.port)
    await client.send(headed(b"0"))
    await client.answer()
    chunked = b"POST /headers HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    await client.send(
        headed(b"a" * 5) + headed(b"b" * 15) + chunked + b"2\r\nxy\r\n0\r\n\r\n" + headed(b"c")
    )
    answers = [orjson.loads((await client.answer())[2]) for _ in range(4)]
    assert answers == [
        seen(b"a" * 5),
        seen(b"b" * 15),
        {"length": None, "id": None, "path": "/headers", "body": "xy"},
        seen(b"c"),
    ]
    whole = headed(b"d" * 40)
    await client.send(whole[:-25])  # the body's end comes later: llhttp's
    await asyncio.sleep(0.05)
    await client.send(whole[-25:])
    assert orjson.loads((await client.answer())[2]) == seen(b"d" * 40)
    client.close()


async def test_a_kept_head_with_a_length_over_the_limit_is_413(serve) -> None:
    server = await serve(max_body=100)
    client = await Client.open(server.port)
    for body in (b"x" * 99, b"y" * 99):
        await client.send(headed(body))
        assert (await client.answer())[0] == 200
    await client.send(headed(b"z" * 150))
    status, _, answer = await client.answer()
    assert status == 413 and b"max_body_bytes=100" in answer
    assert await client.closed()


async def test_an_answer_while_polling_extends_the_window(serve) -> None:
    """An answer that goes out while the loop still polls for the request (the kick without
    its call: `hot` set) makes the window run from the answer, not from the request."""
    server = await serve(busy_poll=0.6)
    poll = server.poll
    assert poll is not None
    client = await Client.open(server.port)
    post = b"POST /?delay=0.3 HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nslow"
    sent = time.perf_counter()
    await client.send(post)  # the request's window would close at 0.6 s, the answer's at 0.9
    assert (await client.answer())[2] == b"slow"
    turns = poll.turns
    await _window_closed(poll)
    assert poll.stopped - sent >= 0.3 + 0.6  # still polling past the request's window
    assert poll.turns - turns >= MANY_TURNS


async def test_a_handler_answers_early_once_and_its_own_result_is_dropped() -> None:
    """`Request.answer_early` writes once (True), then says it answered already (False);
    the handler's own result is dropped."""
    said: list[bool] = []

    async def early_then(request: Request) -> Response:
        said.append(request.answer_early((200, b'{"early":1}')))
        said.append(request.answer_early((200, b'{"again":1}')))
        await asyncio.sleep(0.01)
        return 200, b'{"dropped":1}'

    server = HttpServer(lambda method, path: early_then if path == b"/early" else echo)
    await server.start("127.0.0.1", 0)
    client = await Client.open(server.port)
    await client.send(b"POST /early HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    assert (await client.answer())[2] == b'{"early":1}'
    await client.send(raw_post(b"next"))
    assert (await client.answer())[2] == b"next"  # not the early handler's own result
    assert said == [True, False]
    client.close()
    await server.close()


async def test_a_kept_http10_keep_alive_head_answers_as_llhttps_way(serve) -> None:
    """An HTTP/1.0 client with `Connection: keep-alive`: every answer behind the kept head
    says keep-alive and the connection stays; the same head without it is closed."""
    server = await serve()
    client = await Client.open(server.port)
    head = b"POST / HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: %d\r\n\r\n%b"
    for body in (b"a", b"bb", b"c" * 12):
        await client.send(head % (len(body), body))
        status, headers, answer = await client.answer()
        assert (status, answer, headers["connection"]) == (200, body, "keep-alive")
    await client.send(b"POST / HTTP/1.0\r\nConnection: close\r\nContent-Length: 1\r\n\r\nz")
    status, headers, answer = await client.answer()
    assert (answer, headers["connection"]) == (b"z", "close")
    assert await client.closed()


class CountingRouter:
    """`route`, counting its calls; from call `fail_from` on it raises (a router's bug)."""

    def __init__(self, fail_from: int = 0) -> None:
        self.calls = 0
        self.fail_from = fail_from

    def __call__(self, method: bytes, path: bytes) -> Any:
        self.calls += 1
        if self.fail_from and self.calls >= self.fail_from:
            raise RuntimeError("router bug")
        return route(method, path)


@pytest.mark.parametrize("kept_routes", [False, True])
async def test_a_server_with_kept_routes_asks_its_router_once_per_kept_head(
    serve, kept_routes: bool
) -> None:
    """Behind a kept head the router is asked per request unless the server keeps routes
    (the proxy's: a path's handler is the same for good); the handlers see each request's
    own length either way, bodies of lengths that come back included (the kept head's
    Headers per length)."""
    router = CountingRouter()
    server = await serve(router=router, kept_routes=kept_routes)
    client = await Client.open(server.port)
    bodies = [b"1", b"2" * 10, b"3", b"4" * 12, b"5" * 10, b"6" * 12, b"", b"7" * 100, b"8"]
    for body in bodies:
        await client.send(headed(body))
        status, _, answer = await client.answer()
        assert (status, orjson.loads(answer)) == (200, seen(body))
    assert router.calls == (len(bodies) if not kept_routes else 1)
    client.close()


async def test_a_kept_head_keeps_a_bounded_number_of_lengths(serve) -> None:
    """Bodies of 40 lengths, twice over, behind one kept head: each handler sees its own
    length, and the head keeps at most MAX_KEPT_HEADERS of them."""
    from chainstate.httpserver import MAX_KEPT_HEADERS

    server = await serve(kept_routes=True)
    client = await Client.open(server.port)
    for size in [*range(40), *range(40)]:
        body = b"x" * size
        await client.send(headed(body))
        assert orjson.loads((await client.answer())[2]) == seen(body)
    (conn,) = server.conns
    assert 0 < len(conn.plain.kept) <= MAX_KEPT_HEADERS
    assert 0 < len(conn.plain.heads) <= MAX_KEPT_HEADERS
    client.close()


async def test_a_router_failure_behind_a_kept_head_is_answered_as_llhttps_way(serve) -> None:
    """A router that fails on a request read by a kept head: the same 400 as when it fails
    on a request llhttp reads (then the connection closes), not a dropped connection."""
    server = await serve(router=CountingRouter(fail_from=1))
    client = await Client.open(server.port)
    await client.send(headed(b"{}"))
    llhttps = await client.answer()
    assert await client.closed()
    assert llhttps[0] == 400 and b"malformed HTTP request" in llhttps[2]
    server = await serve(router=CountingRouter(fail_from=3))
    client = await Client.open(server.port)
    for _ in range(2):  # read by llhttp, then by the kept head
        await client.send(headed(b"{}"))
        assert orjson.loads((await client.answer())[2]) == seen(b"{}")
    await client.send(headed(b"{}"))  # the kept head's: the router fails
    status, _, answer = await client.answer()
    assert (status, answer) == (llhttps[0], llhttps[2])
    assert await client.closed()


async def test_a_kept_head_with_a_header_after_its_length_goes_to_llhttp(serve) -> None:
    """A request with the kept head's lines but another (short) line right after its
    length: the digits are not followed by the rest of the kept head, so llhttp reads it."""
    server = await serve()
    client = await Client.open(server.port)
    for _ in range(2):
        await client.send(headed(b"{}"))
        assert orjson.loads((await client.answer())[2]) == seen(b"{}")
    await client.send(headed(b"{}", after=b"X: 1\r\nX-Id: aaaa\r\n"))
    status, _, answer = await client.answer()
    assert (status, orjson.loads(answer)) == (200, seen(b"{}"))
    await client.send(headed(b"{}", after=b"X-Id: zzzz\r\nX-Id: aaaa\r\n"))
    status, _, answer = await client.answer()
    assert (status, orjson.loads(answer)) == (200, seen(b"{}", rid="zzzz, aaaa"))
    client.close()


async def test_a_kept_head_reads_a_length_with_leading_zeros_as_llhttp(serve) -> None:
    """`Content-Length: 0002` behind a kept head: two bytes of body, as llhttp reads it (the
    kept values of lengths under 2 KiB are for digits without leading zeros)."""
    server = await serve()
    client = await Client.open(server.port)
    await client.send(headed(b"{}"))
    assert orjson.loads((await client.answer())[2]) == seen(b"{}")
    zeros = headed(b"{}").replace(b"Content-Length: 2\r\n", b"Content-Length: 0002\r\n")
    await client.send(zeros + headed(b"[]"))
    assert orjson.loads((await client.answer())[2]) == seen(b"{}", length=2) | {"length": "0002"}
    assert orjson.loads((await client.answer())[2]) == seen(b"[]")
    # alone in a read, its size plus digits is that of a body of 3 (or 5) bytes written
    # without zeros: the whole-read shortcut must not take it for one
    for length in (b"02", b"0002"):
        alone = headed(b"{}").replace(b"Content-Length: 2\r\n", b"Content-Length: %b\r\n" % length)
        await client.send(alone)
        status, _, answer = await client.answer()
        assert (status, orjson.loads(answer)) == (200, seen(b"{}") | {"length": length.decode()})
    client.close()

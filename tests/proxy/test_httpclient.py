"""The lean upstream HTTP client against raw HTTP servers that answer in every legal shape."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from proxy.httpclient import HostPool, HttpError
from tests.conftest import free_port

Responder = Callable[[bytes], bytes | None]  # request → raw answer (None: close, b"": none)


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


@pytest.fixture
async def server() -> AsyncIterator[Callable[[Responder], asyncio.Future]]:
    servers: list[asyncio.AbstractServer] = []
    stats = {"connections": 0}

    async def start(respond: Responder) -> tuple[str, dict]:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            stats["connections"] += 1
            try:
                while True:
                    request = await read_request(reader)
                    answer = respond(request)
                    if answer is None:
                        break
                    writer.write(answer)
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            writer.close()

        port = free_port()
        servers.append(await asyncio.start_server(handle, "127.0.0.1", port))
        return f"http://127.0.0.1:{port}/rpc", stats

    yield start
    for s in servers:
        s.close()
        await s.wait_closed()


def fixed(body: bytes, status: str = "200 OK") -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


async def test_keep_alive_connections_are_reused(server) -> None:
    seen: list[bytes] = []

    def respond(req: bytes) -> bytes:
        seen.append(req)
        return fixed(b'{"ok":1}')

    url, stats = await server(respond)
    pool = HostPool(url, limit=4)
    for _ in range(5):
        assert await pool.post(b'{"a":1}') == (200, b'{"ok":1}')
    assert stats["connections"] == 1
    assert seen[0].startswith(b"POST /rpc HTTP/1.1\r\nHost: 127.0.0.1:")
    assert seen[0].endswith(b'Content-Length: 7\r\n\r\n{"a":1}')
    pool.close()


async def test_chunked_answers_and_statuses(server) -> None:
    chunked = (
        b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{"a"\r\n3\r\n:1}\r\n0\r\n\r\n'
    )
    url, _ = await server(lambda req: chunked if b"chunk" in req else fixed(b"no", "503 Busy"))
    pool = HostPool(url, limit=2)
    assert await pool.post(b"chunk") == (200, b'{"a":1}')
    assert await pool.post(b"other") == (503, b"no")
    pool.close()


async def test_connection_close_and_stale_idle_connection(server) -> None:
    count = {"n": 0}

    def respond(req: bytes) -> bytes:
        count["n"] += 1
        return b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"

    url, stats = await server(respond)
    pool = HostPool(url, limit=2)
    assert await pool.post(b"x") == (200, b"ok")
    assert await pool.post(b"y") == (200, b"ok")  # a new connection: the node said close
    assert stats["connections"] == 2
    pool.close()


async def test_node_closing_without_answer_is_an_error(server) -> None:
    url, _ = await server(lambda req: None)
    pool = HostPool(url, limit=2)
    with pytest.raises(HttpError):
        await pool.post(b"x")
    pool.close()


async def test_garbage_answer_and_refused_connection(server) -> None:
    url, _ = await server(lambda req: b"NOT HTTP AT ALL\r\n\r\n")
    pool = HostPool(url, limit=2)
    with pytest.raises(HttpError):
        await pool.post(b"x")
    dead = HostPool(f"http://127.0.0.1:{free_port()}/", limit=1)
    with pytest.raises(HttpError, match="cannot connect"):
        await dead.post(b"x")


async def test_timeout_cancels_and_closes_the_connection(server) -> None:
    url, stats = await server(lambda req: b"" if b"slow" in req else fixed(b"ok"))
    pool = HostPool(url, limit=1)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await pool.post(b"slow")  # the server never answers it
    assert await pool.post(b"ok") == (200, b"ok")  # the slot was released
    assert stats["connections"] == 2  # the timed-out connection was not reused
    pool.close()


async def test_an_answer_ended_by_closing_the_connection() -> None:
    """HTTP/1.0 style: no Content-Length, no chunking; the body ends when the node closes.
    A node that closes inside a length-framed body is still an error."""
    answers = {
        b"eof": b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{"ok":1}',
        b"cut": b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}",
    }

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await read_request(reader)
        writer.write(answers[request.rsplit(b"\r\n", 1)[-1]])
        await writer.drain()
        writer.close()

    port = free_port()
    srv = await asyncio.start_server(handle, "127.0.0.1", port)
    pool = HostPool(f"http://127.0.0.1:{port}/", limit=1)
    try:
        async with asyncio.timeout(5):
            assert await pool.post(b"eof") == (200, b'{"ok":1}')
            assert await pool.post(b"eof") == (200, b'{"ok":1}')  # a new connection each time
            with pytest.raises(HttpError):
                await pool.post(b"cut")
    finally:
        pool.close()
        srv.close()
        await srv.wait_closed()


async def test_credentials_in_the_url_are_sent_as_basic_auth(server) -> None:
    seen: list[bytes] = []

    def respond(req: bytes) -> bytes:
        seen.append(req)
        return fixed(b"{}")

    url, _ = await server(respond)
    pool = HostPool(url.replace("http://", "http://us%40er:p%3Ass@"), limit=1)
    assert await pool.post(b"{}") == (200, b"{}")
    # base64("us@er:p:ss"); the Host header carries no credentials
    assert b"\r\nAuthorization: Basic dXNAZXI6cDpzcw==\r\n" in seen[0]
    assert b"Host: 127.0.0.1:" in seen[0] and b"@" not in seen[0].split(b"\r\n")[1]
    pool.close()


async def test_slots_are_handed_over_and_a_cancelled_waiter_does_not_keep_one(server) -> None:
    url, _ = await server(lambda req: b"" if b"hold" in req else fixed(b"ok"))
    pool = HostPool(url, limit=1)
    holder = asyncio.create_task(pool.post(b"hold"))  # takes the only slot, never answered
    await asyncio.sleep(0.05)
    waiter = asyncio.create_task(pool.post(b"x"))
    await asyncio.sleep(0.05)
    assert not waiter.done()  # waits for the slot
    waiter.cancel()
    holder.cancel()
    for task in (waiter, holder):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert await asyncio.wait_for(pool.post(b"x"), 2) == (200, b"ok")  # the slot is free
    queued = [asyncio.create_task(pool.post(b"x")) for _ in range(5)]
    assert await asyncio.gather(*queued) == [(200, b"ok")] * 5  # one at a time, all served
    pool.close()

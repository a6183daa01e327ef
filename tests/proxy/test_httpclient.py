"""The lean upstream HTTP client against raw HTTP servers that answer in every legal shape."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from proxy.buffers import ByteBudget
from proxy.httpclient import AnswerTooLarge, HostPool, HttpError
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


async def test_an_idle_connection_keeps_no_answer_alive(server) -> None:
    url, _ = await server(lambda req: fixed(b"x" * 100_000))
    pool = HostPool(url, 4)
    status, body = await pool.post(b"{}")
    assert status == 200 and len(body) == 100_000
    (conn,) = pool._idle
    assert conn._waiter is None and conn._body == []  # (an 8 MB answer stayed alive per idle
    pool.close()  # connection before: 453 MB kept after 24 concurrent 8 MB answers)


class Holder:
    def __init__(self) -> None:
        self.reserved = 0


async def test_answers_wait_for_room_in_the_buffered_bytes_budget(server) -> None:
    url, _ = await server(lambda req: fixed(b"y" * 300_000))
    budget = ByteBudget(700_000)  # two answers fit, the third waits for a release
    pool = HostPool(url, 8, budget)
    holders = [Holder() for _ in range(3)]
    posts = [asyncio.ensure_future(pool.post(b"{}", holder=h)) for h in holders]
    done, pending = await asyncio.wait(posts, timeout=0.5)
    assert len(done) == 2 and len(pending) == 1 and budget.used == 600_000
    assert budget.waits == 1
    waiting = next(h for h, p in zip(holders, posts, strict=True) if p in pending)
    assert waiting.reserved == 0
    budget.release(next(h for h in holders if h.reserved))  # one client request answered
    (status, body), *_ = await asyncio.gather(*pending)
    assert status == 200 and len(body) == 300_000 and waiting.reserved == 300_000
    assert budget.peak <= 700_000
    pool.close()


def test_a_request_holding_bytes_never_waits_for_more() -> None:
    budget = ByteBudget(100)
    mine, other = Holder(), Holder()
    assert budget.reserve(80, mine)
    assert not budget.reserve(50, other)  # does not fit: it waits
    granted: list[str] = []
    entry = budget.wait(50, other, lambda: granted.append("other"))
    assert budget.reserve(60, mine)  # a second sub-batch of the same request: overdraft
    assert budget.used == 140 and granted == []
    budget.release(mine)
    assert granted == ["other"] and budget.used == 50 and other.reserved == 50
    budget.cancel(entry)  # (already granted: nothing to cancel)
    budget.release(other)
    assert budget.used == 0
    alone = Holder()
    assert budget.reserve(500, alone)  # larger than the budget, but nothing else is held


async def test_an_answer_larger_than_max_answer_bytes_fails_at_once(server) -> None:
    url, _ = await server(lambda req: fixed(b"z" * 50_000))
    pool = HostPool(url, 4, None, max_answer=10_000)
    with pytest.raises(AnswerTooLarge, match="50000 bytes"):
        await pool.post(b"{}")
    pool.close()


# ---- the node's usual answer head, read without llhttp (`_Connection._plain`) -------------


def headed(body: bytes, extra: bytes = b"") -> bytes:
    """An answer as the project's nodes send it: the length between two other headers."""
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%b"
        b"Date: Wed, 25 Nov 2026 14:00:00 GMT\r\n\r\n%b" % (len(body), extra, body)
    )


async def test_answers_with_the_same_head_but_their_length_are_read_whole(server) -> None:
    """Bodies of 1, 9, 10, 100 and 0 bytes behind one head: each read as it is (the length's
    digits change in number too), on one connection, the later ones without llhttp."""
    bodies = [b"1", b"2" * 9, b"3" * 10, b"4" * 100, b"", b"5" * 12]
    answers = iter(bodies)

    def respond(req: bytes) -> bytes:
        return headed(next(answers))

    url, stats = await server(respond)
    pool = HostPool(url, limit=1)
    got = [await pool.post(b"{}") for _ in bodies]
    assert got == [(200, body) for body in bodies]
    assert stats["connections"] == 1
    conn = pool._idle[0]
    assert conn.plain is not None and conn.plain_hits  # the shortcut was taken
    pool.close()


async def test_a_kept_head_does_not_read_an_answer_whose_other_headers_differ(server) -> None:
    """`Connection: close` after the length, in an answer of the same size as the last,
    where that had another header: llhttp reads it, so the connection is not reused (a kept
    head read as the same would keep it)."""
    pad, close = b"X-Padding-0: abcd\r\n", b"Connection: close\r\n"
    assert len(pad) == len(close)
    answers = iter([headed(b"ab", pad), headed(b"cd", pad), headed(b"ef", close)])
    url, stats = await server(lambda req: next(answers, headed(b"gh")))
    pool = HostPool(url, limit=1)
    assert [await pool.post(b"{}") for _ in range(4)] == [
        (200, b"ab"),
        (200, b"cd"),
        (200, b"ef"),
        (200, b"gh"),
    ]
    assert stats["connections"] == 2
    pool.close()


async def test_a_kept_head_with_a_line_after_its_length_goes_to_llhttp(server) -> None:
    """An answer with the kept head's lines but a short one more right after its length:
    the digits are not followed by the rest of the kept head, so llhttp reads it (whole,
    and the connection is reused)."""
    answers = iter([headed(b"ab"), headed(b"cd"), headed(b"ef", b"X: 1\r\n")])
    url, stats = await server(lambda req: next(answers, headed(b"gh")))
    pool = HostPool(url, limit=1)
    got = [await pool.post(b"{}") for _ in range(4)]
    assert got == [(200, b"ab"), (200, b"cd"), (200, b"ef"), (200, b"gh")]
    assert stats["connections"] == 1
    pool.close()


async def test_a_kept_head_reads_a_length_with_leading_zeros_as_llhttp(server) -> None:
    """`Content-Length: 02` (and `0002`): its size plus digits is that of a 3 (5) byte body
    written without zeros, which the whole-answer shortcut must not take it for."""
    zeros = [
        headed(b"cd").replace(b"Length: 2\r\n", b"Length: %b\r\n" % n) for n in (b"02", b"0002")
    ]
    answers = iter([headed(b"ab"), headed(b"ab"), *zeros])
    url, stats = await server(lambda req: next(answers, headed(b"gh")))
    pool = HostPool(url, limit=1)
    got = [await pool.post(b"{}") for _ in range(5)]
    assert got == [(200, b"ab"), (200, b"ab"), (200, b"cd"), (200, b"cd"), (200, b"gh")]
    assert stats["connections"] == 1
    pool.close()


async def test_a_kept_head_with_its_body_in_later_reads_goes_to_llhttp() -> None:
    """The answer's body comes after a pause: the kept head does not take half an answer."""
    sent = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(headed(b"x" * 20))
        await read_request(reader)
        writer.write(headed(b"y" * 30)[:-10])
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"z" * 10)
        await writer.drain()
        await sent.wait()
        writer.close()

    port = free_port()
    srv = await asyncio.start_server(handle, "127.0.0.1", port)
    pool = HostPool(f"http://127.0.0.1:{port}/", limit=1)
    assert await pool.post(b"{}") == (200, b"x" * 20)
    assert await pool.post(b"{}") == (200, b"y" * 20 + b"z" * 10)
    sent.set()
    pool.close()
    srv.close()
    await srv.wait_closed()


async def test_a_kept_head_still_refuses_an_answer_over_max_answer_bytes(server) -> None:
    answers = iter([headed(b"a" * 10), headed(b"b" * 50)])
    url, _ = await server(lambda req: next(answers))
    pool = HostPool(url, limit=1, max_answer=40)
    assert await pool.post(b"{}") == (200, b"a" * 10)
    with pytest.raises(AnswerTooLarge):
        await pool.post(b"{}")
    pool.close()

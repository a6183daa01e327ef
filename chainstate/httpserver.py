"""The lean HTTP/1.1 server of every JSON-RPC data port: proxy, state node, write node, checker.

Why our own server: on this project's machines aiohttp's server layer (request objects, URL
dispatch, header multidicts, response writers) cost more CPU per request than the proxy's whole
routing engine (docs/http-server.md has the side-by-side figures with uvicorn and granian).
Here llhttp (through httptools) parses on a raw `asyncio.Protocol`; a route handler gets the
method, path, headers and body of a request and returns `(status, body)`; the answer is one
prebuilt head and one write.

Everything a data port does not answer itself (admin API, `/metrics`, `/health`, later
WebSocket upgrades) goes to an aiohttp application on the same loop: at that request's
boundary the connection is handed to aiohttp's own server protocol (the request head is
rebuilt from the parsed parts and the body streamed after it, until the connection can be
given to aiohttp as it is), so those paths keep every aiohttp behaviour. The connection then
stays with aiohttp.

HTTP done here (tests/common/test_httpserver.py drives each case on a real socket):
keep-alive; pipelined requests answered in order; Content-Length and chunked bodies;
`Expect: 100-continue`; HTTP/1.0 (closed unless keep-alive); a body limit (413 with a
JSON-RPC error, for chunked bodies too, without reading the rest) and a head limit (431); a
read timeout for a started request (a slowloris client gets 408) and an idle timeout for
keep-alive connections, both checked by one sweep per second instead of a timer per request;
a connection cap (the longest-idle connections are closed to make room, so new clients are
still served); a client that half-closes after a full request still gets its answer; a
graceful close that stops accepting, closes idle connections and finishes requests in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import resource
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any

import httptools
import orjson

from chainstate.busypoll import BusyPoll
from chainstate.http1 import MAX_PLAINS, MAX_SPAN, SIZE_BY_SPAN, KeptHead, head_parts
from chainstate.jsonrpc import INTERNAL_ERROR, INVALID_REQUEST, cut

log = logging.getLogger(__name__)

# A handler answers (status, body) with a JSON body (b"" with 204), or just the body (200, or
# 204 when empty), or (status, body, extra header lines such as b"Retry-After: 1\r\n"). It
# may be a plain function (answered at once, no task) or a coroutine function; a plain
# function may also return None: it answers later itself, through `Request.answer_early`
# (from a callback) or `Request.answer_later` (a task), and nothing else is written for it.
Response = tuple[int, bytes] | tuple[int, bytes, bytes] | bytes
Handler = Callable[["Request"], Awaitable[Response] | Response | None]
# (method, path without the query) → the handler, or None for the fallback application.
Router = Callable[[bytes, bytes], Handler | None]

MAX_PIPELINE = 64  # requests of one connection in flight before its reading pauses
LINGER_SECONDS = 2.0  # after refusing a request: reading (and dropping) input, then closing
_REASONS = {
    200: "OK",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Payload Too Large",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def _status_line(status: int) -> bytes:
    return f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\n".encode()


_JSON = b"Content-Type: application/json\r\n"
_JSON_HEAD = {status: _status_line(status) + _JSON for status in _REASONS}
# The common answer's tail of the head, by body size: `Content-Length: N` and the blank line,
# built once, because formatting it with `%` for every answer cost more than the rest of the
# head together. Larger answers are formatted.
_LENGTHS = [b"Content-Length: %d\r\n\r\n" % n for n in range(2048)]
_OK_JSON = _JSON_HEAD[200]
OK_SIZES = len(_LENGTHS)  # bodies under this size get a whole head kept per second
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_KEEP_ALIVE = b"Connection: keep-alive\r\n"
_CLOSE = b"Connection: close\r\n"


def error_body(code: int, message: str) -> bytes:
    """A JSON-RPC error answer without an id (the request itself could not be read)."""
    return orjson.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}})


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """The limits of one listener. Each is a named setting of the component that serves it;
    docs/http-server.md lists them with these defaults."""

    max_body: int = 10 * 1024 * 1024  # bytes of one request body; larger → 413
    body_limit_name: str = "max_body_bytes"  # the setting the 413 message names
    max_head: int = 64 * 1024  # bytes of request line and headers; larger → 431
    idle_timeout: float = 60.0  # seconds a keep-alive connection may wait for its next request
    read_timeout: float = 30.0  # seconds from a request's first byte to its last, else 408
    max_connections: int = 0  # open client connections; 0: 3/4 of the descriptor limit
    shutdown_timeout: float = 10.0  # seconds a graceful close waits for requests in flight
    busy_poll: float = 0.0  # seconds the loop keeps polling after a request arrives; 0: off

    @classmethod
    def from_section(cls, sect: dict[str, Any], what: str = "http") -> ServerLimits:
        """Limits from a config table (`[http]` for the nodes' data ports): max_body_bytes,
        max_head_bytes, idle_timeout, read_timeout, max_connections, shutdown_timeout,
        busy_poll_us (microseconds, `chainstate.busypoll`)."""
        from chainstate.config import ConfigError

        names = {
            "max_body_bytes": "max_body",
            "max_head_bytes": "max_head",
            "idle_timeout": "idle_timeout",
            "read_timeout": "read_timeout",
            "max_connections": "max_connections",
            "shutdown_timeout": "shutdown_timeout",
            "busy_poll_us": "busy_poll",
        }
        values: dict[str, Any] = {}
        for name, value in sect.items():
            field = names.get(name)
            if field is None:
                raise ConfigError(f"[{what}] unknown setting {name!r}; known: {sorted(names)}")
            least = 0 if name in ("max_connections", "busy_poll_us") else 1e-9
            if not isinstance(value, int | float) or isinstance(value, bool) or value < least:
                raise ConfigError(f"[{what}] {name} must be a positive number, got {value!r}")
            values[field] = value / 1e6 if name == "busy_poll_us" else value
        return cls(**values)

    def connection_cap(self) -> int:
        if self.max_connections > 0:
            return self.max_connections
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return 65536
        return max(16, soft * 3 // 4)


# Header names as code asks for them (`Headers.get("client-id")`) → their lowercase bytes:
# lowering and encoding a name on every lookup cost more than the lookup (the proxy reads one
# per request). Names come from code, not from clients: a handful, bounded anyway.
_NAME_KEYS: dict[str, bytes] = {}
MAX_NAME_KEYS = 256


class Headers:
    """The headers of a request: `get(name)`, case-insensitive (the last one of a name wins)."""

    __slots__ = ("conn", "raw")

    def __init__(self, raw: dict[bytes, bytes], conn: Any = None) -> None:
        # lower-case name bytes → value bytes; a hot path that reads one header may read it
        # here without `get`'s call and decode (~1k instructions): never change it
        self.raw = raw
        self.conn = conn  # the connection it came on (`peer`)

    def peer(self) -> str:
        """The client's address (quotas of the rare paths that keep state per client)."""
        conn = self.conn
        transport = conn.transport if conn is not None else None
        name = transport.get_extra_info("peername") if transport is not None else None
        return str(name[0]) if isinstance(name, tuple) else "unknown"

    def get(self, name: str, default: str | None = None) -> str | None:
        key = _NAME_KEYS.get(name)
        if key is None:
            key = name.lower().encode("latin-1")
            if len(_NAME_KEYS) < MAX_NAME_KEYS:
                _NAME_KEYS[name] = key
        value = self.raw.get(key)
        return default if value is None else value.decode("latin-1")

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower().encode("latin-1") in self.raw


class _Slot:
    """One answer in a connection's ordered queue (`data` is None until it is ready;
    `early`: written before its handler finished, whose result is then dropped)."""

    __slots__ = ("close", "data", "early", "http10", "keep_alive")

    def __init__(
        self, data: bytes | None = None, close: bool = False, http10: bool = False
    ) -> None:
        self.data = data
        self.close = close
        self.keep_alive = not close
        self.http10 = http10
        self.early = False


_new = object.__new__
_monotonic = time.monotonic


class Request(_Slot):
    """One complete request as a handler sees it, and its answer's place in the
    connection's queue: one object per request, not two, as an allocation is a visible part
    of a request's cost."""

    __slots__ = ("_conn", "body", "headers", "method", "path", "query")

    def __init__(
        self,
        method: bytes,
        path: bytes,
        query: bytes,
        headers: Headers,
        body: bytes,
        conn: _Connection | None = None,
        close: bool = False,
        http10: bool = False,
    ) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self._conn = conn
        self.data = None
        self.close = close
        self.keep_alive = not close
        self.http10 = http10
        self.early = False

    def answer_early(self, result: Response) -> bool:
        """Write this request's answer (a `Response`: bytes are a 200, or 204 for b"") now,
        while its handler still runs (after the earlier answers on the connection, as
        always): the proxy writes a node's answer from the node connection's callback and
        keeps its books afterwards, off the client's latency. The handler's own result is
        then dropped; False when the connection is gone (or this was answered already)."""
        conn = self._conn
        if conn is None or self.early or conn.transport is None:
            return False
        self.early = True
        conn._answer(self, result, self.keep_alive, self.http10)
        return True

    def answer_later(self, answer: Awaitable[Response]) -> None:
        """Answer with what `answer` gives, in a task (a handler that returned None and
        then needs to wait, e.g. for another attempt): as a coroutine handler's result."""
        conn = self._conn
        if conn is not None:
            conn.answer_later(self, answer)
        elif asyncio.iscoroutine(answer):  # a request made without a connection (a harness)
            answer.close()


# What llhttp's way answers (after "malformed HTTP request: ") when a callback of a request
# raised (httptools' HttpParserCallbackError): a kept head's reading answers the same.
CALLBACK_FAILED = "User callback error"


class _Plain(KeptHead):
    """A request head llhttp read on a connection, kept to read the client's next ones
    without it (chainstate/http1.py), with what llhttp's callbacks made of it
    (`_Connection._keep_plain`)."""

    __slots__ = ("handler", "headers", "heads", "http10", "kept", "method", "path", "query")

    def __init__(
        self,
        pre: bytes,
        post: bytes,
        persistent: bool,
        method: bytes,
        path: bytes,
        query: bytes,
        headers: dict[bytes, bytes],
        http10: bool,
        handler: Handler | None,
    ) -> None:
        super().__init__(pre, post, persistent)
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.http10 = http10  # HTTP/1.0 with a Connection header
        self.handler = handler  # the route's handler, when the server keeps routes (else None)
        # Content-Length digits → the head's Headers with them: a client's bodies have a
        # few lengths, and a request's Headers are never changed (shared, not copied)
        self.kept: dict[bytes, Headers] = {}
        # body size → (the whole head with that size's digits, its Headers): a read that is
        # one such request whole is told by one `removeprefix` (`_Connection._plain`)
        self.heads: dict[int, tuple[bytes, Headers]] = {}


MAX_KEPT_HEADERS = 32  # Headers a kept head holds (one per body length), then started afresh


def _whole_head(plain: _Plain, size: int, conn: Any) -> tuple[bytes, Headers]:
    """The head `plain` reads for a body of `size` bytes written without leading zeros, with
    that request's Headers; kept in `plain.heads` for the next request of that size."""
    digits = b"%d" % size
    headers = plain.kept.get(digits) or _length_headers(plain, digits, conn)
    heads = plain.heads
    if len(heads) >= MAX_KEPT_HEADERS:
        heads.clear()
    heads[size] = kept = (plain.sized.get(size) or plain.head_of(size), headers)
    return kept


def _length_headers(plain: _Plain, digits: bytes, conn: Any) -> Headers:
    """The Headers of a request with `plain`'s head and `digits` as its Content-Length,
    kept in `plain.kept` for the next request of that length."""
    raw = plain.headers.copy()
    raw[b"content-length"] = digits
    headers = Headers(raw, conn)
    kept = plain.kept
    if len(kept) >= MAX_KEPT_HEADERS:
        kept.clear()
    kept[digits] = headers
    return headers


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing a refused request."""


class _Connection(asyncio.Protocol):
    """One client connection: parses requests, runs their handlers, writes answers in order."""

    __slots__ = (
        "body",
        "body_size",
        "chunk",
        "chunked",
        "closing",
        "eof",
        "fallback",
        "forward",
        "forwarding",
        "handler",
        "head_size",
        "headers",
        "idle_since",
        "in_head",
        "in_message",
        "lingering",
        "method",
        "parser",
        "path",
        "paused",
        "pending",
        "plain",
        "plains",
        "query",
        "reserved",
        "server",
        "started",
        "transport",
        "url",
        "write_paused",
    )

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.pending: deque[_Slot] = deque()
        self.url = b""
        self.method = b""
        self.path = b""
        self.query = b""
        self.headers: dict[bytes, bytes] = {}
        self.handler: Handler | None = None
        self.body: list[bytes] = []
        self.body_size = 0
        self.head_size = 0
        self.in_head = False
        self.in_message = False
        self.chunked = False
        self.started = 0.0
        self.idle_since = time.monotonic()
        self.closing = False  # no further requests are read; close once the answers are out
        self.eof = False  # the client shut down its sending side
        self.lingering = 0.0  # > 0: a request was refused; input is dropped until then
        self.paused = False
        self.write_paused = False
        self.reserved = 0  # unread answer bytes counted in the server's `held` budget
        self.fallback: asyncio.Protocol | None = None  # aiohttp's protocol after a hand-off
        self.forwarding = False  # requests from here on go to the fallback
        self.forward: list[bytes] = []  # forwarded bytes held until earlier answers are out
        self.plain: _Plain | None = None  # the head this client sends, llhttp's reading kept
        self.plains = 0  # heads kept so far (at most MAX_PLAINS per connection)
        self.chunk: bytes | None = None  # the bytes a request being parsed started a read of

    # ---- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connection_made(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connection_lost(self)
        if self.in_message and not self.lingering and not self.forwarding:
            log.info(
                "%s: client %s closed the connection during a request (%d body bytes read)",
                self.server.name,
                self._peer(),
                self.body_size,
            )
        self.transport = None
        self.pending.clear()
        self._unheld()
        if self.fallback is not None:
            self.fallback.connection_lost(exc)

    def eof_received(self) -> bool:
        self.eof = True
        if self.forwarding:
            if self.fallback is not None and not self.pending and not self.forward:
                # aiohttp closes on the client's end of input: the handler of a request cut
                # off midway is cancelled then (it would otherwise wait for the rest, and
                # the socket would stay in CLOSE-WAIT).
                return bool(self.fallback.eof_received())
            return True  # answers owed here first; the fallback closes on its timeouts
        # Keep the write side open while answers are owed: a client that shut down its
        # sending side after a whole request still gets the answer.
        return bool(self.pending) and not self.in_message

    def pause_writing(self) -> None:
        self.write_paused = True
        held = self.server.held
        if held is not None and self.fallback is None and self.transport is not None:
            held.add(self.transport.get_write_buffer_size(), self)  # (`_unheld`)
        self._set_reading()
        if self.fallback is not None:
            self.fallback.pause_writing()

    def resume_writing(self) -> None:
        self.write_paused = False
        self._unheld()
        self._set_reading()
        if self.fallback is not None:
            self.fallback.resume_writing()

    def _unheld(self) -> None:
        """The answer bytes this client had not read are no longer counted: it read them
        (the transport's buffer fell under its low-water mark), or it is gone."""
        if self.reserved:
            self.server.held.release(self)

    def data_received(self, data: bytes) -> None:
        poll = self.server.poll
        if poll is not None:
            if poll.spinning:
                poll.hot = True  # (`kick` without its call)
            else:
                poll.kick()
        if self.lingering or (self.closing and not self.in_message):
            return  # a refused request's body, or bytes after the last request read
        if not self.in_message and not self.forwarding:
            plain = self.plain
            if plain is not None:
                try:
                    data = self._plain(plain, data)
                except Exception:  # (a router's failure): answered as llhttp's way answers it
                    if not self.closing:
                        self._refuse(400, f"malformed HTTP request: {CALLBACK_FAILED}")
                    return
                if not data or self.closing:
                    return  # (after `Connection: close` nothing more is read, as below)
            self.chunk = data  # a request that is all of it may become `plain`
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            self._upgrade(data[exc.args[0] :])
        except httptools.HttpParserError as exc:
            if self.lingering or self.closing:
                return  # stopped on purpose (_Refused, or no more requests are read)
            if self.forwarding:
                self._flush_forward()
                self._close()
            else:
                self._refuse(400, f"malformed HTTP request: {cut(str(exc))}")
        else:
            if self.in_head:  # llhttp keeps a partial head: bound what a client can make it hold
                self.head_size += len(data)
                if self.head_size > self.server.limits.max_head and not self.forwarding:
                    limit = self.server.limits.max_head
                    self._refuse(431, f"request head larger than {limit} bytes")
            elif self.forwarding:
                self._detach()

    # ---- the client's usual head, read once by llhttp ----------------------------------------

    def _keep_plain(self, chunk: bytes, raw: bytes, persistent: bool, http10: bool) -> None:
        """Keep the head of the request llhttp just read as this connection's `plain`, when
        the request was all of `chunk` (its head as the client sent it) and only its
        Content-Length's digits can differ in the client's next request without changing
        how llhttp reads it: a plain-length body (no chunks, no `Expect`, no upgrade), the
        request routed here (not to the fallback), the digits right after `:` and optional
        spaces, and nothing after them on their line."""
        headers = self.headers
        value = headers.get(b"content-length")
        if (
            value is None
            or not value.isdigit()
            or self.forwarding
            or b"transfer-encoding" in headers
            or b"expect" in headers
            or b"upgrade" in headers
            or self.parser.should_upgrade()
        ):
            return
        parts = head_parts(chunk, len(raw), int(value))
        if parts is None:
            return
        self.plains += 1
        handler = self.handler if self.server.kept_routes else None
        self.plain = _Plain(
            *parts, persistent, self.method, self.path, self.query, dict(headers), http10,
            handler,
        )  # fmt: skip

    def _plain(self, plain: _Plain, data: bytes) -> bytes:
        """Serve the requests at the start of `data` whose head is `plain`'s but for the
        Content-Length digits (each with its whole body there) as llhttp's callbacks would,
        without them; give back the bytes from the first other request on, for llhttp
        (which is between requests then too). Why: chainstate/http1.py."""
        server = self.server
        # The usual read, one request whole: `KeptHead.whole`'s reading, with the request's
        # Headers kept beside each size's head (and no call).
        span = len(data) - plain.fixed
        size = SIZE_BY_SPAN[span] if 0 < span < MAX_SPAN else None
        if size is not None and size < server.plain_sizes:
            kept = plain.heads.get(size) or _whole_head(plain, size, self)
            body = data.removeprefix(kept[0])
            if len(body) == size and body is not data:
                handler = plain.handler or self._plain_handler(plain)
                if handler is None:
                    return data  # llhttp's way hands it to the fallback
                self._serve(
                    handler, plain.method, plain.path, plain.query, kept[1], body,
                    plain.persistent, plain.http10,
                )  # fmt: skip
                return b""
        max_digits = server.body_digits - 1  # (more may be over the limit: llhttp's 413)
        while True:
            found = plain.match(data, max_digits)
            if found is None:
                return data
            end, size, digits = found
            if len(data) - end < size:
                return data  # the body comes in later reads: llhttp's
            handler = plain.handler or self._plain_handler(plain)
            if handler is None:
                return data  # llhttp's way hands it to the fallback
            headers = plain.kept.get(digits)
            if headers is None:
                headers = _length_headers(plain, digits, self)
            self._serve(
                handler, plain.method, plain.path, plain.query, headers,
                data[end : end + size], plain.persistent, plain.http10,
            )  # fmt: skip
            data = data[end + size :]
            if not data or self.closing or self.transport is None:
                return data

    def _plain_handler(self, plain: _Plain) -> Handler | None:
        """The handler of a kept head's request when the server does not keep routes; None
        when it goes to the fallback application."""
        server = self.server
        handler = server.route(plain.method, plain.path)
        if handler is None and server.fallback is None:
            return server.not_found
        return handler

    # ---- httptools callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.closing:
            raise _Refused  # after `Connection: close` (or while stopping): not read
        self.in_message = self.in_head = True
        self.started = self.server.now
        self.head_size = 0
        self.url = b""
        self.headers = {}
        self.body = []
        self.body_size = 0

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.lower()
        headers = self.headers
        if key in headers:  # a repeated header: one comma-separated value (RFC 9110 5.3)
            headers[key] += b", " + value
        else:
            headers[key] = value

    def on_headers_complete(self) -> None:
        self.in_head = False
        parser = self.parser
        headers = self.headers
        self.method = method = parser.get_method()
        self.path, _, self.query = self.url.partition(b"?")
        if not self.forwarding:
            fallback = self.server.fallback
            upgrade = parser.should_upgrade()  # WebSocket, h2c: the fallback's (raw bytes)
            if upgrade and fallback is None:
                self._refuse(400, "protocol upgrades are not served here")
                raise _Refused
            handler = None if upgrade else self.server.route(method, self.path)
            if handler is None and fallback is not None:
                self._start_forwarding()
            else:
                self.handler = handler or self.server.not_found
        if self.forwarding:
            self.chunked = b"chunked" in headers.get(b"transfer-encoding", b"").lower()
            self._forward_head()
            return
        if b"host" not in headers and parser.get_http_version() == "1.1":
            self._refuse(400, "an HTTP/1.1 request needs a Host header")
            raise _Refused
        length = headers.get(b"content-length")
        # (a length with fewer digits than the limit is under it: no `int` per request)
        if (
            length is not None
            and len(length) >= self.server.body_digits
            and length.isdigit()
            and int(length) > self.server.limits.max_body
        ):
            self._refuse_too_large()
        if b"expect" in headers:
            self._expect(headers[b"expect"], length is not None and length != b"0")

    def _expect(self, expect: bytes, has_body: bool) -> None:
        """`Expect: 100-continue`: the client waits for this before it sends the body."""
        has_body = has_body or b"transfer-encoding" in self.headers
        if (
            has_body
            and expect.lower() == b"100-continue"
            and self.parser.get_http_version() == "1.1"
        ):
            self._queue(_Slot(_CONTINUE))

    def on_body(self, body: bytes) -> None:
        if self.forwarding:
            self._forward_bytes(b"%x\r\n%b\r\n" % (len(body), body) if self.chunked else body)
            return
        self.body_size += len(body)
        if self.body_size > self.server.limits.max_body:
            self._refuse_too_large()
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.in_message = False
        if self.forwarding:
            if self.chunked:
                self._forward_bytes(b"0\r\n\r\n")
            return
        if self.transport is None:
            return
        parser = self.parser
        persistent = parser.should_keep_alive()
        # An HTTP/1.0 client keeps the connection only with `Connection: keep-alive`.
        http10 = b"connection" in self.headers and parser.get_http_version() == "1.0"
        body = self.body
        raw = body[0] if len(body) == 1 else b"".join(body)
        chunk, self.chunk = self.chunk, None
        if chunk is not None and self.plains < MAX_PLAINS:
            self._keep_plain(chunk, raw, persistent, http10)
        self._complete(raw, persistent, http10)

    def _complete(self, raw: bytes, persistent: bool, http10: bool) -> None:
        """A whole request llhttp read (`raw` its body; `persistent`: llhttp would keep the
        connection after it): its handler runs, its answer is written or queued."""
        self._serve(
            self.handler, self.method, self.path, self.query, Headers(self.headers, self), raw,  # type: ignore[arg-type]
            persistent, http10,
        )  # fmt: skip

    def _serve(
        self,
        handler: Handler,
        method: bytes,
        path: bytes,
        query: bytes,
        headers: Headers,
        raw: bytes,
        persistent: bool,
        http10: bool,
    ) -> None:
        """A whole request (llhttp's, or a kept head's): its handler runs, its answer is
        written or queued."""
        keep_alive = persistent and not self.server.closing
        if not keep_alive:
            self.closing = True  # nothing after this request is read
        http10 = keep_alive and http10
        # `Request.__init__`'s stores without its call: a class whose `__init__` is Python is
        # called through `type.__call__` and a tuple of the arguments in CPython 3.11,
        # ~0.6k instructions more per request
        slot = request = _new(Request)
        request.method = method
        request.path = path
        request.query = query
        request.headers = headers
        request.body = raw
        request._conn = self
        request.data = None
        request.close = not keep_alive
        request.keep_alive = keep_alive
        request.http10 = http10
        request.early = False
        try:
            result = handler(request)
        except Exception:
            log.exception("%s: request handler failed", self.server.name)
            result = (500, error_body(INTERNAL_ERROR, "internal error"))
        pending = self.pending
        if result is None:  # the handler answers later itself (answer_early/answer_later)
            self._queue(slot)
            return
        answered = type(result) is tuple or type(result) is bytes
        if answered and not pending:  # answered at once, nothing before it
            if self.closing:
                keep_alive = False
            if keep_alive and not http10 and type(result) is bytes and 0 < len(result) < 2048:
                # `_render`'s first case and `_drained`'s usual one without their calls: a
                # node's read answered at once, on the client's wait
                head = self.server.ok_heads[len(result)] or self.server.ok_head(len(result))
                self.transport.write(head + result)  # type: ignore[union-attr]
                if self.forward or self.paused or self.eof or self.server.closing:
                    self._drained()
                else:
                    self.idle_since = _monotonic()
                return
            self.transport.write(self._render(result, keep_alive, http10))  # type: ignore[arg-type,union-attr]
            if keep_alive:
                self._drained()
            else:
                self._close()
            return
        pending.append(slot)
        if answered:
            self._answer(slot, result, keep_alive, http10)  # type: ignore[arg-type]
            return
        if len(pending) >= MAX_PIPELINE:
            self._set_reading()
        self.server.loop.create_task(self._run(result, slot, keep_alive, http10))  # type: ignore[arg-type]

    # ---- answers -------------------------------------------------------------------------

    async def _run(
        self, answer: Awaitable[Response], slot: _Slot, keep_alive: bool, http10: bool
    ) -> None:
        try:
            result = await answer
        except Exception:
            log.exception("%s: request handler failed", self.server.name)
            result = (500, error_body(INTERNAL_ERROR, "internal error"))
        if not slot.early:
            self._answer(slot, result, keep_alive, http10)

    def answer_later(self, slot: _Slot, answer: Awaitable[Response]) -> None:
        """`Request.answer_later`: `slot` is answered by a task running `answer`."""
        loop = self.server.loop
        assert loop is not None
        loop.create_task(self._run(answer, slot, slot.keep_alive, slot.http10))  # type: ignore[arg-type]

    def _render(self, result: Response, keep_alive: bool, http10: bool) -> bytes:
        if keep_alive and not http10:
            # the common answer (a 200 with a JSON body under 2 KiB, kept alive, no Connection
            # header), as bytes or as (200, body) (the proxy's answers): the same bytes as
            # below, joined from prebuilt parts instead of formatted with `%` (~1.6k
            # instructions less per answer)
            if type(result) is bytes:
                body = result
            elif len(result) == 2 and result[0] == 200:
                body = result[1]
            else:
                body = b""
            if 0 < len(body) < 2048:
                return (self.server.ok_heads[len(body)] or self.server.ok_head(len(body))) + body
        extra = b""
        if type(result) is bytes:
            status, body = (200, result) if result else (204, b"")
        elif len(result) == 2:
            status, body = result  # type: ignore[misc]
        else:
            status, body, extra = result  # type: ignore[misc]
        conn = (_KEEP_ALIVE if http10 else b"") if keep_alive else _CLOSE
        if status == 204:
            return b"%b%b%b\r\n" % (_status_line(204), self.server.date, conn)
        head = _JSON_HEAD.get(status) or _status_line(status) + _JSON
        return b"%b%b%bContent-Length: %d\r\n%b\r\n%b" % (
            head,
            extra,
            self.server.date,
            len(body),
            conn,
            body,
        )

    def _answer(self, slot: _Slot, result: Response, keep_alive: bool, http10: bool) -> None:
        poll = self.server.poll
        if poll is not None:  # the client's next request follows its answer
            if poll.spinning:
                poll.hot = True  # (`kick` without its call)
            else:
                poll.kick()
        pending = self.pending
        if keep_alive and self.closing and pending and slot is pending[-1]:
            keep_alive = False  # the last answer of a connection being shut down
            slot.close = True
        if keep_alive and not http10 and type(result) is bytes and 0 < len(result) < 2048:
            # `_render`'s first case without its call: a proxy's single answer written from
            # the node connection's callback, on the client's wait at c=1
            server = self.server
            slot.data = (server.ok_heads[len(result)] or server.ok_head(len(result))) + result
        else:
            slot.data = self._render(result, keep_alive, http10)
        if pending and pending[0] is slot:
            self._write_ready()

    def _queue(self, slot: _Slot) -> None:
        pending = self.pending
        pending.append(slot)
        if slot.data is not None and pending[0] is slot:
            self._write_ready()
        elif len(pending) >= MAX_PIPELINE:
            self._set_reading()

    def _write_ready(self) -> None:
        """Write the answers at the head of the queue that are ready, in request order."""
        pending = self.pending
        transport = self.transport
        while pending and pending[0].data is not None:
            slot = pending.popleft()
            if transport is None:
                continue
            held = self.reserved  # (a write that pauses writing counts itself there)
            transport.write(slot.data)  # type: ignore[arg-type]
            if held:  # more for a client that does not read (`pause_writing`)
                self.server.held.add(len(slot.data), self)  # type: ignore[arg-type]
            if slot.close:
                pending.clear()
                self._close()
                return
        if not pending:
            self._drained()
        elif self.paused:
            self._set_reading()

    def _drained(self) -> None:
        """Every answer owed has been written."""
        self.idle_since = time.monotonic()
        if self.forward:
            self._flush_forward()
            self._set_reading()
            self._detach()
        elif (self.eof or self.server.closing) and not self.in_message:
            self._close()
        elif self.paused:
            self._set_reading()

    def _set_reading(self) -> None:
        """Pause reading while the client does not read its answers, while too many of its
        requests are in flight, or while forwarded bytes wait; resume when none holds."""
        transport = self.transport
        if transport is None or (self.fallback is not None and not self.forward):
            return
        pause = self.write_paused or len(self.pending) >= MAX_PIPELINE or bool(self.forward)
        if pause != self.paused:
            self.paused = pause
            if pause:
                transport.pause_reading()
            else:
                transport.resume_reading()

    def _refuse(self, status: int, message: str) -> None:
        """Answer an error after the answers owed and close; until then input is dropped."""
        slot = _Slot(None, True)
        self.pending.append(slot)
        self.lingering = self.server.now + LINGER_SECONDS
        self.closing = True
        self._answer(slot, (status, error_body(INVALID_REQUEST, message)), False, False)

    def _refuse_too_large(self) -> None:
        limits = self.server.limits
        self._refuse(
            413, f"request body larger than {limits.body_limit_name}={limits.max_body} bytes"
        )
        raise _Refused

    def _close(self) -> None:
        transport = self.transport
        if transport is None:
            return
        if self.lingering and not self.eof and transport.can_write_eof():
            # Stop writing but keep reading (and dropping) for a moment: closing with unread
            # input makes the kernel reset the connection, which can destroy the answer.
            with contextlib.suppress(OSError, RuntimeError):
                transport.write_eof()
                return
        transport.close()

    def _peer(self) -> str:
        transport = self.transport
        peer = transport.get_extra_info("peername") if transport is not None else None
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "?"

    # ---- once a second, from the server's sweep ------------------------------------------

    def is_idle(self) -> bool:
        return not self.pending and not self.in_message and not self.forwarding

    def sweep(self, now: float) -> None:
        limits = self.server.limits
        if self.lingering:
            if now >= self.lingering and self.transport is not None:
                self.transport.close()
        elif self.forwarding:
            return  # aiohttp keeps its own timeouts
        elif self.in_message and now - self.started > limits.read_timeout:
            self._refuse(408, f"request not complete within read_timeout={limits.read_timeout}s")
        elif self.is_idle() and now - self.idle_since > limits.idle_timeout:
            self._close()

    def shut_down(self) -> None:
        """Graceful close: an idle connection closes now, a busy one after its answers."""
        if self.forwarding:
            return  # the fallback's runner shuts its connections down
        self.closing = True
        if not self.pending and not self.in_message:
            self._close()

    # ---- hand-off to the fallback application ---------------------------------------------

    def _start_forwarding(self) -> None:
        """From this request on, the connection's requests go to the fallback application."""
        self.forwarding = True
        self.server.forwarding(self)
        fallback = self.fallback = self.server.fallback_protocol()
        fallback.connection_made(self.transport)  # type: ignore[arg-type]

    def _forward_head(self) -> None:
        parser = self.parser
        version = parser.get_http_version().encode()
        lines = [b"%b %b HTTP/%b\r\n" % (self.method, self.url, version)]
        lines.extend(b"%b: %b\r\n" % pair for pair in self.headers.items())
        lines.append(b"\r\n")
        self._forward_bytes(b"".join(lines))

    def _forward_bytes(self, data: bytes) -> None:
        if self.pending or self.forward:
            self.forward.append(data)  # earlier requests are not answered yet
            self._set_reading()
        elif self.fallback is not None:
            self.fallback.data_received(data)

    def _flush_forward(self) -> None:
        data, self.forward = b"".join(self.forward), []
        if data and self.fallback is not None:
            self.fallback.data_received(data)

    def _upgrade(self, rest: bytes) -> None:
        """After an Upgrade request (WebSocket, h2c) the fallback reads the raw connection:
        the rest of the bytes, and the request's body if it has one (llhttp stops at the
        head of an Upgrade request)."""
        if rest:
            self._forward_bytes(rest)
        self.in_message = False
        self._detach()

    def _detach(self) -> None:
        """Give the transport to the fallback's protocol once nothing is held back here: no
        answer owed, no forwarded bytes waiting, and no request half parsed."""
        transport = self.transport
        if self.forward or self.pending or self.in_message or transport is None:
            return
        if self.paused:
            self.paused = False
            transport.resume_reading()
        transport.set_protocol(self.fallback)  # type: ignore[arg-type]
        self.server.connection_lost(self)
        self.transport = None
        self.fallback = None


class HttpServer:
    """One listener: `await start(host, port)`, then `port`; `await close()` stops gracefully.

    `route(method, path)` picks the handler of a request; None hands it to the `fallback`
    aiohttp application (404 without one). Handlers answer `(status, body)`."""

    def __init__(
        self,
        route: Router,
        *,
        limits: ServerLimits | None = None,
        fallback: Any = None,
        name: str = "http",
        kept_routes: bool = False,
        held: Any = None,
    ) -> None:
        self.route = route
        # A byte budget (`add(size, holder)`, `release(holder)`: the proxy's
        # max_buffered_bytes) that counts the answers clients have not read: from the
        # moment a connection's write buffer passes its high-water mark (the transport
        # pauses writing) until it falls under its low-water mark.
        self.held = held
        # `route` gives every request of a method and path the same handler for good: a
        # connection's kept head keeps its handler (no `route` call per request)
        self.kept_routes = kept_routes
        self.limits = limits or ServerLimits()
        self.body_digits = len(str(self.limits.max_body))  # (a shorter length is under it)
        self.plain_sizes = 10 ** (self.body_digits - 1)  # sizes a kept head reads (fewer digits)
        self.fallback = fallback  # an aiohttp web.Application, or None
        self.name = name
        self.conns: set[_Connection] = set()  # served here (timeouts, cap, graceful close)
        self.shims: set[_Connection] = set()  # forwarding to the fallback, not detached yet
        self._all_closed: asyncio.Event | None = None
        self.closing = False
        self.now = time.monotonic()
        self.date = b""  # (`set_date`)
        self.ok_heads: list[bytes | None] = [None] * OK_SIZES  # (`ok_head`)
        self._cap = self.limits.connection_cap()
        self._server: asyncio.base_events.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._runner: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.poll: BusyPoll | None = None  # `limits.busy_poll` > 0: polls after each request

    # ---- lifecycle ------------------------------------------------------------------------

    async def start(
        self, host: str, port: int, *, reuse_port: bool = False, backlog: int = 1024
    ) -> None:
        self.loop = asyncio.get_running_loop()
        if self.limits.busy_poll > 0:
            self.poll = BusyPoll(self.loop, self.limits.busy_poll)
        if self.fallback is not None:
            from aiohttp import web

            runner = web.AppRunner(
                self.fallback,
                access_log=None,
                handle_signals=False,
                shutdown_timeout=self.limits.shutdown_timeout,
                keepalive_timeout=self.limits.idle_timeout,
            )
            await runner.setup()
            self._runner = runner
        self._tick()
        try:
            self._server = await self.loop.create_server(
                lambda: _Connection(self),
                host,
                port,
                backlog=backlog,
                reuse_address=True,
                reuse_port=reuse_port or None,
            )
        except BaseException:
            await self.close()
            raise

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            raise RuntimeError("server not started")
        return self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop accepting, close idle connections, let requests in flight finish (at most
        `shutdown_timeout` seconds), then close what is left."""
        self.closing = True
        if self.poll is not None:
            self.poll.stop()
        if self._server is not None:
            self._server.close()
        for conn in list(self.conns):
            conn.shut_down()
        if self.conns:
            self._all_closed = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._all_closed.wait(), self.limits.shutdown_timeout)
        if self._runner is not None:
            await self._runner.cleanup()  # aiohttp's connections (and its lifecycle)
            self._runner = None
        for conn in [*self.conns, *self.shims]:
            if conn.transport is not None:
                conn.transport.abort()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    # ---- connections ----------------------------------------------------------------------

    def connection_made(self, conn: _Connection) -> None:
        transport = conn.transport
        assert transport is not None
        if len(self.conns) >= self._cap and not self._make_room():
            transport.write(
                b"%b%bContent-Length: 0\r\n%b\r\n" % (_status_line(503), self.date, _CLOSE)
            )
            transport.close()
            return
        self.conns.add(conn)

    def connection_lost(self, conn: _Connection) -> None:
        self.conns.discard(conn)
        self.shims.discard(conn)
        if self._all_closed is not None and not self.conns:
            self._all_closed.set()

    def forwarding(self, conn: _Connection) -> None:
        """`conn` now carries the fallback's requests: aiohttp's timeouts and shutdown apply."""
        self.conns.discard(conn)
        self.shims.add(conn)
        if self._all_closed is not None and not self.conns:
            self._all_closed.set()

    def _make_room(self) -> bool:
        """At the connection cap: close the longest-idle connections (1/64 of them at once, so
        a flood of new clients does not rescan every time). False when none is idle."""
        idle = [c for c in self.conns if c.is_idle()]
        if not idle:
            return False
        count = max(1, len(self.conns) // 64)
        for conn in heapq.nsmallest(count, idle, key=lambda c: c.idle_since):
            self.conns.discard(conn)
            if conn.transport is not None:
                conn.transport.close()
        return True

    def fallback_protocol(self) -> asyncio.Protocol:
        return self._runner.server()

    def not_found(self, request: Request) -> Response:
        path = request.path.decode("latin-1")
        return 404, error_body(INVALID_REQUEST, f"no such path: {cut(path)}")

    def set_date(self, date: bytes) -> None:
        """The Date header line every answer carries from now on (heads of the old one
        are dropped)."""
        self.date = date
        self.ok_heads = [None] * OK_SIZES

    def ok_head(self, size: int) -> bytes:
        """The whole head of a kept-alive 200 with a JSON body of `size` bytes (under
        OK_SIZES): kept in `ok_heads` until the Date changes, so the common answer is one
        concatenation of head and body."""
        self.ok_heads[size] = head = b"".join((_OK_JSON, self.date, _LENGTHS[size]))
        return head

    def _tick(self) -> None:
        """Once a second: the clock and the Date header every answer carries, and timeouts."""
        self.now = now = time.monotonic()
        self.set_date(b"Date: %b\r\n" % formatdate(usegmt=True).encode())
        for conn in list(self.conns):
            conn.sweep(now)
        assert self.loop is not None
        self._sweeper = self.loop.call_later(1.0, self._tick)

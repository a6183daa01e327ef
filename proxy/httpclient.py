"""A lean keep-alive HTTP/1.1 client for the proxy's hot path to plain-http nodes.

Why not aiohttp's ClientSession here: measured on this machine, its per-request work
(request/response objects, header multidicts, timers, tracing hooks) costs about 95 µs of
CPU per call, more than the aiohttp server and the whole routing engine together; a proxy
that forwards raw bytes needs none of it. This client keeps a pool of open connections per
node, writes one prebuilt request head plus the body, and parses the answer with httptools
(llhttp: Content-Length, chunked, keep-alive rules; an answer without either ends when
the node closes the connection). Credentials in the URL (`http://user:pass@host/`) are sent
as HTTP Basic auth, as aiohttp does for https:// nodes, which still use aiohttp.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlsplit

import httptools

from chainstate.http1 import MAX_PLAINS, KeptHead, head_parts
from proxy.buffers import ByteBudget

log = logging.getLogger(__name__)


class HttpError(ConnectionError):
    """The connection failed or the answer was not valid HTTP."""


class AnswerTooLarge(HttpError):
    """The node's answer is larger than `max_answer_bytes` (the connection is dropped)."""


class SlotWaitCancelled(asyncio.CancelledError):
    """Cancelled while the proxy itself was the bottleneck — waiting for a connection slot,
    or for room in the buffered-bytes budget: a deadline that expires here is the proxy's
    saturation, not the node's fault."""


MAX_DIGITS = 24  # Content-Length digits a kept head reads (a longer one is llhttp's)

# `Content-Length: ` is the end of a pool's head: each body size's rest of it, built once.
_LENGTHS = [b"%d\r\n\r\n" % n for n in range(2048)]


class _Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    __slots__ = (
        "_body",
        "_complete",
        "_early",
        "_framed",
        "_headers_done",
        "_received",
        "_waiter",
        "between",
        "budget",
        "chunk",
        "closed",
        "got_bytes",
        "holder",
        "keep_alive",
        "length",
        "loop",
        "max_answer",
        "parser",
        "plain",
        "plain_hits",
        "plains",
        "status",
        "transport",
        "waiting",
    )

    def __init__(self, budget: ByteBudget | None = None, max_answer: int = 0) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self._early: Callable[[int, bytes], Any] | None = None
        self._body: list[bytes] = []
        self._complete = False
        self._headers_done = False
        self._framed = False  # Content-Length or Transfer-Encoding seen
        self._received = 0  # body bytes of the current answer
        self.closed = False
        self.got_bytes = False
        self.keep_alive = True
        self.status = 0
        self.budget = budget  # proxy/buffers.py; None: answers are not counted
        self.max_answer = max_answer  # bytes; 0: no limit
        self.holder: Any = None  # who the current answer's bytes are reserved for
        self.length: int | None = None  # the current answer's Content-Length
        self.waiting: list[Any] | None = None  # the budget entry while reading is paused
        self.between = True  # llhttp is between answers (no answer's first byte read yet)
        self.chunk: bytes | None = None  # the read an answer being parsed started with
        self.plain: KeptHead | None = None  # the node's usual answer head (chainstate/http1.py)
        self.plain_hits = False  # `plain` read an answer since it was kept
        self.plains = 0  # heads kept that read nothing (at most MAX_PLAINS)

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # Once: asyncio.get_running_loop() checks the pid, a getpid() system call each time.
        self.loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        if self.between:  # llhttp is between answers: `data` may be one like the last
            plain = self.plain
            if plain is not None and self._plain(plain, data):
                return
            self.chunk = data  # an answer that is all of it may become `plain`
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(HttpError(f"invalid HTTP answer: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if exc is None and self._headers_done and not self._framed and not self._complete:
            self.keep_alive = False  # an answer delimited by the end of the connection
            self.on_message_complete()
            return
        self._fail(HttpError(f"connection closed by the node{f': {exc}' if exc else ''}"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        # Only two names matter; a name of another length is not lowered (an answer's
        # Content-Type and Date: two calls less per answer).
        size = len(name)
        if size == 14:
            if name.lower() == b"content-length":
                self._framed = True
                if value.isdigit():  # (no contextlib.suppress: this runs for every answer)
                    self.length = int(value)
        elif size == 17 and name.lower() == b"transfer-encoding":
            self._framed = True

    def on_headers_complete(self) -> None:
        self._headers_done = True
        length = self.length
        if length is None:
            return
        if self.max_answer and length > self.max_answer:
            self._too_large(length)
            return
        budget, holder = self.budget, self.holder
        if budget is not None and holder is not None and not budget.reserve(length, holder):
            # No room for this answer now: leave it with the node until there is.
            assert self.transport is not None
            self.transport.pause_reading()
            self.waiting = budget.wait(length, holder, self._granted)

    def _granted(self) -> None:
        self.waiting = None
        if not self.closed and self.transport is not None:
            self.transport.resume_reading()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        if self.length is None:  # no length announced: counted as it comes
            self._received += len(body)
            if self.max_answer and self._received > self.max_answer:
                self._too_large(self._received)
            elif self.budget is not None and self.holder is not None:
                self.budget.add(len(body), self.holder)

    def _too_large(self, size: int) -> None:
        self._fail(AnswerTooLarge(f"answer of {size} bytes, more than max_answer_bytes"))
        self.close()

    def on_message_begin(self) -> None:
        self.between = False

    def on_message_complete(self) -> None:
        parser = self.parser
        status, persistent = parser.get_status_code(), parser.should_keep_alive()
        self.between = True
        chunk, self.chunk = self.chunk, None
        if chunk is not None and status == 200 and self.plains < MAX_PLAINS:
            self._keep_plain(chunk, persistent)
        self._done(status, persistent)

    def _keep_plain(self, chunk: bytes, persistent: bool) -> None:
        """Keep the head of the 200 answer llhttp just read as this connection's `plain`
        when it can be (`head_parts`: the answer was all of `chunk`, …)."""
        body = self._body
        size = len(body[0]) if len(body) == 1 else sum(map(len, body))
        parts = head_parts(chunk, size, self.length)
        if parts is None:
            return
        if self.plain is not None and not self.plain_hits:
            self.plains += 1  # a head kept for nothing: a node whose head keeps changing
        self.plain = KeptHead(*parts, persistent)
        self.plain_hits = False

    def _plain(self, plain: KeptHead, data: bytes) -> bool:
        """Read `data` as llhttp's callbacks would when it is one whole answer with
        `plain`'s head but for the Content-Length digits (False, nothing done: llhttp's).
        Why: chainstate/http1.py."""
        body = plain.whole(data)
        if body is None:
            found = plain.match(data, MAX_DIGITS)
            if found is None:
                return False
            end, size, _ = found
            if len(data) - end != size:
                return False
            body = data[end:]
        self.plain_hits = True
        self._framed = True  # on_header's (Content-Length)
        self.length = len(body)
        self.on_headers_complete()
        self._done(200, plain.persistent, body)  # (no chunk kept: on_body's list stays empty)
        return True

    def _done(self, status: int, persistent: bool, whole: bytes | None = None) -> None:
        """The answer is complete (`status`; `persistent`: llhttp's should_keep_alive;
        `whole`: its body when read in one piece, else the chunks `on_body` kept)."""
        self.status = status
        self.keep_alive = self.keep_alive and persistent
        self._complete = True
        # An idle connection keeps no answer alive: neither the chunks nor the future that
        # holds the joined answer (8 MB answers stayed in memory per idle connection).
        waiter, self._waiter = self._waiter, None
        answer = whole
        if answer is None:
            body, self._body = self._body, []
            answer = body[0] if len(body) == 1 else b"".join(body)
        early, self._early = self._early, None
        if waiter is not None and not waiter.done():
            if early is not None:  # the client may have its answer before the task wakes
                try:
                    early(status, answer)
                except Exception:
                    log.exception("writing an answer early failed")
            waiter.set_result((status, answer))

    def _fail(self, exc: Exception) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def send(
        self,
        data: bytes | tuple[bytes, bytes],
        holder: Any = None,
        early: Callable[[int, bytes], Any] | None = None,
        waiter: Any = None,
    ) -> asyncio.Future[tuple[int, bytes]]:
        """Write a request; its answer comes as the future's (status, body), and is first
        given to `early(status, body)` (called from this protocol's callback) when set.
        `waiter`: an object with a future's `done`, `set_result` and `set_exception` to
        hand the answer to instead (no task awaits it: `Upstream.send_now`). The bytes go
        first: the answer can only come through the loop, after the caller's callback, and
        at c=1 everything before the write is on the client's wait. A (head, body) pair
        goes as two buffers (`HttpClient.parts`)."""
        assert self.transport is not None
        if type(data) is tuple:
            self.transport.writelines(data)
        else:
            self.transport.write(data)  # type: ignore[arg-type]
        return self.expect(holder, early, waiter)

    def expect(
        self,
        holder: Any = None,
        early: Callable[[int, bytes], Any] | None = None,
        waiter: Any = None,
    ) -> asyncio.Future[tuple[int, bytes]]:
        """The answer's state of a request just written to `transport` (`send`'s second
        half): the engine writes a single request first and builds what the answer needs
        after the write (`FirstAttempt.start`), still in the same callback."""
        self._early = early
        self._body = []
        self._complete = self._headers_done = self._framed = False
        self.got_bytes = False
        self.holder, self.length, self._received = holder, None, 0
        if waiter is None:
            waiter = self.loop.create_future()
        self._waiter = waiter
        return waiter

    @property
    def reusable(self) -> bool:
        return not self.closed and self._complete and self.keep_alive

    def close(self) -> None:
        self.closed = True
        if self.waiting is not None and self.budget is not None:
            self.budget.cancel(self.waiting)
            self.waiting = None
        if self.transport is not None:
            self.transport.close()


class HostPool:
    """Open connections to one node (host, port), at most `limit` at a time."""

    def __init__(
        self, url: str, limit: int, budget: ByteBudget | None = None, max_answer: int = 0
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"not a plain http URL: {url}")
        self.host = parts.hostname
        self.port = parts.port or 80
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        host_header = parts.netloc.rsplit("@", 1)[-1]
        auth = _basic_auth(parts.username, parts.password)
        self._head = (
            f"POST {path} HTTP/1.1\r\nHost: {host_header}\r\n{auth}"
            "Content-Type: application/json\r\nContent-Length: "
        ).encode("latin-1")
        self._idle: deque[_Connection] = deque()
        self._limit = limit
        self._budget = budget
        self._max_answer = max_answer
        self._busy = 0  # exchanges in flight (a counter: no semaphore on the hot path)
        self._waiters: deque[asyncio.Future[None]] = deque()  # for a slot, first come first

    async def post(
        self,
        body: bytes,
        race: Any = None,
        holder: Any = None,
        early: Callable[[int, bytes], Any] | None = None,
    ) -> tuple[int, bytes]:
        """(status, body) of one POST; raises HttpError or OSError (and CancelledError from
        the caller's deadline: SlotWaitCancelled while the proxy itself held it up). `race`
        (proxy/hedge.py) is given the answer's future once the request is sent; the answer's
        bytes are reserved for `holder` in the buffered-bytes budget (proxy/buffers.py);
        `early(status, body)` sees the answer as soon as it is complete, before this
        coroutine resumes (the engine writes a final answer to its client from there)."""
        data = self.request(body) if len(body) < 2048 else self.parts(body)
        if self._busy < self._limit and not self._waiters:
            self._busy += 1
        else:
            await self._wait_for_slot()
        try:
            conn = self._take_idle()
            fresh = conn is None
            while True:
                if conn is None:
                    if race is not None:
                        race.connect()
                    conn = await self._connect()
                try:
                    waiter = conn.send(data, holder, early)
                    if race is not None:
                        race.attach(waiter)
                    answer = await waiter
                except BaseException as exc:
                    budget_wait = conn.waiting is not None
                    conn.close()  # cancelled or failed mid-answer: its state is unknown
                    if budget_wait and isinstance(exc, asyncio.CancelledError):
                        raise SlotWaitCancelled(*exc.args) from None
                    if not isinstance(exc, HttpError) or fresh or conn.got_bytes:
                        raise
                    # the node closed an idle connection just before we used it: one fresh try
                    conn, fresh = None, True
                    continue
                self._keep(conn)
                return answer
        finally:
            self._release()

    def request(self, body: bytes) -> bytes:
        """The bytes of one POST of `body` (head and body). A body under 2 KiB takes its
        length's tail from `_LENGTHS` (the `%` formatting was ~1.2k instructions of the
        request's way to the node at c=1)."""
        size = len(body)
        if size < 2048:
            return b"".join((self._head, _LENGTHS[size], body))
        return b"%b%d\r\n\r\n%b" % (self._head, size, body)

    def parts(self, body: bytes) -> tuple[bytes, bytes]:
        """A larger body's POST as its head and the body itself, written as two buffers:
        no copy of the body joined to its head (~13k instructions for a batch of 100
        reads, 11.8 KB)."""
        return b"%b%d\r\n\r\n" % (self._head, len(body)), body

    def take(self) -> _Connection | None:
        """An idle connection with its slot taken, now, or None when none is idle or every
        slot is busy (no waiting: `Upstream.send_now`). `give_back` ends the exchange."""
        if self._busy >= self._limit or self._waiters:
            return None
        idle = self._idle
        while idle:  # (`_take_idle` inline: a call less before the write at c=1)
            conn = idle.pop()
            if not conn.closed:
                self._busy += 1
                return conn
        return None

    def give_back(self, conn: _Connection) -> None:
        """The end of an exchange on a connection from `take`, answered or not (`_keep` and
        `_release` inline: once per single request sent now)."""
        idle = self._idle
        if not conn.closed and conn._complete and conn.keep_alive and len(idle) < self._limit:
            idle.append(conn)
        else:
            conn.close()
        if self._waiters:
            self._release()
        else:
            self._busy -= 1

    def _keep(self, conn: _Connection) -> None:
        if conn.reusable and len(self._idle) < self._limit:
            self._idle.append(conn)
        else:
            conn.close()

    async def _wait_for_slot(self) -> None:
        """Wait until a finishing exchange hands its slot over (`_busy` stays counted)."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError as exc:
            if waiter.done() and not waiter.cancelled():
                self._release()  # the slot was handed over just as we were cancelled
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise SlotWaitCancelled(*exc.args) from None

    def _release(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes on
                return
        self._busy -= 1

    def _take_idle(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
        return None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        budget, max_answer = self._budget, self._max_answer
        try:
            _, conn = await loop.create_connection(
                lambda: _Connection(budget, max_answer), self.host, self.port
            )
        except OSError as exc:
            raise HttpError(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        return conn

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()


def _basic_auth(user: str | None, password: str | None) -> str:
    """The Authorization header line for credentials in a node URL ("" without any)."""
    if user is None and password is None:
        return ""
    raw = f"{unquote(user or '')}:{unquote(password or '')}".encode()
    return f"Authorization: Basic {base64.b64encode(raw).decode()}\r\n"

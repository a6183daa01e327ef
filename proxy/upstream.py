"""Step 4 of routing: sending bytes to a node.

Plain `http://` nodes go through `proxy.httpclient` (pooled keep-alive connections, about a
third of aiohttp's client cost per request, see that module); `https://` nodes through one
aiohttp ClientSession with a tuned TCPConnector per app; `inproc://name` URLs call the
node's handler in this process (no HTTP hop). Bodies go out and come back as raw bytes:
nothing is decoded here. Every attempt's time limit is kept by one `Deadlines` timer (no
per-attempt `asyncio.timeout`). `send_now` writes to an idle plain-http connection without a
task (the engine's synchronous first attempt); its answer or failure comes to a callback.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
from yarl import URL

from chainstate.inproc import InprocRegistry, is_inproc
from proxy.buffers import ByteBudget
from proxy.deadlines import Deadlines
from proxy.httpclient import AnswerTooLarge, HostPool, HttpError, SlotWaitCancelled

log = logging.getLogger(__name__)
_HEADERS = {"Content-Type": "application/json"}
# Headers aiohttp would add to every request; nodes need none of them (bodies stay raw bytes).
_SKIP_HEADERS = ("User-Agent", "Accept", "Accept-Encoding")


class UpstreamError(Exception):
    """An attempt that got no usable answer: `kind` is connect, timeout, http, inproc,
    bad_response, saturated or too_large (proxy/outcome.py says what each means)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


class Upstream:
    def __init__(
        self,
        registry: InprocRegistry | None,
        connections: int = 512,
        keepalive: float = 30.0,
        max_buffered: int = 0,
        max_answer: int = 0,
    ) -> None:
        self.registry = registry
        self._connections = connections
        self._keepalive = keepalive
        # Answer bytes held at once (proxy/buffers.py); 0: not counted.
        self.budget = ByteBudget(max_buffered) if max_buffered else None
        self._max_answer = max_answer
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}
        self._urls: dict[str, URL] = {}  # parsed once: yarl parsing costs per request
        # plain-http node URL → its connections (only such URLs: the engine's first write
        # looks a node up here, `Engine._quick`)
        self.hosts: dict[str, HostPool] = {}
        self._deadlines = Deadlines()

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=self._connections,
            limit_per_host=0,
            keepalive_timeout=self._keepalive,
            ttl_dns_cache=300,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=_HEADERS,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=_SKIP_HEADERS,
            auto_decompress=False,
            trust_env=False,
        )

    async def close(self) -> None:
        self._deadlines.close()
        for pool in self.hosts.values():
            pool.close()
        self.hosts.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _timeout(self, seconds: float) -> aiohttp.ClientTimeout:
        t = self._timeouts.get(seconds)
        if t is None:
            t = self._timeouts[seconds] = aiohttp.ClientTimeout(total=seconds)
        return t

    @property
    def deadlines(self) -> Deadlines:
        """The deadline lanes every attempt uses (hedge timers share them)."""
        return self._deadlines

    async def send(
        self,
        url: str,
        body: bytes,
        limit: float,
        race: Any = None,
        holder: Any = None,
        early: Callable[[int, bytes], Any] | None = None,
    ) -> bytes:
        """The raw response body (b"" for a 204) within `limit` seconds. Raises
        UpstreamError. `race` (proxy/hedge.py, plain-http nodes only) may end the wait
        early with another node's answer; the answer's bytes count for `holder` (an object
        with a `reserved` int, released by the caller) in the buffered-bytes budget.
        `early(status, body)` (plain-http nodes) is given the answer the moment it is
        complete, before this coroutine resumes: the engine answers its client from there."""
        deadline = self._deadlines.start(limit)
        try:
            if url.startswith("http://"):
                pool = self.hosts.get(url) or self._pool(url)
                try:
                    status, data = await pool.post(body, race, holder, early)
                except AnswerTooLarge as exc:
                    raise UpstreamError("too_large", f"{url}: {exc}") from None
                except (HttpError, OSError) as exc:
                    raise UpstreamError("connect", f"{url}: {exc}") from None
                return _answer(url, status, data)
            if is_inproc(url):
                registry = self.registry
                handler = registry.resolve(url) if registry is not None else None
                if handler is None:
                    raise UpstreamError("connect", f"{url}: no such in-process node")
                try:
                    now = registry.resolve_now(url)  # type: ignore[union-attr]
                    answer = None if now is None else now(body)  # plain reads: no await
                    data = answer if answer is not None else await handler(body)
                except Exception as exc:  # a failing in-process node is an unusable answer
                    raise UpstreamError("inproc", f"{url}: {type(exc).__name__}: {exc}") from None
            else:
                data = await self._send_session(url, body, limit)
            self._count(url, data, holder)
            return data
        except SlotWaitCancelled:
            if deadline.expired():
                raise _timed_out(url, limit, saturated=True) from None
            raise
        except asyncio.CancelledError:
            if deadline.expired():
                raise _timed_out(url, limit, saturated=False) from None
            raise
        finally:
            self._deadlines.stop(deadline)

    def send_now(
        self,
        url: str,
        body: bytes,
        limit: float,
        holder: Any,
        early: Callable[[int, bytes], Any],
        then: Landed,
        items: list[Any] | None = None,
    ) -> bool:
        """`send` without a task, for a plain-http node with an idle connection and a free
        slot: `body` is written now and False returned when it cannot be (nothing done).
        The outcome goes to `then(raw, error)` from the connection's callback or the
        deadline timer, after `early(status, body)` saw the answer as `send` gives it;
        `then(None, None)`: the node had closed the idle connection (nothing was answered:
        send it again the usual way, which retries on a fresh connection).

        An in-process node that answers parsed items as a future (`InprocRegistry.
        resolve_later`: eth_calls, plain reads) is given `items` (the objects `body` holds)
        instead of the bytes: its answers come to `then` as bytes from the future's callback,
        within the same limit; False when it declines them (`send` then takes the body)."""
        if items is not None and is_inproc(url):
            return self._later_now(url, items, limit, holder, early, then)
        taken = self.take_now(url)
        if taken is None:
            return False
        pool, conn = taken
        conn.transport.write(pool.request(body))
        self.expect_now(taken, url, limit, holder, early, then)
        return True

    def take_now(self, url: str) -> tuple[HostPool, Any] | None:
        """An idle connection to a plain-http node with its slot taken (its `transport`
        is written to by the caller, then `expect_now` given it), or None (nothing taken)."""
        pool = self.hosts.get(url)
        conn = None if pool is None else pool.take()
        return None if conn is None else (pool, conn)  # type: ignore[return-value]

    def expect_now(
        self,
        taken: tuple[HostPool, Any],
        url: str,
        limit: float,
        holder: Any,
        early: Callable[[int, bytes], Any],
        then: Landed,
    ) -> None:
        """`send_now`'s second half, once the request is written on the connection of
        `take_now`: its answer and deadline. (After the write: the answer comes through the
        loop, after the caller's callback ends, so none of this is on the client's wait.)"""
        pool, conn = taken
        exchange = SentNow(pool, conn, url, limit, then)
        conn.expect(holder, early, exchange)
        self._deadlines.schedule(limit, exchange)

    def _later_now(
        self,
        url: str,
        items: list[Any],
        limit: float,
        holder: Any,
        early: Callable[[int, bytes], Any],
        then: Landed,
    ) -> bool:
        """`send_now` to an in-process node's future of parsed items' answers."""
        registry = self.registry
        later = None if registry is None else registry.resolve_later(url)
        if later is None:
            return False
        try:
            future = later(items)
        except Exception:  # `send` asks it again, with the body, and counts the failure
            return False
        if future is None:
            return False
        exchange = AwaitedNow(self, url, limit, holder, early, then, future, len(items) == 1)
        self._deadlines.schedule(limit, exchange)
        future.add_done_callback(exchange.landed)
        return True

    async def _send_session(self, url: str, body: bytes, limit: float) -> bytes:
        session = self._session
        if session is None:
            raise UpstreamError("connect", "upstream session is closed")
        target = self._urls.get(url)
        if target is None:
            if len(self._urls) > 10_000:  # URLs come from config; bound it anyway
                self._urls.clear()
            target = self._urls[url] = URL(url)
        try:
            async with session.post(target, data=body, timeout=self._timeout(limit)) as resp:
                data = await resp.read()
                status = resp.status
        except TimeoutError:
            raise UpstreamError("timeout", f"no answer from {url} within {limit}s") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError("connect", f"{url}: {type(exc).__name__}: {exc}") from None
        return _answer(url, status, data)

    def _count(self, url: str, data: bytes, holder: Any) -> None:
        """An answer that came whole (in process, or through aiohttp): checked against
        max_answer_bytes and counted in the budget."""
        if self._max_answer and len(data) > self._max_answer:
            msg = f"{url}: answer of {len(data)} bytes, more than max_answer_bytes"
            raise UpstreamError("too_large", msg)
        if self.budget is not None and holder is not None:
            self.budget.add(len(data), holder)

    def _pool(self, url: str) -> HostPool:
        pool = self.hosts.get(url)
        if pool is None:
            if len(self.hosts) > 10_000:  # URLs come from config; bound it anyway
                for old in self.hosts.values():
                    old.close()
                self.hosts.clear()
            try:
                pool = self.hosts[url] = HostPool(
                    url, self._connections, self.budget, self._max_answer
                )
            except ValueError as exc:
                raise UpstreamError("connect", str(exc)) from None
        return pool


# `Upstream.send_now`'s outcome: (the node's answer, or None; the failure, or None)
Landed = Callable[[bytes | None, UpstreamError | None], Any]


class _Exchange:
    """What both exchanges of `Upstream.send_now` keep: the node, the limit, the deadline's
    lane, whether it ended, and `then`, told the outcome once."""

    __slots__ = ("finished", "lane", "limit", "then", "url")

    def __init__(self, url: str, limit: float, then: Landed) -> None:
        self.url = url
        self.limit = limit
        self.then = then
        self.finished = False
        self.lane: Any = None  # set by Deadlines.schedule

    def _land(self, raw: bytes | None, exc: UpstreamError | None) -> None:
        try:
            self.then(raw, exc)
        except Exception:  # a callback: nobody above it would see the error
            log.exception("finishing a request after its node's answer failed")


class SentNow(_Exchange):
    """One exchange of `Upstream.send_now`: the connection's waiter (a future's `done`,
    `set_result` and `set_exception`) and its deadline (`expire`), in one object."""

    __slots__ = ("conn", "pool")

    def __init__(self, pool: HostPool, conn: Any, url: str, limit: float, then: Landed) -> None:
        super().__init__(url, limit, then)
        self.pool = pool
        self.conn = conn

    def done(self) -> bool:
        return self.finished

    def set_result(self, result: tuple[int, bytes]) -> None:
        self._end()
        try:
            raw = _answer(self.url, *result)
        except UpstreamError as exc:
            self._land(None, exc)
        else:
            self._land(raw, None)

    def set_exception(self, exc: BaseException) -> None:
        stale = not self.conn.got_bytes
        self._end()
        if isinstance(exc, AnswerTooLarge):
            self._land(None, UpstreamError("too_large", f"{self.url}: {exc}"))
        elif stale and isinstance(exc, HttpError):
            self._land(None, None)
        else:
            self._land(None, UpstreamError("connect", f"{self.url}: {exc}"))

    def expire(self) -> None:
        """No answer within the limit (the lanes dropped this entry already)."""
        if self.finished:
            return
        self.finished = True
        conn = self.conn
        saturated = conn.waiting is not None  # the answer waits for room in the budget
        conn.close()  # cut off mid-answer: its state is unknown
        self.pool.give_back(conn)
        self._land(None, _timed_out(self.url, self.limit, saturated))

    def _end(self) -> None:
        self.finished = True
        Deadlines.stop(self)
        self.pool.give_back(self.conn)


class AwaitedNow(_Exchange):
    """One exchange of `Upstream.send_now` with an in-process node's future: its answers
    rendered as the node's body would be, or its failure, or the deadline (`expire`)."""

    __slots__ = ("early", "future", "holder", "single", "upstream")

    def __init__(
        self,
        upstream: Upstream,
        url: str,
        limit: float,
        holder: Any,
        early: Callable[[int, bytes], Any],
        then: Landed,
        future: asyncio.Future[list[Any]],
        single: bool,
    ) -> None:
        super().__init__(url, limit, then)
        self.upstream = upstream
        self.holder = holder
        self.early = early
        self.future = future
        self.single = single  # the items of a request object: its answer alone, not a list

    def landed(self, future: asyncio.Future[list[Any]]) -> None:
        if self.finished:
            return
        self.finished = True
        Deadlines.stop(self)
        try:
            raw = self._raw(future)
        except UpstreamError as exc:
            self._land(None, exc)
            return
        self.early(200, raw)
        self._land(raw, None)

    def _raw(self, future: asyncio.Future[list[Any]]) -> bytes:
        """The answers as the node's body would carry them (b"": nothing to answer)."""
        url = self.url
        if future.cancelled():
            raise UpstreamError("inproc", f"{url}: the node dropped the request")
        exc = future.exception()
        if exc is not None:
            raise UpstreamError("inproc", f"{url}: {type(exc).__name__}: {exc}")
        answers = future.result()
        if self.single:
            answer = answers[0]
            raw = b"" if answer is None else orjson.dumps(answer)
        else:
            kept = [answer for answer in answers if answer is not None]
            raw = orjson.dumps(kept) if kept else b""
        self.upstream._count(url, raw, self.holder)
        return raw

    def expire(self) -> None:
        """No answer within the limit (the lanes dropped this entry already)."""
        if self.finished:
            return
        self.finished = True
        self.future.cancel()  # its answers would come to nobody
        self._land(None, _timed_out(self.url, self.limit, saturated=False))


def _timed_out(url: str, limit: float, saturated: bool) -> UpstreamError:
    if saturated:
        msg = f"no free connection to {url} within {limit}s (upstream_connections)"
        return UpstreamError("saturated", msg)
    return UpstreamError("timeout", f"no answer from {url} within {limit}s")


def _answer(url: str, status: int, data: bytes) -> bytes:
    """The body of a usable answer: 2xx, or a 4xx that carries a JSON-RPC answer (a node
    refusing the request itself, e.g. too large); 5xx and other 4xx are failures (retried)."""
    if status == 200 or status == 204:
        return data
    if status == 429:  # the node's rate limit: backed off, retried elsewhere (outcome.py)
        raise UpstreamError("rate_limited", f"{url} answered HTTP 429 (rate limited)")
    if 400 <= status < 500 and b'"jsonrpc"' in data[:200]:
        return data
    raise UpstreamError("http", f"{url} answered HTTP {status}")

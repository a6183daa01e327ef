"""Step 4 of routing: sending to a node through its transport (proxy/transport.py).

`Upstream` keeps one transport per node URL (pooled keep-alive connections for `http://`,
one aiohttp session for `https://`, the handler in this process for `inproc://`), the one
deadline timer every attempt shares (proxy/deadlines.py: no per-attempt `asyncio.timeout`)
and the buffered-bytes budget. Bodies go out and come back as raw bytes: nothing is decoded
here. `send_now` is the first attempt without a task: written to an idle connection, or
given to an in-process node's future, its outcome comes to a callback.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import aiohttp

from chainstate.inproc import InprocRegistry, is_inproc
from proxy.buffers import ByteBudget
from proxy.deadlines import Deadlines
from proxy.httpclient import HostPool, SlotWaitCancelled
from proxy.outcome import ConnectFailed, UpstreamError
from proxy.transport import (
    HTTP,
    AwaitedNow,
    HttpTransport,
    InprocTransport,
    Landed,
    SentNow,
    SessionTransport,
    Transport,
    count_whole,
    timed_out,
)

__all__ = ["Upstream", "UpstreamError"]

log = logging.getLogger(__name__)
_HEADERS = {"Content-Type": "application/json"}
# Headers aiohttp would add to every request; nodes need none of them (bodies stay raw bytes).
_SKIP_HEADERS = ("User-Agent", "Accept", "Accept-Encoding")
MAX_TRANSPORTS = 10_000  # node URLs come from config; bound them anyway


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
        self.transports: dict[str, Transport] = {}  # node URL → its transport (`transport`)
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
        for transport in self.transports.values():
            if type(transport) is HttpTransport:
                transport.pool.close()
        self.transports.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def deadlines(self) -> Deadlines:
        """The deadline lanes every attempt uses (hedge timers share them)."""
        return self._deadlines

    def transport(self, url: str) -> Transport:
        """The node's transport (made on first use; an in-process one is resolved again
        once the registry changed). Raises ConnectFailed for a URL no transport serves."""
        found = self.transports.get(url)
        if found is not None and (
            type(found) is not InprocTransport or found.version == self._version()
        ):
            return found
        if len(self.transports) >= MAX_TRANSPORTS:
            for old in self.transports.values():
                if type(old) is HttpTransport:
                    old.pool.close()
            self.transports.clear()
        made: Transport
        if url.startswith(HTTP):
            try:
                pool = HostPool(url, self._connections, self.budget, self._max_answer)
            except ValueError as exc:
                raise ConnectFailed(str(exc)) from None
            made = HttpTransport(url, pool)
        elif is_inproc(url):
            registry = self.registry
            if registry is None:
                raise ConnectFailed(f"{url}: no such in-process node")
            made = InprocTransport(url, registry)
        else:
            made = SessionTransport(url, self._current_session)
        self.transports[url] = made
        return made

    def http(self, url: str) -> HttpTransport | None:
        """The plain-http transport of `url` once made (None for any other URL, or before its
        first use): the first attempt written before any object looks a node up here."""
        found = self.transports.get(url)
        return found if type(found) is HttpTransport else None

    def _version(self) -> int:
        registry = self.registry
        return -1 if registry is None else registry.version

    def _current_session(self) -> aiohttp.ClientSession | None:
        return self._session

    async def send(
        self,
        url: str,
        body: bytes,
        limit: float,
        race: Any = None,
        holder: Any = None,
        early: Callable[[int, bytes], Any] | None = None,
    ) -> bytes:
        """The raw response body (b"" for a 204) within `limit` seconds. Raises an
        UpstreamError. `race` (proxy/hedge.py, plain-http nodes only) may end the wait
        early with another node's answer; the answer's bytes count for `holder` (an object
        with a `reserved` int, released by the caller) in the buffered-bytes budget.
        `early(status, body)` (plain-http nodes) is given the answer the moment it is
        complete, before this coroutine resumes: the engine answers its client from there."""
        deadline = self._deadlines.start(limit)
        try:
            transport = self.transport(url)
            if type(transport) is HttpTransport:
                return await transport.exchange(body, race, holder, early)
            if type(transport) is InprocTransport:
                data = await transport.exchange(body)
            else:
                data = await transport.exchange(body, limit)  # type: ignore[call-arg]
            count_whole(self.budget, self._max_answer, url, data, holder)
            return data
        except SlotWaitCancelled:
            if deadline.expired():
                raise timed_out(url, limit, saturated=True) from None
            raise
        except asyncio.CancelledError:
            if deadline.expired():
                raise timed_out(url, limit, saturated=False) from None
            raise
        finally:
            self._deadlines.stop(deadline)

    def send_now(
        self,
        url: str,
        body: bytes | None,
        limit: float,
        holder: Any,
        early: Callable[[int, bytes], Any],
        then: Landed,
        items: list[Any] | None = None,
    ) -> bool:
        """`send` without a task: `body` written now to an idle plain-http connection, or
        the parsed `items` (the objects `body` holds) given to an in-process node's future
        of answers; False when neither can be done now (nothing done: `send` then takes
        the body). The outcome goes to `then(raw, error)` from the connection's (or the
        future's) callback or the deadline timer, after `early(status, body)` saw the
        answer as `send` gives it; `then(None, None)`: the node had closed the idle
        connection (nothing was answered: send it again the usual way)."""
        try:
            transport = self.transport(url)
        except UpstreamError:
            return False
        if type(transport) is InprocTransport:
            if items is None:
                return False
            return self._later_now(transport, items, limit, holder, early, then)
        if type(transport) is not HttpTransport or body is None:
            return False
        taken = transport.take_now()
        if taken is None:
            return False
        pool, conn = taken
        conn.transport.write(pool.request(body))
        self.expect_now(taken, url, limit, holder, early, then)
        return True

    def take_now(self, url: str) -> tuple[HostPool, Any] | None:
        """An idle connection to a plain-http node with its slot taken (its `transport`
        is written to by the caller, then `expect_now` given it), or None (nothing taken)."""
        transport = self.http(url)
        return None if transport is None else transport.take_now()

    def expect_now(
        self,
        taken: tuple[HostPool, Any],
        url: str,
        limit: float,
        holder: Any,
        early: Callable[[int, bytes], Any],
        then: Landed,
        soft: float | None = None,
        slow: Callable[[SentNow], Any] | None = None,
    ) -> None:
        """`send_now`'s second half, once the request is written on the connection of
        `take_now`: its answer's wait and deadline (off the client's wait: the answer can
        only come through the loop, after the caller). `slow(exchange)`: called at `soft`
        seconds instead (an attempt timeout), it schedules the rest of `limit` itself."""
        pool, conn = taken
        exchange = SentNow(pool, conn, url, limit, then)
        conn.expect(holder, early, exchange)
        if slow is not None:
            exchange.slow = slow
            limit = soft  # type: ignore[assignment]
        self._deadlines.schedule(limit, exchange)

    def _later_now(
        self,
        transport: InprocTransport,
        items: list[Any],
        limit: float,
        holder: Any,
        early: Callable[[int, bytes], Any],
        then: Landed,
    ) -> bool:
        """`send_now` to an in-process node's future of parsed items' answers."""
        future = transport.later_now(items)
        if future is None:
            return False
        url = transport.url

        def count(raw: bytes) -> None:
            count_whole(self.budget, self._max_answer, url, raw, holder)

        exchange = AwaitedNow(url, limit, count, early, then, future, len(items) == 1)
        self._deadlines.schedule(limit, exchange)
        future.add_done_callback(exchange.landed)
        return True

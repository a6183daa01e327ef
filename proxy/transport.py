"""The transport seam: how bytes (or parsed items) reach one node and its answer comes back.

Each node URL has one transport (`Upstream.transport`):

- `HttpTransport` (`http://`): the lean keep-alive client (proxy/httpclient.py). It can also
  write a first attempt now, without a task (`take_now` + `expect_now`): its answer comes to
  a callback from the connection.
- `SessionTransport` (`https://`): one aiohttp ClientSession, for TLS.
- `InprocTransport` (`inproc://name`): the node's handler in this process. A node may answer
  parsed items synchronously (`NodePath`: no bytes, no task; the transport then *finishes
  synchronously*) or as a future of answers (`later_now`), else it takes the body.

The pipeline's steps never look at the URL scheme: they ask the node's transport. Failures
are raised as the `UpstreamError` subclass that says what they mean (proxy/outcome.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, NamedTuple

import aiohttp
import orjson
from yarl import URL

from chainstate.inproc import (
    AnswerChecked,
    AnswerItems,
    AnswerKeyed,
    InprocRegistry,
    ItemsAnswered,
)
from proxy.buffers import ByteBudget
from proxy.deadlines import Deadlines
from proxy.httpclient import AnswerTooLarge, HostPool, HttpError
from proxy.outcome import (
    ConnectFailed,
    HttpFailed,
    NodeFailed,
    RateLimited,
    Saturated,
    TimedOut,
    TooLarge,
    UpstreamError,
)

log = logging.getLogger(__name__)
HTTP = "http://"
# What a first attempt sent now hears back: (the node's answer, or None; the failure, or
# None). Both None: the node had closed the idle connection, nothing was answered.
Landed = Callable[[bytes | None, UpstreamError | None], Any]


class NodePath(NamedTuple):
    """An in-process node's synchronous answers of parsed items (chainstate/inproc.py)."""

    items: AnswerItems  # any request objects
    answered: ItemsAnswered | None  # tells the node the answers it gave were kept
    checked: AnswerChecked | None  # items of one method the caller checked
    keyed: AnswerKeyed | None  # items of one method the node checks and keys by block text

    def answer(self, items: list[Any], errors: list[int], method: str | None) -> Any:
        """The node's answers to `items` (None: it declines them); `method`: the one method
        of every item, each a request object with an int or string id (the node then
        skips those checks), or None."""
        checked = self.checked
        if method is None or checked is None:
            return self.items(items, errors)
        return checked(method, items, errors)


class HttpTransport:
    """A plain-http node through the lean keep-alive client."""

    __slots__ = ("pool", "url")

    def __init__(self, url: str, pool: HostPool) -> None:
        self.url = url
        self.pool = pool

    async def exchange(self, body: bytes, race: Any, holder: Any, early: Any) -> bytes:
        try:
            status, data = await self.pool.post(body, race, holder, early)
        except AnswerTooLarge as exc:
            raise TooLarge(f"{self.url}: {exc}") from None
        except (HttpError, OSError) as exc:
            raise ConnectFailed(f"{self.url}: {exc}") from None
        return http_answer(self.url, status, data)

    def take_now(self) -> tuple[HostPool, Any] | None:
        """An idle connection with its slot taken (the caller writes the request to its
        `transport`, then calls `Upstream.expect_now`), or None (nothing taken)."""
        pool = self.pool
        conn = pool.take()
        return None if conn is None else (pool, conn)


class SessionTransport:
    """An https node through aiohttp's client (TLS)."""

    __slots__ = ("session", "target", "timeout", "url")

    def __init__(self, url: str, session: Callable[[], aiohttp.ClientSession | None]) -> None:
        self.url = url
        self.session = session
        self.target = URL(url)
        self.timeout: dict[float, aiohttp.ClientTimeout] = {}

    async def exchange(self, body: bytes, limit: float) -> bytes:
        session = self.session()
        if session is None:
            raise ConnectFailed("upstream session is closed")
        timeout = self.timeout.get(limit)
        if timeout is None:
            timeout = self.timeout[limit] = aiohttp.ClientTimeout(total=limit)
        try:
            async with session.post(self.target, data=body, timeout=timeout) as resp:
                data = await resp.read()
                status = resp.status
        except TimeoutError:
            raise TimedOut(f"no answer from {self.url} within {limit}s") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise ConnectFailed(f"{self.url}: {type(exc).__name__}: {exc}") from None
        return http_answer(self.url, status, data)


class InprocTransport:
    """A node in this process: its handler of bytes, and the paths it has for parsed items
    (resolved again when the registry changes: `Upstream.transport`)."""

    __slots__ = ("handler", "later", "now", "path", "url", "version")

    def __init__(self, url: str, registry: InprocRegistry) -> None:
        self.url = url
        self.version = registry.version
        self.handler = registry.resolve(url)
        self.now = registry.resolve_now(url)  # plain reads answered without awaiting
        self.later = registry.resolve_later(url)  # parsed items answered as a future
        items = registry.resolve_items(url)
        self.path = None
        if items is not None:
            self.path = NodePath(
                items,
                registry.resolve_answered(url),
                registry.resolve_checked(url),
                registry.resolve_keyed(url),
            )

    async def exchange(self, body: bytes) -> bytes:
        handler = self.handler
        if handler is None:
            raise ConnectFailed(f"{self.url}: no such in-process node")
        try:
            now = self.now
            answer = None if now is None else now(body)
            return answer if answer is not None else await handler(body)
        except Exception as exc:  # a failing in-process node is an unusable answer
            raise NodeFailed(f"{self.url}: {type(exc).__name__}: {exc}") from None

    def later_now(self, items: list[Any]) -> asyncio.Future[list[Any]] | None:
        """The node's future of the answers to parsed `items`, or None (declined, or it has
        no such path: the body goes the usual way, which counts a failure)."""
        later = self.later
        if later is None:
            return None
        try:
            return later(items)
        except Exception:
            return None


Transport = HttpTransport | SessionTransport | InprocTransport


class _Exchange:
    """What both exchanges of a first attempt sent now keep: the node, the limit, the
    deadline's lane, whether it ended, and `then`, told the outcome once."""

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
    """One exchange written on an idle connection: the connection's waiter (a future's
    `done`, `set_result` and `set_exception`) and its deadline (`expire`), in one object.
    `slow(self)`, when set, is called instead at a sooner soft deadline (an attempt
    timeout), and schedules the rest of the limit itself: one deadline entry either way."""

    __slots__ = ("conn", "pool", "slow")

    def __init__(self, pool: HostPool, conn: Any, url: str, limit: float, then: Landed) -> None:
        # `_Exchange.__init__`'s stores without its call (one per single request sent now)
        self.url = url
        self.limit = limit
        self.then = then
        self.finished = False
        self.lane: Any = None
        self.pool = pool
        self.conn = conn
        self.slow: Callable[[SentNow], Any] | None = None

    def done(self) -> bool:
        return self.finished

    def set_result(self, result: tuple[int, bytes]) -> None:
        self._end()
        status, data = result
        if status == 200:  # (`http_answer`'s first case and `_land`, without their calls)
            try:
                self.then(data, None)
            except Exception:  # a callback: nobody above it would see the error
                log.exception("finishing a request after its node's answer failed")
            return
        try:
            raw = http_answer(self.url, status, data)
        except UpstreamError as exc:
            self._land(None, exc)
        else:
            self._land(raw, None)

    def set_exception(self, exc: BaseException) -> None:
        stale = not self.conn.got_bytes
        self._end()
        if isinstance(exc, AnswerTooLarge):
            self._land(None, TooLarge(f"{self.url}: {exc}"))
        elif stale and isinstance(exc, HttpError):
            self._land(None, None)
        else:
            self._land(None, ConnectFailed(f"{self.url}: {exc}"))

    def expire(self) -> None:
        """No answer within the limit (the lanes dropped this entry already)."""
        if self.finished:
            return
        slow = self.slow
        if slow is not None:  # the soft deadline: the attempt goes on
            self.slow = None
            slow(self)
            return
        self.finished = True
        conn = self.conn
        saturated = conn.waiting is not None  # the answer waits for room in the budget
        conn.close()  # cut off mid-answer: its state is unknown
        self.pool.give_back(conn)
        self._land(None, timed_out(self.url, self.limit, saturated))

    def _end(self) -> None:
        self.finished = True
        self.lane.pop(self, None)  # (`Deadlines.stop`, inline)
        self.pool.give_back(self.conn)


class AwaitedNow(_Exchange):
    """One exchange with an in-process node's future: its answers rendered as the node's
    body would be, or its failure, or the deadline (`expire`)."""

    __slots__ = ("count", "early", "future", "single")

    def __init__(
        self,
        url: str,
        limit: float,
        count: Callable[[bytes], None],
        early: Callable[[int, bytes], Any],
        then: Landed,
        future: asyncio.Future[list[Any]],
        single: bool,
    ) -> None:
        super().__init__(url, limit, then)
        self.count = count  # checks and counts the answer's bytes (max_answer, the budget)
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
            raise NodeFailed(f"{url}: the node dropped the request")
        exc = future.exception()
        if exc is not None:
            raise NodeFailed(f"{url}: {type(exc).__name__}: {exc}")
        answers = future.result()
        if self.single:
            answer = answers[0]
            raw = b"" if answer is None else orjson.dumps(answer)
        else:
            kept = [answer for answer in answers if answer is not None]
            raw = orjson.dumps(kept) if kept else b""
        self.count(raw)
        return raw

    def expire(self) -> None:
        """No answer within the limit (the lanes dropped this entry already)."""
        if self.finished:
            return
        self.finished = True
        self.future.cancel()  # its answers would come to nobody
        self._land(None, timed_out(self.url, self.limit, saturated=False))


def timed_out(url: str, limit: float, saturated: bool) -> UpstreamError:
    if saturated:
        msg = f"no free connection to {url} within {limit}s (upstream_connections)"
        return Saturated(msg)
    return TimedOut(f"no answer from {url} within {limit}s")


def http_answer(url: str, status: int, data: bytes) -> bytes:
    """The body of a usable answer: 2xx, or a 4xx that carries a JSON-RPC answer (a node
    refusing the request itself, e.g. too large); 5xx and other 4xx are failures (retried)."""
    if status == 200 or status == 204:
        return data
    if status == 429:  # the node's rate limit: backed off, retried elsewhere (outcome.py)
        raise RateLimited(f"{url} answered HTTP 429 (rate limited)")
    if 400 <= status < 500 and b'"jsonrpc"' in data[:200]:
        return data
    raise HttpFailed(f"{url} answered HTTP {status}")


def count_whole(budget: ByteBudget | None, max_answer: int, url: str, data: bytes, holder: Any):
    """An answer that came whole (in process, or through aiohttp): checked against
    max_answer_bytes and counted in the budget."""
    if max_answer and len(data) > max_answer:
        raise TooLarge(f"{url}: answer of {len(data)} bytes, more than max_answer_bytes")
    if budget is not None and holder is not None:
        budget.add(len(data), holder)

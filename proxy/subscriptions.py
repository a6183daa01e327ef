"""One WebSocket connection's JSON-RPC: requests, eth_subscribe/eth_unsubscribe, and the
bounded queue of everything sent back. Independent of the server: a `Session` gets each text
message with `receive()` and sends through a `Transport` (aiohttp's WebSocketResponse in
proxy/events.py; anything with `send` and `close` in tests).

- Requests (single or batch) are answered like `POST /:chainId` answers them (through
  `answer`: the proxy's routing, filters included), each message as it comes, at most
  `max_requests_in_flight` at once; answers go out in the order they are ready.
- `eth_subscribe("newHeads")`: each new block's header, as the chain becomes readable
  through the proxy (the pool's chain feed); after a reorg, the new chain's headers.
- `eth_subscribe("logs", filter)`: the matching logs of each new block; after a reorg, the
  logs of the dropped blocks again with `removed: true` (newest first), then the new ones.
  Only new blocks: a concrete `fromBlock`/`toBlock` (history) is refused, as geth refuses it.
- `newPendingTransactions` (and `syncing`) are refused: the proxy has no mempool.
- Everything sent waits in one queue of at most `ws_queue_messages` messages and
  `ws_queue_bytes` bytes; a client that does not read fast enough to stay under both is
  disconnected (close code 1008 with the reason), so it can never make the proxy's memory grow.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import orjson

from chainstate.jsonrpc import (
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    SERVER_BUSY,
    JsonRpcError,
    params_list,
)
from chainstate.logfilter import LogFilter, parse_filter
from proxy.chainfeed import ChainFeed, FeedBlock, FeedError
from proxy.eventsettings import EventSettings
from proxy.filters import matching, new_id

log = logging.getLogger(__name__)

CLOSE_POLICY = 1008  # WebSocket close code: the client broke a limit (slow consumer)
_HEAD = b'{"jsonrpc":"2.0","method":"eth_subscription","params":{"subscription":"'
_MID = b'","result":'
_TAIL = b"}}"
PENDING_REFUSED = (
    "newPendingTransactions is not served by the chainstate proxy: pending transactions live "
    "in the Leader's execution client, which the proxy does not expose; use eth_subscribe "
    '("newHeads") or ("logs") for mined blocks'
)


class Transport(Protocol):
    """The connection under a session (aiohttp: send_frame/close of a WebSocketResponse)."""

    async def send(self, data: bytes) -> None: ...

    async def close(self, code: int, reason: str) -> None: ...


def notification(sub_id: bytes, result: bytes) -> bytes:
    """An eth_subscription message, built from pre-serialized parts (no JSON encoding)."""
    return _HEAD + sub_id + _MID + result + _TAIL


class Subscription:
    """A chain feed listener that turns blocks into notifications for one session."""

    def __init__(self, session: Session, kind: str, flt: LogFilter | None) -> None:
        self.id = new_id()
        self.raw_id = self.id.encode()
        self.session = session
        self.kind = kind
        self.flt = flt
        self.wants_logs = flt is not None
        self.since = -1

    def on_blocks(self, removed: list[FeedBlock], added: list[FeedBlock]) -> None:
        push = self.session.push
        if self.flt is None:
            for block in added:
                if not push(notification(self.raw_id, block.head)):
                    return
            return
        for entry in matching(self.flt, self.since, removed, added):
            if not push(notification(self.raw_id, orjson.dumps(entry))):
                return


Answer = Callable[[bytes, "Session"], Awaitable[bytes]]


class Session:
    """The JSON-RPC state of one WebSocket connection."""

    def __init__(
        self,
        transport: Transport,
        feed: ChainFeed,
        answer: Answer,
        settings: EventSettings,
    ) -> None:
        self.transport = transport
        self.feed = feed
        self._answer = answer
        self.settings = settings
        self.subscriptions: dict[str, Subscription] = {}
        self.closed: str | None = None  # why, once closing
        self._queue: deque[bytes] = deque()
        self._queued_bytes = 0
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(settings.max_requests_in_flight)
        self._tasks: set[asyncio.Task[None]] = set()
        self._writer: asyncio.Task[None] | None = None

    # lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._writer = asyncio.create_task(self._write_loop(), name="ws-writer")

    async def close(self, why: str = "closed") -> None:
        """Forget every subscription, stop the requests in flight and the writer."""
        if self.closed is None:
            self.closed = why
        for sub in self.subscriptions.values():
            self.feed.remove(sub)
        self.subscriptions.clear()
        for task in [*self._tasks, *([self._writer] if self._writer else [])]:
            task.cancel()
        for task in [*self._tasks, *([self._writer] if self._writer else [])]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        self._writer = None
        self._queue.clear()
        self._queued_bytes = 0

    # incoming --------------------------------------------------------------------------

    async def receive(self, data: bytes) -> None:
        """One message from the client: answered in a task of its own, at most
        `max_requests_in_flight` at once (the caller waits for a slot: backpressure)."""
        await self._slots.acquire()
        task = asyncio.create_task(self._handle(data))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()

    async def _handle(self, data: bytes) -> None:
        try:
            out = await self._answer(data, self)
        except Exception:
            log.exception("websocket: a request failed")
            return
        if out:
            self.push(out)

    # outgoing --------------------------------------------------------------------------

    def push(self, message: bytes) -> bool:
        """Queue a message; False (and the connection is being closed) when the client is
        too slow to stay within the queue limits."""
        if self.closed is not None:
            return False
        settings = self.settings
        if (
            len(self._queue) >= settings.ws_queue_messages
            or self._queued_bytes + len(message) > settings.ws_queue_bytes
        ):
            self._drop_slow_consumer()
            return False
        self._queue.append(message)
        self._queued_bytes += len(message)
        self._wake.set()
        return True

    def _drop_slow_consumer(self) -> None:
        s = self.settings
        why = (
            f"slow consumer: more than {s.ws_queue_messages} messages or {s.ws_queue_bytes} "
            "bytes waiting"
        )
        self.closed = why
        for sub in self.subscriptions.values():
            self.feed.remove(sub)
        task = asyncio.create_task(self.transport.close(CLOSE_POLICY, why[:120]))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write_loop(self) -> None:
        queue = self._queue
        while True:
            while not queue:
                self._wake.clear()
                await self._wake.wait()
            message = queue.popleft()
            self._queued_bytes -= len(message)
            await self.transport.send(message)

    # eth_subscribe / eth_unsubscribe -----------------------------------------------------

    async def subscribe(self, params: Any) -> str:
        values = params if isinstance(params, list) else None
        if not values or not isinstance(values[0], str):
            raise JsonRpcError(INVALID_PARAMS, "eth_subscribe: expected [name, options?]")
        if len(values) > 2:
            raise JsonRpcError(INVALID_PARAMS, "eth_subscribe: too many params, at most 2")
        name, options = values[0], values[1] if len(values) == 2 else None
        if name == "newHeads":
            if options not in (None, {}):
                raise JsonRpcError(INVALID_PARAMS, "newHeads takes no options")
            flt = None
        elif name == "logs":
            flt = self._live_filter({} if options is None else options)
        elif name == "newPendingTransactions":
            raise JsonRpcError(METHOD_NOT_FOUND, PENDING_REFUSED)
        else:
            raise JsonRpcError(METHOD_NOT_FOUND, f'no "{name[:40]}" subscription in eth namespace')
        limit = self.settings.max_subscriptions_per_connection
        if len(self.subscriptions) >= limit:
            raise JsonRpcError(
                SERVER_BUSY,
                f"too many subscriptions on this connection ({limit}, "
                "max_subscriptions_per_connection)",
            )
        sub = Subscription(self, name, flt)
        try:
            await self.feed.add(sub)
        except FeedError as exc:
            raise JsonRpcError(SERVER_BUSY, f"cannot follow the chain: {exc}") from None
        self.subscriptions[sub.id] = sub
        return sub.id

    def _live_filter(self, options: Any) -> LogFilter:
        flt = parse_filter(options, max_list=self.settings.max_log_query_list)
        if flt.block_hash is not None:
            raise JsonRpcError(INVALID_PARAMS, "a logs subscription cannot name a blockHash")
        for ref in (flt.from_ref, flt.to_ref):
            if ref is not None and (ref.number is not None or ref.tag == "earliest"):
                raise JsonRpcError(
                    INVALID_PARAMS,
                    "log subscription does not support history block range: a logs "
                    "subscription delivers new blocks only (use eth_getLogs for past blocks)",
                )
        return flt

    async def unsubscribe(self, params: Any) -> bool:
        (sub_id,) = params_list(params, ["id"])
        sub = self.subscriptions.pop(sub_id, None) if isinstance(sub_id, str) else None
        if sub is None:
            return False
        self.feed.remove(sub)
        return True

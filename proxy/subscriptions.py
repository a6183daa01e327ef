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
- Everything sent is written to the connection at once; what the client has not read yet
  waits in the connection's buffer, at most `ws_queue_bytes`. A client that does not read
  fast enough to stay under it is disconnected (close code 1008 with the reason), so it can
  never make the proxy's memory grow.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from chainstate.jsonrpc import (
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    SERVER_BUSY,
    JsonRpcError,
    params_list,
)
from chainstate.logfilter import LogFilter, parse_filter
from proxy.chainfeed import ChainFeed, FeedBlock, follow
from proxy.eventsettings import EventSettings
from proxy.filters import new_id
from proxy.listeners import ListenerQuota, criteria_bytes

log = logging.getLogger(__name__)

CLOSE_POLICY = 1008  # WebSocket close code: the client broke a limit (slow consumer)
CLOSE_TOO_BIG = 1009  # WebSocket close code: a message over the size limit
_HEAD = b'{"jsonrpc":"2.0","method":"eth_subscription","params":{"subscription":"'
_MID = b'","result":'
_TAIL = b"}}"
PENDING_REFUSED = (
    "newPendingTransactions is not served as a subscription by the chainstate proxy: its "
    "subscriptions come from mined blocks; poll eth_newPendingTransactionFilter for pending "
    'transactions, or use eth_subscribe("newHeads") or ("logs")'
)


class Transport(Protocol):
    """The connection under a session: whole text messages written at once (no task, no
    await: the fan-out of a block to many connections stays one pass), the bytes still
    waiting in its buffer, and a close."""

    def write(self, message: bytes) -> None: ...

    def buffered(self) -> int: ...

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
        self.size = criteria_bytes(flt)

    def on_logs(self, entries: list[dict[str, Any]]) -> None:
        """The matching logs of one feed step (found by the chain feed's index)."""
        push, encode = self.session.push, self.session.feed.encode
        for entry in entries:
            if not push(notification(self.raw_id, encode(entry))):
                return

    def on_blocks(self, removed: list[FeedBlock], added: list[FeedBlock]) -> None:
        push = self.session.push  # (newHeads: logs come through `on_logs`)
        for block in added:
            if not push(notification(self.raw_id, block.head)):
                return


Answer = Callable[[bytes, "Session"], Awaitable[bytes]]


class Unread:
    """The bytes written to the process's WebSocket connections that their clients have not
    read, as last seen per connection: each connection's figure is brought up to date when
    a message is pushed to it (a connection that reads all only lowers its own figure at
    its next message: the sum may be high for a while, never low for long)."""

    __slots__ = ("connections", "total")

    def __init__(self) -> None:
        self.total = 0
        self.connections = 0

    def join(self) -> None:
        self.connections += 1

    def seen(self, session: Session, unread: int) -> None:
        self.total += unread - session.unread
        session.unread = unread

    def leave(self, session: Session) -> None:
        self.total -= session.unread
        session.unread = 0
        self.connections -= 1


class Session:
    """The JSON-RPC state of one WebSocket connection."""

    def __init__(
        self,
        transport: Transport,
        feed: ChainFeed,
        answer: Answer,
        settings: EventSettings,
        client: str = "",
        quota: ListenerQuota | None = None,
        unread: Unread | None = None,
    ) -> None:
        self.transport = transport
        self.feed = feed
        self._answer = answer
        self.settings = settings
        self.client = client  # its address (quotas)
        self.quota = quota if quota is not None else ListenerQuota(settings)
        self.over_since: float | None = None  # since when unread bytes are over ws_queue_bytes
        self.unread = 0  # what its client had not read when a message last came (`Unread`)
        self.all_unread = unread if unread is not None else Unread()  # of the process
        self.all_unread.join()
        self.subscriptions: dict[str, Subscription] = {}
        self.closed: str | None = None  # why, once closing
        self._slots = asyncio.Semaphore(settings.max_requests_in_flight)
        self._tasks: set[asyncio.Task[None]] = set()

    # lifecycle -------------------------------------------------------------------------

    async def close(self, why: str = "closed") -> None:
        """Forget every subscription and stop the requests in flight."""
        if self.closed is None:
            self.closed = why
        self._unsubscribe_all()
        self._forget_unread()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()

    def _forget_unread(self) -> None:
        if self.all_unread is not None:
            self.all_unread.leave(self)
            self.all_unread = None  # type: ignore[assignment]  (left once)

    def _unsubscribe_all(self) -> None:
        for sub in self.subscriptions.values():
            self.feed.remove(sub)
            self.quota.give_back(self.client, sub.size, True)
        self.subscriptions.clear()

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
        """Send a message whole; False (and the connection is being closed) when the client
        does not read: what it has not read yet passed `ws_queue_max_bytes`, or stayed over
        `ws_queue_bytes` for `ws_slow_seconds` (a client that reads gets every message, a
        large one too); or when the message is over `max_notification_bytes` (1009)."""
        if self.closed is not None:
            return False
        s = self.settings
        if len(message) > s.max_notification_bytes:
            why = (
                f"message too big: a notification of {len(message)} bytes, more than "
                f"{s.max_notification_bytes} (max_notification_bytes)"
            )
            self._drop(why, CLOSE_TOO_BIG)
            return False
        unread = self.transport.buffered()
        if unread > s.ws_queue_bytes:
            now = time.monotonic()
            if self.over_since is None:
                self.over_since = now
            if unread > s.ws_queue_max_bytes or now - self.over_since > s.ws_slow_seconds:
                self._drop(
                    f"slow consumer: {unread} bytes not read (more than "
                    f"{s.ws_queue_bytes} for {s.ws_slow_seconds:g} s, ws_queue_bytes and "
                    f"ws_slow_seconds, or more than {s.ws_queue_max_bytes}, ws_queue_max_bytes)",
                    CLOSE_POLICY,
                )
                return False
        else:
            self.over_since = None
        if self._over_process(unread):
            return False
        self.transport.write(message)
        self.all_unread.seen(self, unread + len(message))
        return True

    def _over_process(self, unread: int) -> bool:
        """Whether the process's WebSocket connections hold more unread bytes than
        `ws_unread_max_bytes` and this one more than their average: then it is closed (the
        connections that fall furthest behind go first; one that reads holds ~0)."""
        shared = self.all_unread
        shared.seen(self, unread)
        limit = self.settings.ws_unread_max_bytes
        if shared.total <= limit or not unread or unread * shared.connections < shared.total:
            return False
        self._drop(
            f"slow consumer: {unread} bytes not read while the proxy's WebSocket connections "
            f"hold {shared.total} (more than {limit}, ws_unread_max_bytes)",
            CLOSE_POLICY,
        )
        return True

    def _drop(self, why: str, code: int) -> None:
        self.closed = why
        self._unsubscribe_all()
        self._forget_unread()
        task = asyncio.create_task(self.transport.close(code, why[:120]))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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
        total = self.settings.max_subscriptions
        if self.quota.subscriptions >= total:
            raise JsonRpcError(
                SERVER_BUSY, f"too many subscriptions on this proxy ({total}, max_subscriptions)"
            )
        sub = Subscription(self, name, flt)
        self.quota.take(self.client, sub.size, True)
        try:
            await follow(self.feed, sub)
        except BaseException:
            self.quota.give_back(self.client, sub.size, True)
            raise
        if self.closed is not None:  # the connection closed meanwhile
            self.feed.remove(sub)
            self.quota.give_back(self.client, sub.size, True)
            raise JsonRpcError(SERVER_BUSY, "the connection is closing")
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
        self.quota.give_back(self.client, sub.size, True)
        return True

"""WebSocket on the proxy's data path: JSON-RPC as over POST, eth_subscribe newHeads/logs
as the chain becomes readable, reorgs as geth delivers them, and the limits (subscriptions per
connection, connections per client, a slow consumer)."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from chainstate.logfilter import parse_filter
from proxy.chainfeed import NOT_IN_HEADS, ChainFeed, FeedSettings
from proxy.eventsettings import EventSettings
from proxy.subscriptions import CLOSE_POLICY, CLOSE_TOO_BIG, Session, Unread
from tests.proxy.events_stack import EMITTERS, TOPIC_POOL, EventsStack, start_stack, stop_stack

LIMITS = {"max_subscriptions_per_connection": 3, "max_connections_per_client": 4}


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[EventsStack]:
    running = await start_stack(tmp_path, **LIMITS)
    yield running
    await stop_stack(running)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


class Client:
    """A WebSocket JSON-RPC client: requests by id, notifications by subscription."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = 0

    async def request(self, method: str, *params: Any) -> dict[str, Any]:
        self.ids += 1
        await self.ws.send_bytes(
            orjson.dumps({"jsonrpc": "2.0", "id": self.ids, "method": method, "params": params})
        )
        answer = await self.next()
        assert answer.get("id") == self.ids, answer
        return answer

    async def result(self, method: str, *params: Any) -> Any:
        answer = await self.request(method, *params)
        assert "error" not in answer, answer
        return answer["result"]

    async def next(self, within: float = 10.0) -> Any:
        msg = await self.ws.receive(timeout=within)
        assert msg.type == aiohttp.WSMsgType.TEXT, msg
        return orjson.loads(msg.data)

    async def collect(self, counts: dict[str, int]) -> dict[str, list[Any]]:
        """Notifications of several subscriptions, until each has its count."""
        out: dict[str, list[Any]] = {sub: [] for sub in counts}
        while any(len(out[sub]) < count for sub, count in counts.items()):
            msg = await self.next()
            out[msg["params"]["subscription"]].append(msg["params"]["result"])
        return out

    async def notifications(self, sub: str, count: int) -> list[Any]:
        out = []
        while len(out) < count:
            msg = await self.next()
            assert msg["method"] == "eth_subscription" and msg["params"]["subscription"] == sub
            out.append(msg["params"]["result"])
        return out


async def connect(http: aiohttp.ClientSession, stack: EventsStack) -> Client:
    return Client(await http.ws_connect(stack.ws_url))


async def test_new_heads_arrive_once_in_order_as_readable_headers(
    stack: EventsStack, http: aiohttp.ClientSession
) -> None:
    client = await connect(http, stack)
    sub = await client.result("eth_subscribe", "newHeads")
    assert sub.startswith("0x") and len(sub) == 34
    start = stack.chain.head + 1
    await stack.add_blocks(5)
    heads = await client.notifications(sub, 5)
    assert [h["hash"] for h in heads] == [b["Header"]["hash"] for b in stack.chain.blocks[start:]]
    for head in heads:  # what eth_getBlockByNumber says, without the body fields
        block = await stack.rpc("eth_getBlockByNumber", head["number"], False)
        assert head == {k: v for k, v in block.items() if k not in NOT_IN_HEADS}
    # A reorg: the new chain's heads, each once.
    keep = stack.chain.head - 2
    await stack.reorg(keep, 3, "side")
    again = await client.notifications(sub, 3)
    assert [h["hash"] for h in again] == [
        b["Header"]["hash"] for b in stack.chain.blocks[keep + 1 :]
    ]
    assert await client.result("eth_unsubscribe", sub) is True
    assert await client.result("eth_unsubscribe", sub) is False
    await stack.add_blocks(1)
    assert await client.result("eth_blockNumber") == hex(stack.chain.head)  # nothing else came


async def test_logs_subscription_with_removed_logs_on_reorg(
    stack: EventsStack, http: aiohttp.ClientSession
) -> None:
    client = await connect(http, stack)
    criteria = {"address": EMITTERS[:3], "topics": [None, TOPIC_POOL[1][:3]]}
    flt = parse_filter(criteria)
    sub = await client.result("eth_subscribe", "logs", criteria)
    everything = await client.result("eth_subscribe", "logs")
    start = stack.chain.head + 1
    await stack.add_blocks(12)
    new = stack.logs(start)
    expected = [lg for lg in new if flt.matches(lg)]
    assert expected, "the filter must match something for this test to mean something"
    assert await client.collect({sub: len(expected), everything: len(new)}) == {
        sub: expected,
        everything: new,
    }
    keep = stack.chain.head - 3
    dropped = await stack.reorg(keep, 2, "side")
    removed = [
        {**lg, "removed": True}
        for block in reversed(dropped)
        for lg in reversed([lg for r in block["BlockFile"]["receipts"] for lg in r["logs"]])
    ]
    assert removed
    after = removed + stack.logs(keep + 1)
    matched = [lg for lg in after if flt.matches(lg)]
    got = await client.collect({sub: len(matched), everything: len(after)})
    assert got == {sub: matched, everything: after}


async def test_json_rpc_over_the_websocket(stack: EventsStack, http: aiohttp.ClientSession) -> None:
    client = await connect(http, stack)
    assert await client.result("eth_chainId") == "0x539"
    logs = await client.result("eth_getLogs", {"fromBlock": "0x0"})
    assert logs == stack.logs(0)
    await client.ws.send_str(
        '[{"jsonrpc":"2.0","id":"x","method":"eth_blockNumber"},'
        '{"jsonrpc":"2.0","method":"eth_blockNumber"},'
        '{"jsonrpc":"2.0","id":9,"method":"eth_newBlockFilter"},'
        '{"jsonrpc":"2.0","id":10,"method":"nope"}]'
    )
    answers = await client.next()
    assert [a["id"] for a in answers] == ["x", 9, 10]
    assert answers[0]["result"] == hex(stack.chain.head)
    assert answers[1]["result"].startswith("0x")
    assert answers[2]["error"]["code"] == -32601
    await client.ws.send_str("{not json")
    assert (await client.next())["error"]["code"] == -32700
    await client.ws.send_str('{"jsonrpc":"2.0","method":"eth_blockNumber"}')  # notification
    assert await client.result("net_version") == "1337"  # the notification got no answer
    async with http.get(stack.url.replace("/1337", "/4242")) as resp:
        assert resp.status in (404, 405)
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await http.ws_connect(stack.ws_url.replace("/1337", "/4242"))
    assert refused.value.status == 404


@pytest.mark.parametrize(
    ("params", "code", "text"),
    [
        (["newPendingTransactions"], -32601, "poll eth_newPendingTransactionFilter"),
        (["syncing"], -32601, 'no "syncing" subscription'),
        (["logs", {"fromBlock": "0x1"}], -32602, "does not support history"),
        (["logs", {"fromBlock": "earliest"}], -32602, "does not support history"),
        (["logs", {"blockHash": "0x" + "11" * 32}], -32602, "blockHash"),
        (["logs", {"topics": "0x1"}], -32602, "invalid topics"),
        (["logs", {}, 1], -32602, "too many params"),
        (["newHeads", {"a": 1}], -32602, "no options"),
        ([], -32602, "expected [name"),
        ([5], -32602, "expected [name"),
    ],
)
async def test_bad_subscriptions(
    stack: EventsStack, http: aiohttp.ClientSession, params, code, text
) -> None:
    client = await connect(http, stack)
    answer = await client.request("eth_subscribe", *params)
    assert answer["error"]["code"] == code and text in answer["error"]["message"], answer


async def test_subscription_and_connection_limits(
    stack: EventsStack, http: aiohttp.ClientSession
) -> None:
    client = await connect(http, stack)
    for _ in range(3):
        await client.result("eth_subscribe", "newHeads")
    answer = await client.request("eth_subscribe", "newHeads")
    assert answer["error"]["code"] == -32005
    assert "max_subscriptions_per_connection" in answer["error"]["message"]
    others = [await connect(http, stack) for _ in range(3)]  # 4 from this address
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await http.ws_connect(stack.ws_url)
    assert refused.value.status == 429
    await others[0].ws.close()
    for _ in range(100):  # the server sees the close
        if stack.events.per_client.get("127.0.0.1") == 3:
            break
        await asyncio.sleep(0.01)
    await connect(http, stack)


async def test_a_slow_consumer_is_disconnected_with_the_reason(tmp_path: Path) -> None:
    """A client that never reads: the kernel buffers fill, then the proxy's queue, then the
    proxy closes the connection (1008, with why) instead of growing its memory: once its
    unread bytes pass ws_queue_max_bytes (or stay over ws_queue_bytes for ws_slow_seconds)."""
    stack = await start_stack(
        tmp_path,
        ws_queue_bytes=50_000,
        ws_queue_max_bytes=200_000,
        ws_slow_seconds=600.0,
        max_subscriptions_per_connection=100,
    )
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", stack.server.port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            f"GET /1337 HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101")
        for i in range(60):
            frame = orjson.dumps(
                {"jsonrpc": "2.0", "id": i, "method": "eth_subscribe", "params": ["newHeads"]}
            )
            writer.write(_client_frame(frame))
        await writer.drain()
        session = None
        async with asyncio.timeout(60):
            while session is None:
                session = next(iter(stack.events.sessions), None)
                await asyncio.sleep(0.01)
            while session.closed is None:
                await stack.add_blocks(20)
        assert session.closed.startswith("slow consumer") and "ws_queue_bytes" in session.closed
        # The check runs before each write, so the buffer passes the limit by at most the one
        # notification written last (a newHeads header is 1-2 KB) and the close frame.
        assert session.transport.buffered() <= 200_000 + 4096
        for _ in range(200):
            if not stack.events.sessions:
                break
            await asyncio.sleep(0.02)
        assert not stack.events.sessions
        writer.close()
    finally:
        await stop_stack(stack)


def _client_frame(payload: bytes) -> bytes:
    """A masked text frame, as a client sends it (RFC 6455)."""
    mask = os.urandom(4)
    size = len(payload)
    head = bytes([0x81]) + (
        bytes([0x80 | size]) if size < 126 else bytes([0xFE]) + size.to_bytes(2, "big")
    )
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def test_a_message_larger_than_max_body_bytes_closes_the_connection(tmp_path: Path) -> None:
    stack = await start_stack(tmp_path, proxy={"max_body_bytes": 10_000})
    try:
        async with aiohttp.ClientSession() as http:
            client = await connect(http, stack)
            assert await client.result("eth_chainId") == "0x539"
            big = {"jsonrpc": "2.0", "id": 2, "method": "eth_chainId", "params": ["x" * 20_000]}
            await client.ws.send_bytes(orjson.dumps(big))
            msg = await client.ws.receive(timeout=10)
            assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 1009, msg
    finally:
        await stop_stack(stack)


class StuckTransport:
    """A connection whose peer stopped reading: everything written stays buffered."""

    def __init__(self) -> None:
        self.closed: tuple[int, str] | None = None
        self.waiting: list[bytes] = []

    def write(self, message: bytes) -> None:
        self.waiting.append(message)

    def buffered(self) -> int:
        return sum(len(m) for m in self.waiting)

    async def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)


async def test_the_unread_bytes_of_a_connection_are_bounded() -> None:
    """The slow-consumer rule looks at what the client fails to read: a message is written
    whole while the unread bytes are under ws_queue_bytes, or over it for less than
    ws_slow_seconds; past ws_queue_max_bytes, or over ws_queue_bytes for longer, the
    connection is closed (1008); a message over max_notification_bytes closes it (1009)."""
    settings = EventSettings(ws_queue_bytes=1000, ws_queue_max_bytes=2000, ws_slow_seconds=600.0)
    feed = ChainFeed("1", lambda: None, lambda url: None, FeedSettings())  # type: ignore[arg-type,return-value]

    async def answer(data: bytes, session: Session) -> bytes:
        return data

    transport = StuckTransport()
    session = Session(transport, feed, answer, settings)
    assert session.push(b"z" * 1500)  # larger than ws_queue_bytes, but nothing unread yet
    assert all(session.push(b"x" * 100) for _ in range(6))  # over 1000, under 2000: kept
    assert not session.push(b"y")  # 2100 unread: past ws_queue_max_bytes
    await asyncio.sleep(0.01)
    assert transport.closed == (CLOSE_POLICY, session.closed[:120])
    assert "slow consumer" in transport.closed[1] and "ws_queue_bytes" in transport.closed[1]
    assert not session.push(b"after") and transport.buffered() == 2100
    await session.close()

    slow = Session(StuckTransport(), feed, answer, replace(settings, ws_slow_seconds=0.05))
    assert all(slow.push(b"x" * 100) for _ in range(12))  # 1200 unread from the 12th on
    await asyncio.sleep(0.1)
    assert not slow.push(b"y")  # over ws_queue_bytes for longer than ws_slow_seconds
    await slow.close()

    big = Session(StuckTransport(), feed, answer, replace(settings, max_notification_bytes=10))
    assert not big.push(b"x" * 11)
    await asyncio.sleep(0.01)
    assert big.transport.closed[0] == CLOSE_TOO_BIG  # type: ignore[attr-defined]
    assert "max_notification_bytes" in big.closed
    await big.close()


class ReadingTransport(StuckTransport):
    """A connection whose peer reads everything at once."""

    def buffered(self) -> int:
        self.waiting.clear()
        return 0


async def test_the_unread_bytes_of_all_connections_are_bounded() -> None:
    """Past ws_unread_max_bytes for the process, a connection holding more than the
    average of unread bytes is closed when a message comes for it (each stays under its
    own limits here); one that reads is never closed; a closed one no longer counts."""
    settings = EventSettings(
        ws_queue_bytes=10_000, ws_queue_max_bytes=20_000, ws_unread_max_bytes=5_000
    )
    feed = ChainFeed("1", lambda: None, lambda url: None, FeedSettings())  # type: ignore[arg-type,return-value]

    async def answer(data: bytes, session: Session) -> bytes:
        return data

    unread = Unread()
    stuck = [Session(StuckTransport(), feed, answer, settings, unread=unread) for _ in range(3)]
    reader = Session(ReadingTransport(), feed, answer, settings, unread=unread)
    for _ in range(2):
        for session in stuck:
            assert session.push(b"x" * 1000)
    assert unread.total == 6000  # past the limit: the next message to a stuck one closes it
    assert reader.push(b"x" * 1000)  # (nothing unread: kept)
    assert not stuck[0].push(b"y")
    await asyncio.sleep(0.01)
    assert "ws_unread_max_bytes" in stuck[0].closed
    assert unread.total == 5000 and unread.connections == 3  # (the reader: 1000 till it reads)
    assert stuck[1].push(b"z" * 100)  # under the limit again
    for session in [*stuck, reader]:
        await session.close()
    assert unread.total == 0 and unread.connections == 0

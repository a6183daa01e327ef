"""The state feed: the node's StateReader served over loopback HTTP for pyrevm's fork mode.

pyrevm fetches state with eth_getTransactionCount / eth_getBalance / eth_getCode /
eth_getStorageAt at a block number, and eth_getBlockByNumber for BLOCKHASH. It blocks its
process while it waits, so it runs in worker processes and reads from this feed. The feed
answers only at heights inside the reader's range (-39006 otherwise), so a call never mixes
states of two blocks.

Why a hand-rolled server (llhttp through httptools) and not aiohttp: pyrevm 0.3.7 builds a
new tokio runtime and opens a new TCP connection for every single read (measured: one
`connect` per account field or slot), so a cold call at an old block costs one whole HTTP
exchange per slot. aiohttp's per-request machinery cost more than the read itself; this
protocol does only what the feed needs (POST, Content-Length, keep-alive for the workers'
own batched reads). `FeedCore` holds the answers and is shared by the feed in the node's
event loop (overlays, readers other than the LMDB store) and by the feed process
(`feedproc.py`, the LMDB store opened read-only, away from the node's event loop).

`feed_accounts` (not a standard method) answers balance, nonce and code of several accounts
in one request, and `feed_preload` those plus storage slots: workers use them to load what
calls touch (caller, callee, coinbase, the slots calls read before) into a new EVM's cache
before it runs, instead of one pyrevm read per field and per slot.

eth_getBlockByNumber answers the header fields the reader knows; the roots and bloom that
ethers (inside pyrevm) insists on parsing but the EVM never reads are zero. The feed binds
127.0.0.1 on a free port and is internal: never expose it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httptools
import orjson

from chainstate.hexcodec import parse_address, parse_quantity, to_hash32
from chainstate.jsonrpc import (
    DATABASE_FAILED,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    JsonRpcError,
    error_response,
    params_list,
    result_response,
)
from nodes.state.reader import StateReader

log = logging.getLogger(__name__)

ZERO_HASH = "0x" + "00" * 32
EMPTY_BLOOM = "0x" + "00" * 256
EMPTY_UNCLES = "0x1dcc4de8dec75d7aab85b567b6ccd41ad312451b948a7413f0a142fd40d49347"
MAX_BODY = 1024 * 1024  # bytes of one request body
MAX_ACCOUNTS = 1024  # accounts per feed_accounts request
MAX_SLOTS = 4096  # storage slots per feed_preload request
TAGS = ("latest", "pending", "safe", "finalized")


@dataclass
class Overlay:
    """State on top of the block's: state overrides, or the writes of earlier transactions
    of a simulation. pyrevm reads it as plain (cold, committed) state, exactly as a later
    transaction in a block sees the writes of earlier ones."""

    accounts: dict[str, dict[str, Any]] = field(default_factory=dict)  # balance, nonce, code
    storage: dict[str, dict[int, int]] = field(default_factory=dict)
    replaced: set[str] = field(default_factory=set)  # storage replaced wholesale

    def merge_writes(self, writes: dict[str, Any]) -> None:
        for address, (balance, nonce, code) in writes["accounts"].items():
            self.accounts[address] = {"balance": balance, "nonce": nonce, "code": code}
        for address, slots in writes["slots"].items():
            self.storage.setdefault(address, {}).update(slots)


Handler = Callable[[Any, Overlay | None], Any]


class FeedCore:
    """The feed's answers: JSON-RPC request bytes in, response bytes out (synchronous)."""

    def __init__(self, reader: StateReader, chain_id: int) -> None:
        self.reader = reader
        self.chain_id = chain_id
        self.overlays: dict[str, Overlay] = {}
        self._methods: dict[str, Handler] = {
            "eth_getBalance": self._balance,
            "eth_getTransactionCount": self._nonce,
            "eth_getCode": self._code,
            "eth_getStorageAt": self._storage,
            "eth_getBlockByNumber": self._block,
            "eth_blockNumber": self._block_number,
            "eth_chainId": self._chain_id,
            "feed_accounts": self._accounts,
            "feed_preload": self._preload,
        }

    def answer(self, path: str, body: bytes) -> tuple[int, bytes]:
        """(HTTP status, body) for a POST to `/` (the block's state) or `/o/<token>`."""
        overlay = None
        if path.startswith("/o/"):
            overlay = self.overlays.get(path[3:])
            if overlay is None:
                return 404, b"no such overlay"
        elif path != "/":
            return 404, b"not found"
        try:
            request = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            return 200, orjson.dumps(error_response(None, PARSE_ERROR, f"Parse error: {exc}"))
        if isinstance(request, list):
            if not request:
                return 200, orjson.dumps(error_response(None, INVALID_REQUEST, "empty batch"))
            return 200, orjson.dumps([self._one(item, overlay) for item in request])
        return 200, orjson.dumps(self._one(request, overlay))

    def _one(self, item: Any, overlay: Overlay | None) -> dict[str, Any]:
        if not isinstance(item, dict):
            return error_response(None, INVALID_REQUEST, "a request must be an object")
        rid = item.get("id")
        handler = self._methods.get(item.get("method"))  # type: ignore[arg-type]
        if handler is None:
            return error_response(rid, METHOD_NOT_FOUND, f"no method {item.get('method')!r}")
        try:
            return result_response(rid, handler(item.get("params") or [], overlay))
        except JsonRpcError as exc:
            return error_response(rid, exc.code, exc.message, exc.data)
        except Exception:  # a reader bug must not kill the connection: answer it
            log.exception("state feed read failed")
            return error_response(rid, DATABASE_FAILED, "state read failed")

    # -- methods ----------------------------------------------------------------------

    def _height(self, value: Any) -> int:
        lo, hi = self.reader.range()
        if value in TAGS:
            return hi
        height = parse_quantity(value, "block number")
        if not lo <= height <= hi:
            raise JsonRpcError(-39006, f"block {height} is out of this node's range {lo}..{hi}")
        return height

    def _field(self, name: str, address: str, height: int, overlay: Overlay | None) -> Any:
        """balance / nonce (int) or code (bytes) of an account, through the overlay."""
        if overlay is not None:
            value = overlay.accounts.get(address, {}).get(name)
            if value is not None:
                return value
        if name == "balance":
            return self.reader.balance(address, height)
        if name == "nonce":
            return self.reader.nonce(address, height)
        return self.reader.code(address, height)

    def _account_field(self, name: str, params: Any, overlay: Overlay | None) -> Any:
        addr, block = params_list(params, ["address", "block"])
        return self._field(name, parse_address(addr), self._height(block), overlay)

    def _balance(self, params: Any, overlay: Overlay | None) -> str:
        return hex(self._account_field("balance", params, overlay))

    def _nonce(self, params: Any, overlay: Overlay | None) -> str:
        return hex(self._account_field("nonce", params, overlay))

    def _code(self, params: Any, overlay: Overlay | None) -> str:
        return "0x" + self._account_field("code", params, overlay).hex()

    def _storage(self, params: Any, overlay: Overlay | None) -> str:
        addr, slot, block = params_list(params, ["address", "slot", "block"])
        address = parse_address(addr)
        position = parse_quantity(slot, "slot", lenient=True)
        height = self._height(block)
        if overlay is not None:
            slots = overlay.storage.get(address, {})
            if position in slots or address in overlay.replaced:
                return to_hash32(slots.get(position, 0))
        return to_hash32(self.reader.storage(address, position, height))

    def _accounts(self, params: Any, overlay: Overlay | None) -> list[list[str]]:
        """[[balance, nonce, code], …] of the addresses, exactly the values the single
        methods answer (same overlay rules)."""
        addrs, block = params_list(params, ["addresses", "block"])
        if not isinstance(addrs, list) or len(addrs) > MAX_ACCOUNTS:
            raise JsonRpcError(INVALID_PARAMS, f"addresses: a list of at most {MAX_ACCOUNTS}")
        height = self._height(block)
        out = []
        for raw in addrs:
            address = parse_address(raw)
            balance = self._field("balance", address, height, overlay)
            nonce = self._field("nonce", address, height, overlay)
            code = self._field("code", address, height, overlay)
            out.append([hex(balance), hex(nonce), "0x" + code.hex()])
        return out

    def _preload(self, params: Any, overlay: Overlay | None) -> dict[str, Any]:
        """What a new EVM is given before it runs: `{"accounts": feed_accounts' answer,
        "slots": [32-byte word, …]}` for `slots` = [[address, slot], …], exactly the values
        eth_getStorageAt answers (same overlay rules)."""
        addrs, slots, block = params_list(params, ["addresses", "slots", "block"])
        if not isinstance(slots, list) or len(slots) > MAX_SLOTS:
            raise JsonRpcError(INVALID_PARAMS, f"slots: a list of at most {MAX_SLOTS}")
        for pair in slots:
            if not isinstance(pair, list) or len(pair) != 2:
                raise JsonRpcError(INVALID_PARAMS, "slots: [[address, slot], …]")
        accounts = self._accounts([addrs, block], overlay)
        values = [self._storage([a, slot, block], overlay) for a, slot in slots]
        return {"accounts": accounts, "slots": values}

    def _block_number(self, params: Any, overlay: Overlay | None) -> str:
        return hex(self.reader.range()[1])

    def _chain_id(self, params: Any, overlay: Overlay | None) -> str:
        return hex(self.chain_id)

    def _block(self, params: Any, overlay: Overlay | None) -> dict[str, Any] | None:
        block, _full = params_list(params, ["block", "full"])
        height = parse_quantity(block, "block number")
        try:
            h = self.reader.header(height)
            block_hash = h.hash
        except JsonRpcError as exc:
            if exc.code == INVALID_PARAMS:
                raise
            # BLOCKHASH of a block this node does not hold reads as zero, as geth's does for
            # an unknown block; the other fields are those of the head (never read).
            h = self.reader.header(self.reader.range()[1])
            block_hash = ZERO_HASH
        return {
            "hash": block_hash,
            "parentHash": h.parent_hash,
            "sha3Uncles": EMPTY_UNCLES,
            "miner": h.miner,
            "stateRoot": ZERO_HASH,
            "transactionsRoot": ZERO_HASH,
            "receiptsRoot": ZERO_HASH,
            "logsBloom": EMPTY_BLOOM,
            "difficulty": hex(h.difficulty),
            "number": hex(h.number),
            "gasLimit": hex(h.gas_limit),
            "gasUsed": hex(h.gas_used),
            "timestamp": hex(h.timestamp),
            "extraData": "0x",
            "mixHash": h.mix_hash,
            "nonce": "0x0000000000000000",
            "baseFeePerGas": hex(h.base_fee_per_gas),
            "totalDifficulty": "0x0",
            "uncles": [],
            "transactions": [],
            "size": "0x0",
        }


_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 405: b"Method Not Allowed"}
_REASONS[413] = b"Payload Too Large"


class FeedProtocol(asyncio.Protocol):
    """One HTTP/1.1 connection to the feed: POST bodies in, FeedCore answers out.

    Requests on a connection are answered in order (the answer is computed synchronously
    as soon as the request is complete). Keep-alive follows the client's wishes; anything
    but a POST with a body of at most MAX_BODY bytes is refused.
    """

    def __init__(self, core: FeedCore) -> None:
        self.core = core
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self._url = b""
        self._body: list[bytes] = []
        self._size = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            self._reply(400, b"malformed HTTP request", keep_alive=False)

    # httptools callbacks
    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size <= MAX_BODY:
            self._body.append(body)

    def on_message_complete(self) -> None:
        keep_alive = self.parser.should_keep_alive()
        if self.parser.get_method() != b"POST":
            status, out = 405, b"POST only"
        elif self._size > MAX_BODY:
            status, out, keep_alive = 413, b"request body too large", False
        else:
            path = self._url.split(b"?", 1)[0].decode("latin-1")
            status, out = self.core.answer(path, b"".join(self._body))
        self._url, self._body, self._size = b"", [], 0
        self._reply(status, out, keep_alive)

    def _reply(self, status: int, body: bytes, keep_alive: bool) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        kind = b"application/json" if status == 200 else b"text/plain"
        head = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n" % (
            status,
            _REASONS.get(status, b"Error"),
            kind,
            len(body),
        )
        head += b"\r\n" if keep_alive else b"connection: close\r\n\r\n"
        self.transport.write(head + body)
        if not keep_alive:
            self.transport.close()


async def serve(core: FeedCore) -> tuple[asyncio.Server, str]:
    """Serve `core` on 127.0.0.1:<free port> in the running loop; (server, url)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: FeedProtocol(core), sock=sock, backlog=1024)
    return server, f"http://127.0.0.1:{sock.getsockname()[1]}"


class StateFeed:
    """The feed in the node's event loop: overlays, and any StateReader.

    `url` is valid after `start()`. `state_url()` is where workers read a block's plain
    state: the feed process (`feedproc.FeedProcess`) when one is attached and running,
    else this feed.
    """

    def __init__(self, reader: StateReader, chain_id: int) -> None:
        self.core = FeedCore(reader, chain_id)
        self.process: Any = None  # a feedproc.FeedProcess, attached by EvmMethods
        self._server: asyncio.Server | None = None
        self.url: str | None = None

    @property
    def reader(self) -> StateReader:
        return self.core.reader

    @contextlib.contextmanager
    def overlay(self, overlay: Overlay) -> Iterator[str]:
        """A state URL serving `overlay` over the block's state, valid inside the block."""
        assert self.url is not None, "start() the feed first"
        token = secrets.token_hex(12)
        self.core.overlays[token] = overlay
        try:
            yield f"{self.url}/o/{token}"
        finally:
            del self.core.overlays[token]

    def state_url(self) -> str:
        assert self.url is not None, "start() the feed first"
        if self.process is not None:
            url = self.process.url_if_running()
            if url is not None:
                return url
        return self.url

    async def start(self) -> str:
        if self.url is not None:
            return self.url
        self._server, self.url = await serve(self.core)
        log.info("evm state feed started", extra={"url": self.url})
        if self.process is not None:
            await self.process.start()
        return self.url

    async def close(self) -> None:
        if self.process is not None:
            await self.process.stop()
        if self._server is not None:
            self._server.close()  # stops listening; workers' open connections end with them
        self._server = None
        self.url = None

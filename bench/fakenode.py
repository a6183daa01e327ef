"""A fast FAKE state node for benchmarking the proxy and load generators.

Every value it answers is made up: balances, storage, code, nonces, call results and block
headers are pseudo-random bytes derived (blake2b) from the request's params and the block
height, so the same request at the same height always gets the same answer and different
requests get different answers. It holds no state and runs no EVM; it exists so that a load
test measures the proxy, not the node behind it. Never point a user at it.

What it does model faithfully, because routing depends on it:
- a head that can advance (`block_time`; several fake nodes given the same `start_time` share
  one head), a `state` kind that keeps only the last `window` blocks and an `archive` kind that
  keeps all; a block outside the range → -39006;
- strict params (bad address/block → -32602/-39007), single and batch bodies, notifications;
- `blockx_getValidation` (fake validation hashes), so a consistency checker can compare fake
  nodes;
- faults for the failsafe suite (bench/faults.py): added latency per response, injected HTTP
  failures (every Nth request), **lying** from a height on (`lie_from`: other state values and
  other validation hashes, counted as `wrong_answers` in `GET /`), and large `eth_call`
  answers (`call_bytes`).

It is served by the project's lean HTTP/1.1 server (`chainstate.httpserver`, keep-alive,
pipelining, chunked bodies) with a plain function as handler (no task per request), so one
core answers tens of thousands of requests per second.
"""

from __future__ import annotations

import asyncio
import hashlib
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from chainstate.blockref import BlockRef, parse_block_ctx, parse_block_id, parse_block_number_param
from chainstate.hexcodec import parse_address, parse_data, parse_quantity
from chainstate.httpserver import HttpServer, Request, Response, ServerLimits
from chainstate.jsonrpc import (
    BLOCK_NOT_FOUND,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    JsonRpcError,
    check_request,
    cut,
    params_list,
    request_id,
)

DEFAULT_WINDOW = 128  # blocks a `state` kind fake node keeps (like the real state node)
DEFAULT_CHAIN_ID = 1337
DEFAULT_MAX_BODY = 10 * 1024 * 1024  # bytes; larger requests get HTTP 413
DEFAULT_MAX_BATCH = 10_000  # items; larger batches get -32600
GENESIS_TIMESTAMP = 1_700_000_000  # fake header timestamps: genesis + 12 s per block
FAKE_MINER = "0x" + "fa" * 20
ZERO_HASH = "0x" + "00" * 32
VERSION = "chainstate-bench-fake-node/1 (fake data)"


def _digest(*parts: bytes) -> bytes:
    """32 pseudo-random bytes determined by `parts` (the source of every fake value)."""
    return hashlib.blake2b(b"|".join(parts), digest_size=32).digest()


def _h8(n: int) -> bytes:
    return n.to_bytes(8, "big")


def block_hash(height: int, fork: int = 0) -> str:
    """Fake block hash: the height in the first 8 bytes, so a hash maps back to a height;
    `fork` (0: the chain every fake node starts on) makes another block at that height."""
    salt = _digest(b"block", _h8(height)) if fork == 0 else _digest(b"fork", _h8(height), _h8(fork))
    return "0x" + (_h8(height) + salt[:24]).hex()


@dataclass
class FakeNodeSettings:
    """Every knob of the fake node; defaults are what `chainstate bench fake-node` uses."""

    host: str = "127.0.0.1"
    port: int = 0  # 0 = any free port (see FakeNode.port after start)
    kind: str = "state"  # "state" keeps `window` blocks, "archive" keeps all
    head: int = 1_000_000
    window: int = DEFAULT_WINDOW
    chain_id: int = DEFAULT_CHAIN_ID
    block_time: float = 0.0  # seconds per new block; 0 = the head never moves
    latency_ms: float = 0.0  # added before each response is written
    fail_every: int = 0  # every Nth HTTP request answers `fail_status`; 0 = never
    fail_status: int = 503
    max_body: int = DEFAULT_MAX_BODY
    max_batch: int = DEFAULT_MAX_BATCH
    start_time: float | None = None  # unix time at which the head was `head` (None: at start)
    lie_from: int | None = None  # from this height on, state values and hashes are wrong
    call_bytes: int = 32  # bytes of an eth_call result
    stop_grace: float = 10.0  # seconds `stop` waits for answers in flight, then cuts them

    def __post_init__(self) -> None:
        if self.kind not in ("state", "archive"):
            raise ValueError(f"kind must be 'state' or 'archive', not {self.kind!r}")
        if self.head < 0 or self.window < 1:
            raise ValueError("head must be >= 0 and window >= 1")
        if self.block_time < 0 or self.latency_ms < 0 or self.fail_every < 0:
            raise ValueError("block_time, latency_ms and fail_every must be >= 0")
        if self.call_bytes < 1 or (self.lie_from is not None and self.lie_from < 0):
            raise ValueError("call_bytes must be >= 1 and lie_from >= 0")


@dataclass
class FakeChain:
    """The fake chain's head, its blocks' hashes and the range of heights this node
    answers. `reorg` replaces the blocks from a height up with those of another fork."""

    settings: FakeNodeSettings
    started: float = field(default_factory=time.monotonic)
    forks: list[tuple[int, int]] = field(default_factory=list)  # (from height, fork number)

    def reorg(self, from_height: int, fork: int) -> None:
        """Blocks from `from_height` up are now those of fork `fork` (other hashes)."""
        self.forks.append((from_height, fork))

    def fork_at(self, height: int) -> int:
        fork = 0
        for start, number in self.forks:
            if height >= start:  # a later reorg from a lower height replaces what was above
                fork = number
        return fork

    def hash_at(self, height: int) -> str:
        return block_hash(height, self.fork_at(height)) if self.forks else block_hash(height)

    def height_of(self, value: str) -> int | None:
        """The height a block hash of this chain names, or None if it is not one of its
        blocks (another fork's, or not a fake hash)."""
        raw = bytes.fromhex(value[2:])
        height = int.from_bytes(raw[:8], "big")
        return height if self.hash_at(height) == value.lower() else None

    def head(self) -> int:
        s = self.settings
        if s.block_time <= 0:
            return s.head
        if s.start_time is not None:  # wall clock: fake nodes started apart share one head
            return s.head + max(0, int((time.time() - s.start_time) / s.block_time))
        return s.head + int((time.monotonic() - self.started) / s.block_time)

    def earliest(self, head: int) -> int:
        if self.settings.kind == "archive":
            return 0
        return max(0, head - self.settings.window + 1)

    def resolve(self, ref: BlockRef, head: int) -> int:
        """The height `ref` names; -39006 when it is outside [earliest, head]."""
        if ref.number is not None:
            height = ref.number
        elif ref.hash is not None:
            found = self.height_of(ref.hash)
            if found is None or found > head:
                raise JsonRpcError(BLOCK_NOT_FOUND, f"block {ref.hash} not found")
            height = found
        elif ref.tag == "earliest":
            height = 0
        else:  # latest, pending, safe, finalized: the fake chain has no reorgs
            height = head
        low = self.earliest(head)
        if not low <= height <= head:
            msg = f"block {height} is outside this node's range [{low}, {head}]"
            raise JsonRpcError(BLOCK_NOT_FOUND, msg)
        return height


class FakeMethods:
    """The read methods of a state node, answered with derived (fake) values."""

    def __init__(self, chain: FakeChain, chain_id: int) -> None:
        self.chain = chain
        self.chain_id = chain_id
        self.lie_from = chain.settings.lie_from
        self.call_bytes = chain.settings.call_bytes
        self.wrong_answers = 0  # state values answered wrong (lie_from)
        self.table: dict[str, Callable[[Any, int], Any]] = {
            "eth_blockNumber": self.eth_block_number,
            "eth_chainId": self.eth_chain_id,
            "eth_getBalance": self.eth_get_balance,
            "eth_getTransactionCount": self.eth_get_transaction_count,
            "eth_getCode": self.eth_get_code,
            "eth_getStorageAt": self.eth_get_storage_at,
            "eth_call": self.eth_call,
            "eth_getBlockByNumber": self.eth_get_block_by_number,
            "eth_getBlockByHash": self.eth_get_block_by_hash,
            "eth_baseFee": self.eth_base_fee,
            "getAddressBalance": self.get_address_balance,
            "getAddressNonce": self.get_address_nonce,
            "getAddressCode": self.get_address_code,
            "getStorageAt": self.get_storage_at,
            "getLatestBlock": self.get_latest_block,
            "getBlockByHeight": self.get_block_by_height,
            "getBlockById": self.get_block_by_id,
            "blockIsValid": self.block_is_valid,
            "blockx_range": self.blockx_range,
            "blockx_getValidation": self.blockx_get_validation,
            "version": self.version,
        }

    # --- derived values -------------------------------------------------------------------
    @staticmethod
    def balance(address: str, height: int) -> int:
        return int.from_bytes(_digest(b"bal", address.encode(), _h8(height))[:10], "big")

    @staticmethod
    def nonce(address: str, height: int) -> int:
        base = int.from_bytes(_digest(b"nonce", address.encode())[:2], "big")
        return base + height // 100  # never decreases with height, like a real nonce

    @staticmethod
    def code(address: str) -> bytes:
        d = _digest(b"code", address.encode())
        return b"" if d[0] % 2 == 0 else bytes.fromhex("6080604052") + d

    @staticmethod
    def storage(address: str, slot: int, height: int) -> bytes:
        return _digest(b"slot", address.encode(), slot.to_bytes(32, "big"), _h8(height))

    def header(self, height: int) -> dict[str, Any]:
        d = _digest(b"hdr", _h8(height))
        return {
            "number": hex(height),
            "hash": self.chain.hash_at(height),
            "parentHash": self.chain.hash_at(height - 1) if height else ZERO_HASH,
            "timestamp": hex(GENESIS_TIMESTAMP + 12 * height),
            "miner": FAKE_MINER,
            "gasLimit": hex(30_000_000),
            "gasUsed": hex(int.from_bytes(d[:3], "big") % 30_000_000),
            "baseFeePerGas": hex(self.base_fee(height)),
            "transactions": [],
            "uncles": [],
        }

    @staticmethod
    def base_fee(height: int) -> int:
        return 1_000_000_000 + int.from_bytes(_digest(b"fee", _h8(height))[:3], "big")

    def vendor_block(self, height: int) -> dict[str, Any]:
        h = self.header(height)
        return {
            "id": h["hash"],
            "height": height,
            "timestamp": GENESIS_TIMESTAMP + 12 * height,
            "parent_id": h["parentHash"],
            "base_fee_per_gas": self.base_fee(height),
            "miner": FAKE_MINER,
            "gas_limit": 30_000_000,
            "gas_used": int(h["gasUsed"], 16),
        }

    def validation_hash(self, height: int) -> str:
        salt = b"lie" if self.lying(height) else b"val"
        return "0x" + _digest(salt, _h8(height)).hex()

    def lying(self, height: int) -> bool:
        return self.lie_from is not None and height >= self.lie_from

    def _told(self, value: int, height: int) -> int:
        """A state value as this node tells it: one more from `lie_from` on (counted)."""
        if self.lie_from is None or height < self.lie_from:
            return value
        self.wrong_answers += 1
        return value + 1

    # --- eth namespace --------------------------------------------------------------------
    def _at(self, value: Any, head: int) -> int:
        return self.chain.resolve(parse_block_number_param(value), head)

    def eth_block_number(self, params: Any, head: int) -> str:
        return hex(head)

    def eth_chain_id(self, params: Any, head: int) -> str:
        return hex(self.chain_id)

    def eth_get_balance(self, params: Any, head: int) -> str:
        addr, block = params_list(params, ["address", "blockNumber"])
        address = parse_address(addr)
        height = self._at(block, head)
        return hex(self._told(self.balance(address, height), height))

    def eth_get_transaction_count(self, params: Any, head: int) -> str:
        addr, block = params_list(params, ["address", "blockNumber"])
        address = parse_address(addr)
        height = self._at(block, head)
        return hex(self._told(self.nonce(address, height), height))

    def eth_get_code(self, params: Any, head: int) -> str:
        addr, block = params_list(params, ["address", "blockNumber"])
        address = parse_address(addr)
        self._at(block, head)
        return "0x" + self.code(address).hex()

    def eth_get_storage_at(self, params: Any, head: int) -> str:
        addr, pos, block = params_list(params, ["address", "position", "blockNumber"])
        address = parse_address(addr)
        slot = parse_quantity(pos, "position", lenient=True)
        return self._slot(address, slot, self._at(block, head))

    def _slot(self, address: str, slot: int, height: int) -> str:
        value = self.storage(address, slot, height)
        if self.lying(height):
            self._told(0, height)
            value = bytes([value[0] ^ 1]) + value[1:]
        return "0x" + value.hex()

    def eth_call(self, params: Any, head: int) -> str:
        names = ["request", "blockNumber", "stateOverride", "blockOverrides"]
        request, block, _, _ = params_list(params, names)
        if not isinstance(request, dict):
            raise JsonRpcError(INVALID_PARAMS, "eth_call: request must be an object")
        to = parse_address(request.get("to"), "to")
        data = parse_data(request.get("data", request.get("input", "0x")), "data")
        height = self._at(block, head)
        out = _digest(b"call", to.encode(), data, _h8(height))
        if self.call_bytes != len(out):  # large answers (memory tests): the digest repeated
            out = (out * (self.call_bytes // len(out) + 1))[: self.call_bytes]
        if self.lying(height):
            self._told(0, height)
            out = bytes([out[0] ^ 1]) + out[1:]
        return "0x" + out.hex()

    def eth_get_block_by_number(self, params: Any, head: int) -> dict[str, Any] | None:
        block, _full = params_list(params, ["blockNumber", "full"])
        return self.header(self.chain.resolve(parse_block_number_param(block, None), head))

    def eth_get_block_by_hash(self, params: Any, head: int) -> dict[str, Any] | None:
        value, _full = params_list(params, ["blockHash", "full"])
        ref = parse_block_id(value)
        if ref.hash is None:
            raise JsonRpcError(INVALID_PARAMS, "eth_getBlockByHash: expected a 32-byte hash")
        return self.header(self.chain.resolve(ref, head))

    def eth_base_fee(self, params: Any, head: int) -> int:
        (block,) = params_list(params, ["blockNumber"])
        return self.base_fee(self._at(block, head))

    # --- vendor namespace -----------------------------------------------------------------
    def _ctx(self, value: Any, head: int) -> int:
        return self.chain.resolve(parse_block_ctx(value), head)

    def get_address_balance(self, params: Any, head: int) -> str:
        addr, ctx = params_list(params, ["address", "blockCtx"])
        address = parse_address(addr)
        height = self._ctx(ctx, head)
        return hex(self._told(self.balance(address, height), height))

    def get_address_nonce(self, params: Any, head: int) -> str:
        addr, ctx = params_list(params, ["address", "blockCtx"])
        address = parse_address(addr)
        height = self._ctx(ctx, head)
        return hex(self._told(self.nonce(address, height), height))

    def get_address_code(self, params: Any, head: int) -> str:
        addr, ctx = params_list(params, ["address", "blockCtx"])
        address = parse_address(addr)
        self._ctx(ctx, head)
        return "0x" + self.code(address).hex()

    def get_storage_at(self, params: Any, head: int) -> str:
        addr, pos, ctx = params_list(params, ["address", "position", "blockCtx"])
        address = parse_address(addr)
        slot = parse_quantity(pos, "position", lenient=True)
        return self._slot(address, slot, self._ctx(ctx, head))

    def get_latest_block(self, params: Any, head: int) -> dict[str, Any]:
        return self.vendor_block(head)

    def get_block_by_height(self, params: Any, head: int) -> dict[str, Any]:
        (height,) = params_list(params, ["height"])
        return self.vendor_block(self.chain.resolve(parse_block_id(height), head))

    def get_block_by_id(self, params: Any, head: int) -> dict[str, Any]:
        (value,) = params_list(params, ["id"])
        return self.vendor_block(self.chain.resolve(parse_block_id(value), head))

    def block_is_valid(self, params: Any, head: int) -> bool:
        (value,) = params_list(params, ["id"])
        ref = parse_block_id(value)
        if ref.hash is None:
            raise JsonRpcError(INVALID_PARAMS, "blockIsValid: expected a 32-byte block hash")
        height = self.chain.height_of(ref.hash)
        return height is not None and height <= head

    def blockx_range(self, params: Any, head: int) -> dict[str, int]:
        return {"earliest": self.chain.earliest(head), "latest": head}

    def blockx_get_validation(self, params: Any, head: int) -> list[dict[str, Any]]:
        """What a consistency checker compares (docs/checker.md), for the held heights of
        [from, from + count)."""
        start, count = params_list(params, ["fromHeight", "count"])
        if not isinstance(start, int) or not isinstance(count, int) or not 0 < count <= 1000:
            raise JsonRpcError(INVALID_PARAMS, "fromHeight and count (1..1000) must be integers")
        low = max(start, self.chain.earliest(head))
        return [
            {
                "height": h,
                "id": self.chain.hash_at(h),
                "parent_id": self.chain.hash_at(h - 1) if h else ZERO_HASH,
                "validation_hash": self.validation_hash(h),
            }
            for h in range(low, min(start + count, head + 1))
        ]

    def version(self, params: Any, head: int) -> dict[str, Any]:
        return {"version": VERSION, "kind": self.chain.settings.kind, "fake": True}


def _error(rid: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}


class FakeRpc:
    """Answers raw JSON-RPC bodies synchronously (no coroutine per request: it is cheaper)."""

    def __init__(self, settings: FakeNodeSettings) -> None:
        self.settings = settings
        self.chain = FakeChain(settings)
        self.methods = FakeMethods(self.chain, settings.chain_id)

    def answer_item(self, item: Any, head: int) -> dict[str, Any] | None:
        bad = check_request(item)
        if bad is not None:
            return _error(request_id(item), bad.code, bad.message)
        rid = item.get("id")
        handler = self.methods.table.get(item["method"])
        try:
            if handler is None:
                raise JsonRpcError(METHOD_NOT_FOUND, f"Method not found: {cut(item['method'])}")
            answer = {"jsonrpc": "2.0", "id": rid, "result": handler(item.get("params", []), head)}
        except JsonRpcError as exc:
            answer = _error(rid, exc.code, exc.message)
        except (ValueError, TypeError, OverflowError) as exc:
            answer = _error(rid, INVALID_PARAMS, f"invalid params: {exc}")
        return None if "id" not in item else answer

    def answer_body(self, body: bytes) -> bytes:
        """The response body for a request body; b"" when only notifications were sent."""
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            return orjson.dumps(_error(None, PARSE_ERROR, f"Parse error: {exc}"))
        head = self.chain.head()
        if isinstance(payload, list):
            if not payload:
                return orjson.dumps(_error(None, INVALID_REQUEST, "Invalid Request: empty batch"))
            if len(payload) > self.settings.max_batch:
                msg = f"batch too large: {len(payload)} items, at most {self.settings.max_batch}"
                return orjson.dumps(_error(None, INVALID_REQUEST, msg))
            out = [a for a in (self.answer_item(it, head) for it in payload) if a is not None]
            return orjson.dumps(out) if out else b""
        answer = self.answer_item(payload, head)
        return orjson.dumps(answer) if answer is not None else b""


@dataclass
class FakeNodeStats:
    """What the fake node has seen (tests compare it with what the load generator counted)."""

    requests: int = 0
    failed: int = 0  # answered with the injected failure status


class FakeNode:
    """The fake node's server: `await start()`, then `port`; `await stop()` to close."""

    def __init__(self, settings: FakeNodeSettings) -> None:
        self.settings = settings
        self.rpc = FakeRpc(settings)
        self.stats = FakeNodeStats()
        self.server: HttpServer | None = None

    @property
    def port(self) -> int:
        if self.server is None:
            raise RuntimeError("fake node not started")
        return self.server.port

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.port}"

    def route(self, method: bytes, path: bytes) -> Any:
        if method == b"POST":
            return self.answer if self.settings.latency_ms <= 0 else self.answer_later
        if method == b"GET":
            return self.status
        return self.not_allowed

    def answer(self, request: Request) -> Response:
        """HTTP status and body of one JSON-RPC POST."""
        self.stats.requests += 1
        every = self.settings.fail_every
        if every and self.stats.requests % every == 0:
            self.stats.failed += 1
            err = _error(None, INTERNAL_ERROR, "fake node: injected failure")
            return self.settings.fail_status, orjson.dumps(err)
        answer = self.rpc.answer_body(request.body)
        return (200, answer) if answer else (204, b"")

    async def answer_later(self, request: Request) -> Response:
        """`answer` after `latency_ms` (answers still go out in request order)."""
        await asyncio.sleep(self.settings.latency_ms / 1000.0)
        return self.answer(request)

    def start_lying(self) -> None:
        """Answer wrong state values and validation hashes from the next block on."""
        methods = self.rpc.methods
        if methods.lie_from is None:
            methods.lie_from = self.settings.lie_from = self.rpc.chain.head() + 1

    def status(self, request: Request) -> Response:
        head = self.rpc.chain.head()
        status = {
            "fake": True,
            "kind": self.settings.kind,
            "head": head,
            "earliest": self.rpc.chain.earliest(head),
            "requests": self.stats.requests,
            "lie_from": self.settings.lie_from,
            "wrong_answers": self.rpc.methods.wrong_answers,
        }
        return 200, orjson.dumps(status)

    @staticmethod
    def not_allowed(request: Request) -> Response:
        return 405, b'{"error":"use POST for JSON-RPC"}'

    async def start(self) -> None:
        limits = ServerLimits(
            max_body=self.settings.max_body,
            body_limit_name="max_body",
            shutdown_timeout=self.settings.stop_grace,
        )
        self.server = HttpServer(self.route, limits=limits, name="fake node")
        await self.server.start(self.settings.host, self.settings.port)

    async def stop(self) -> None:
        if self.server is None:
            return
        await self.server.close()
        self.server = None


async def serve_forever(settings: FakeNodeSettings, announce: Callable[[str], None]) -> None:
    """Run a fake node until SIGINT/SIGTERM (the `chainstate bench fake-node` command).
    SIGUSR1 makes it start lying from the next block (the fault suite's "wrong answers")."""
    from chainstate.runner import wait_for_stop

    node = FakeNode(settings)
    await node.start()
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, node.start_lying)
    try:
        announce(node.url)
        await wait_for_stop()
    finally:
        await node.stop()

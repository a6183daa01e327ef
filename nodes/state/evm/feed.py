"""The state feed: the node's StateReader served over loopback HTTP for pyrevm's fork mode.

pyrevm fetches state with eth_getTransactionCount / eth_getBalance / eth_getCode /
eth_getStorageAt at a block number, and eth_getBlockByNumber for BLOCKHASH. It blocks its
process while it waits, so it runs in worker processes and reads from this feed, which runs
in the node's event loop. The feed answers only at heights inside the reader's range
(-39006 otherwise), so a call never mixes states of two blocks.

eth_getBlockByNumber answers the header fields the reader knows; the roots and bloom that
ethers (inside pyrevm) insists on parsing but the EVM never reads are zero. The feed binds
127.0.0.1 on a free port and is internal: never expose it.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from chainstate.hexcodec import parse_address, parse_quantity, to_hash32
from chainstate.jsonrpc import (
    INVALID_PARAMS,
    Dispatcher,
    JsonRpcError,
    dumps,
    error_response,
    params_list,
    result_response,
)
from chainstate.rpcserver import rpc_handler
from nodes.state.reader import StateReader

log = logging.getLogger(__name__)

ZERO_HASH = "0x" + "00" * 32
EMPTY_BLOOM = "0x" + "00" * 256
_ACCOUNT_FIELDS = {
    "eth_getBalance": "balance",
    "eth_getTransactionCount": "nonce",
    "eth_getCode": "code",
}
EMPTY_UNCLES = "0x1dcc4de8dec75d7aab85b567b6ccd41ad312451b948a7413f0a142fd40d49347"


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


class StateFeed:
    """An aiohttp site on 127.0.0.1:<free port>; `url` is valid after `start()`."""

    def __init__(self, reader: StateReader, chain_id: int) -> None:
        self.reader = reader
        self.chain_id = chain_id
        self.dispatcher = Dispatcher("evm-feed", max_batch=10_000)
        self.dispatcher.update(
            {
                "eth_getBalance": self._balance,
                "eth_getTransactionCount": self._nonce,
                "eth_getCode": self._code,
                "eth_getStorageAt": self._storage,
                "eth_getBlockByNumber": self._block,
                "eth_blockNumber": self._block_number,
                "eth_chainId": self._chain_id,
            }
        )
        self._runner: web.AppRunner | None = None
        self._overlays: dict[str, Overlay] = {}
        self.url: str | None = None

    @contextlib.contextmanager
    def overlay(self, overlay: Overlay) -> Iterator[str]:
        """A state URL serving `overlay` over the block's state, valid inside the block."""
        assert self.url is not None, "start() the feed first"
        token = secrets.token_hex(12)
        self._overlays[token] = overlay
        try:
            yield f"{self.url}/o/{token}"
        finally:
            del self._overlays[token]

    async def _overlay_handler(self, request: web.Request) -> web.Response:
        overlay = self._overlays.get(request.match_info["token"])
        body = await request.read()
        if overlay is None:
            return web.Response(status=404, text="no such overlay")
        try:
            item = orjson.loads(body)
            answer = self._from_overlay(overlay, item) if isinstance(item, dict) else None
        except JsonRpcError as exc:
            answer = error_response(item.get("id"), exc.code, exc.message)
        except orjson.JSONDecodeError:
            answer = None
        out = dumps(answer) if answer is not None else await self.dispatcher.handle_body(body)
        return web.Response(body=out, content_type="application/json")

    def _from_overlay(self, overlay: Overlay, item: dict[str, Any]) -> dict[str, Any] | None:
        """The overlay's answer to one request, or None to read the block's state."""
        method, params, rid = item.get("method"), item.get("params") or [], item.get("id")
        if method == "eth_getStorageAt" and len(params) == 3:
            address = parse_address(params[0])
            slot = parse_quantity(params[1], "slot", lenient=True)
            self._height(params[2])
            slots = overlay.storage.get(address, {})
            if slot in slots or address in overlay.replaced:
                return result_response(rid, to_hash32(slots.get(slot, 0)))
            return None
        if method in _ACCOUNT_FIELDS and len(params) == 2:
            address = parse_address(params[0])
            self._height(params[1])
            value = overlay.accounts.get(address, {}).get(_ACCOUNT_FIELDS[method])
            if value is None:
                return None
            shown = "0x" + value.hex() if isinstance(value, bytes) else hex(value)
            return result_response(rid, shown)
        return None

    async def start(self) -> str:
        if self.url is not None:
            return self.url
        app = web.Application(client_max_size=1024 * 1024)
        app.router.add_post("/", rpc_handler(self.dispatcher.handle_body))
        app.router.add_post("/o/{token}", self._overlay_handler)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        site = web.SockSite(self._runner, sock)
        await site.start()
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        log.info("evm state feed started", extra={"url": self.url})
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        self._runner = None
        self.url = None

    def _height(self, value: Any) -> int:
        lo, hi = self.reader.range()
        if value in ("latest", "pending", "safe", "finalized"):
            return hi
        height = parse_quantity(value, "block number")
        if not lo <= height <= hi:
            raise JsonRpcError(-39006, f"block {height} is out of this node's range {lo}..{hi}")
        return height

    async def _balance(self, params: Any) -> str:
        addr, block = params_list(params, ["address", "block"])
        return hex(self.reader.balance(parse_address(addr), self._height(block)))

    async def _nonce(self, params: Any) -> str:
        addr, block = params_list(params, ["address", "block"])
        return hex(self.reader.nonce(parse_address(addr), self._height(block)))

    async def _code(self, params: Any) -> str:
        addr, block = params_list(params, ["address", "block"])
        return "0x" + self.reader.code(parse_address(addr), self._height(block)).hex()

    async def _storage(self, params: Any) -> str:
        addr, slot, block = params_list(params, ["address", "slot", "block"])
        position = parse_quantity(slot, "slot", lenient=True)
        return to_hash32(self.reader.storage(parse_address(addr), position, self._height(block)))

    async def _block_number(self, params: Any) -> str:
        return hex(self.reader.range()[1])

    async def _chain_id(self, params: Any) -> str:
        return hex(self.chain_id)

    async def _block(self, params: Any) -> dict[str, Any] | None:
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

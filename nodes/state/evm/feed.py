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

import logging
import socket
from typing import Any

from aiohttp import web

from chainstate.hexcodec import parse_address, parse_quantity, to_hash32
from chainstate.jsonrpc import INVALID_PARAMS, Dispatcher, JsonRpcError, params_list
from chainstate.rpcserver import rpc_handler
from nodes.state.reader import StateReader

log = logging.getLogger(__name__)

ZERO_HASH = "0x" + "00" * 32
EMPTY_BLOOM = "0x" + "00" * 256
EMPTY_UNCLES = "0x1dcc4de8dec75d7aab85b567b6ccd41ad312451b948a7413f0a142fd40d49347"


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
        self.url: str | None = None

    async def start(self) -> str:
        if self.url is not None:
            return self.url
        app = web.Application(client_max_size=1024 * 1024)
        app.router.add_post("/", rpc_handler(self.dispatcher.handle_body))
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

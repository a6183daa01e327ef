"""The write node: follows an execution client and serves `trace_vendorBlock`.

It is also the chain's door to its execution client: the transaction lifecycle (send, fees,
gas estimate, receipt and transaction lookup, accounts) and state reads at the `pending`
block are passed through unchanged (docs/write-node.md), since only the execution client
knows the mempool. The proxy sends them to the pool's Leader write node.

Lifecycle: `start()` opens the store, registers the JSON-RPC handler in the in-process
registry (`inproc://<key>`) and starts following; `close()` undoes it. `make_app()` gives the
same JSON-RPC on HTTP `POST /`, plus `GET /health` and `GET /metrics`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from chainstate.blockref import TAGS, parse_block_id
from chainstate.inproc import InprocRegistry
from chainstate.jsonrpc import (
    BLOCK_NOT_FOUND,
    INTERNAL_ERROR,
    INVALID_BLOCK_ID,
    INVALID_PARAMS,
    Dispatcher,
    Handler,
    JsonRpcError,
    params_list,
)
from chainstate.rpcclient import RpcUnavailable
from chainstate.rpcserver import rpc_handler
from chainstate.txmethods import PENDING_READS, TX_LIFECYCLE
from nodes.devnet.rpc import EthClient
from nodes.writer import blockdiff as bd
from nodes.writer.follower import ChainFollower
from nodes.writer.settings import WriterSettings
from nodes.writer.store import BlockStore

log = logging.getLogger(__name__)

STORE_FILE = "writer.sqlite3"

# More of the execution client's own methods, passed to it unchanged as the transaction
# lifecycle is: signing, the transaction pool, raw encodings, what needs a state trie, and
# the block reads the proxy sends here at `pending` (docs/proxy.md "Method table").
PASS_THROUGH: dict[str, tuple[str, ...]] = {
    "eth_sign": ("address", "message"),
    "eth_signTransaction": ("transaction",),
    "eth_signTypedData_v4": ("address", "typedData"),
    "eth_fillTransaction": ("transaction",),
    "eth_coinbase": (),
    "eth_protocolVersion": (),
    "eth_config": (),
    "net_peerCount": (),
    "txpool_status": (),
    "txpool_content": (),
    "txpool_inspect": (),
    "txpool_contentFrom": ("address",),
    "debug_getRawTransaction": ("transactionHash",),
    "debug_getRawHeader": ("blockNumber",),
    "debug_getRawBlock": ("blockNumber",),
    "debug_getRawReceipts": ("blockNumber",),
    "debug_getBadBlocks": (),
    "eth_getProof": ("address", "storageKeys", "blockNumber"),
    "eth_getStorageValues": ("requests", "blockNumber"),
    "eth_getBlockTransactionCountByNumber": ("blockNumber",),
    "eth_getTransactionByBlockNumberAndIndex": ("blockNumber", "index"),
    "eth_getBlockReceipts": ("blockNumber",),
    "eth_getUncleCountByBlockNumber": ("blockNumber",),
    "eth_getUncleByBlockNumberAndIndex": ("blockNumber", "index"),
    "eth_createAccessList": ("transaction", "blockNumber"),
    "eth_simulateV1": ("payload", "blockNumber"),
    "debug_traceCall": ("request", "blockNumber", "options"),
    # A pending-transaction filter lives in the execution client (the proxy keeps the id it
    # hands its client and polls this one): only the mempool knows pending transactions.
    "eth_newPendingTransactionFilter": (),
    "eth_getFilterChanges": ("id",),
    "eth_uninstallFilter": ("id",),
}


class WriterNode:
    """One write node; see docs/write-node.md."""

    def __init__(
        self,
        settings: WriterSettings,
        *,
        data_dir: Path,
        registry: InprocRegistry | None = None,
    ) -> None:
        self.settings = settings
        self.data_dir = data_dir
        self.registry = registry
        self.dispatcher = Dispatcher(name=f"writer {settings.key}")
        self.dispatcher.update(
            {
                "trace_vendorBlock": self.rpc_trace_vendor_block,
                "eth_blockNumber": self.rpc_block_number,
                "eth_chainId": self.rpc_chain_id,
                "writer_health": self.rpc_writer_health,
            }
        )
        for method, names in {**TX_LIFECYCLE, **PASS_THROUGH}.items():
            self.dispatcher.register(method, self._pass_through(method, names))
        for method, names in PENDING_READS.items():
            self.dispatcher.register(method, self._pending_read(method, names))
        self.store: BlockStore | None = None
        self.client: EthClient | None = None
        self.follower: ChainFollower | None = None
        self._task: asyncio.Task[None] | None = None
        self._paused = False
        self.metrics = CollectorRegistry(auto_describe=True)
        self._requests = Counter(
            "chainstate_writer_requests",
            "JSON-RPC requests answered by the write node, by method",
            ["method"],
            registry=self.metrics,
        )
        self._up = Gauge("chainstate_writer_up", "1 while following", registry=self.metrics)
        self.metrics.register(_FollowerCollector(self))

    @classmethod
    def from_config(
        cls, section: dict, *, data_dir: Path, registry: InprocRegistry | None = None
    ) -> WriterNode:
        return cls(WriterSettings.from_section(section), data_dir=data_dir, registry=registry)

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        alloc = bd.parse_alloc(json.loads(self.settings.genesis.read_text()))
        self.store = await asyncio.to_thread(BlockStore, self.data_dir / STORE_FILE)
        self.client = EthClient(self.settings.execution_url, timeout=self.settings.request_timeout)
        self.follower = ChainFollower(self.client, self.store, self.settings, alloc)
        if self.store.head() is None:
            # Emit block 0 before returning when the client answers at once, so nodes
            # started next in the same process find a chain to ingest.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.follower.prime(), self.settings.request_timeout)
        self._task = asyncio.create_task(self.follower.run(), name=f"follow {self.settings.key}")
        self._up.set(1)
        if self.registry is not None:
            self.registry.register(self.settings.key, self.handle_body)

    async def pause(self) -> None:
        """Stop following until `resume`, with no write to the store in flight: the devnet
        restores its execution client from the write nodes' stores meanwhile."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            self._paused = True
            self._up.set(0)
        if self.store is not None:
            await asyncio.to_thread(self.store.wait_idle)

    def resume(self) -> None:
        """Follow again after `pause`; the first poll says where the stored head stands."""
        if not self._paused or self.follower is None:
            return
        self._paused = False
        self.follower.announce()
        self._task = asyncio.create_task(self.follower.run(), name=f"follow {self.settings.key}")
        self._up.set(1)

    async def close(self) -> None:
        if self.registry is not None:
            self.registry.unregister(self.settings.key)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._up.set(0)
        if self.client is not None:
            await self.client.close()
            self.client = None
        if self.store is not None:
            self.store.close()
            self.store = None

    @property
    def head(self) -> int | None:
        """Height of the latest emitted block, None before block 0 is emitted."""
        stored = self.store.head() if self.store else None
        return stored.number if stored else None

    async def wait_for_head(self, height: int, within: float = 30.0) -> None:
        """Wait until block `height` is emitted (tests and start-up ordering use this)."""
        async with asyncio.timeout(within):
            while self.head is None or self.head < height:
                assert self.follower is not None
                if self.follower.stats.fatal:
                    raise RuntimeError(self.follower.stats.last_error)
                self.follower.head_changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.follower.head_changed.wait(), 0.5)

    # -- JSON-RPC ----------------------------------------------------------------------

    async def handle_body(self, body: bytes) -> bytes:
        return await self.dispatcher.handle_body(body)

    def block_output(self, block_id: Any) -> bytes:
        """The stored canonical JSON of one block; raises -39007 / -39006."""
        if self.store is None:
            raise JsonRpcError(BLOCK_NOT_FOUND, "write node is not started")
        if block_id is None:
            raise JsonRpcError(INVALID_BLOCK_ID, "missing block id: a hex number, hash or tag")
        if not isinstance(block_id, str) or not (block_id.startswith("0x") or block_id in TAGS):
            shown = repr(block_id)[:80]
            raise JsonRpcError(
                INVALID_BLOCK_ID, f"invalid block id {shown}: a hex number, hash or tag"
            )
        ref = parse_block_id(block_id)
        head = self.head
        if ref.hash is not None:
            output = self.store.output_by_hash(ref.hash)
            if output is None:
                raise JsonRpcError(BLOCK_NOT_FOUND, f"block {ref.hash} is not known")
            return output
        if ref.tag == "earliest":
            number = 0
        elif ref.tag is not None:
            if head is None:
                raise JsonRpcError(BLOCK_NOT_FOUND, "no block emitted yet")
            number = head
        else:
            number = ref.number if ref.number is not None else 0
        output = self.store.output_by_number(number)
        if output is None:
            raise JsonRpcError(BLOCK_NOT_FOUND, f"block {number} is not emitted yet (head: {head})")
        return output

    async def rpc_trace_vendor_block(self, params: Any) -> Any:
        self._requests.labels("trace_vendorBlock").inc()
        (block_id,) = params_list(params, ["block"])
        # Stored bytes are already canonical JSON: embed them without decoding.
        return orjson.Fragment(self.block_output(block_id))

    async def rpc_block_number(self, params: Any) -> str:
        self._requests.labels("eth_blockNumber").inc()
        params_list(params, [])
        head = self.head
        if head is None:
            raise JsonRpcError(BLOCK_NOT_FOUND, "no block emitted yet")
        return hex(head)

    async def rpc_chain_id(self, params: Any) -> str:
        self._requests.labels("eth_chainId").inc()
        params_list(params, [])
        chain_id = self.follower.chain_id if self.follower else None
        if chain_id is None and self.store is not None:
            stored = self.store.get_meta("chain_id")
            chain_id = int(stored) if stored else None
        if chain_id is None:
            return await self._forward("eth_chainId", [])
        return hex(chain_id)

    def _pass_through(self, method: str, names: tuple[str, ...]) -> Handler:
        """A handler forwarding `method` to the execution client unchanged."""

        async def handler(params: Any) -> Any:
            self._requests.labels(method).inc()
            return await self._forward(method, _positional(params, names))

        return handler

    def _pending_read(self, method: str, names: tuple[str, ...]) -> Handler:
        """A handler forwarding a state read at `pending`; other blocks are refused."""
        at = names.index("blockNumber")

        async def handler(params: Any) -> Any:
            self._requests.labels(method).inc()
            values = _positional(params, names)
            block = values[at] if at < len(values) else None
            if block != "pending":
                msg = (
                    f"{method}: the write node answers state reads only at the pending block "
                    f"(got {block!r:.80}); ask a state node or the proxy for other blocks"
                )
                raise JsonRpcError(INVALID_PARAMS, msg)
            return await self._forward(method, values)

        return handler

    async def _forward(self, method: str, params: Any) -> Any:
        if self.client is None:
            raise JsonRpcError(INTERNAL_ERROR, "write node is not started")
        try:
            return await self.client.call(method, params)
        except RpcUnavailable as exc:
            raise JsonRpcError(INTERNAL_ERROR, f"execution client unavailable: {exc}") from None

    # -- HTTP --------------------------------------------------------------------------

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/", rpc_handler(self.handle_body))
        app.router.add_get("/health", self.http_health)
        app.router.add_get("/metrics", self.http_metrics)
        return app

    def health(self) -> dict[str, Any]:
        """The node's health as `/health`, `writer_health` and the proxy's writers list show
        it: healthy unless following stopped, stalled on failures, or fell `stall_blocks`
        behind its client without storing a block; `last_error` says why."""
        head = self.head
        following = self._task is not None and not self._task.done()
        if self.follower is None:
            healthy, reason, lag, state, client_head = False, "not started", None, "stopped", None
        else:
            verdict = self.follower.verdict(head)
            stats = self.follower.stats
            healthy, reason, lag = verdict.healthy and following, verdict.reason, verdict.lag
            state = stats.state if following else "paused" if self._paused else "stopped"
            if self._paused:
                reason = "paused while the devnet's execution client is restored"
            client_head = stats.execution_head
        return {
            "status": "ok" if healthy else "error",
            "healthy": healthy,
            "state": state,
            "key": self.settings.key,
            "head": head,
            "execution_url": self.settings.execution_url,
            "execution_head": client_head,
            "lag": lag,
            "stall_blocks": self.settings.stall_blocks,
            "last_error": reason,
        }

    async def rpc_writer_health(self, params: Any) -> dict[str, Any]:
        self._requests.labels("writer_health").inc()
        params_list(params, [])
        return self.health()

    async def http_health(self, request: web.Request) -> web.Response:
        doc = self.health()
        return web.json_response(doc, status=200 if doc["status"] == "ok" else 503)

    async def http_metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics), content_type="text/plain")


def _positional(params: Any, names: tuple[str, ...]) -> list[Any]:
    """Params as the list execution clients take (object params mapped through `names`)."""
    if params is None:
        return []
    values = params_list(params, list(names))
    while values and values[-1] is None:
        values.pop()
    return values


class _FollowerCollector:
    """Exposes the follower's counters at scrape time (no duplicated bookkeeping)."""

    def __init__(self, node: WriterNode) -> None:
        self.node = node

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        follower = self.node.follower
        stats = follower.stats if follower else None
        head = self.node.head
        verdict = follower.verdict(head) if follower else None
        values = {
            "chainstate_writer_head": head,
            "chainstate_writer_execution_head": stats and stats.execution_head,
            "chainstate_writer_lag_blocks": verdict and verdict.lag,
            "chainstate_writer_healthy": self.node.health()["healthy"],
            "chainstate_writer_failed_attempts": stats and stats.failures,
            "chainstate_writer_blocks_built": stats and stats.blocks_built,
            "chainstate_writer_trace_calls": stats and stats.traces,
            "chainstate_writer_reorgs": stats and stats.reorgs,
            "chainstate_writer_rewound_blocks": stats and stats.rewound_blocks,
            "chainstate_writer_errors": stats and stats.errors,
            "chainstate_writer_last_build_seconds": stats and stats.last_build_seconds,
        }
        for name, value in values.items():
            family = GaugeMetricFamily(name, name.replace("chainstate_writer_", "write node: "))
            if value is not None:
                family.add_metric([], float(value))
            yield family

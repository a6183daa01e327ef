"""The state node as a component: store + ingest + JSON-RPC methods + health + metrics."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import logging
import time
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from chainstate.config import ConfigError
from chainstate.inproc import (
    AnswerChecked,
    AnswerItems,
    AnswerKeyed,
    InprocRegistry,
    ItemsAnswered,
)
from chainstate.jsonrpc import Dispatcher, JsonRpcError, dumps, params_list
from chainstate.rpcserver import rpc_handler
from nodes.state.backfill import BodyBackfill
from nodes.state.blocks import BlockMethods
from nodes.state.hot import HotState
from nodes.state.ingest import Ingest
from nodes.state.leader import LeaderWatch
from nodes.state.logs import LogService
from nodes.state.logs import register as register_logs
from nodes.state.methods import StateMethods
from nodes.state.metrics import StateMetrics
from nodes.state.reader import StateReader
from nodes.state.reads import ReadPath
from nodes.state.settings import StateSettings
from nodes.state.store import StateStore, StoreError

log = logging.getLogger(__name__)

EVM_METHODS_MODULE = "nodes.state.evm.methods"
STORE_DIR = "lmdb"


def _evm_module_available() -> bool:
    try:
        return importlib.util.find_spec(EVM_METHODS_MODULE) is not None
    except ModuleNotFoundError:
        return False


class StateNode:
    """One state or archive node.

    `start()` opens the store, registers the read methods (and the EVM methods when
    `nodes/state/evm/methods.py` is present), starts ingest and registers `handle_body` in
    the in-process registry under `key`. Whoever serves `make_app()` over HTTP sets
    `http_url`.
    """

    def __init__(
        self,
        settings: StateSettings,
        *,
        data_dir: Path,
        registry: InprocRegistry | None = None,
    ) -> None:
        self.settings = settings
        self.key = settings.key
        self.kind = settings.kind
        self.data_dir = Path(data_dir)
        self.registry = registry
        self.http_url: str | None = None
        self.metrics = StateMetrics(settings.key)
        self.store = StateStore(
            self.data_dir / STORE_DIR,
            kind=settings.kind,
            window=settings.window,
            map_size_mb=settings.map_size_mb,
        )
        self.reader: StateReader = self.store
        self.dispatcher = Dispatcher(f"state:{settings.key}", max_batch=settings.max_batch)
        self.methods = StateMethods(
            self.store,
            key=settings.key,
            kind=settings.kind,
            window=settings.window,
            chain_id=self.chain_id,
            max_validation_count=settings.max_validation_count,
            blob_fee_update_fraction=settings.blob_fee_update_fraction,
        )
        self.blocks = BlockMethods(self.store, self.methods.resolve)
        self.hot = HotState(settings.hot_blocks, settings.hot_cache_entries)
        self.reads = ReadPath(
            self.store, self.hot, self.methods, self.dispatcher, max_batch=settings.max_batch
        )
        self.ingest = Ingest(self.store, settings, self.metrics, registry=registry, hot=self.hot)
        self.methods.source_head = lambda: self.ingest.source_head  # for eth_syncing
        # The proxy in this process calls these per body: bound straight to what does
        # the work (a wrapper method was one more Python call per body, ~0.1-0.3 µs).
        # answer_items(items): the answers of parsed request objects when every one is a
        # plain state read (else None), for the proxy, which parsed and routed them. Not
        # counted there: the proxy calls items_answered([seconds, …]) when it keeps the
        # answers (it may send the body again the usual way instead, which counts it then),
        # for several calls at once when it folds its books in (proxy/inprocbooks.py).
        self.answer_items: AnswerItems = self.reads.answer_items
        # answer_checked(method, items): answer_items for items the proxy checked already
        # (one method, request objects with int or string ids): not counted there either
        self.answer_checked: AnswerChecked = self.reads.answer_checked
        # answer_keyed(method, size, keys, items, errors, found): answer_checked for items the
        # node checks itself, with each item's route (`keys[its last param]`) for the proxy
        self.answer_keyed: AnswerKeyed = self.reads.answer_keyed
        self.items_answered: ItemsAnswered = self.metrics.request_seconds.observe_all
        self._task: asyncio.Task[None] | None = None
        self.leader: LeaderWatch | None = None
        if settings.leader_from:
            self.leader = LeaderWatch(
                settings.leader_from,
                self.ingest,
                interval=settings.leader_poll_interval,
                timeout=settings.request_timeout,
                token_env=settings.leader_token_env,
            )
        self._leader_task: asyncio.Task[None] | None = None
        self._started = False
        self.evm: Any = None  # set by nodes.state.evm.methods.register when present
        self.logs: LogService | None = None  # eth_getLogs and its index, set at start
        self.body_backfill = BodyBackfill(self)  # for a store from before bodies were kept
        self._backfill_task: asyncio.Task[None] | None = None
        self.evm_settings: Any = None

    @classmethod
    def from_config(
        cls, section: dict[str, Any], *, data_dir: Path, registry: InprocRegistry | None = None
    ) -> StateNode:
        return cls(StateSettings.from_section(section), data_dir=data_dir, registry=registry)

    def chain_id(self) -> int | None:
        """From the config, else as learned from the source (kept in the store)."""
        if self.settings.chain_id is not None:
            return self.settings.chain_id
        return self.store.chain_id() if self._started else None

    def resolve(self, ref: Any) -> int:
        """Height to answer a `BlockRef` at (raises -39006/-39007); for the EVM methods."""
        return self.methods.resolve(ref)

    async def start(self) -> None:
        try:
            await asyncio.to_thread(self.store.open)
        except StoreError as exc:  # e.g. a pruned store configured as an archive
            raise ConfigError(f"state node {self.key}: {exc}") from None
        self._started = True
        stored = self.store.chain_id()
        wanted = self.settings.chain_id
        if wanted is not None and stored is not None and stored != wanted:
            self.store.close()
            self._started = False
            raise ConfigError(
                f"state node {self.key}: {self.data_dir} holds chain {stored}, "
                f"configured for chain {wanted}"
            )
        if wanted is not None and stored is None:
            await asyncio.to_thread(self.store.set_chain_id, wanted)
        self.dispatcher.update(self.methods.handlers())
        self.dispatcher.update(self.reads.handlers())
        self.dispatcher.update(self.blocks.handlers())
        self.dispatcher.update({"blockx_health": self._rpc_health})
        bounds = self.store.bounds()
        self.methods.starting_block = 0 if bounds is None else bounds[1]
        if _evm_module_available():
            from nodes.state.evm.settings import EvmSettings

            self.evm_settings = EvmSettings.from_config(self.settings.evm)
            importlib.import_module(EVM_METHODS_MODULE).register(self)
            self.reads.evm = self.evm  # eth_calls of a batch queued at once
        self.logs = register_logs(self)
        if self.body_backfill.needed():
            self._backfill_task = asyncio.create_task(
                self.body_backfill.run(), name=f"body-backfill:{self.key}"
            )
        self.ingest.publish_metrics()
        await self.ingest.fill_hot()
        self._task = asyncio.create_task(self.ingest.run(), name=f"state-ingest:{self.key}")
        if self.leader is not None:
            self._leader_task = asyncio.create_task(
                self.leader.run(), name=f"state-leader:{self.key}"
            )
        if self.registry is not None:
            self.register_in(self.registry)

    def register_in(self, registry: InprocRegistry) -> str:
        """Enter this node in `registry` with every fast path it has (as `chainstate up`
        does); returns its `inproc://` URL."""
        return registry.register(
            self.key,
            self.handle_body,
            self.answer_now,
            self.answer_items,
            self.items_answered,
            self.answer_later,
            self.answer_checked,
            self.answer_keyed,
        )

    async def close(self) -> None:
        if self.registry is not None:
            self.registry.unregister(self.key)
        for task in (self._leader_task, self._task, self._backfill_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._leader_task = self._backfill_task = None
        await self.body_backfill.close()
        if self.logs is not None:
            self.reads.add_port_read("eth_getLogs", None)
            await self.logs.close()
            self.logs = None
        await self.ingest.close()
        evm = getattr(self, "evm", None)
        self.reads.evm = None
        if evm is not None:
            await evm.close()
            self.evm = None
        await asyncio.to_thread(self.store.close)
        self._started = False

    def set_source(self, url: str) -> None:
        """Follow another write node (the write pipeline switched Leaders)."""
        self.ingest.set_source(url)

    async def handle_body(self, body: bytes) -> bytes:
        started = time.perf_counter()
        try:
            return await self.reads.handle_body(body)
        finally:
            self.metrics.request_seconds.observe(time.perf_counter() - started)

    def answer_now(self, body: bytes) -> bytes | None:
        """`handle_body`'s answer when it needs no await (every item a plain state read),
        else None: a server may call this first and write the answer at once."""
        started = time.perf_counter()
        answer = self.reads.answer_now(body)
        if answer is not None:
            self.metrics.request_seconds.observe(time.perf_counter() - started)
        return answer

    def answer_port(self, body: bytes) -> bytes | asyncio.Future[bytes] | None:
        """For the node's own port: `answer_now`'s answer, or the future of it when the body
        holds eth_calls (the server writes it from the future's callback), else None."""
        started = time.perf_counter()
        observe = self.metrics.request_seconds.observe
        answer = self.reads.answer_port(body, lambda: observe(time.perf_counter() - started))
        if answer.__class__ is bytes:
            observe(time.perf_counter() - started)
        return answer

    def answer_later(self, items: list[Any]) -> asyncio.Future[list[Any]] | None:
        """The answers of parsed request objects that are plain reads or eth_calls, as a
        future (else None): for the proxy in the same process, which sends the answers on
        from the future's callback instead of a body through `handle_body`. Counted here,
        once the answers are there."""
        started = time.perf_counter()
        answers = self.reads.answer_later(items)
        if answers is not None:
            observe = self.metrics.request_seconds.observe
            answers.add_done_callback(lambda _: observe(time.perf_counter() - started))
        return answers

    # HTTP ------------------------------------------------------------------------------

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_post("/", rpc_handler(self.handle_body))
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        return app

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Healthy = the store answers, holds at least one block, and ingest is not stalled
        (`stall_failures` failed rounds in a row: the node no longer follows its source)."""
        try:
            bounds = self.store.bounds()
        except JsonRpcError as exc:
            return False, {"status": "error", "error": exc.message}
        stalled = self.ingest.stalled
        doc = {
            "status": "stalled" if stalled else "ok" if bounds else "syncing",
            "key": self.key,
            "kind": self.kind,
            "earliest": bounds[0] if bounds else None,
            "head": bounds[1] if bounds else None,
            "source": self.ingest.source,
            "source_head": self.ingest.source_head,
            "last_error": self.ingest.last_error,
        }
        if stalled:
            doc["reason"] = stalled
        if self.leader is not None:
            doc["leader_error"] = self.leader.last_error
        return bounds is not None and not stalled, doc

    async def _rpc_health(self, params: Any) -> dict[str, Any]:
        """`/health`'s document over JSON-RPC: the proxy's head poll asks for it, and takes
        a node that says "stalled" out of rotation."""
        params_list(params, [])
        return self.health()[1]

    async def _health(self, request: web.Request) -> web.Response:
        ok, doc = self.health()
        return web.Response(
            status=200 if ok else 503, body=dumps(doc), content_type="application/json"
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

"""The state node's EVM methods: eth_call, eth_multiCall, contractMultiCall,
simulateTransactions, estimateGas, pre_traceCall, pre_traceMany, blockx_stateReadBatch.

`register(node)` is the integration point: the state node calls it at start. Execution runs
on worker processes that read the node's state at the requested block through the state feed
(the node's StateReader over loopback HTTP). Return shapes are in docs/evm.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

from chainstate.blockref import BlockRef, parse_block_ctx, parse_block_id, parse_block_number_param
from chainstate.hexcodec import parse_data
from chainstate.jsonrpc import (
    BLOCK_NOT_FOUND,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    NONCE_ERROR,
    SERVER_BUSY,
    JsonRpcError,
    params_list,
)
from nodes.state.evm import bsrb
from nodes.state.evm.codec import (
    apply_block_overrides,
    block_env,
    check_chain_id,
    effective_price,
    parse_call,
    parse_calls,
    parse_flag,
    parse_state_override,
)
from nodes.state.evm.executor import Executor
from nodes.state.evm.feed import Overlay, StateFeed
from nodes.state.evm.feedproc import FeedProcess
from nodes.state.evm.settings import EvmSettings
from nodes.state.evm.traces import TraceMethods
from nodes.state.reader import StateReader
from nodes.state.store import StateStore

log = logging.getLogger(__name__)

# Block envs kept (by height) and block parameters kept: the oldest entry goes when full
# (not all of them: at random heights of a chain longer than the cache, clearing it made
# four calls in five read their block's header again, ~7 µs each, and send its env anew).
ENV_CACHE = 16_384
BLOCK_REFS = 16_384
CALL_CACHE = 4096  # parsed call objects kept
CALL_CACHE_DATA = 2048  # calldata (hex characters) up to which a parsed call is kept
LAZY_DATA_CHARS = 64 * 1024  # longer calldata is decoded by the worker (`EvmMethods._lazy`)


def nonce_error(message: str) -> dict[str, Any]:
    return {"code": NONCE_ERROR, "message": message}


def resolve_height(reader: StateReader, ref: BlockRef) -> int:
    """The height a BlockRef names on this node; -39006 when outside the node's range."""
    lo, hi = reader.range()
    if ref.tag is not None:
        height = 0 if ref.tag == "earliest" else hi
    elif ref.hash is not None:
        found = reader.height_of(ref.hash)
        if found is None:
            raise JsonRpcError(BLOCK_NOT_FOUND, f"block {ref.hash} is not known to this node")
        height = found
    else:
        assert ref.number is not None
        height = ref.number
        if ref.contains and lo <= height <= hi:
            height = hi  # any block containing that state: the head does
    if not lo <= height <= hi:
        raise JsonRpcError(
            BLOCK_NOT_FOUND, f"block {height} is outside this node's range {lo}..{hi}"
        )
    return height


def _lazy_text(obj: Any) -> str | None:
    """The calldata of a call object when it is long and given once (`EvmMethods._lazy`)."""
    if obj.__class__ is not dict:
        return None
    data, given = obj.get("data"), obj.get("input")
    text = given if data is None else data if given is None else None
    if text.__class__ is str and len(text) > LAZY_DATA_CHARS and text.startswith("0x"):
        return text
    return None


class EvmMethods:
    """Handlers of the EVM methods for one node; the feed and the workers start in the
    background (`start_soon`) or on first use, whichever comes first."""

    def __init__(
        self,
        reader: StateReader,
        settings: EvmSettings,
        *,
        resolver: Callable[[BlockRef], int] | None = None,
        chain_id: Callable[[], int | None] | None = None,
    ) -> None:
        self.reader = reader
        self.settings = settings
        self.executor = Executor(settings)
        self.feed = StateFeed(reader, settings.chain_id)
        # Workers read what a new EVM is given straight from the store (read-only) when the
        # node's reader is one: [path, map size in MB].
        self._store: list[Any] | None = None
        if settings.feed == "process" and isinstance(reader, StateStore):
            mb = reader.map_size // (1024 * 1024)
            self.feed.process = FeedProcess(
                reader.path, mb, settings.chain_id, on_exit=reader.free_stale_readers
            )
            self._store = [str(reader.path), mb]
            self.executor.pool.on_replace = reader.free_stale_readers
        self._resolver = resolver or (lambda ref: resolve_height(reader, ref))
        self._chain_id = chain_id
        self._envs: dict[int, tuple[int, dict[str, Any]]] = {}
        self._calls: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._refs: dict[str, BlockRef] = {}
        self._known_chain_id: int | None = None
        self._start_lock = asyncio.Lock()
        self._started = False
        self._closed = False
        self._starting: asyncio.Task[None] | None = None

    def handlers(self) -> dict[str, Callable[[Any], Any]]:
        return {
            **TraceMethods(self).handlers(),
            "eth_call": self.eth_call,
            "eth_multiCall": self.eth_multi_call,
            "contractMultiCall": self.contract_multi_call,
            "simulateTransactions": self.simulate_transactions,
            "estimateGas": self.estimate_gas,
            "pre_traceCall": self.pre_trace_call,
            "pre_traceMany": self.pre_trace_many,
            "blockx_stateReadBatch": self.state_read_batch,
            "eth_simulateV1": self.eth_simulate_v1,
        }

    async def start(self) -> None:
        async with self._start_lock:
            if self._started or self._closed:
                return
            await self.feed.start()
            await self.executor.start()
            self._started = True

    def start_soon(self) -> None:
        """Start the feed and the workers in the background: a worker takes a second or two
        to spawn and import its EVMs, which a node's first EVM request would otherwise wait
        for (once per worker), while plain reads need none of it."""
        if self._starting is None and not self._started and not self._closed:
            self._starting = asyncio.get_running_loop().create_task(self._start_in_background())

    async def _start_in_background(self) -> None:
        try:
            await self.start()
        except Exception as exc:  # the first EVM request tries again and answers the error
            log.error("evm workers did not start: %s", exc)

    async def close(self) -> None:
        """Stop for good: later EVM requests answer -32005 instead of starting workers."""
        self._closed = True
        if self._starting is not None:  # (workers it is spawning are stopped below)
            await self._starting
        await self.executor.close()
        await self.feed.close()
        self._started = False

    # -- helpers (also for traces.py) -----------------------------------------------

    async def ready(self) -> None:
        """Start the feed and the workers when they are not yet; -32005 once closed."""
        if self._closed:
            raise JsonRpcError(SERVER_BUSY, "the node is shutting down")
        if not self._started:
            await self.start()

    def resolve(self, ref: BlockRef) -> int:
        """The height a block reference names here (-39006 outside the node's range)."""
        return self._resolver(ref)

    def block_env(self, height: int) -> dict[str, Any]:
        return self._block_env(height)

    def build_job(
        self, kind: str, height: int, env: dict[str, Any], calls: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """A worker job reading the state at `height` with the block env `env`."""
        return self._build(kind, height, env, calls)

    async def prepare(
        self, kind: str, ref: BlockRef, request: Any, *, block_overrides: Any = None
    ) -> dict[str, Any]:
        """The job of one call object at a block (validated, gas limited)."""
        return await self._job(kind, ref, request, single=True, block_overrides=block_overrides)

    def overlaid(
        self, job: dict[str, Any], overlay: Overlay | None
    ) -> contextlib.AbstractContextManager[dict[str, Any]]:
        return self._overlaid(job, overlay)

    async def _job(
        self,
        kind: str,
        ref: BlockRef,
        calls_raw: Any,
        *,
        single: bool,
        block_overrides: Any = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """Validate everything, resolve the block, build the job (one call or many).

        The calls are checked before the block is resolved, so a malformed request is -32602
        on every node (never -39006, which the proxy would retry elsewhere).
        """
        height, env, calls = self._checked(ref, calls_raw, single, block_overrides)
        await self.ready()
        return self._build(kind, height, env, calls, **extra)

    def _checked(
        self, ref: BlockRef, calls_raw: Any, single: bool, block_overrides: Any
    ) -> tuple[int, dict[str, Any], list[dict[str, Any]]]:
        """(height, block env, calls) of a request, validated, gas limited."""
        cap = self.settings.gas_cap
        if single:
            calls = [self._parse_call(calls_raw)]
        else:
            calls = parse_calls(calls_raw, cap, self.settings.max_calls)
        height = self._resolver(ref)
        env = apply_block_overrides(self._block_env(height), block_overrides)
        limit = min(cap, env["gas_limit"])
        for call in calls:
            call["gas"] = min(call["gas"], limit)
        return height, env, calls

    def _build(
        self,
        kind: str,
        height: int,
        env: dict[str, Any],
        calls: list[dict[str, Any]],
        **extra: Any,
    ) -> dict[str, Any]:
        """The worker job (the feed and workers started)."""
        chain_id = self._known_chain_id
        if chain_id is None:
            if self._chain_id is not None:
                chain_id = self._known_chain_id = self._chain_id()  # kept once known
            if chain_id is None:
                chain_id = self.settings.chain_id
        if len(calls) != 1 or calls[0].get("chain_id") is not None:  # (one call: most often)
            check_chain_id(calls, chain_id)
        job = self.executor.job(kind, self.feed.state_url(), height, env, calls, **extra)
        job["chain_id"] = chain_id
        if self._store is not None:
            job["store"] = self._store
        return job

    def _parse_call(self, obj: Any) -> dict[str, Any]:
        """`parse_call`, remembered for call objects of plain strings (the same calls come
        again and again: a balanceOf per holder, a view); a copy each time (gas is set per
        job). Long calldata is neither hashed for the memo nor decoded here (`_lazy`)."""
        lazy = _lazy_text(obj)
        if lazy is not None:
            return self._lazy(obj, lazy)
        try:  # (keyed in the client's order of fields: one entry per order it uses)
            key = tuple(obj.items()) if obj.__class__ is dict else None
            cached = self._calls.get(key) if key is not None else None
        except TypeError:  # a list or object inside (accessList): not cached
            key = cached = None
        if cached is None:
            cached = parse_call(obj, self.settings.gas_cap)
            if (
                key is not None
                and len(obj.get("data") or obj.get("input") or "") <= CALL_CACHE_DATA
            ):
                if len(self._calls) >= CALL_CACHE:
                    self._calls.clear()
                self._calls[key] = cached
        return dict(cached)

    def _lazy(self, obj: dict[str, Any], text: str) -> dict[str, Any]:
        """A call whose calldata (`text`, given once as `data` or `input`) is long: the
        rest parsed here, the calldata handed to the worker as the ASCII bytes of its hex
        (`hex`: decoded and checked there, -32602 as `parse_data` answers; pickled as a
        copy, where a text is encoded char by char). Decoding megabytes on the event loop
        held up every other client (~5 ms per 5 MB quiet, ~20 ms on a loaded machine)."""
        rest = {name: value for name, value in obj.items() if name not in ("data", "input")}
        call = parse_call(rest, self.settings.gas_cap)
        field = "request.data" if obj.get("data") is not None else "request.input"
        if not text.isascii():
            raise JsonRpcError(INVALID_PARAMS, f"invalid {field}: expected 0x-prefixed hex bytes")
        call["hex"] = (field, text.encode("ascii"))
        return call

    def _ref(self, value: Any) -> BlockRef:
        """`parse_block_number_param`, remembered for strings (tags, heights, hashes)."""
        ref = self._refs.get(value) if value.__class__ is str else None
        if ref is None:
            ref = parse_block_number_param(value)
            if value.__class__ is str:
                refs = self._refs
                if len(refs) >= BLOCK_REFS:
                    del refs[next(iter(refs))]
                refs[value] = ref
        return ref

    def _block_env(self, height: int) -> dict[str, Any]:
        """The block env at a height, from a small cache (a header never changes unless
        its block is rolled back; the store counts rollbacks)."""
        generation = getattr(self.reader, "rollbacks", None)
        cached = self._envs.get(height)
        if cached is not None and generation is not None and cached[0] == generation:
            return cached[1]
        env = block_env(self.reader.header(height))
        if generation is not None:
            envs = self._envs
            if len(envs) >= ENV_CACHE:
                del envs[next(iter(envs))]
            envs[height] = (generation, env)
        return env

    @contextlib.contextmanager
    def _overlaid(self, job: dict[str, Any], overlay: Overlay | None) -> Iterator[dict[str, Any]]:
        """The job reading through `overlay` (on a fresh EVM), or unchanged without one."""
        if overlay is None:
            yield job
            return
        with self.feed.overlay(overlay) as url:
            yield {**job, "fork_url": url, "fresh": True, "store": None}

    @staticmethod
    def _call_result(r: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "success": r["ok"],
            "returnData": r.get("output", "0x"),
            "gasUsed": hex(r.get("gas_used", 0)),
        }
        if not r["ok"]:
            out["error"] = r["error"]
            data = r["error"].get("data")
            if isinstance(data, str):
                out["returnData"] = data
        return out

    @staticmethod
    def _fast_fail(results: list[dict[str, Any]]) -> None:
        for i, r in enumerate(results):
            if not r["ok"]:
                err = r["error"]
                data = {"index": i, "data": err.get("data")}
                raise JsonRpcError(err["code"], f"requests[{i}]: {err['message']}", data)

    async def _multi(
        self,
        ref: BlockRef,
        requests: Any,
        fast_fail: Any,
        use_parallel: Any,
        disable_cache: Any,
        block_overrides: Any = None,
        state_override: Any = None,
    ) -> list[dict[str, Any]]:
        ff = parse_flag(fast_fail, "fastFail")
        parallel = parse_flag(use_parallel, "useParallel")
        no_cache = parse_flag(disable_cache, "disableCache")
        overlay = parse_state_override(state_override)
        job = await self._job(
            "calls",
            ref,
            requests,
            single=False,
            block_overrides=block_overrides,
            fast_fail=ff,
            disable_cache=no_cache,
        )
        with self._overlaid(job, overlay) as job:
            results = await self.executor.calls(job, parallel)
        if ff:
            self._fast_fail(results)
        return [self._call_result(r) for r in results]

    # -- eth namespace ----------------------------------------------------------------

    async def eth_call(self, params: Any) -> str:
        request, block, state_override, block_overrides = params_list(
            params, ["request", "blockNumber", "stateOverride", "blockOverrides"]
        )
        ref = self._ref(block)
        overlay = parse_state_override(state_override)
        job = await self._job("calls", ref, request, single=True, block_overrides=block_overrides)
        if overlay is None:
            return (await self.executor.call(job))["output"]
        with self._overlaid(job, overlay) as job:
            return (await self.executor.call(job))["output"]

    def call_now(self, params: Any, sink: Any = None) -> asyncio.Future[dict[str, Any]] | None:
        """eth_call without a coroutine, for a read path answering many at once: the call
        validated and queued, the future of its result dict (or `sink`, `Executor.enqueue`'s);
        None when it must go the usual way (EVM not started yet or closing, a state
        override)."""
        if not self._started or self._closed:
            return None
        request, block, state_override, block_overrides = params_list(
            params, ["request", "blockNumber", "stateOverride", "blockOverrides"]
        )
        if state_override is not None:
            return None
        height, env, calls = self._checked(self._ref(block), request, True, block_overrides)
        return self.executor.enqueue(self._build("calls", height, env, calls), sink)

    async def eth_multi_call(self, params: Any) -> list[dict[str, Any]]:
        names = ["requests", "blockNumber", "fastFail", "useParallel", "disableCache"]
        requests, block, ff, parallel, no_cache = params_list(params, names)
        return await self._multi(parse_block_number_param(block), requests, ff, parallel, no_cache)

    async def eth_simulate_v1(self, params: Any) -> Any:
        """Refused plainly: its simulated blocks carry state roots and block hashes, which
        need the state trie this node does not keep (a half answer would mislead)."""
        raise JsonRpcError(
            METHOD_NOT_FOUND,
            "eth_simulateV1 is not supported by the state node: simulated blocks need state "
            "roots it does not compute; use simulateTransactions, or a full node",
        )

    # -- vendor namespace -------------------------------------------------------------

    async def contract_multi_call(self, params: Any) -> list[dict[str, Any]]:
        names = [
            "requests",
            "blockCtx",
            "blockOverrides",
            "stateOverride",
            "fastFail",
            "useParallel",
            "disableCache",
        ]
        requests, ctx, block_ov, state_ov, ff, parallel, no_cache = params_list(params, names)
        ref = parse_block_ctx(ctx)
        return await self._multi(ref, requests, ff, parallel, no_cache, block_ov, state_ov)

    async def simulate_transactions(self, params: Any) -> list[dict[str, Any]]:
        """Each transaction is one job reading the block's state under an overlay holding
        the writes of the transactions before it (cold, committed state, as in a block)."""
        requests, ctx, block_ov = params_list(params, ["requests", "blockCtx", "blockOverrides"])
        job = await self._job(
            "calls", parse_block_ctx(ctx), requests, single=False, block_overrides=block_ov
        )
        overlay = Overlay()
        out: list[dict[str, Any]] = []
        with self.feed.overlay(overlay) as url:
            for call in job["calls"]:
                sender = call["from"]
                known = overlay.accounts.get(sender, {}).get("nonce")
                nonce = self.reader.nonce(sender, job["height"]) if known is None else known
                if call["nonce"] is not None and call["nonce"] != nonce:
                    msg = f"nonce {call['nonce']} does not match the account's nonce {nonce}"
                    out.append(self._sim_result({"ok": False, "error": nonce_error(msg)}))
                    continue
                one = {**job, "calls": [call], "fork_url": url, "fresh": True, "store": None}
                result = (await self.executor.run({**one, "collect_writes": True}))["results"][0]
                if result["ok"]:
                    overlay.merge_writes(result["writes"])
                if result["ok"] or result.get("gas_used"):  # included: a revert is too
                    self._settle(overlay, call, nonce, result.get("gas_used", 0), job)
                out.append(self._sim_result(result))
        return out

    def _account(self, overlay: Overlay, address: str, height: int) -> dict[str, Any]:
        account = overlay.accounts.setdefault(address, {})
        if "balance" not in account:
            account["balance"] = self.reader.balance(address, height)
        if "nonce" not in account:
            account["nonce"] = self.reader.nonce(address, height)
        if "code" not in account:
            account["code"] = self.reader.code(address, height)
        return account

    def _settle(
        self, overlay: Overlay, call: dict[str, Any], nonce: int, gas_used: int, job: dict
    ) -> None:
        """What a block does after an included transaction: the sender's nonce advances and,
        with a gas price, the sender pays gas used × price and the coinbase gets the part
        above the base fee (the base fee is burnt). Without a gas price nothing is charged,
        as in eth_call."""
        height = job["height"]
        price = effective_price(call, job["block"]["basefee"])
        sender = self._account(overlay, call["from"], height)
        sender["nonce"] = nonce + 1
        if price:
            sender["balance"] -= gas_used * price
            tip = max(0, price - job["block"]["basefee"]) * gas_used
            if tip:
                coinbase = self._account(overlay, job["block"]["coinbase"], height)
                coinbase["balance"] += tip

    @staticmethod
    def _sim_result(r: dict[str, Any]) -> dict[str, Any]:
        item: dict[str, Any] = {
            "status": "0x1" if r["ok"] else "0x0",
            "gasUsed": hex(r.get("gas_used", 0)),
            "returnData": r.get("output", "0x"),
            "logs": r.get("logs", []),
        }
        if not r["ok"]:
            item["error"] = r["error"]
            data = r["error"].get("data")
            if isinstance(data, str):
                item["returnData"] = data
        return item

    async def estimate_gas(self, params: Any) -> str:
        request, ctx, block_ov = params_list(params, ["request", "blockCtx", "blockOverrides"])
        job = await self._job(
            "estimate", parse_block_ctx(ctx), request, single=True, block_overrides=block_ov
        )
        return hex((await self.executor.run(job))["result"])

    # -- pre / blockx namespaces ------------------------------------------------------

    async def pre_trace_call(self, params: Any) -> dict[str, Any]:
        request, block_id = params_list(params, ["request", "blockId"])
        ref = parse_block_id("latest" if block_id is None else block_id)
        job = await self._job("trace", ref, request, single=True)
        return (await self.executor.run(job))["results"][0]

    async def pre_trace_many(self, params: Any) -> list[dict[str, Any]]:
        requests, block_id = params_list(params, ["requests", "blockId"])
        ref = parse_block_id("latest" if block_id is None else block_id)
        job = await self._job("trace", ref, requests, single=False)
        return (await self.executor.run(job))["results"]

    async def state_read_batch(self, params: Any) -> str:
        (payload,) = params_list(params, ["payload"])
        raw = parse_data(payload, "payload")
        try:
            req = bsrb.decode_request(raw, self.settings.max_bsrb_reads)
        except bsrb.BsrbLimitError as exc:
            raise JsonRpcError(SERVER_BUSY, f"BSRB/1: {exc}") from None
        except bsrb.BsrbError as exc:
            raise JsonRpcError(INVALID_PARAMS, f"malformed BSRB/1 payload: {exc}") from None
        ref = BlockRef(tag="latest") if req.height is None else BlockRef(number=req.height)
        height = self._resolver(ref)
        header = self.reader.header(height)
        values: list[tuple[int, int | bytes]] = []
        r = self.reader
        for read in req.reads:
            if read.kind == bsrb.BALANCE:
                values.append((read.kind, r.balance(read.address, height)))
            elif read.kind == bsrb.NONCE:
                values.append((read.kind, r.nonce(read.address, height)))
            elif read.kind == bsrb.CODE:
                values.append((read.kind, r.code(read.address, height)))
            else:
                values.append((read.kind, r.storage(read.address, read.slot, height)))
        return "0x" + bsrb.encode_response(height, header.hash, values).hex()


def register(node: Any, settings: EvmSettings | None = None) -> EvmMethods:
    """Register the EVM methods on `node.dispatcher`; their workers start in the background
    at once and stop when `node.close()` is awaited (workers also exit on their own when the
    node dies)."""
    if settings is None:
        settings = getattr(node, "evm_settings", None) or EvmSettings()
    chain_id_fn = getattr(node, "chain_id", None)
    chain_id = chain_id_fn if callable(chain_id_fn) else None
    resolver = getattr(node, "resolve", None)
    methods = EvmMethods(node.reader, settings, resolver=resolver, chain_id=chain_id)
    node.dispatcher.update(methods.handlers())
    node.evm = methods
    _close_with(node, methods)
    methods.start_soon()
    return methods


def _close_with(node: Any, methods: EvmMethods) -> None:
    """Stop the workers and the feed when the node closes (the node has no cleanup hook)."""
    node_close = getattr(node, "close", None)
    if node_close is None:
        return

    async def close() -> None:
        try:
            await methods.close()
        finally:
            await node_close()

    node.close = close


__all__ = ["EvmMethods", "register", "resolve_height"]

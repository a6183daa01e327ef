"""The trace methods of the state node: debug_traceCall, debug_traceTransaction,
debug_traceBlockByNumber/ByHash, trace_block, trace_transaction, trace_filter,
trace_replayBlockTransactions, and eth_createAccessList (which traces its call).

A mined transaction is traced by re-executing its block's transactions before it on the
state of the parent block, with the block's environment, in a worker (tracing.py); the
block's transactions and receipts come from the store (`reader.block_body`). Params are
checked here, so a malformed request is -32602 before any work starts; a block or
transaction this node does not hold is -39006 (the proxy then asks an archive node).
Shapes and limits: docs/evm.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chainstate.blockref import BlockRef, parse_block_id, parse_block_number_param
from chainstate.hexcodec import parse_address, parse_hash
from chainstate.jsonrpc import BLOCK_NOT_FOUND, INVALID_PARAMS, JsonRpcError, params_list
from nodes.state.evm.codec import parse_state_override

if TYPE_CHECKING:
    from nodes.state.evm.methods import EvmMethods

# struct-logger options of geth's TraceConfig (`timeout` and `reexec` are accepted and
# not used: the node's trace_timeout bounds a trace, and it always holds the state)
TRACE_OPTIONS = frozenset(
    {
        "tracer",
        "tracerConfig",
        "timeout",
        "reexec",
        "disableStack",
        "disableStorage",
        "enableMemory",
        "enableReturnData",
        "disableMemory",
        "disableReturnData",
        "debug",
        "limit",
    }
)
CALL_TRACE_OPTIONS = TRACE_OPTIONS | {"stateOverrides", "blockOverrides"}
# tracers and the options of their tracerConfig
TRACERS = {
    "callTracer": frozenset({"onlyTopCall", "withLog"}),
    "prestateTracer": frozenset({"diffMode", "disableCode", "disableStorage"}),
    "noopTracer": frozenset(),
}
FLAG_OPTIONS = (
    "disableStack",
    "disableStorage",
    "enableMemory",
    "enableReturnData",
    "disableMemory",
    "disableReturnData",
    "debug",
)
FILTER_FIELDS = frozenset(
    {"fromBlock", "toBlock", "fromAddress", "toAddress", "mode", "after", "count"}
)
REPLAY_TYPES = frozenset({"trace", "stateDiff", "vmTrace"})


def invalid(message: str) -> JsonRpcError:
    return JsonRpcError(INVALID_PARAMS, message)


def parse_tracer(options: Any, allowed: frozenset[str] = TRACE_OPTIONS) -> dict[str, Any]:
    """geth's tracing options → `{"name", "config"}` for tracing.py: `name` None is the
    struct logger (its options are the config). Unknown options, tracers and tracer
    options are -32602, never ignored."""
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise invalid("invalid tracing options: expected an object")
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise invalid(f"invalid tracing options: unknown fields {unknown}")
    for name in FLAG_OPTIONS:
        if options.get(name) is not None and not isinstance(options[name], bool):
            raise invalid(f"invalid tracing options: {name} must be true or false")
    if options.get("timeout") is not None and not isinstance(options["timeout"], str):
        raise invalid("invalid tracing options: timeout must be a duration string")
    limit = options.get("limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise invalid("invalid tracing options: limit must be a non-negative integer")
    name = options.get("tracer")
    config = options.get("tracerConfig")
    if name in (None, ""):
        if config not in (None, {}):
            raise invalid("invalid tracing options: tracerConfig without a tracer")
        struct = {k: options[k] for k in (*FLAG_OPTIONS, "limit") if options.get(k) is not None}
        return {"name": None, "config": struct}
    if not isinstance(name, str) or name not in TRACERS:
        shown = name if isinstance(name, str) and len(name) <= 40 else f"{str(name)[:40]}…"
        supported = ", ".join(sorted(TRACERS))
        raise invalid(
            f"tracer {shown!r} is not supported (supported: the default struct logger, {supported})"
        )
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise invalid("invalid tracerConfig: expected an object")
    unknown = sorted(set(config) - TRACERS[name])
    if unknown:
        raise invalid(f"invalid tracerConfig for {name}: unknown fields {unknown}")
    for key, value in config.items():
        if value is not None and not isinstance(value, bool):
            raise invalid(f"invalid tracerConfig for {name}: {key} must be true or false")
    return {"name": name, "config": {k: v for k, v in config.items() if v is not None}}


def _block_number(value: Any, what: str) -> BlockRef:
    if value is None:
        raise invalid(f"missing {what}")
    return parse_block_id(value)


class TraceMethods:
    """The trace handlers of one node, on its EvmMethods (feed, executor, reader)."""

    def __init__(self, evm: EvmMethods) -> None:
        self.evm = evm

    def handlers(self) -> dict[str, Any]:
        return {
            "debug_traceCall": self.debug_trace_call,
            "debug_traceTransaction": self.debug_trace_transaction,
            "debug_traceBlockByNumber": self.debug_trace_block_by_number,
            "debug_traceBlockByHash": self.debug_trace_block_by_hash,
            "trace_block": self.trace_block,
            "trace_transaction": self.trace_transaction,
            "trace_filter": self.trace_filter,
            "trace_replayBlockTransactions": self.trace_replay_block_transactions,
            "eth_createAccessList": self.eth_create_access_list,
        }

    # -- helpers ----------------------------------------------------------------------

    @property
    def reader(self) -> Any:
        return self.evm.reader

    def _body(self, height: int) -> dict[str, Any]:
        """The stored block object (with its transactions) and receipts; -39006 when the
        node does not hold them (genesis has none to trace)."""
        if height == 0:
            return {"block": {"transactions": [], "hash": self.reader.header(0).hash}}
        body = self.reader.block_body(height)
        if body is None:
            raise JsonRpcError(BLOCK_NOT_FOUND, f"block {height}'s transactions are not held here")
        return body

    def _parent_in_range(self, height: int) -> None:
        lo, hi = self.reader.range()
        if not lo <= height - 1 <= hi:
            raise JsonRpcError(
                BLOCK_NOT_FOUND,
                f"block {height}'s parent state (block {height - 1}) is outside this "
                f"node's range {lo}..{hi}",
            )

    async def _replay(
        self, height: int, body: dict[str, Any], targets: list[int], tracer: dict[str, Any]
    ) -> list[Any]:
        """Traces of the transactions at `targets` of block `height` (one worker job that
        re-runs the block's transactions up to the last target on its parent's state)."""
        txs = body["block"]["transactions"]
        if not targets:
            return []
        if any(isinstance(tx, str) for tx in txs):
            raise JsonRpcError(BLOCK_NOT_FOUND, f"block {height}'s transactions are not held here")
        self._parent_in_range(height)
        await self.evm.ready()
        env = self.evm.block_env(height)
        job = self.evm.build_job("replay", height - 1, env, [])
        job.update(txs=txs, receipts=body["receipts"], targets=targets, tracer=tracer)
        return (await self.evm.executor.run(job))["results"]

    def _locate(self, value: Any) -> tuple[int, int]:
        tx_hash = parse_hash(value, "transaction hash")
        found = self.reader.transaction_location(tx_hash)
        if found is None:
            raise JsonRpcError(BLOCK_NOT_FOUND, f"transaction {tx_hash} not found")
        return found

    def _height(self, ref: BlockRef) -> int:
        return self.evm.resolve(ref)

    # -- debug namespace --------------------------------------------------------------

    async def debug_trace_call(self, params: Any) -> Any:
        request, block, options = params_list(params, ["request", "blockNumber", "options"])
        tracer = parse_tracer(options, CALL_TRACE_OPTIONS)
        options = options or {}
        overlay = parse_state_override(options.get("stateOverrides"))
        ref = parse_block_number_param("latest" if block is None else block)
        job = await self.evm.prepare(
            "trace_call", ref, request, block_overrides=options.get("blockOverrides")
        )
        job.update(call=job["calls"][0], tracer=tracer)
        with self.evm.overlaid(job, overlay) as job:
            return (await self.evm.executor.run(job))["results"][0]

    async def debug_trace_transaction(self, params: Any) -> Any:
        tx_hash, options = params_list(params, ["transactionHash", "options"])
        tracer = parse_tracer(options)
        height, index = self._locate(tx_hash)
        return (await self._replay(height, self._body(height), [index], tracer))[0]

    async def _trace_block(self, height: int, options: Any) -> list[dict[str, Any]]:
        tracer = parse_tracer(options)
        body = self._body(height)
        txs = body["block"]["transactions"]
        results = await self._replay(height, body, list(range(len(txs))), tracer)
        return [
            {"txHash": tx["hash"], "result": result}
            for tx, result in zip(txs, results, strict=True)
        ]

    async def debug_trace_block_by_number(self, params: Any) -> list[dict[str, Any]]:
        block, options = params_list(params, ["blockNumber", "options"])
        parse_tracer(options)  # bad options are -32602 before the block is looked at
        return await self._trace_block(self._height(_block_number(block, "block")), options)

    async def debug_trace_block_by_hash(self, params: Any) -> list[dict[str, Any]]:
        block_hash, options = params_list(params, ["blockHash", "options"])
        parse_tracer(options)
        ref = BlockRef(hash=parse_hash(block_hash, "block hash"))
        return await self._trace_block(self._height(ref), options)

    # -- eth namespace ----------------------------------------------------------------

    async def eth_create_access_list(self, params: Any) -> dict[str, Any]:
        """geth's eth_createAccessList (run until the list settles, on py-evm): the list,
        the gas used with it, and `error` when the call fails with it (a result, as geth and
        the execution-apis spec answer; anvil answers a JSON-RPC error instead)."""
        request, block = params_list(params, ["transaction", "blockNumber"])
        ref = parse_block_number_param("latest" if block is None else block)
        job = await self.evm.prepare("access_list", ref, request)
        job.update(call=job["calls"][0], tracer={"name": "accessList", "config": {}})
        return (await self.evm.executor.run(job))["results"][0]

    # -- trace namespace (Parity style) -----------------------------------------------

    async def _parity_block(self, height: int) -> list[dict[str, Any]]:
        """Every transaction's traces of block `height`, with the block and transaction
        fields trace_block answers."""
        body = self._body(height)
        txs = body["block"]["transactions"]
        per_tx = await self._replay(
            height, body, list(range(len(txs))), {"name": "parity", "config": {}}
        )
        out = []
        for position, (tx, traces) in enumerate(zip(txs, per_tx, strict=True)):
            out.extend(
                _localized(t, body["block"]["hash"], height, tx["hash"], position) for t in traces
            )
        return out

    async def trace_block(self, params: Any) -> list[dict[str, Any]]:
        (block,) = params_list(params, ["blockNumber"])
        return await self._parity_block(self._height(_block_number(block, "block")))

    async def trace_transaction(self, params: Any) -> list[dict[str, Any]]:
        (tx_hash,) = params_list(params, ["transactionHash"])
        height, index = self._locate(tx_hash)
        body = self._body(height)
        tx = body["block"]["transactions"][index]
        traces = (await self._replay(height, body, [index], {"name": "parity", "config": {}}))[0]
        return [_localized(t, body["block"]["hash"], height, tx["hash"], index) for t in traces]

    async def trace_replay_block_transactions(self, params: Any) -> list[dict[str, Any]]:
        """The `trace` and `stateDiff` types; `vmTrace` is refused (not half answered)."""
        block, types = params_list(params, ["blockNumber", "traceTypes"])
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise invalid("invalid traceTypes: expected an array of strings")
        unknown = sorted(set(types) - REPLAY_TYPES)
        if unknown:
            raise invalid(f"invalid traceTypes: unknown {unknown}")
        if "vmTrace" in types:
            raise invalid("traceType vmTrace is not supported (supported: trace, stateDiff)")
        height = self._height(_block_number(block, "block"))
        body = self._body(height)
        txs = body["block"]["transactions"]
        tracer = {"name": "replay", "config": {"stateDiff": "stateDiff" in types}}
        per_tx = await self._replay(height, body, list(range(len(txs))), tracer)
        return [
            {
                "output": _output(one["trace"]),
                "stateDiff": one["stateDiff"],
                "trace": one["trace"] if "trace" in types else [],
                "vmTrace": None,
                "transactionHash": tx["hash"],
            }
            for tx, one in zip(txs, per_tx, strict=True)
        ]

    async def trace_filter(self, params: Any) -> list[dict[str, Any]]:
        (flt,) = params_list(params, ["filter"])
        first, last, match, after, count = self._filter(flt)
        out: list[dict[str, Any]] = []
        for height in range(max(first, 1), last + 1):  # genesis has no transactions
            out.extend(t for t in await self._parity_block(height) if match(t))
            if count is not None and len(out) >= after + count:
                break
        out = out[after:]
        return out if count is None else out[:count]

    def _filter(self, flt: Any) -> tuple[int, int, Any, int, int | None]:
        """trace_filter's filter (alloy's TraceFilter: unknown fields refused) → (first
        block, last block, matcher, after, count)."""
        if not isinstance(flt, dict):
            raise invalid("invalid filter: expected an object")
        unknown = sorted(set(flt) - FILTER_FIELDS)
        if unknown:
            raise invalid(f"invalid filter: unknown fields {unknown}")
        lo, hi = self.reader.range()
        first = (
            0
            if flt.get("fromBlock") is None
            else self._height(_block_number(flt["fromBlock"], "fromBlock"))
        )
        last = (
            hi
            if flt.get("toBlock") is None
            else self._height(_block_number(flt["toBlock"], "toBlock"))
        )
        if first > last:
            raise invalid("invalid block range: fromBlock is after toBlock")
        most = self.evm.settings.max_trace_filter_blocks
        if last - first > most:
            raise invalid(f"block range too large: at most {most} blocks after fromBlock")
        if first < lo:
            raise JsonRpcError(
                BLOCK_NOT_FOUND, f"block {first} is outside this node's range {lo}..{hi}"
            )
        senders = _addresses(flt.get("fromAddress"), "fromAddress")
        receivers = _addresses(flt.get("toAddress"), "toAddress")
        mode = flt.get("mode", "union")
        if mode not in ("union", "intersection"):
            raise invalid("invalid filter mode: union or intersection")
        after = _count(flt.get("after"), "after") or 0
        count = _count(flt.get("count"), "count")
        return first, last, _matcher(senders, receivers, mode), after, count


def _addresses(value: Any, what: str) -> set[str]:
    if value is None:
        return set()
    if not isinstance(value, list):
        raise invalid(f"invalid {what}: expected an array of addresses")
    return {parse_address(a, what) for a in value}


def _count(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise invalid(f"invalid {what}: expected a non-negative integer")
    return value


def _matcher(senders: set[str], receivers: set[str], mode: str) -> Any:
    """alloy's TraceFilterMatcher: an empty set matches every address; in union mode only
    the given side(s) decide."""

    def side(addresses: set[str], value: str | None) -> bool:
        return not addresses or value in addresses

    def match(trace: dict[str, Any]) -> bool:
        action = trace["action"]
        if trace["type"] == "call":
            source, target = action["from"], action["to"]
            to_ok = side(receivers, target)
        elif trace["type"] == "create":
            source = action["from"]
            result = trace.get("result")
            to_ok = side(receivers, result["address"]) if result else not receivers
        else:  # suicide
            source, target = action["address"], action["refundAddress"]
            to_ok = side(receivers, target)
        from_ok = side(senders, source)
        if mode == "intersection":
            return from_ok and to_ok
        if not senders:
            return to_ok
        if not receivers:
            return from_ok
        return from_ok or to_ok

    return match


def _output(traces: list[dict[str, Any]]) -> str:
    """A transaction's output in trace_replayBlockTransactions: its top frame's."""
    result = traces[0].get("result") if traces else None
    if not result:
        return "0x"
    return result.get("output", result.get("code", "0x"))


def _localized(
    trace: dict[str, Any], block_hash: str, height: int, tx_hash: str, position: int
) -> dict[str, Any]:
    return {
        **trace,
        "blockHash": block_hash,
        "blockNumber": height,
        "transactionHash": tx_hash,
        "transactionPosition": position,
    }

"""Step 1 of routing: which methods the proxy serves and which block each request targets.

The method set is the spec's (the state node's eth_* table, the vendor names, pre_*,
blockx_stateReadBatch, trace_vendorBlock) and the whole standard Ethereum JSON-RPC API (the
execution-apis `eth_*`/`debug_*` methods and the common non-spec ones: traces, txpool,
signing), each with where it is answered (docs/proxy.md, "Method table"):

- state, execution, traces by re-execution, logs, block bodies, transactions and receipts:
  the state nodes, chosen by block;
- the transaction pool, signing, fees and anything at the `pending` block: the chain's Leader
  write node, which passes them to its execution client;
- what needs a state trie (`eth_getProof`): the pool's `full` nodes, else the Leader;
- a transaction looked up by hash (`mempool`): the state nodes, and when none holds it, the
  Leader (a pending transaction is known only to its execution client).

`extra_methods` (a setting) allows more, routed like latest reads. Params are checked only as
far as routing needs and as the spec makes obvious (missing address, malformed hash, bad block
id); the node checks the rest.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from operator import itemgetter
from typing import Any

from chainstate.blockref import BlockRef, parse_block_ctx, parse_block_id, parse_block_number_param
from chainstate.hexcodec import parse_address, parse_data, parse_hash, parse_quantity
from chainstate.jsonrpc import (
    INVALID_BLOCK_ID,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    JsonRpcError,
    cut,
)
from chainstate.logfilter import parse_filter

Check = Callable[[Any, str], Any]


def _object(value: Any, what: str) -> Any:
    if not isinstance(value, dict):
        raise JsonRpcError(INVALID_PARAMS, f"invalid {what}: expected an object")
    return value


def _list(value: Any, what: str) -> Any:
    if not isinstance(value, list):
        raise JsonRpcError(INVALID_PARAMS, f"invalid {what}: expected an array")
    return value


def _optional_list(value: Any, what: str) -> Any:
    return value if value is None else _list(value, what)


def _block_height(value: Any) -> BlockRef:
    ref = parse_block_id(value)
    return ref


def _block_hash(value: Any) -> BlockRef:
    return BlockRef(hash=parse_hash(value, "block hash"))


def _block_id(value: Any) -> BlockRef:
    return parse_block_id("latest" if value is None else value)


# The proxy checks a filter's shape; its list limits are the node's (max_log_query_list).
_UNLIMITED = 2**62


def _log_range(value: Any) -> BlockRef:
    """eth_getLogs: the oldest block of the range (or the named block) decides the node."""
    return parse_filter(value, max_list=_UNLIMITED).oldest


_TRACE_FILTER_FIELDS = frozenset(
    ("fromBlock", "toBlock", "fromAddress", "toAddress", "mode", "after", "count")
)


def _trace_range(value: Any) -> BlockRef:
    """trace_filter (OpenEthereum/reth): its `fromBlock` decides the node, as eth_getLogs'."""
    if not isinstance(value, dict):
        raise JsonRpcError(INVALID_PARAMS, "invalid trace filter: expected an object")
    unknown = sorted(set(value) - _TRACE_FILTER_FIELDS)
    if unknown:
        expected = sorted(_TRACE_FILTER_FIELDS)
        msg = f"unknown field {cut(unknown[0])!r} in trace filter: expected {expected}"
        raise JsonRpcError(INVALID_PARAMS, msg)
    start = value.get("fromBlock")
    return BlockRef(tag="earliest") if start is None else parse_block_id(start)


BLOCK_PARSERS: dict[str, Callable[[Any], BlockRef]] = {
    "number": parse_block_number_param,  # eth_* blockNumber (tags, hex, EIP-1898, hash)
    "ctx": parse_block_ctx,  # vendor blockCtx (Equals/Contains)
    "height": _block_height,  # getBlockByHeight
    "hash": _block_hash,  # getBlockById, eth_getBlockByHash
    "id": _block_id,  # pre_* blockId
    "logs": _log_range,  # eth_getLogs filter
    "trace": _trace_range,  # trace_filter filter
}


@dataclass(frozen=True, slots=True)
class MethodSpec:
    params: tuple[str, ...]  # names, in positional order
    required: int = 0  # leading params that must be present
    block: str | None = None  # how the block param is read (BLOCK_PARSERS key)
    block_at: int = -1
    checks: tuple[tuple[int, Check], ...] = ()
    writer: bool = False  # goes to the chain's Leader write node
    pending: bool = False  # at the `pending` block it goes to the Leader write node
    parse_block: Callable[[Any], BlockRef] | None = None  # BLOCK_PARSERS[block]
    trie: bool = False  # needs a state trie: the pool's `full` nodes, else the Leader
    mempool: bool = False  # a transaction by hash: the state nodes, then the Leader
    missing_null: bool = False  # not found (a final -39006) is answered `null`
    # Its block param takes an EIP-1898 object, so a pinned block is sent by hash; the
    # traces "by number" (a number, tag or bare hash) are sent the pinned height
    # (proxy/reads.py)
    by_hash: bool = True
    # A method of the standard Ethereum API: its clients see standard error codes (set for
    # every name of STANDARD_PREFIXES below but the spec's own vendor methods).
    standard: bool = False


def _m(
    params: str = "",
    required: int = 0,
    block: str | None = None,
    checks: tuple[tuple[int, Check], ...] = (),
    writer: bool = False,
    pending: bool = False,
    *,
    trie: bool = False,
    mempool: bool = False,
    missing_null: bool = False,
    by_hash: bool = True,
) -> MethodSpec:
    names = tuple(params.split()) if params else ()
    block_at = -1
    if block is not None:
        names_of = {
            "number": "blockNumber",
            "ctx": "blockCtx",
            "id": "blockId",
            "logs": "filter",
            "trace": "filter",
        }
        block_name = names_of.get(block)
        block_at = names.index(block_name) if block_name in names else 0
    parse = None if block is None else BLOCK_PARSERS[block]
    return MethodSpec(
        names,
        required,
        block,
        block_at,
        checks,
        writer,
        pending,
        parse,
        trie=trie,
        mempool=mempool,
        missing_null=missing_null,
        by_hash=by_hash,
    )


def _address(value: Any, what: str) -> None:
    """Checks a 20-byte 0x address (parse_address's rule, without making the lowercase copy
    routing does not need). Clients ask about the same accounts again and again: a text that
    matched once is found in `_ADDRESSES_SEEN` (a set lookup; an lru_cache's was 4 % of the
    proxy's CPU under 100-item batches, a regex over 42 characters several times that)."""
    if type(value) is str and value in _ADDRESSES_SEEN:
        return
    if type(value) is not str or len(value) != 42 or _ADDRESS.match(value) is None:
        parse_address(value, what)  # raises the error
    if len(_ADDRESSES_SEEN) >= MAX_ADDRESSES_SEEN:
        _ADDRESSES_SEEN.clear()  # bounded: a memo of a pure check, started afresh when full
    _ADDRESSES_SEEN.add(value)


MAX_ADDRESSES_SEEN = 8192
_ADDRESSES_SEEN: set[str] = set()  # address texts that passed `_ADDRESS` (valid for good)


_ADDRESS = re.compile(r"^0x[0-9a-fA-F]{40}$")
_ADDRESS_CHECKS = (_address,)  # a param whose one check is `_address` (`known_targets`)
_ADDR = ((0, _address),)
_HASH = ((0, parse_hash),)
_INDEX = ((1, parse_quantity),)


def _optional_object(value: Any, what: str) -> Any:
    return value if value is None else _object(value, what)


METHODS: dict[str, MethodSpec] = {
    # state node: eth namespace (a `pending` read goes to the Leader: see `pending`)
    "eth_call": _m(
        "request blockNumber stateOverride blockOverrides",
        1,
        "number",
        ((0, _object),),
        pending=True,
    ),
    "eth_multiCall": _m(
        "requests blockNumber fastFail useParallel disableCache", 1, "number", ((0, _list),)
    ),
    "eth_blockNumber": _m(),
    "eth_getBalance": _m("address blockNumber", 1, "number", _ADDR, pending=True),
    "eth_getCode": _m("address blockNumber", 1, "number", _ADDR, pending=True),
    "eth_getStorageAt": _m("address position blockNumber", 2, "number", _ADDR, pending=True),
    "eth_getTransactionCount": _m("address blockNumber", 1, "number", _ADDR, pending=True),
    "eth_getStorageValues": _m("requests blockNumber", 1, "number", ((0, _object),), pending=True),
    "eth_chainId": _m(),
    "eth_baseFee": _m("blockNumber", 0, "number"),
    "eth_blobBaseFee": _m(),
    "eth_syncing": _m(),
    "eth_getLogs": _m("filter", 1, "logs"),
    # state node: blocks, their transactions and receipts (not found: null)
    # The full-transactions flag is required, as the spec and geth have it (-32602 without).
    "eth_getBlockByNumber": _m("blockNumber full", 2, "number", pending=True, missing_null=True),
    "eth_getBlockByHash": _m("blockHash full", 2, "hash", missing_null=True),
    "eth_getBlockTransactionCountByNumber": _m(
        "blockNumber", 1, "number", pending=True, missing_null=True
    ),
    "eth_getBlockTransactionCountByHash": _m("blockHash", 1, "hash", missing_null=True),
    "eth_getTransactionByBlockNumberAndIndex": _m(
        "blockNumber index", 2, "number", _INDEX, pending=True, missing_null=True
    ),
    "eth_getTransactionByBlockHashAndIndex": _m(
        "blockHash index", 2, "hash", _INDEX, missing_null=True
    ),
    "eth_getBlockReceipts": _m("blockNumber", 1, "number", pending=True, missing_null=True),
    "eth_getUncleCountByBlockNumber": _m(
        "blockNumber", 1, "number", pending=True, missing_null=True
    ),
    "eth_getUncleCountByBlockHash": _m("blockHash", 1, "hash", missing_null=True),
    "eth_getUncleByBlockNumberAndIndex": _m(
        "blockNumber index", 2, "number", _INDEX, pending=True, missing_null=True
    ),
    "eth_getUncleByBlockHashAndIndex": _m("blockHash index", 2, "hash", _INDEX, missing_null=True),
    # state nodes, then the Leader when none holds it (a pending transaction)
    "eth_getTransactionByHash": _m(
        "transactionHash", 1, checks=_HASH, mempool=True, missing_null=True
    ),
    "eth_getTransactionReceipt": _m(
        "transactionHash", 1, checks=_HASH, mempool=True, missing_null=True
    ),
    # state node: execution and traces by re-execution
    "eth_createAccessList": _m(
        "transaction blockNumber", 1, "number", ((0, _object),), pending=True
    ),
    "debug_traceCall": _m(
        "request blockNumber options",
        1,
        "number",
        ((0, _object), (2, _optional_object)),
        pending=True,
    ),
    "debug_traceTransaction": _m(
        "transactionHash options", 1, checks=((0, parse_hash), (1, _optional_object))
    ),
    "debug_traceBlockByNumber": _m(
        "blockNumber options", 1, "number", ((1, _optional_object),), by_hash=False
    ),
    "debug_traceBlockByHash": _m("blockHash options", 1, "hash", ((1, _optional_object),)),
    # A block or transaction that does not exist is traced as `null`, as reth and erigon
    # (the trace_* namespace's references) answer.
    "trace_block": _m("blockNumber", 1, "number", by_hash=False, missing_null=True),
    "trace_replayBlockTransactions": _m(
        "blockNumber traceTypes", 2, "number", ((1, _list),), by_hash=False
    ),
    "trace_transaction": _m("transactionHash", 1, checks=_HASH, missing_null=True),
    "trace_filter": _m("filter", 1, "trace"),
    # state node: what clients ask to identify the node and network
    "web3_clientVersion": _m(),
    "web3_sha3": _m("data", 1, checks=((0, parse_data),)),
    "net_version": _m(),
    "net_listening": _m(),
    # state node: vendor namespace
    "version": _m(),
    "getAddressBalance": _m("address blockCtx", 1, "ctx", _ADDR),
    "getAddressNonce": _m("address blockCtx", 1, "ctx", _ADDR),
    "getAddressCode": _m("address blockCtx", 1, "ctx", _ADDR),
    "getStorageAt": _m("address position blockCtx", 2, "ctx", _ADDR),
    "contractMultiCall": _m(
        "requests blockCtx blockOverrides stateOverride fastFail useParallel disableCache",
        1,
        "ctx",
        ((0, _list),),
    ),
    "simulateTransactions": _m("requests blockCtx blockOverrides", 1, "ctx", ((0, _list),)),
    "estimateGas": _m("request blockCtx blockOverrides", 1, "ctx", ((0, _object),)),
    "getLatestBlock": _m(),
    "getBlockByHeight": _m("height", 1, "height"),
    "getBlockById": _m("id", 1, "hash"),
    "blockIsValid": _m("id", 1, checks=((0, parse_hash),)),
    # pre and blockx namespaces
    "pre_traceCall": _m("request blockId", 1, "id", ((0, _object),)),
    "pre_traceMany": _m("requests blockId", 1, "id", ((0, _list),)),
    "blockx_stateReadBatch": _m("payload", 1, checks=((0, parse_data),)),
    # a state trie: the pool's `full` nodes, else the Leader's execution client
    "eth_getProof": _m(
        "address storageKeys blockNumber",
        2,
        "number",
        ((0, _address), (1, _list)),
        pending=True,
        trie=True,
    ),
    # write node and the transaction lifecycle: the chain's Leader (its execution client)
    "trace_vendorBlock": _m("block", 1, writer=True),
    "eth_sendRawTransaction": _m("data", 1, checks=((0, parse_data),), writer=True),
    "eth_sendTransaction": _m("transaction", 1, checks=((0, _object),), writer=True),
    "eth_estimateGas": _m(
        "transaction blockNumber stateOverride", 1, "number", ((0, _object),), writer=True
    ),
    "eth_gasPrice": _m(writer=True),
    "eth_maxPriorityFeePerGas": _m(writer=True),
    "eth_feeHistory": _m(
        "blockCount newestBlock rewardPercentiles", 2, checks=((2, _optional_list),), writer=True
    ),
    "eth_accounts": _m(writer=True),
    # the Leader: signing, the transaction pool, the execution client's own view
    "eth_sign": _m("address message", 2, checks=((0, _address), (1, parse_data)), writer=True),
    "eth_signTransaction": _m("transaction", 1, checks=((0, _object),), writer=True),
    "eth_signTypedData_v4": _m("address typedData", 2, checks=_ADDR, writer=True),
    "eth_fillTransaction": _m("transaction", 1, checks=((0, _object),), writer=True),
    # simulated blocks carry state roots, which need the trie the state nodes do not keep
    "eth_simulateV1": _m("payload blockNumber", 1, "number", ((0, _object),), writer=True),
    "eth_coinbase": _m(writer=True),
    "eth_protocolVersion": _m(writer=True),
    "eth_config": _m(writer=True),
    "net_peerCount": _m(writer=True),
    "txpool_status": _m(writer=True),
    "txpool_content": _m(writer=True),
    "txpool_inspect": _m(writer=True),
    "txpool_contentFrom": _m("address", 1, checks=_ADDR, writer=True),
    # the Leader: raw (RLP) encodings and what only an execution client keeps
    "debug_getRawTransaction": _m("transactionHash", 1, checks=_HASH, writer=True),
    "debug_getRawHeader": _m("blockNumber", 1, "number", writer=True),
    "debug_getRawBlock": _m("blockNumber", 1, "number", writer=True),
    "debug_getRawReceipts": _m("blockNumber", 1, "number", writer=True),
    "debug_getBadBlocks": _m(writer=True),
}
# The standard Ethereum API (clients see standard error codes, docs/proxy.md "Errors"): every
# name in these namespaces but the spec's vendor methods, whose callers keep its -39xxx codes.
STANDARD_PREFIXES = ("eth_", "net_", "web3_", "debug_", "trace_", "txpool_")
VENDOR_NAMES = frozenset(("eth_multiCall", "trace_vendorBlock"))
for _name, _spec in METHODS.items():
    if _name.startswith(STANDARD_PREFIXES) and _name not in VENDOR_NAMES:
        METHODS[_name] = replace(_spec, standard=True)
# `mempool` methods as the Leader answers them: when no state node holds the transaction
LEADER_FALLBACK = {
    name: replace(spec, writer=True) for name, spec in METHODS.items() if spec.mempool
}
EXTRA = MethodSpec(params=())


class LocalMethod(Exception):
    """Raised by `MethodTable.target` for a method the proxy answers itself (filters and
    subscriptions, proxy/events.py) instead of "Method not found": the engine hands the whole
    body over (`Engine.divert`). Not a JsonRpcError, so no item's handler answers it."""


_LAST = itemgetter(-1)
MAX_TARGETS = 4096  # remembered block texts per (method, number of params); then cleared


class _Texts:
    """The block texts remembered for one (method, number of params): each one's target,
    block and height (None: a tag or a hash), and the checks of the other params by index,
    so a batch finds each column with one C loop."""

    __slots__ = ("checks", "numbers", "raw", "raw_heights", "refs", "spec", "targets")

    def __init__(self, spec: MethodSpec, size: int) -> None:
        self.spec = spec
        self.checks: list[tuple[Check, ...]] = [
            tuple(check for at, check in spec.checks if at == index) for index in range(size)
        ]
        self.targets: dict[str, tuple[MethodSpec, BlockRef]] = {}
        self.refs: dict[str, BlockRef] = {}
        self.numbers: dict[str, int | None] = {}
        # each text, its block and height by the text's UTF-8 bytes: as a JSON body writes
        # it when it needs no escape (a batch read from its bytes, proxy/scan.py)
        self.raw: dict[bytes, tuple[str, BlockRef, int | None]] = {}
        self.raw_heights: dict[bytes, int | None] = {}  # (`raw`'s heights: a batch's column)

    def __len__(self) -> int:
        return len(self.targets)

    def add(self, text: str, found: tuple[MethodSpec, BlockRef]) -> None:
        ref = found[1]
        self.targets[text] = found
        self.refs[text] = ref
        self.numbers[text] = ref.number
        raw = text.encode()
        self.raw[raw] = (text, ref, ref.number)
        self.raw_heights[raw] = ref.number

    def clear(self) -> None:
        """Start afresh. The bytes' dicts are replaced, not emptied: rows read from a batch's
        bytes before keep looking their entries up in the ones they were read with."""
        self.targets.clear()
        self.refs.clear()
        self.numbers.clear()
        self.raw = {}
        self.raw_heights = {}


class MethodTable:
    """The allowed methods (spec + `extra_methods`) and how to read their target block.

    Clients name the same blocks again and again (a height, `latest`): the target of a
    request whose last param is its block param, given as a text, is remembered per (method,
    number of params, that text), so the block's text is parsed (one to three regular
    expressions) once; the other params are still checked every time."""

    def __init__(self, extra_methods: tuple[str, ...] = ()) -> None:
        self.specs = dict(METHODS)
        for name in extra_methods:
            self.specs.setdefault(name, EXTRA)
        self.local: frozenset[str] = frozenset()  # LocalMethod names (Engine.divert)
        # (method, number of params) → the block texts remembered: a batch looks its texts
        # up in one dict, with no key made per item
        self._known: dict[tuple[str, int], _Texts] = {}

    def spec(self, method: str) -> MethodSpec:
        spec = self.specs.get(method)
        if spec is None:
            raise JsonRpcError(METHOD_NOT_FOUND, f"Method not found: {cut(method)}")
        return spec

    def target(self, method: str, params: Any) -> tuple[MethodSpec, BlockRef | None]:
        """The spec of `method` and the block its params target (None: no block named)."""
        if type(params) is list and params and type(params[-1]) is str and None not in params:
            texts = self._known.get((method, len(params)))
            known = None if texts is None else texts.targets.get(params[-1])
            if known is None:
                key = (method, len(params), params[-1])
                return self._remember(key, self._target(method, params))
            spec = known[0]
            for index, check in spec.checks:  # (the block param's text passed already)
                if index != spec.block_at:
                    check(params[index] if index < len(params) else None, spec.params[index])
            return known
        return self._target(method, params)

    def known_targets(
        self, method: str, size: int, params: list[list[Any]], texts: list[Any]
    ) -> tuple[MethodSpec, list[BlockRef], list[int | None]] | None:
        """`target(method, p)` for every `p` of `params` (lists of `size` params; `texts`:
        each one's last param), each found by its block text among the targets remembered,
        with C loops over the items (a batch of one method: no Python step per item for the
        common check, an address seen before): the method's spec, each item's block and its
        height (None: a tag or a hash). None when a text is not remembered, a param is null
        or a check fails (then `target` per item finds the same targets, or the error)."""
        known = self._known.get((method, size))
        if known is None:
            return None
        try:
            refs = list(map(known.refs.__getitem__, texts))  # (one not remembered: KeyError)
            spec = known.spec
            for index in range(size - 1):  # (the last is the block text: a key, not null)
                column = list(map(itemgetter(index), params))
                checks = known.checks[index]
                if checks == _ADDRESS_CHECKS and _ADDRESSES_SEEN.issuperset(column):
                    continue  # (addresses that passed: none of them null)
                if None in column:
                    return None  # (a null param: `target` fills or refuses it)
                for check in checks:
                    name = spec.params[index]
                    for value in column:
                        check(value, name)
            for index, check in spec.checks:
                if index >= size:
                    check(None, spec.params[index])
        except (JsonRpcError, TypeError, KeyError):  # (TypeError: an unhashable param)
            return None
        return spec, refs, list(map(known.numbers.__getitem__, texts))

    def address_layout(self, method: str) -> tuple[_Texts, tuple[bool, ...]] | None:
        """For a batch read from its bytes (proxy/scan.py): the remembered block texts of
        `method` and, for each param before its block text (the last), whether it is an
        address (else it has no check: any value but null passes), when no other param is
        checked (the params after them are absent and optional); None otherwise (then the
        batch is parsed and checked as objects)."""
        spec = self.specs.get(method)
        if spec is None:
            return None
        for size in range(1, len(spec.params) + 1):
            known = self._known.get((method, size))
            if known is None:
                continue
            kinds = known.checks[: size - 1]
            if all(checks in (_ADDRESS_CHECKS, ()) for checks in kinds) and not any(
                at >= size for at, _ in spec.checks
            ):
                return known, tuple(checks == _ADDRESS_CHECKS for checks in kinds)
        return None

    def _remember(
        self, key: tuple[str, int, str], found: tuple[MethodSpec, BlockRef | None]
    ) -> tuple[MethodSpec, BlockRef | None]:
        """`found` (a valid target of `key`'s params) kept when its block is the last param
        (a text: never `Contains`, which only an object names)."""
        spec, ref = found
        if ref is not None and spec.block_at == key[1] - 1 and not ref.contains:
            method, size, text = key
            known = self._known.get((method, size))
            if known is None:
                known = self._known[(method, size)] = _Texts(spec, size)
            elif len(known) >= MAX_TARGETS:
                known.clear()
            known.add(text, found)  # type: ignore[arg-type]
        return found

    def _target(self, method: str, params: Any) -> tuple[MethodSpec, BlockRef | None]:
        spec = self.specs.get(method)
        if spec is None:
            if method in self.local:
                raise LocalMethod(method)
            raise JsonRpcError(METHOD_NOT_FOUND, f"Method not found: {cut(method)}")
        if spec is EXTRA:
            return spec, None
        names = spec.params
        if (
            type(params) is list
            and spec.required <= len(params) <= len(names)
            and None not in params
        ):
            values = params  # no param missing (the common case: nothing to fill or check)
        else:
            values = _positional(params, spec)
        for index, check in spec.checks:
            check(values[index] if index < len(values) else None, names[index])
        parse = spec.parse_block
        if parse is None:
            return spec, None
        try:
            return spec, parse(values[spec.block_at] if spec.block_at < len(values) else None)
        except JsonRpcError as exc:
            if exc.code == INVALID_BLOCK_ID and spec.standard:
                # A bad block id is a bad param to a client of the standard API (geth: -32602)
                raise JsonRpcError(INVALID_PARAMS, exc.message, exc.data) from None
            raise


def _positional(params: Any, spec: MethodSpec) -> list[Any]:
    names = spec.params
    if params is None:
        values = [None] * len(names)
    elif isinstance(params, dict):
        unknown = set(params) - set(names)
        if unknown:
            msg = f"unknown param(s) {cut(str(sorted(unknown)))}; expected {list(names)}"
            raise JsonRpcError(INVALID_PARAMS, msg)
        values = [params.get(n) for n in names]
    elif isinstance(params, list):
        if len(params) > len(names):
            msg = f"too many params: expected at most {len(names)} ({', '.join(names)})"
            raise JsonRpcError(INVALID_PARAMS, msg)
        values = params + [None] * (len(names) - len(params))
    else:
        raise JsonRpcError(INVALID_PARAMS, "params must be an array or object")
    for i in range(spec.required):
        if values[i] is None:
            raise JsonRpcError(INVALID_PARAMS, f"missing param {i}: {names[i]}")
    return values

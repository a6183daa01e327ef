"""`eth_getLogs` on the state node, over the log index (nodes/state/logindex.py).

`register(node)` is the integration point (the state node calls it at start): it attaches the
index to the node's store, registers the method, and starts the backfill when the store holds
blocks from before the index existed.

Answers are geth's/anvil's: the logs exactly as the execution client gave them in the block's
receipts, in chain order. A range or block this node does not hold (outside a `state` node's
window, beyond the head, or not indexed yet) answers -39006, so the proxy retries elsewhere
(an archive node for old blocks). Limits are named settings (`[[state_nodes]] logs = {…}`):
blocks per query, logs per answer, addresses or topics per position; exceeding one answers
-32005 saying which and, for too many logs, a range that fits.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import lmdb
import orjson

from chainstate.blockref import BlockRef
from chainstate.config import ConfigError
from chainstate.jsonrpc import (
    BLOCK_NOT_FOUND,
    DATABASE_FAILED,
    INVALID_PARAMS,
    SERVER_BUSY,
    JsonRpcError,
    params_list,
)
from chainstate.logfilter import (
    DEFAULT_MAX_LIST,
    LogFilter,
    invalid_range,
    parse_filter,
)
from chainstate.tasks import stop_task
from nodes.state.backfill import Backfill as BlockBackfill
from nodes.state.logindex import LogIndex, block_seeks, criteria_prefixes
from nodes.state.reads import Deferred, Reads
from nodes.state.store import Snapshot, StateStore
from nodes.state.vendor import VendorBlock

log = logging.getLogger(__name__)

DEFAULT_MAX_BLOCKS_PER_QUERY = 100_000  # reth's --rpc.max-blocks-per-filter
DEFAULT_MAX_LOGS_PER_RESPONSE = 20_000  # reth's --rpc.max-logs-per-response
# A query over at most INLINE_BLOCKS blocks is first tried on the event loop and given up
# after INLINE_LOGS logs (then it runs again in a thread): a small answer costs microseconds,
# less than the hop to a thread and back, and a large one never blocks the loop for long.
# The port's read loop (`in_loop`) also gives a query up past INLINE_BYTES of logs: only the
# dispatcher's batch counts answer bytes against batch_answer_bytes, so a batch of big answers
# must not be made in that loop.
INLINE_BLOCKS = 128
INLINE_LOGS = 256
INLINE_BYTES = 128 * 1024
FILTER_CACHE = 4096  # parsed filters kept, and filter shapes (then each cache restarts)
FILTER_CACHE_BYTES = 1024  # a filter longer than this as JSON is not kept
_NONE = orjson.Fragment(b"[]")  # no matching log


@dataclass(frozen=True, slots=True)
class LogSettings:
    """`[[state_nodes]] logs = {…}`; every limit with its default (docs/events.md)."""

    max_blocks_per_query: int = DEFAULT_MAX_BLOCKS_PER_QUERY
    max_logs_per_response: int = DEFAULT_MAX_LOGS_PER_RESPONSE
    max_log_query_list: int = DEFAULT_MAX_LIST  # addresses, or topics in one position
    backfill: bool = True  # index the blocks a store held before it had a log index

    @classmethod
    def from_config(cls, section: dict[str, Any]) -> LogSettings:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ConfigError(f"state node logs: unknown settings {unknown}")
        for name, value in section.items():
            default = cls.__dataclass_fields__[name].default
            if isinstance(default, bool):
                if not isinstance(value, bool):
                    raise ConfigError(f"state node logs.{name} must be true or false")
            elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"state node logs.{name} must be a positive integer")
        return cls(**section)


class _Query(NamedTuple):
    """A parsed filter and its criteria as the index keys them (sorted raw bytes), and
    their key prefixes (`criteria_prefixes`)."""

    filter: LogFilter
    addresses: list[bytes]
    topics: list[list[bytes] | None]
    prefixes: list[list[bytes]]
    single: list[bytes] | None  # the prefixes when each criterion has one (`keys_single`)
    block: int  # the one height `fromBlock` and `toBlock` both name, else -1
    seeks: list[bytes] | None  # with `block` and `single`: `block_seeks` (`block_keys`)


class LogMethods:
    """eth_getLogs over one store's log index."""

    def __init__(self, store: StateStore, index: LogIndex, settings: LogSettings) -> None:
        self.store = store
        self.index = index
        self.settings = settings
        self._filters: dict[bytes, _Query] = {}  # parsed filters by their JSON
        # The index cursor of the port's last snapshot: the store keeps one snapshot for the
        # loop's reads until a write begins, and opening a cursor costs more than a seek.
        self._cursor: tuple[Snapshot, lmdb.Cursor] | None = None
        self._shapes: dict[bytes, _Query] = {}  # the same, by their JSON without blocks

    async def eth_get_logs(self, params: Any) -> orjson.Fragment:
        query = self._parsed(params)
        small = self.query(query, inline=True)
        if small is None:
            small = await asyncio.to_thread(self.query, query)
        return orjson.Fragment(small)

    def port_read(self, reads: Reads, params: Any) -> orjson.Fragment:
        """eth_getLogs answered inside the read transaction of the read path's loop
        (`ReadPath.add_port_read`): a small answer costs less than the coroutine and task
        the dispatcher would spend on it. `Deferred` when the range or the answer is larger
        than the loop should read (INLINE_*): the dispatcher answers it then.

        One block by number (a poll block by block, most queries) is read here without
        `_query`'s range and limit checks, which one block cannot fail: only the index's
        covered range is looked at. A kept filter is looked up here, not in `_parsed`: the
        call would cost more than the lookup."""
        value = params[0] if params.__class__ is list and len(params) == 1 else None
        key = orjson.dumps(value) if value.__class__ is dict else None
        query = self._filters.get(key) if key is not None else None
        if query is None:
            query = self._parsed(params, key)
        snap = reads.snap
        txn = snap.txn
        seeks = query.seeks
        if seeks is not None:
            lo, hi = self.index.covered_read(txn)
            block = query.block
            if lo <= block <= hi:
                limit = self.settings.max_logs_per_response
                most = limit if limit < INLINE_LOGS else INLINE_LOGS
                kept = self._cursor
                if kept is None or kept[0] is not snap:
                    kept = self._cursor = (snap, self.index.keys_cursor(txn))
                keys = self.index.block_keys(txn, seeks, most + 1, kept[1])
                if not keys:
                    return _NONE
                small = self._answer_keys(txn, keys, block, INLINE_LOGS, INLINE_BYTES)
                if small is None:
                    raise Deferred
                return orjson.Fragment(small)
        small = self._query(txn, query, True, INLINE_BYTES)
        if small is None:
            raise Deferred
        return orjson.Fragment(small)

    def _parsed(self, params: Any, key: bytes | None = None) -> _Query:
        """The request's filter parsed, with its addresses and topics as the index keys
        them; remembered by the filter's value, as orjson writes it (dapps send the same
        filters again and again, and parsing one costs more than reading a block's logs).
        Only filters of at most FILTER_CACHE_BYTES are kept (the cache stays small).
        `key`: the JSON of `params`' one filter, already looked up and not kept."""
        if params.__class__ is list and len(params) == 1:
            value = params[0]
        else:
            (value,) = params_list(params, ["filter"])
        if key is None:
            key = orjson.dumps(value) if value.__class__ is dict else None
            query = self._filters.get(key) if key is not None else None
            if query is not None:
                return query
        if value is None:
            raise JsonRpcError(INVALID_PARAMS, "missing required parameter: filter")
        query = self._by_shape(value) if key is not None else None
        if query is None:
            query = self._query_of(parse_filter(value, max_list=self.settings.max_log_query_list))
        if key is not None and len(key) <= FILTER_CACHE_BYTES:
            _keep(self._filters, key, query)
        return query

    def _by_shape(self, value: dict[str, Any]) -> _Query | None:
        """A filter whose fields but its blocks were parsed before (a poll block by block
        sends the same criteria with new heights): the kept criteria, and the blocks parsed
        alone, with the same checks and errors as the whole filter (the criteria's come
        first either way). None for a filter with a `blockHash` or without blocks."""
        if "blockHash" in value:
            return None
        blocks: dict[str, Any] = {}
        rest: dict[str, Any] = {}
        for name, item in value.items():
            if name == "fromBlock" or name == "toBlock":
                blocks[name] = item
            else:
                rest[name] = item
        if not blocks:
            return None
        key = orjson.dumps(rest)
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._query_of(parse_filter(rest, max_list=self.settings.max_log_query_list))
            if len(key) <= FILTER_CACHE_BYTES:
                _keep(self._shapes, key, shape)
        ends = parse_filter(blocks)
        criteria = shape.filter
        flt = LogFilter(ends.from_ref, ends.to_ref, None, criteria.addresses, criteria.topics)
        return self._query_of(flt, shape)

    def _query_of(self, flt: LogFilter, shape: _Query | None = None) -> _Query:
        """`flt` with its criteria as the index keys them (`shape`'s, when given: a query
        of the same criteria)."""
        if shape is not None:
            addresses, topics, prefixes, single = shape[1:5]
        else:
            addresses = [bytes.fromhex(a[2:]) for a in sorted(flt.addresses or ())]
            topics = [
                None if t is None else [bytes.fromhex(x[2:]) for x in sorted(t)] for t in flt.topics
            ]
            prefixes = criteria_prefixes(addresses, topics)
            single = None
            if prefixes and all(len(options) == 1 for options in prefixes):
                single = [options[0] for options in prefixes]
        block, seeks = _one_block(flt), None
        if single is not None and block >= 0:
            seeks = block_seeks(single, block)
        return _Query(flt, addresses, topics, prefixes, single, block, seeks)

    def query(self, query: _Query, inline: bool = False) -> bytes | None:
        """The JSON array of matching logs (raises JsonRpcError); `inline`: None instead
        when the range or the answer is larger than the loop should read (INLINE_*)."""
        env = self.index.env
        if env is None:
            raise JsonRpcError(DATABASE_FAILED, "state store is closed")
        try:
            with env.begin() as txn:
                return self._query(txn, query, inline)
        except lmdb.Error as exc:
            log.error("log index read failed: %s", exc)
            raise JsonRpcError(DATABASE_FAILED, "log index read failed") from None

    def _query(
        self, txn: lmdb.Transaction, query: _Query, inline: bool, max_bytes: int | None = None
    ) -> bytes | None:
        seeks = query.seeks
        if seeks is not None:  # one block by number (a poll block by block): no `_range`
            lo, hi = self.index.covered_read(txn)
            block = query.block
            if lo <= block <= hi:
                budget = INLINE_LOGS if inline else None
                keys = self.index.block_keys(txn, seeks, self._most(budget) + 1)
                return self._answer_keys(txn, keys, block, budget, max_bytes) if keys else b"[]"
        start, end = self._range(txn, query.filter)
        if inline and end - start >= INLINE_BLOCKS:
            return None
        return self._collect(txn, query, start, end, INLINE_LOGS if inline else None, max_bytes)

    def _range(self, txn: lmdb.Transaction, flt: LogFilter) -> tuple[int, int]:
        lo, hi = self.index.covered_read(txn)
        if flt.block_hash is not None:
            height = self.index.height_of(txn, flt.block_hash)
            if height is None:
                raise self._unknown_block(flt.block_hash)
            return height, height
        start, end = _height(flt.from_ref, hi), _height(flt.to_ref, hi)
        if start > end:
            raise invalid_range(start, end)
        if hi < lo or start < lo or end > hi:
            raise self._outside(start, end, lo, hi)
        limit = self.settings.max_blocks_per_query
        if end - start + 1 > limit:
            raise JsonRpcError(
                SERVER_BUSY,
                f"query exceeds max block range {limit}: {end - start + 1} blocks "
                f"[{start:#x}, {end:#x}] (max_blocks_per_query)",
            )
        return start, end

    def _collect(
        self,
        txn: lmdb.Transaction,
        query: _Query,
        start: int,
        end: int,
        budget: int | None,
        max_bytes: int | None = None,
    ) -> bytes | None:
        limit = self.settings.max_logs_per_response
        if query.single is not None:
            return self._collect_single(txn, query.single, start, end, budget, max_bytes)
        out: list[bytes] = []
        size = 0
        for height, raw in self.index.scan_prefixed(txn, start, end, query.prefixes):
            if len(out) == limit:
                raise _too_many_logs(limit, start, height)
            if len(out) == budget:
                return None
            if max_bytes is not None:
                size += len(raw)
                if size > max_bytes:
                    return None
            out.append(raw)
        return b"[" + b",".join(out) + b"]"

    def _collect_single(
        self,
        txn: lmdb.Transaction,
        single: list[bytes],
        start: int,
        end: int,
        budget: int | None,
        max_bytes: int | None,
    ) -> bytes | None:
        """`_collect` for criteria of one prefix each: the matching keys as a list (one more
        than may be answered), then their logs; the same answers and limits."""
        most = self._most(budget) + 1
        if start == end:  # (a block by hash or by tag)
            keys = self.index.block_keys(txn, block_seeks(single, start), most)
        else:
            keys = self.index.keys_single(txn, single, start, end, most)
        return self._answer_keys(txn, keys, start, budget, max_bytes)

    def _most(self, budget: int | None) -> int:
        """How many logs an answer may hold: the limit, or the inline budget below it."""
        limit = self.settings.max_logs_per_response
        return limit if budget is None else min(limit, budget)

    def _answer_keys(
        self,
        txn: lmdb.Transaction,
        keys: list[bytes],
        start: int,
        budget: int | None,
        max_bytes: int | None,
    ) -> bytes | None:
        """The answer of the matching logs' keys (one more than may be answered: the
        limit's error, or None past the inline budget), their logs read."""
        limit = self.settings.max_logs_per_response
        if len(keys) > limit:
            raise _too_many_logs(limit, start, self.index.height_of_key(keys[limit]))
        if budget is not None and len(keys) > budget:
            return None
        raws = self.index.logs_of(txn, keys)
        if max_bytes is not None and sum(map(len, raws)) > max_bytes:
            return None
        return b"[" + b",".join(raws) + b"]"

    def _unknown_block(self, block_hash: str) -> JsonRpcError:
        height = self.store.height_of(block_hash)
        if height is None:
            return JsonRpcError(
                BLOCK_NOT_FOUND, f"unknown block {block_hash}: not known to this node"
            )
        return JsonRpcError(
            BLOCK_NOT_FOUND,
            f"block {block_hash} (height {height}) is outside this node's logs range",
        )

    def _outside(self, start: int, end: int, lo: int, hi: int) -> JsonRpcError:
        if hi < lo:
            return JsonRpcError(BLOCK_NOT_FOUND, "this node holds no indexed logs yet")
        bounds = self.store.bounds()
        pending = bounds is not None and lo > bounds[0]
        note = f" (blocks below {lo} are being indexed)" if pending else ""
        return JsonRpcError(
            BLOCK_NOT_FOUND,
            f"block range [{start}, {end}] is outside this node's logs range [{lo}, {hi}]{note}",
        )


def _keep(cache: dict[bytes, _Query], key: bytes, query: _Query) -> None:
    if len(cache) >= FILTER_CACHE:
        cache.clear()
    cache[key] = query


def _one_block(flt: LogFilter) -> int:
    """The height when the filter names one block by number in both ends, else -1."""
    start, end = flt.from_ref, flt.to_ref
    if start is None or end is None or start.number is None or start.number != end.number:
        return -1
    return start.number


def _height(ref: BlockRef | None, head: int) -> int:
    """A filter's tag or height on this node: `earliest` is 0, every other tag the head."""
    if ref is None or ref.tag is not None:
        return 0 if ref is not None and ref.tag == "earliest" else head
    assert ref.number is not None
    return ref.number


def _too_many_logs(limit: int, start: int, height: int) -> JsonRpcError:
    if height > start:
        retry = f", retry with the range {start:#x}-{height - 1:#x}"
    else:
        retry = f": block {height:#x} alone has more"
    return JsonRpcError(
        SERVER_BUSY, f"query exceeds max results {limit} (max_logs_per_response){retry}"
    )


class Backfill(BlockBackfill):
    """Indexes the logs of the blocks a store held before it had a log index."""

    what = "log index backfill"

    def __init__(self, node: Any, index: LogIndex) -> None:
        super().__init__(node)
        self.index = index

    def _todo(self) -> tuple[int, int] | None:
        bounds = self.node.store.bounds()
        env = self.index.env
        if bounds is None or env is None:
            return None
        with env.begin() as txn:
            lo, _ = self.index.covered(txn)
        return None if lo <= bounds[0] else (bounds[0], lo - 1)

    def _fill(self, txn: lmdb.Transaction, block: VendorBlock) -> bool:
        return self.index.backfilled(txn, block.number, block.hash, block.logs)


class LogService:
    """What `register` sets up on a node; `close()` stops the backfill."""

    def __init__(self, node: Any, settings: LogSettings) -> None:
        self.settings = settings
        self.index = LogIndex()
        node.store.attach(self.index)
        self.methods = LogMethods(node.store, self.index, settings)
        self.backfill = Backfill(node, self.index)
        self._task: asyncio.Task[None] | None = None
        if settings.backfill and self.backfill.needed():
            self._task = asyncio.create_task(self.backfill.run(), name=f"logs-backfill:{node.key}")

    async def close(self) -> None:
        await stop_task(self._task)
        self._task = None
        await self.backfill.close()


def register(node: Any) -> LogService:
    """Attach the log index to `node.store` and serve eth_getLogs on `node.dispatcher` and,
    when small, in the loop of the node's port (`node.reads`)."""
    service = LogService(node, LogSettings.from_config(node.settings.logs))
    node.dispatcher.register("eth_getLogs", service.methods.eth_get_logs)
    node.reads.add_port_read("eth_getLogs", service.methods.port_read)
    return service

"""The read path: JSON-RPC bodies of plain state reads answered at the store's speed.

Why not the generic Dispatcher for these: a balance read is one LMDB seek (~2 µs) and the
dispatcher's per-item machinery (a coroutine and a gather task per item, a read transaction
and a range read per item, regex parsing, int round trips) cost ten times that. Here:

1. the body is parsed once (orjson); a batch is answered item by item, in order, by one
   loop (`ReadPath._answer`) that every entry point shares: a body, parsed items, and the
   items the proxy in the same process checked or has the loop check;
2. the plain reads (`ReadPath.fast`) are plain functions called in that loop: no coroutine,
   no task, no exception on the success path; every other method (EVM, headers, vendor
   blocks, …) and every malformed envelope goes to the dispatcher, which answers exactly as
   before (errors included);
3. all the fast items of one body share one LMDB read transaction and one cursor, and the
   node's bounds are read once; on the event loop, the bodies between two writes share the
   store's kept one (`StateStore.snapshot`);
4. values stay in the store's encoding (minimal big-endian bytes) up to the answer's hex;
   parsed addresses, slots and block numbers are cached by their request text;
5. heights the hot view covers (`nodes/state/hot.py`) are answered from memory.

Errors of fast items are the same objects, codes and messages as the dispatcher's.
"""

from __future__ import annotations

import asyncio
import logging
from binascii import unhexlify
from collections.abc import Callable
from typing import Any

import lmdb
import orjson

from chainstate.blockref import TAGS, parse_block_ctx, parse_block_number_param
from chainstate.hexcodec import parse_address
from chainstate.jsonrpc import (
    DATABASE_FAILED,
    INTERNAL_ERROR,
    Dispatcher,
    Handler,
    JsonRpcError,
    params_list,
)
from nodes.state.hot import HotState
from nodes.state.methods import StateMethods, _require, _slot
from nodes.state.store import (
    ACCOUNT_PREFIX,
    F_BALANCE,
    F_CODE,
    F_NONCE,
    F_STORAGE,
    Snapshot,
    StateStore,
    oldest,
    out_of_range,
    seek,
)

log = logging.getLogger(__name__)

PARSE_CACHE = 65_536  # parsed addresses / slots / block numbers kept (then the cache restarts)
# A full address or slot cache admits nothing for this many misses, then restarts: requests
# spread over far more keys than it holds would otherwise insert and free on most reads
# (the same policy as the hot view's base cache).
PARSE_RESTART = 4 * PARSE_CACHE
# Every JUDGE_ITEMS items the read path judges each read cache (`CacheGate`); one judged not
# worth its lookups stays off for OFF_TIMES its capacity in items, then learns again.
JUDGE_ITEMS = 4096
_TICK = 256  # items counted down per body between two adds to the clock (a small int: no
# allocation per body)
OFF_TIMES = 4
PARSE_FLOOR = 0.25  # a parse cache is kept on while its full hit rate would reach this
# The hot view's base cache: a hit saves a seek, but every miss pays the lookup and
# `remember_base` and every value kept is memory read at random; on a big store read at
# random, a full cache answering a quarter of the reads still costs more than none.
BASE_FLOOR = 0.5
_HEAD = -1  # a cached block parameter meaning "the head"
_SLOW = object()  # an item the dispatcher answers
_IDS = (int, str)  # the ids of items checked or answered strictly (not bool, float or None)
_ANY_IDS = (str, int, float)  # the ids the read path answers otherwise (and a missing one)
_PARAMS = (list, dict)


class CacheGate:
    """Whether a read cache is worth consulting and filling, judged by its hit rate.

    A store of millions of keys read at random misses a cache of thousands on nearly every
    read: then each read pays a lookup in a big table, an insert and a kept key on top of
    the seek, for a few percent of hits. The gate counts the cache's misses (its only cost
    on the hit path is the reader's count of items per body). The share of items that miss
    in its first window, nearly empty, is the share that reaches it at all (not every item
    reads through every cache); in each later window, what that share has fallen by is
    what the cache answers, which extrapolated to a full cache (hits grow at most linearly
    with the keys held) is its hit rate when full: below `floor`, the cache is emptied and
    left off (a lookup in an empty table, no admission) for `OFF_TIMES` its capacity in
    items; then it is on again and learns. Switching off only empties a cache, so answers
    never depend on it."""

    __slots__ = ("cache", "capacity", "cold", "floor", "mark", "misses", "off_until")

    def __init__(self, cache: dict[Any, Any], capacity: int, floor: float) -> None:
        self.cache = cache
        self.capacity = capacity
        self.floor = floor
        self.misses = 0  # lookups the cache could not answer, ever (its owner counts them)
        self.mark = 0  # `misses` at the last judgement
        self.off_until = -1  # the item count at which an off cache is on again (-1: on)
        self.cold = -1.0  # the share of items that missed in the first window (-1: to come)

    @property
    def on(self) -> bool:
        return self.off_until < 0

    def judge(self, clock: int, items: int) -> bool:
        """Whether the cache is on for the next window; `items` read since the last call,
        `clock` items read in all."""
        if self.off_until >= 0:
            if clock < self.off_until:
                return False
            self.off_until = -1
            self.mark = self.misses
            self.cold = -1.0
            return True
        share = (self.misses - self.mark) / items
        self.mark = self.misses
        held = len(self.cache)
        if self.cold <= 0:  # (none yet, or a window in which no item reached the cache)
            self.cold = share
            return True
        if held == 0:
            return True
        if (self.cold - share) * self.capacity >= self.floor * self.cold * held:
            return True
        self.cache.clear()
        self.off_until = clock + OFF_TIMES * self.capacity
        return False


def _consume(future: asyncio.Future[Any]) -> None:
    """Mark the result of a call nobody waits for as seen (no "never retrieved" log)."""
    if not future.cancelled():
        future.exception()


class _Call:
    """An eth_call item queued on the EVM executor: its id and the future of its result."""

    __slots__ = ("future", "rid", "wanted")

    def __init__(self, rid: Any, future: Any, wanted: bool) -> None:
        self.rid = rid
        self.future = future
        self.wanted = wanted  # not a notification


class _Landing:
    """A single eth_call of the node's port, queued on the EVM executor with this in place
    of a future (`Executor.enqueue`'s sink): its result becomes the answer's bytes in `out`
    as the executor delivers it, with no future and callback of its own per call."""

    __slots__ = ("out", "path", "rid", "settled", "wanted")

    def __init__(
        self,
        path: ReadPath,
        rid: Any,
        wanted: bool,
        out: asyncio.Future[bytes],
        settled: Callable[[], Any] | None,
    ) -> None:
        self.path = path
        self.rid = rid
        self.wanted = wanted  # not a notification (read with `rid` by `_call_answer`)
        self.out = out
        self.settled = settled

    def done(self) -> bool:
        return self.out.done()

    def set_result(self, result: Any) -> None:
        out = self.out
        if out.done():
            return
        try:
            answer = self.path._call_answer(self, result)  # type: ignore[arg-type]
            if self.settled is not None:
                self.settled()
            out.set_result(orjson.dumps(answer) if answer is not None else b"")
        except asyncio.CancelledError:
            out.cancel()
        except Exception as exc:  # (never into the executor's loop over a job's calls)
            out.set_exception(exc)

    set_exception = set_result  # (`_call_answer` answers an exception too)


def _as_list(answers: list[Any]) -> list[Any]:
    return answers


def _as_one(answers: list[Any]) -> bytes:
    """A single request's answer as the port writes it (b"": a notification's none)."""
    return orjson.dumps(answers[0]) if answers[0] is not None else b""


def _as_batch(answers: list[Any]) -> bytes:
    out = [answer for answer in answers if answer is not None]
    return orjson.dumps(out) if out else b""


def _cancel(futures: list[Any]) -> None:
    for future in futures:
        future.cancel()


_BLOCK_TAGS = {tag: (0 if tag == "earliest" else _HEAD) for tag in TAGS}


def quantity(raw: bytes | None) -> str:
    """A stored integer (minimal big-endian bytes) as a hex quantity."""
    return "0x" + (raw.hex().lstrip("0") or "0") if raw else "0x0"


def word(raw: bytes | None) -> str:
    """A stored integer as a 32-byte word."""
    return "0x" + raw.hex().rjust(64, "0") if raw else "0x" + "0" * 64


def data(raw: bytes | None) -> str:
    return "0x" + raw.hex() if raw else "0x"


def _args(params: Any, names: list[str]) -> list[Any]:
    """`params_list`, without a copy when the params are already a full positional list."""
    if params.__class__ is list and len(params) == len(names):
        return params
    return params_list(params, names)


class Reads:
    """The reads of one body: one snapshot of the store, the hot view in front of it."""

    __slots__ = ("earliest", "earliest_key", "head", "hot", "snap")

    def __init__(self, snap: Snapshot, hot: HotState) -> None:
        self.snap = snap
        self.hot = hot
        self.earliest, self.head = snap.bounds or (0, -1)  # head -1: no block yet
        self.earliest_key = self.earliest.to_bytes(8, "big")  # (as a version key ends)

    def checked(self, height: int) -> int:
        """`height` when the node holds it, else -39006."""
        if self.earliest <= height <= self.head:
            return height
        raise out_of_range(height, None if self.head < 0 else (self.earliest, self.head))

    def value(self, prefix: bytes, height: int) -> bytes | None:
        """Raw value of a field or slot at a height already checked against the bounds."""
        hot = self.hot
        if hot.lo <= height <= hot.hi:
            value = hot.value(prefix, height)
            if value is not None:
                return value
            # Not written in [lo, height] and not cached: the value as of lo - 1 holds.
            base_height = hot.lo - 1
            earliest = self.earliest
            if base_height >= earliest:
                snap = self.snap  # (its `value`, without the call: most reads of a big store)
                cur = snap.accounts if len(prefix) == ACCOUNT_PREFIX else snap.cursor
                if base_height == earliest:  # (a `state` node's view always starts there)
                    value = oldest(cur, prefix, prefix + self.earliest_key) or b""
                else:
                    value = seek(cur, prefix, base_height) or b""
                if hot.caching:
                    hot.remember_base(prefix, value)
                return value
        return self.snap.value(prefix, height)


Fast = Callable[[Reads, Any], Any]


class Deferred(Exception):
    """Raised by a read of the node's own port (`ReadPath.port`) that is too large to answer
    in the loop: the item then goes to the dispatcher, which answers it off the loop."""


class ReadPath:
    """`handle_body` for the state node: fast plain reads, the dispatcher for the rest."""

    def __init__(
        self,
        store: StateStore,
        hot: HotState,
        methods: StateMethods,
        dispatcher: Dispatcher,
        *,
        max_batch: int,
    ) -> None:
        self.store = store
        self.hot = hot
        self.methods = methods
        self.dispatcher = dispatcher
        self.max_batch = max_batch
        self.evm: Any = None  # the EVM methods (`call_now`), set when the node registers them
        # The parse caches (empty while their gate has them off) and their gates.
        self._addresses: dict[str, bytes] = {}
        self._slots: dict[str, bytes] = {}
        self._address_gate = CacheGate(self._addresses, PARSE_CACHE, PARSE_FLOOR)
        self._slot_gate = CacheGate(self._slots, PARSE_CACHE, PARSE_FLOOR)
        self._base_gate = CacheGate(hot.base, hot.base_entries, BASE_FLOOR)
        self._items = 0  # items read (the gates' clock), up to the last `_tick`
        self._left = _TICK  # items until the next `_tick` (counted down per body)
        self._judged = 0  # `_items` at the last judgement
        self._misses_full = 0  # parses not cached (a full cache) since a cache last restarted
        self._heights: dict[str, int] = dict(_BLOCK_TAGS)
        self._last: Reads | None = None  # the reads of the last snapshot (`_reads`)
        self.fast: dict[str, Fast] = {
            "eth_blockNumber": self.eth_block_number,
            "eth_getBalance": self.eth_get_balance,
            "eth_getTransactionCount": self.eth_get_transaction_count,
            "eth_getCode": self.eth_get_code,
            "eth_getStorageAt": self.eth_get_storage_at,
            "getAddressBalance": self.get_address_balance,
            "getAddressNonce": self.get_address_nonce,
            "getAddressCode": self.get_address_code,
            "getStorageAt": self.get_storage_at,
        }
        # The reads of the node's own port (a body over HTTP): the plain reads and what the
        # node adds (`add_port_read`: eth_getLogs over its index). The proxy in the same
        # process is given the plain reads only: it routes and answers the others its way.
        self.port: dict[str, Fast] = dict(self.fast)

    def add_port_read(self, method: str, read: Fast | None) -> None:
        """Answer `method` in the port's loop with `read` (which may raise `Deferred`);
        None: by the dispatcher again."""
        if read is None:
            self.port.pop(method, None)
        else:
            self.port[method] = read

    def handlers(self) -> dict[str, Handler]:
        """The plain reads as the dispatcher's handlers, for callers of the dispatcher itself
        (`Dispatcher.call`, a body given to it directly): the same functions as the read
        path's loop, each call with its own read transaction. The read path sends the
        dispatcher only what it does not answer itself, never a well-formed plain read."""
        return {method: self._handler(read) for method, read in self.fast.items()}

    def _reads(self, snap: Snapshot) -> Reads:
        """The reads over `snap`: the last ones again while the store keeps the same
        snapshot (until a write begins), so a body costs no new object."""
        last = self._last
        if last is None or last.snap is not snap:
            last = self._last = Reads(snap, self.hot)
        return last

    def _handler(self, read: Fast) -> Handler:
        async def handler(params: Any) -> Any:
            self._left -= 1
            snap = self.store.snapshot()  # (-39005 when it fails, as in the loop)
            try:
                return read(self._reads(snap), params)
            except lmdb.Error as exc:
                log.error("state store read failed: %s", exc)
                self.store.discard(snap)
                raise JsonRpcError(DATABASE_FAILED, "state store read failed") from None
            finally:
                snap.close()

        return handler

    # the body ----------------------------------------------------------------------------

    async def handle_body(self, body: bytes) -> bytes:
        """Answer a raw JSON-RPC body (b"" when only notifications came)."""
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            return await self.dispatcher.handle_body(body)  # answers the parse error
        port = self.port
        if payload.__class__ is dict:
            answer = self._answer(None, [payload], [], strict=False, table=port)[0]  # type: ignore[index]
            if answer is _SLOW:
                answer = await self.dispatcher.handle_item(payload)
            elif answer.__class__ is _Call:
                answer = (await self._finish([answer]))[0]
            return orjson.dumps(answer) if answer is not None else b""
        if payload.__class__ is not list or not payload or len(payload) > self.max_batch:
            return await self.dispatcher.handle_body(body)  # answers the envelope error
        answers: list[Any] = self._answer(None, payload, [], strict=False, table=port)  # type: ignore[assignment]
        slow = [i for i, answer in enumerate(answers) if answer is _SLOW]
        calls = [i for i, answer in enumerate(answers) if answer.__class__ is _Call]
        if slow or calls:
            slow_done, calls_done = await asyncio.gather(
                self.dispatcher.handle_items([payload[i] for i in slow]),  # (byte budget)
                self._finish([answers[i] for i in calls]),
            )
            for i, answer in zip([*slow, *calls], [*slow_done, *calls_done], strict=True):
                answers[i] = answer
        out = [answer for answer in answers if answer is not None]
        return orjson.dumps(out) if out else b""

    async def _finish(self, calls: list[_Call]) -> list[Any]:
        """The answers of queued eth_calls (None for notifications): one gather over their
        futures, no task per call."""
        if not calls:
            return []
        results = await asyncio.gather(*(c.future for c in calls), return_exceptions=True)
        answer = self._call_answer
        return [answer(call, result) for call, result in zip(calls, results, strict=True)]

    def _call_answer(self, call: _Call, result: Any) -> Any:
        """The answer of one queued eth_call given its future's result (or exception)."""
        if not call.wanted:
            return None
        if isinstance(result, dict):
            if result["ok"]:
                return {"jsonrpc": "2.0", "id": call.rid, "result": result["output"]}
            err = result["error"]
            exc = JsonRpcError(err["code"], err["message"], err.get("data"))
            return self.dispatcher.error(call.rid, exc)
        if isinstance(result, JsonRpcError):
            return self.dispatcher.error(call.rid, result)
        if isinstance(result, asyncio.CancelledError):
            raise result
        log.error("eth_call failed: %r", result)
        return self.dispatcher.error(call.rid, JsonRpcError(INTERNAL_ERROR, "Internal error"))

    def answer_later(self, items: list[Any]) -> asyncio.Future[list[Any]] | None:
        """`answer_items` for items that may include eth_calls: the future of the answers, in
        their order (None for a notification), set from the calls' futures' callbacks (no task,
        no coroutine); None when an item needs `handle_body` (not a plain read or eth_call, a
        malformed envelope, an id orjson may have changed, a call the EVM methods take the
        usual way: a state override, workers not started). For the proxy in the same process.
        A batch declined after some of its calls were queued has them run for nothing (only a
        batch that mixes such a call with others): the caller sends it the usual way."""
        return self._later(items, self.fast, _as_list)

    def answer_port(
        self, body: bytes, settled: Callable[[], Any] | None = None
    ) -> bytes | asyncio.Future[bytes] | None:
        """For the node's own port: `answer_now`'s answer, or the future of the answer when
        the body's items are plain reads, eth_getLogs and eth_calls, set from the calls'
        futures' callbacks (the server writes it from there: no task); None when the body
        needs `handle_body` (as `answer_later` declines items). `settled` is called just
        before such a future gets its answer (a metric: no callback of its own)."""
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        if payload.__class__ is dict:
            if payload.get("method") == "eth_call" and self.evm is not None:
                return self._one_call(payload, settled)
            return self._later([payload], self.port, _as_one, settled)
        if payload.__class__ is not list or not payload or len(payload) > self.max_batch:
            return None
        return self._later(payload, self.port, _as_batch, settled)

    def _one_call(
        self, item: dict[str, Any], settled: Callable[[], Any] | None
    ) -> bytes | asyncio.Future[bytes] | None:
        """`_later([item], self.port, _as_one)` for a single eth_call (the most common body
        that waits for the EVM), without the loop over items: the same answer, or None when
        `handle_body` answers it (no `"jsonrpc": "2.0"`, an id or params of another type,
        a call the EVM methods take the usual way)."""
        rid = item.get("id")
        params = item.get("params", [])
        if (
            item.get("jsonrpc") != "2.0"
            or not (rid is None or rid.__class__ in _IDS)
            or params.__class__ not in _PARAMS
        ):
            return None
        wanted = "id" in item
        out: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        landing = _Landing(self, rid, wanted, out, settled)
        try:
            queued = self.evm.call_now(params, landing)
        except JsonRpcError as exc:
            return orjson.dumps(self.dispatcher.error(rid, exc)) if wanted else b""
        if queued is None:
            return None
        # (The port's server never gives up on `out`, so unlike `_later`'s it does not take
        # the call off the EVM queue when cancelled.)
        return out

    def _later(
        self,
        items: list[Any],
        table: dict[str, Fast],
        shape: Callable[[list[Any]], Any],
        settled: Callable[[], Any] | None = None,
    ) -> Any:
        """The answers of `items` (`table`'s reads and eth_calls) as `shape` makes them of
        the list, at once when no eth_call is among them, else the future of it (`settled`
        called just before it is set); None when an item needs `handle_body`."""
        calls_ok = self.evm is not None
        for item in items:
            if item.__class__ is not dict or item.get("id").__class__ is float:
                return None
            method = item.get("method")
            if method.__class__ is not str or (
                table.get(method) is None and (method != "eth_call" or not calls_ok)
            ):
                return None
        answers: list[Any] = self._answer(None, items, [], strict=False, table=table)  # type: ignore[assignment]
        calls = [i for i, answer in enumerate(answers) if answer.__class__ is _Call]
        if any(answer is _SLOW for answer in answers):
            for i in calls:
                answers[i].future.add_done_callback(_consume)
            return None
        if not calls:
            if shape is _as_list:  # (the proxy's: a future either way)
                out: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                out.set_result(answers)
                return out
            return shape(answers)
        out = asyncio.get_running_loop().create_future()
        waiting = [len(calls)]

        def landed(_: Any) -> None:
            waiting[0] -= 1
            if waiting[0] or out.done():
                return
            try:
                for i in calls:
                    call = answers[i]
                    future = call.future
                    result = future.exception() or future.result()
                    answers[i] = self._call_answer(call, result)
                if settled is not None:
                    settled()
                out.set_result(shape(answers))
            except asyncio.CancelledError:
                out.cancel()

        for i in calls:
            answers[i].future.add_done_callback(landed)
        # A caller that stops waiting (the proxy's attempt timed out: it asks another node)
        # takes its calls off the EVM queue: a call not started yet is not run (`_take`).
        futures = [answers[i].future for i in calls]
        out.add_done_callback(lambda done: _cancel(futures) if done.cancelled() else None)
        return out

    def answer_now(self, body: bytes) -> bytes | None:
        """The answer, computed without awaiting, when every item of the body is a plain
        read (a server can then write it at once, with no task); None otherwise, and the
        body goes to `handle_body`. Ids come back as the client wrote them: a body with an
        id orjson may have changed (a float) is left to `handle_body` and the port's
        `restore_ids`, so the common case needs no scan of the body for such ids."""
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        if payload.__class__ is dict:
            answers = self._answer(None, [payload], [], table=self.port)
            if answers is None:
                return None
            return orjson.dumps(answers[0]) if answers[0] is not None else b""
        if payload.__class__ is not list or not payload or len(payload) > self.max_batch:
            return None
        answers = self._answer(None, payload, [], table=self.port)
        if answers is None:
            return None
        out = [answer for answer in answers if answer is not None]
        return orjson.dumps(out) if out else b""

    def answer_items(self, items: list[Any], errors: list[int] | None = None) -> list[Any] | None:
        """The answers of parsed request objects, in their order (None for a notification),
        computed without awaiting; None when an item needs `handle_body`: not a plain read,
        or an id orjson may have changed (a float). For callers that parsed the body
        already: the data port above, and the proxy in the same process, which passes
        `errors` to be told the positions of the error answers (so it need not look)."""
        return self._answer(None, items, [] if errors is None else errors)

    def answer_keyed(
        self,
        method: str,
        size: int,
        keys: dict[str, Any],
        items: list[Any],
        errors: list[int],
        found: list[Any],
    ) -> list[Any] | None:
        """`answer_checked(method, items, errors)` for items the caller has not checked: the
        loop that answers them checks each too. Each must be a request object of `method`
        with an int or string id, `"jsonrpc": "2.0"` and a list of `size` params whose last
        is a key of `keys`; `found` gets `keys[last]` of each, in order. For the proxy in the
        same process, which keeps a route per block text: checking and looking up here, in
        the loop the node makes anyway, costs it less than passes of its own over the items
        before the call. None as soon as an item is not such (or needs `handle_body`, as
        `answer_checked`)."""
        return self._answer(method, items, errors, size, keys, found)

    def _answer(
        self,
        method: str | None,
        items: list[Any],
        errors: list[int],
        size: int = 0,
        keys: dict[str, Any] | None = None,
        found: list[Any] | None = None,
        strict: bool = True,
        table: dict[str, Fast] | None = None,
    ) -> list[Any] | None:
        """The one loop of the read path: the answers of `items` in order (None for a
        notification), the positions of the error answers of plain reads appended to
        `errors`. Parameterised by what the caller knows of the items:

        - `method` None: any items; each one's method is looked up;
        - `method` given: every item is a request object of that method with an int or
          string id (the caller checked it: `answer_checked`), None when it is no plain
          read; with `keys`, the loop checks that itself (and `size`: as `answer_keyed`
          says) and appends each item's route to `found`;
        - `strict` (the default): None as soon as an item is not a plain read this loop
          answers (the caller sends the body to `handle_body`), a float id included (orjson
          may have changed how it was written); else (`handle_body`, `answer_later`) such an
          item is _SLOW, for the dispatcher, or an eth_call queued on the EVM (`_Call`);
        - `table`: the reads looked up for `method` None (default the plain reads; the
          node's own port passes `port`), any of which may raise `Deferred` (strict: None;
          else _SLOW).

        One read transaction and cursor for all the items, opened by the first read."""
        self._left -= len(items)
        if self._left < 0:
            self._tick()
        fast = self.fast if table is None else table
        one = None if method is None else fast.get(method)
        if one is None and method is not None:
            return None  # not a plain read
        ids = _IDS if strict else _ANY_IDS
        out: list[Any] = []
        reads: Reads | None = None
        snap: Snapshot | None = None  # opened by the first read, inside its `try`
        read = one  # (each item's, when `method` is None)
        try:
            for item in items:
                if keys is not None:  # (`answer_keyed`)
                    try:
                        params = item["params"]
                        rid = item["id"]
                        if (
                            item["method"] != method
                            or params.__class__ is not list
                            or len(params) != size
                            or rid.__class__ not in _IDS
                            or item["jsonrpc"] != "2.0"
                        ):
                            return None
                        found.append(keys[params[-1]])  # type: ignore[union-attr]
                    except (KeyError, TypeError, IndexError):  # (not a dict, a key missing, …)
                        return None
                elif one is not None:  # (`answer_checked`)
                    params = item.get("params", [])
                    if item.get("jsonrpc") != "2.0" or params.__class__ not in _PARAMS:
                        return None
                    rid = item["id"]
                else:
                    if item.__class__ is not dict or item.get("jsonrpc") != "2.0":
                        if strict:
                            return None
                        out.append(_SLOW)
                        continue
                    name = item.get("method")
                    read = fast.get(name) if name.__class__ is str else None
                    rid = item.get("id")
                    params = item.get("params", [])
                    if not (rid is None or rid.__class__ in ids) or params.__class__ not in _PARAMS:
                        if strict:
                            return None
                        out.append(_SLOW)
                        continue
                    if read is None:
                        if strict:
                            return None
                        out.append(self._call(name, rid, params, "id" in item))
                        continue
                    if "id" not in item:  # a notification: no answer, nothing to read
                        out.append(None)
                        continue
                try:
                    if reads is None:
                        snap = self.store.snapshot()
                        reads = self._reads(snap)
                    out.append({"jsonrpc": "2.0", "id": rid, "result": read(reads, params)})
                except Deferred:
                    if strict:
                        return None
                    out.append(_SLOW)
                except JsonRpcError as exc:
                    errors.append(len(out))
                    out.append(self.dispatcher.error(rid, exc))
                except lmdb.Error as exc:
                    log.error("state store read failed: %s", exc)
                    if snap is not None:
                        self.store.discard(snap)
                    errors.append(len(out))
                    failed = JsonRpcError(DATABASE_FAILED, "state store read failed")
                    out.append(self.dispatcher.error(rid, failed))
        finally:
            if snap is not None:
                snap.close()
        return out

    # answer_checked(method, items, errors): `answer_items(items, errors)` for items the caller
    # checked already, every one a request object (a dict) of `method` with an int or string
    # id. For the proxy in the same process, which looked at every item of a batch to route
    # it: the method is looked up once, not per item, and what the caller checked is not
    # checked again (a fifth of a 10-item batch's cost). The same answers and error positions
    # as `answer_items`, and None when an item needs `handle_body` (not a plain read, no
    # `"jsonrpc": "2.0"`, params neither a list nor an object). It is the loop itself, with
    # no call in between: it answers the proxy's single requests.
    answer_checked = _answer

    def _call(self, method: str, rid: Any, params: Any, wanted: bool) -> Any:
        """An eth_call queued on the EVM executor (`_Call`), its error answer, or _SLOW
        (any other method, or an eth_call the EVM methods want to take the usual way)."""
        evm = self.evm
        if method != "eth_call" or evm is None:
            return _SLOW
        try:
            future = evm.call_now(params)
        except JsonRpcError as exc:
            return self.dispatcher.error(rid, exc) if wanted else None
        return _SLOW if future is None else _Call(rid, future, wanted)

    # parsing with caches ---------------------------------------------------------------

    def _tick(self) -> None:
        """Add the items counted down to the clock; judge the caches every `JUDGE_ITEMS`."""
        self._items += _TICK - self._left
        self._left = _TICK
        if self._items - self._judged >= JUDGE_ITEMS:
            self._judge()

    def _judge(self) -> None:
        """Turn each read cache on or off for the next window (`CacheGate`)."""
        clock, items = self._items, self._items - self._judged
        self._judged = clock
        self._address_gate.judge(clock, items)
        self._slot_gate.judge(clock, items)
        hot, gate = self.hot, self._base_gate
        gate.misses = hot.misses
        on = gate.judge(clock, items)
        if on != hot.caching:
            hot.set_caching(on)

    # An address or slot missing from its cache that is "0x" and exactly 40 / 64 hex digits
    # (how clients write them) is decoded by `unhexlify`, the parsers (and their errors) for
    # the rest. A store of millions of keys read at random misses the caches on most reads:
    # this costs a third of the parsers' regex matches, and `unhexlify` half of
    # `bytes.fromhex` (it skips no whitespace; the exact length makes exactly the bytes). The
    # test is inline: a call would cost as much as the decoding.

    def _address(self, value: Any) -> bytes:
        key = self._addresses.get(value) if value.__class__ is str else None
        if key is None:
            if value.__class__ is str and len(value) == 42 and value.startswith("0x"):
                try:
                    key = unhexlify(value[2:])
                except ValueError:  # (binascii.Error: a character that is no hex digit)
                    key = None
            if key is None:
                key = bytes.fromhex(parse_address(_require(value, "address"))[2:])
            gate = self._address_gate
            if gate.off_until < 0:  # (`_keep` would not keep it: no call)
                self._keep(gate, value, key)
        return key

    def _keep(self, gate: CacheGate, value: str, key: bytes) -> None:
        """`key` kept as `value`'s parse, unless the gate has the cache off (it stays empty)
        or the cache is full: then it admits nothing until `PARSE_RESTART` misses have
        passed, and starts again empty."""
        if gate.off_until >= 0:
            return
        gate.misses += 1
        cache = gate.cache
        if len(cache) < PARSE_CACHE:
            cache[value] = key
            return
        self._misses_full += 1
        if self._misses_full >= PARSE_RESTART:
            self._misses_full = 0
            cache.clear()

    def _slot(self, value: Any) -> bytes:
        key = self._slots.get(value) if value.__class__ is str else None
        if key is None:
            if value.__class__ is str and len(value) == 66 and value.startswith("0x"):
                try:
                    key = unhexlify(value[2:])
                except ValueError:
                    key = None
            if key is None:
                key = _slot(value).to_bytes(32, "big")
            gate = self._slot_gate
            if gate.off_until < 0:
                self._keep(gate, value, key)
        return key

    def _height(self, reads: Reads, value: Any) -> int:
        """The height an eth_* block parameter names, checked against the snapshot."""
        if value is None:
            return reads.checked(reads.head)
        height = self._heights.get(value) if value.__class__ is str else None
        if height is None:
            ref = parse_block_number_param(value)  # -39007 when malformed
            if ref.number is None or ref.contains:
                return reads.checked(self.methods.resolve(ref))
            height = ref.number
            if value.__class__ is str:
                if len(self._heights) >= PARSE_CACHE:
                    self._heights = dict(_BLOCK_TAGS)
                self._heights[value] = height
        elif height == _HEAD:
            return reads.checked(reads.head)
        return reads.checked(height)

    def _ctx_height(self, reads: Reads, value: Any) -> int:
        """The height a vendor `blockCtx` names (omitted: the head)."""
        if value is None:
            return reads.checked(reads.head)
        return reads.checked(self.methods.resolve(parse_block_ctx(value)))

    # eth namespace ---------------------------------------------------------------------

    def eth_block_number(self, reads: Reads, params: Any) -> str:
        params_list(params, [])
        return hex(reads.checked(reads.head))

    def eth_get_balance(self, reads: Reads, params: Any) -> str:
        addr, block = _args(params, ["address", "blockNumber"])
        address = self._address(addr)
        return quantity(reads.value(address + F_BALANCE, self._height(reads, block)))

    def eth_get_transaction_count(self, reads: Reads, params: Any) -> str:
        addr, block = _args(params, ["address", "blockNumber"])
        address = self._address(addr)
        return quantity(reads.value(address + F_NONCE, self._height(reads, block)))

    def eth_get_code(self, reads: Reads, params: Any) -> str:
        addr, block = _args(params, ["address", "blockNumber"])
        address = self._address(addr)
        return data(reads.value(address + F_CODE, self._height(reads, block)))

    def eth_get_storage_at(self, reads: Reads, params: Any) -> str:
        addr, position, block = _args(params, ["address", "position", "blockNumber"])
        address = self._address(addr)
        slot = self._slot(position)
        return word(reads.value(address + F_STORAGE + slot, self._height(reads, block)))

    # vendor namespace ------------------------------------------------------------------

    def get_address_balance(self, reads: Reads, params: Any) -> str:
        addr, ctx = _args(params, ["address", "blockCtx"])
        address = self._address(addr)
        return quantity(reads.value(address + F_BALANCE, self._ctx_height(reads, ctx)))

    def get_address_nonce(self, reads: Reads, params: Any) -> int:
        addr, ctx = _args(params, ["address", "blockCtx"])
        address = self._address(addr)
        raw = reads.value(address + F_NONCE, self._ctx_height(reads, ctx))
        return int.from_bytes(raw or b"", "big")

    def get_address_code(self, reads: Reads, params: Any) -> str:
        addr, ctx = _args(params, ["address", "blockCtx"])
        address = self._address(addr)
        return data(reads.value(address + F_CODE, self._ctx_height(reads, ctx)))

    def get_storage_at(self, reads: Reads, params: Any) -> str:
        addr, position, ctx = _args(params, ["address", "position", "blockCtx"])
        address = self._address(addr)
        slot = self._slot(position)
        return word(reads.value(address + F_STORAGE + slot, self._ctx_height(reads, ctx)))

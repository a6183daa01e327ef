"""The JSON-RPC engine: admit → parse → target block → choose → send → classify → retry.

`Engine.handle(chain_id, body, headers)` answers one client body and is the in-process entry
point (the workspace calls it). A pool over its in-flight limit refuses the body at once
(proxy/admission.py). Every request item then goes through one loop (`_route`), for single
requests and batches alike: each round chooses a node per pending item (items that the same
nodes can serve share one pick), sends one body per chosen node (proxy/attempts.py: the
client's bytes when they can go as they are, else a sub-batch with ids rewritten to
positions), classifies every answer (proxy/outcome.py) and keeps what the outcome says to
retry for the next round, up to `max_attempts` rounds. A single request is forwarded as the
client's bytes and the node's bytes returned without re-encoding; they are only peeked at for
the retryable codes (-39006, -39008).

`Engine.start` is the data listener's entry: the same steps, run synchronously from the
server's callback for a single request until one needs to wait. A plain read's first attempt
is written to an idle node connection there, with no task; only a retry, a timeout or the read
path's waiting continue in a task, from the step reached (docs/proxy.md).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import operator
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from itertools import repeat
from operator import itemgetter
from typing import Any

import orjson
from opentelemetry import trace

from chainstate.blockref import MAX_HEIGHT, BlockRef
from chainstate.inproc import is_inproc
from chainstate.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    JsonRpcError,
    check_request,
    cut,
    error_response,
    exact_ids,
    request_id,
    restore_ids,
)
from proxy import buffers, nesting, outcome
from proxy.admission import Admission
from proxy.attempts import BATCH, Attempts, Group
from proxy.breaker import CLOSED
from proxy.face import public, public_raw
from proxy.methods import LEADER_FALLBACK, LocalMethod, MethodSpec, MethodTable
from proxy.metrics import ProxyMetrics
from proxy.mirror import Mirrors
from proxy.model import Node, Pool, normalize_pool
from proxy.reads import MAX_KEYED_BYTES, Plan, Reads
from proxy.routes import MAX_ROUTES, UNCACHED, PoolRoutes, QuickRoute, RouteCache
from proxy.select import NoEligibleNode, Selector
from proxy.settings import ProxySettings
from proxy.state import RoutingState
from proxy.tenancy.nodebudget import limited
from proxy.upstream import Upstream, UpstreamError

log = logging.getLogger(__name__)
access_log = logging.getLogger("chainstate.proxy.access")
SOURCE_HEADERS = ("x-vendor-biz", "x-vendor-source", "x-vendor-source-host", "x-vendor-env")
NO_NODE_KEY = "-"  # node label of items no node answered
COALESCED = "coalesced"  # node label of items that shared an identical read's answer
UNKNOWN_METHOD = "unknown"  # method label of items whose method is not served
MAX_HEADER_VALUE = 256  # longer client header values are cut in logs and spans
MAX_CHAIN_IDS = 1024  # distinct raw chain ids whose normalized pool id is remembered
# Single request bodies this large are parsed in a turn of the event loop of their own
# (`Engine._large`): parsing 1 MiB takes ~1-3 ms, and a client sending many such bodies at
# once must not hold the loop for all of their steps in one go.
LARGE_BODY = 1 << 20
_UNREAD = object()  # `Engine.start`: the body is not parsed yet
# A client's highest block seen: `latest` is never answered below it (docs/proxy.md)
MIN_BLOCK = "x-min-block"


# Answers that show the block a transaction was mined in. The Leader's execution client knows
# a block before the state nodes have ingested it; until a `latest` read can be answered at
# that block, the transaction is shown as not mined yet, so a client that saw its receipt
# can read the state it produced (read-your-writes; docs/proxy.md).
UNMINED_FIELDS = {
    "eth_getTransactionReceipt": None,  # the whole receipt: null, as for a pending transaction
    "eth_getTransactionByHash": ("blockHash", "blockNumber", "transactionIndex"),
}


def hide_unreadable(method: str, answer: dict[str, Any], readable: int | None) -> bool:
    """Show the transaction of `answer` as pending when its block is above `readable`
    (None: no reader to wait for). Returns whether `answer` was changed."""
    result = answer.get("result")
    if readable is None or not isinstance(result, dict):
        return False
    try:
        number = int(result.get("blockNumber"), 16)
    except (TypeError, ValueError):
        return False  # pending already, or not a transaction object
    if number <= readable:
        return False
    fields = UNMINED_FIELDS[method]
    answer["result"] = None if fields is None else {**result, **dict.fromkeys(fields)}
    return True


def _cut(value: str | None) -> str | None:
    return None if value is None else value[:MAX_HEADER_VALUE]


def _dumps_error(rid: Any, exc: JsonRpcError) -> bytes:
    return orjson.dumps(error_response(rid, exc.code, exc.message, exc.data))


def _usable_single(raw: bytes) -> bool:
    """A second attempt's answer to a single request may win unless it asks for a retry."""
    return not outcome.of_raw(raw).retry


def _usable_batch(raw: bytes) -> bool:
    return True


Answer = tuple[int, bytes] | tuple[int, bytes, bytes]  # (status, body[, header lines])
# Answers a whole client body the engine hands over: (pool id, body, headers) -> Answer.
Divert = Callable[[str, bytes, Mapping[str, str]], Awaitable[Answer]]


class Admitted:
    """A client body's pool, with its place among the pool's requests in flight taken."""

    __slots__ = ("chain", "pool")

    def __init__(self, chain: str, pool: Pool) -> None:
        self.chain = chain
        self.pool = pool


class Ctx:
    """One client request as it goes through the steps."""

    __slots__ = (
        "chain",
        "early",
        "heads",
        "keep",
        "least",
        "methods",
        "nodes",
        "own_ids",
        "pool",
        "reserved",
        "tally",
    )

    def __init__(
        self,
        chain: str,
        pool: Pool,
        early: Callable[[bytes], Any] | None = None,
        tally: Any = None,
    ) -> None:
        self.chain = chain
        self.pool = pool
        # The client's usage tally when tenancy follows the request (proxy/tenancy/usage.py):
        # each attempt sent to a node adds one to its `upstream`.
        self.tally = tally
        # Writes the client's answer now (the data listener's Request.answer_early); set
        # while a node's bytes, when final, are the answer exactly as the node sent them.
        self.early = early
        self.methods: list[str] = []
        self.nodes: list[str] = []  # every node tried (access log)
        self.reserved = 0  # answer bytes held for it in the buffered-bytes budget
        self.heads: Any = None  # the request's resolved heads (proxy/heads.RequestHeads)
        self.least: int | None = None  # the client's lowest acceptable `latest` (MIN_BLOCK)
        self.keep: tuple[tuple[str, int], ...] | None = None  # a whole batch to cache: methods
        # Every item of the batch has its own int or string id (no two alike): sub-batches
        # go with the client's ids rather than positions (`_send_group`).
        self.own_ids = False

    def answer_early(self, status: int, raw: bytes) -> None:
        """A node's answer, the moment it is complete (from its connection's callback): when
        it is final as it is (a 200 whose bytes ask for no retry, the same test as step 5
        makes), the client gets it now, and the books, metrics and logs of the request follow
        after the write instead of before it (the added latency at c=1, docs/proxy.md)."""
        write = self.early
        # (An answer naming a -390xx code is never final as it is: it may be retried or, for
        # a standard method, shown with a standard code: proxy/face.py.)
        if write is not None and status == 200 and raw and raw.find(b"-390") < 0:
            if raw.find(b'"error"') >= 0 and limited(raw):  # a rate limit: retried elsewhere
                return
            self.early = None
            write(raw)


class Item:
    """One request object (of a batch, or the single one) and its retry bookkeeping."""

    __slots__ = (
        "err",
        "last",
        "method",
        "notif",
        "obj",
        "plan",
        "pos",
        "prefer_archive",
        "reason",
        "ref",
        "rid",
        "spec",
        "tried",
    )

    def __init__(
        self,
        pos: int,
        obj: dict[str, Any],
        rid: Any,
        method: str,
        spec: MethodSpec,
        ref: BlockRef | None,
        notif: bool,
    ) -> None:
        self.pos = pos
        self.obj = obj
        self.rid = rid  # the client's id as sent (orjson.Fragment where a float would change it)
        self.method = method
        self.spec = spec
        self.ref = ref
        self.notif = notif
        self.tried: list[Node] = []
        self.prefer_archive = False
        # The last answer that asked for a retry: a dict, or the node's bytes for a single
        # request (answered as they are when the attempts run out).
        self.last: dict[str, Any] | bytes | None = None
        self.err: UpstreamError | None = None  # last transport failure
        self.reason = ""  # the outcome that asked for the next attempt (retry metric label)
        self.plan: Plan | None = None  # what the read path decided (proxy/reads.py)

    def retry_later(self, node: Node, answer: dict[str, Any] | bytes, result: Any) -> None:
        """Keep an answer that asks for another attempt (and, for an item pinned to a block
        by hash, a node that does not know that block: `Engine._retry_choice`)."""
        self.last, self.reason, self.prefer_archive = answer, result.name, result.prefer_archive
        plan = self.plan
        if result.prefer_archive and plan is not None and plan.fallback is not None:
            if plan.missing is None:
                plan.missing = [node]
            else:
                plan.missing.append(node)


# One valid request item of a batch as parsed, `Item`'s arguments: (position, object, id as
# sent, method, spec, target block, notification). Items the read path does not touch stay
# rows unless the one loop needs them (`Engine._send_plain`).
Row = tuple[int, dict[str, Any], Any, str, MethodSpec, BlockRef | None, bool]


class _Sent:
    """The items `Engine._send_plain` sends as one body, as `Attempts.exchange` sees them:
    one entry whose nodes tried are every item's (a hedge adds its node here)."""

    __slots__ = ("tried",)

    def __init__(self, node: Node) -> None:
        self.tried = [node]


class Engine:
    def __init__(
        self,
        settings: ProxySettings,
        state: RoutingState,
        upstream: Upstream,
        selector: Selector,
        metrics: ProxyMetrics,
        mirrors: Mirrors,
        tracer: trace.Tracer | None = None,
        reads: Reads | None = None,
    ) -> None:
        self.settings = settings
        self.reads = reads  # heads, cache and coalescing (None: every item goes to a node)
        self.state = state
        self.upstream = upstream
        self.selector = selector
        self.metrics = metrics
        self.mirrors = mirrors
        self.methods = MethodTable(settings.extra_methods)
        self.tracer = None if tracer is None or isinstance(tracer, trace.NoOpTracer) else tracer
        self.attempts = Attempts(settings, upstream, selector, metrics, self.tracer)
        self.routes = RouteCache(selector)  # first attempts' candidates (proxy/routes.py)
        self.admission = Admission(
            settings.admission_wait, settings.max_pool_inflight, settings.upstream_connections
        )
        self.inflight = 0
        self._rounds = settings.max_attempts
        self._max_body = settings.max_body_bytes
        self._max_batch = settings.max_batch_items
        self._pool_ids: dict[str, str | None] = {}  # raw /:chainId → pool id (a pure function)
        self._admitted: dict[str, Admitted] = {}  # pool id → its Admitted (`admit_resolved`)
        self._divert: Divert | None = None
        self._large_turn = asyncio.Lock()  # one large body parsed per turn (`_large`)

    def divert(self, methods: frozenset[str], handle: Divert) -> None:
        """Bodies naming one of `methods` (not served by the method table) are answered by
        `handle` instead (the proxy's filters and subscriptions, proxy/events.py). Free for
        other bodies: the table raises LocalMethod only where it would answer "Method not
        found", and the whole body is handed over before anything was forwarded."""
        self.methods.local = methods
        self._divert = handle

    # ---- entry ---------------------------------------------------------------------------

    def resolve(self, chain_id: str) -> tuple[str, Pool] | None:
        """The (normalized chain, pool) a data path `/:chainId` addresses, or None."""
        pool_id = self._pool_ids.get(chain_id, "")
        if pool_id == "":
            pool_id = normalize_pool(chain_id)
            if len(self._pool_ids) >= MAX_CHAIN_IDS:
                self._pool_ids.clear()
            self._pool_ids[chain_id] = pool_id
        if pool_id is None:
            return None
        chain = pool_id.partition("-")[0]
        if pool_id != chain:  # an explicit versioned pool, e.g. /1337-blue
            pool = self.state.pools.get(pool_id)
        else:
            pool = self.state.pool_for_chain(chain)
        return None if pool is None else (chain, pool)

    def _unknown(self, chain_id: str) -> str:
        pool_id = normalize_pool(chain_id)
        version = self.state.versions.get(pool_id) if pool_id else None
        if version:
            pool = f"{pool_id}-{version}"
            return f"chain {pool_id} is in version mode ({version}) but pool {pool} has no nodes"
        return f"unknown chain {chain_id[:80]!r}: no node pool is configured for it"

    def admit(self, chain_id: str) -> Admitted | Answer:
        """Step 0, synchronous (the data listener answers a refusal without a task): the
        pool a body may go to, its place among the pool's requests in flight taken; or the
        answer at once: 404 for an unknown chain, 503 + Retry-After when the pool is over
        its in-flight limit (proxy/admission.py)."""
        return self.admit_resolved(chain_id, self.resolve(chain_id))

    def admit_resolved(self, chain_id: str, found: tuple[str, Pool] | None) -> Admitted | Answer:
        """`admit` with what `resolve(chain_id)` gave, for a caller that asked already."""
        if found is None:
            return 404, _dumps_error(None, JsonRpcError(INVALID_REQUEST, self._unknown(chain_id)))
        chain, pool = found
        budget = self.upstream.budget  # (answers in flight, and those clients have not read)
        if budget is not None and budget.used > budget.limit:  # the process's budget: 503 now
            self.metrics.refused(chain)
            return 503, _dumps_error(None, buffers.over_budget(budget)), b"Retry-After: 1\r\n"
        if pool.inflight:  # (nothing in flight is under any limit: none worked out, as at c=1)
            admission, now = self.admission, time.perf_counter()
            limit = admission.limit(pool, now)  # (the refusal is worked out only when over it)
            if limit and pool.inflight >= limit:
                refused = admission.check(pool, now)
                if refused is not None:
                    self.metrics.refused(chain)
                    return 503, _dumps_error(None, refused), refused.header
        pool.inflight += 1
        # One Admitted per pool (never changed by its users): no object per request.
        admitted = self._admitted.get(pool.id)
        if admitted is None or admitted.pool is not pool or admitted.chain != chain:
            if len(self._admitted) >= MAX_CHAIN_IDS:
                self._admitted.clear()
            admitted = self._admitted[pool.id] = Admitted(chain, pool)
        return admitted

    async def handle(
        self,
        chain_id: str,
        body: bytes,
        headers: Mapping[str, str],
        admitted: Admitted | None = None,
        early: Callable[[bytes], Any] | None = None,
        tally: Any = None,
    ) -> Answer:
        """Answer one client body: (HTTP status, response body; b"" with 204), and extra
        header lines when the pool refuses it (`Retry-After` with a 503). `admitted`: what
        `admit(chain_id)` gave, when the caller asked already. `early(body)`: writes a 200
        answer to the client before this returns (a single request's node answer, final
        as the node sent it, goes out from the node connection's callback); the returned
        answer is then the same bytes, which the caller no longer writes."""
        started = time.perf_counter()
        if admitted is None:
            entry = self.admit(chain_id)
            if type(entry) is tuple:
                return entry
            admitted = entry  # type: ignore[assignment]
        self.inflight += 1
        try:
            if self.tracer is None:
                return await self._handle(admitted, body, headers, None, started, early, tally)
            with self.tracer.start_as_current_span("jsonrpc.request") as span:
                return await self._handle(admitted, body, headers, span, started, early, tally)
        finally:
            self.inflight -= 1
            admitted.pool.inflight -= 1

    async def _handle(
        self,
        admitted: Admitted,
        body: bytes,
        headers: Mapping[str, str],
        span: Any,
        started: float,
        early: Callable[[bytes], Any] | None = None,
        tally: Any = None,
    ) -> Answer:
        chain, pool = admitted.chain, admitted.pool
        ctx = Ctx(chain, pool, None, tally)
        self.metrics.client(headers.get("client-id"))
        shape = "single"
        size = 1
        least = headers.get(MIN_BLOCK)
        bad = None if least is None else _least(least, ctx)
        try:
            if bad is not None:
                status, out = 200, _dumps_error(None, bad)
            elif len(body) > self._max_body:
                msg = f"request body larger than max_body_bytes={self._max_body} bytes"
                status, out = 413, _dumps_error(None, JsonRpcError(INVALID_REQUEST, msg))
            elif self.reads is not None and body[:1] == b"[" and self._quiet():
                shape = "batch"
                status, out = await self._cached_batch(ctx, body)
            else:
                try:
                    payload = orjson.loads(body)
                except orjson.JSONDecodeError as exc:
                    payload = None
                    msg = f"Parse error: {cut(str(exc))}"
                    status, out = 200, _dumps_error(None, JsonRpcError(PARSE_ERROR, msg))
                else:
                    if isinstance(payload, list):
                        shape, size = "batch", len(payload)
                        status, out = await self._batch(ctx, payload, body)
                    else:
                        ctx.early = early
                        status, out = await self._single(ctx, payload, body)
        except LocalMethod:  # raised only once divert() has set the handler
            assert self._divert is not None
            return await self._divert(pool.id, body, headers)
        finally:
            if ctx.reserved:
                self.upstream.budget.release(ctx)  # type: ignore[union-attr]
        return self._books(ctx, shape, size, (status, out), started, headers, span)

    def _books(
        self,
        ctx: Ctx,
        shape: str,
        size: int,
        answer: tuple[int, bytes],
        started: float,
        headers: Mapping[str, str],
        span: Any = None,
    ) -> tuple[int, bytes]:
        """The request's own books once it is answered: its latency, span and access log."""
        elapsed = time.perf_counter() - started
        self.metrics.observe(ctx.chain, shape, elapsed)
        if span is not None:
            self._annotate(span, ctx, size, headers)
        if access_log.isEnabledFor(logging.INFO):
            self._log(ctx, size, answer[0], elapsed, headers)
        return answer

    # ---- the synchronous start (the data listener) ---------------------------------------

    def start(
        self,
        chain_id: str,
        body: bytes,
        headers: Mapping[str, str],
        admitted: Admitted,
        answer: Callable[[Answer], Any],
        later: Callable[[Awaitable[Answer]], Any],
        payload: Any = _UNREAD,
        tally: Any = None,
    ) -> Answer | Awaitable[Answer] | None:
        """`handle` for the data listener, without a task where none is needed: a single
        request is parsed, checked, planned and chosen for by the same steps, synchronously,
        and when its first attempt needs no task (`Attempts.send_now`: a plain-http node,
        an idle connection, nothing to hedge or time out early; nothing the read path waits
        for) the client's bytes go to the node now and None is returned. The node's answer
        then goes to `answer` from the node connection's callback and the books run after
        it; an answer that needs another attempt (or none in time) continues in a task
        given to `later`. Anything else returns what `handle` does: a coroutine (a batch, a
        trace, a read that waits for an identical one, ...) or an answer made at once.
        `payload`: the body parsed already (`_large`)."""
        if self.tracer is not None or body[:1] != b"{" or len(body) > self._max_body:
            return self.handle(chain_id, body, headers, admitted, answer, tally)
        started = time.perf_counter()
        if payload is _UNREAD:
            if len(body) >= LARGE_BODY:
                return self._large(chain_id, body, headers, admitted, tally)
            try:
                payload = orjson.loads(body)
            except orjson.JSONDecodeError:
                return self.handle(chain_id, body, headers, admitted, answer, tally)
        pool = admitted.pool
        quick = self._quick(pool, payload) if not pool.mirrors else None
        self.inflight += 1
        chosen = None
        if quick is not None:
            _, node, taken = quick
            if taken is not None:  # written: the request's objects come after the write
                sent = time.perf_counter()
                taken[1].transport.write(taken[0].request(body))
                self._sent_first(
                    admitted, payload, body, quick, sent, started, headers, answer, later, tally
                )
                self.metrics.client(headers.get("client-id"))
                return None
            chosen = node  # (picked already: the general path goes on with it)
        elif headers.get(MIN_BLOCK) is not None:  # (checked, and kept: `handle`)
            self.inflight -= 1
            return self.handle(chain_id, body, headers, admitted, answer, tally)
        ctx = Ctx(admitted.chain, pool, answer, tally)
        try:
            first = self._single_item(ctx, payload, body)
        except LocalMethod:  # raised only once divert() has set the handler
            first = self._diverted(ctx, body, headers)  # type: ignore[assignment]
        except BaseException:
            self._leave(ctx)
            raise
        if type(first) is tuple:  # answered at once: invalid, or a ready result
            result = self._done(ctx, first, started, headers)
        elif type(first) is Item:
            result = self._first_attempt(ctx, first, body, started, headers, later, chosen)
        else:
            result = first  # type: ignore[assignment]
        # Counted once the node has the request (at c=1 every µs before the write is the
        # client's): the same count as `handle` makes first.
        self.metrics.client(headers.get("client-id"))
        return result

    async def _large(
        self,
        chain_id: str,
        body: bytes,
        headers: Mapping[str, str],
        admitted: Admitted,
        tally: Any = None,
    ) -> Answer:
        """`start` for a body of LARGE_BODY bytes or more: it is parsed in a turn of the
        event loop of its own, one such body per turn, then checked, planned and sent as
        `start` does (to a node in process as the objects parsed). A turn runs every
        callback ready when it began before it reads the sockets again, so eight 5 MB
        eth_calls arriving together would parse one after another before any other client
        is read (~8 x 7 ms, several times that on a loaded 2-core machine); one per turn, the
        others are served between them. (Parsing is the one step that must stay on the
        loop: the node's decode of the calldata is the EVM worker's, nothing is written
        again or hashed for the cache at this size.)"""
        try:
            async with self._large_turn:  # (its release wakes the next one a turn later)
                try:
                    payload = orjson.loads(body)
                except orjson.JSONDecodeError:
                    payload = _UNREAD  # (`handle` answers the parse error)
        except BaseException:
            admitted.pool.inflight -= 1  # (taken by `admit`: given back as `handle` does)
            raise
        if payload is _UNREAD:
            return await self.handle(chain_id, body, headers, admitted, None, tally)
        done: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        step = self.start(
            chain_id, body, headers, admitted, _settles(done), _continues(done), payload, tally
        )
        if step is None:
            return await done
        return await step if inspect.isawaitable(step) else step  # type: ignore[return-value]

    def _first_attempt(
        self,
        ctx: Ctx,
        item: Item,
        body: bytes,
        started: float,
        headers: Mapping[str, str],
        later: Callable[[Awaitable[Answer]], Any],
        chosen: Node | None = None,
    ) -> Answer | Awaitable[Answer] | None:
        """Steps 3-4 of a checked request object for `start`: its node chosen and the
        client's bytes written to it now (None), when nothing needs a task; else the rest
        of the steps as a coroutine (or the answer, when no node is eligible). An item the
        read path planned goes the same way in a pool with in-process readers when it waits
        for no identical read: it is sent pinned as planned, and its answer lands in the read
        path (`_landed`). (Over HTTP alone, planned items keep the task: choosing them at
        once moved the weighted shares, tests/proxy/test_failsafe.py.) `chosen`: the node
        `_quick` picked for it already (a plain item: not planned)."""
        plan = item.plan
        if ctx.early is None or (
            plan is not None and (plan.flight is not None or not _has_inproc(ctx.pool))
        ):
            return self._finish(ctx, self._single_sent(ctx, item, body), started, headers)
        answers: list[Any] = [None]
        pinned = False
        if plan is not None:  # what `_follow` does for an item that leads its read
            sent = item.obj
            item.obj, item.ref = plan.obj, plan.ref
            pinned = plan.obj is not sent
        group = self._first_group(ctx, item, answers, chosen)
        if group is None:  # no eligible node: answered by `_give_up`
            answer = self._single_answer(ctx, item, body, None, answers)
            self._landed(item, None, answers)
            return self._done(ctx, answer, started, headers)
        if pinned:  # written only for a node that takes bytes (in process: the objects)
            written = None
            if not is_inproc(group.node.entry.url):
                written = self._pinned_body(ctx, item, answers)
                if type(written) is tuple:
                    return self._done(ctx, written, started, headers)
            body = written  # type: ignore[assignment]  (None: another attempt, a sub-batch)
        then = self._then(ctx, item, group, body, answers, started, headers, later)
        if self.attempts.send_now(ctx, group, body, then):
            return None
        resumed = self._resume(ctx, item, body, answers, 1, [item], {group.node: group})
        return self._finish(ctx, resumed, started, headers)

    def _then(
        self,
        ctx: Ctx,
        item: Item,
        group: Group,
        body: bytes | None,
        answers: list[Any],
        started: float,
        headers: Mapping[str, str],
        later: Callable[[Awaitable[Answer]], Any],
    ) -> Callable[[Node, bytes | None, UpstreamError | None], None]:
        """What a first attempt `start` sent does with its outcome: the answer and the
        books, or the rest of the steps in a task given to `later`."""

        def then(node: Node, raw: bytes | None, exc: UpstreamError | None) -> None:
            try:
                step = self._first_landed(ctx, item, group, body, answers, node, raw, exc)
            except Exception as error:  # answered as the task path answers a failed handler
                self._landed(item, None, answers)
                step = _reraise(error)
            if type(step) is not tuple:
                later(self._finish(ctx, step, started, headers))  # type: ignore[arg-type]
                return
            respond = ctx.early  # None when written from the node connection's callback
            ctx.early = None
            result = self._done(ctx, step, started, headers)  # type: ignore[arg-type]
            if respond is not None:
                respond(result)

        return then

    # ---- the first write before any object (`start`'s plain single request) -------------

    def _quick(self, pool: Pool, payload: Any) -> tuple[QuickRoute, Node, Any] | None:
        """A request object whose first attempt the general path would write to its node
        at once, unchanged, with nothing planned (`start` → `_single_item` → `_first_attempt`
        → `Attempts.send_now`): (its kept route, the node picked, an idle connection to it,
        or None when the attempt needs the general path's task after all: the node picked
        stays its choice); None for any other body, before anything is picked or counted.

        Why: at c=1 every µs before the write to the node is the client's, and the general
        path built the request's objects (Ctx, Item, the read path's heads, Group, the
        answer's callbacks: 29 Python functions to the write, 9 here) before it; a plain
        read needs none of them to know where its bytes go (bench/README.md "Issue 14,
        session 9")."""
        if type(payload) is not dict:
            return None
        try:  # (subscripts, not four `get` calls: ~0.2k instructions less per request)
            if payload["jsonrpc"] != "2.0":
                return None
            method, rid, params = payload["method"], payload["id"], payload["params"]
        except KeyError:  # (a notification, a bad envelope: the general path's)
            return None
        if type(method) is not str or (type(rid) is not int and type(rid) is not str):
            return None  # (a notification, a float id, a bad envelope: the general path's)
        if type(params) is not list or not params or None in params:
            return None
        text = params[-1]
        if type(text) is not str:
            return None
        routes = self.routes.routes(pool)
        route = routes.quick.get((method, len(params), text))
        if route is None:
            route = self._quick_route(pool, routes, method, params)
            if route is None:
                return None
        try:
            for index, check, name in route.checks:  # what `MethodTable.target` checks
                check(params[index] if index < len(params) else None, name)
        except Exception:  # the general path answers it (the same error)
            return None
        height = route.height
        if height is not None:  # the read path pins a height whose hash it knows
            view = self.reads.heads.views.get(pool.id)  # type: ignore[union-attr]
            if view is not None and view.hashes.get(height) is not None:
                return None
        nodes = route.nodes
        if len(nodes) > 1:
            node = self.selector.pick(nodes)
            if node.breaker.state is not CLOSED or not node.entry.url.startswith("http://"):
                return route, node, None
            return route, node, self.attempts.connection_now(pool, node, method, len(nodes))
        # One candidate (no race due: `connection_now`'s answer without its calls): its
        # connections are found only for a plain-http URL (`Upstream.hosts`)
        node = nodes[0]
        if node.budget.rate:  # (`Selector.pick` takes it when it chooses)
            node.budget.spend()
        host = self.upstream.hosts.get(node.entry.url)
        if host is None or node.breaker.state is not CLOSED:
            return route, node, None
        conn = host.take()
        return route, node, None if conn is None else (host, conn)

    def _quick_route(
        self, pool: Pool, routes: PoolRoutes, method: str, params: list[Any]
    ) -> QuickRoute | None:
        """The route of a request object as the general path finds it (the method table's
        target, the read path's rule, the route cache's candidates), kept in `routes` when
        every such request goes the same way: a read at a height or `Contains` named by its
        last param, with eligible nodes. None (not kept): anything else."""
        try:
            spec, ref = self.methods.target(method, params)
        except Exception:  # an invalid item, a diverted method: the general path's
            return None
        if ref is None or spec.writer or spec.block is None or spec.block_at != len(params) - 1:
            return None
        if ref.tag is not None or ref.hash is not None or spec.block == "logs":
            return None  # a tag is pinned per request, a hash looked up per request
        nodes, cls = self.routes.candidates(pool, routes, method, spec, ref)
        if not nodes or cls is UNCACHED:
            return None
        reads = self.reads
        planned = reads is not None and method in reads.methods and not ref.contains
        if planned and ref.number is None:
            return None
        route = QuickRoute(method, spec, ref, nodes, ref.number if planned else None)
        quick = routes.quick
        if len(quick) >= MAX_ROUTES:
            quick.clear()
        quick[(method, len(params), params[-1])] = route
        return route

    def _sent_first(
        self,
        admitted: Admitted,
        payload: dict[str, Any],
        body: bytes,
        quick: tuple[QuickRoute, Node, Any],
        sent: float,
        started: float,
        headers: Mapping[str, str],
        answer: Callable[[Answer], Any],
        later: Callable[[Awaitable[Answer]], Any],
        tally: Any = None,
    ) -> None:
        """After `start` wrote the client's bytes (at `sent`) to the node `_quick` picked,
        on its connection (this call, with its arguments, is after the write: off the
        client's wait): the request's objects as `_first_attempt` makes them, and the
        answer's wait (`Attempts.sent_now`)."""
        route, node, taken = quick
        ctx = Ctx(admitted.chain, admitted.pool, answer, tally)
        method = route.method
        ctx.methods.append(method)
        item = Item(0, payload, payload["id"], method, route.spec, route.ref, False)
        item.tried.append(node)
        group = Group(node, [item], route.nodes, method)
        then = self._then(ctx, item, group, body, [None], started, headers, later)
        self.attempts.sent_now(ctx, group, taken, sent, then)

    def _first_landed(
        self,
        ctx: Ctx,
        item: Item,
        group: Group,
        body: bytes | None,
        answers: list[Any],
        node: Node,
        raw: bytes | None,
        exc: UpstreamError | None,
    ) -> tuple[int, bytes] | Awaitable[tuple[int, bytes]]:
        """Step 5 of a first attempt `start` sent: the answer, or the rest of the steps
        (another attempt) as a coroutine."""
        if exc is not None:
            pending, out = self._transport_failed(ctx, [item], exc, answers), None
        elif raw is not None:
            pending, out = self._raw_answer(ctx, group, node, raw, answers, True)
        else:  # not sent after all (a closed idle connection): the usual way, same node
            return self._resume(ctx, item, body, answers, 1, [item], {node: group})
        if pending:
            return self._resume(ctx, item, body, answers, 2, pending)
        self._landed(item, out, answers)
        return self._single_answer(ctx, item, body, out, answers)

    def _landed(self, item: Item, out: bytes | None, answers: list[Any]) -> None:
        """A planned single item's final answer handed to the read path (as
        `_route_planned` does when its attempts end)."""
        plan = item.plan
        if plan is not None and (plan.lead or plan.store):
            self.reads.land(plan, out if out is not None else answers[0])  # type: ignore[union-attr]

    async def _resume(
        self,
        ctx: Ctx,
        item: Item,
        body: bytes | None,
        answers: list[Any],
        attempt: int,
        pending: list[Item],
        chosen: dict[Node, Group] | None = None,
    ) -> tuple[int, bytes]:
        """The attempts of a single request from `attempt` on (`_route`; `_route_planned`
        for an item the read path planned), and its answer."""
        route = self._route if item.plan is None else self._route_planned
        out = await route(ctx, pending, body, answers, True, attempt, chosen)
        return self._single_answer(ctx, item, body, out, answers)

    async def _finish(
        self, ctx: Ctx, step: Awaitable[tuple[int, bytes]], started: float, headers: Any
    ) -> Answer:
        """The rest of a request `start` began, in a task: its answer, then its books."""
        try:
            answer = await step
        except BaseException:
            self._leave(ctx)
            raise
        return self._done(ctx, answer, started, headers)

    async def _diverted(self, ctx: Ctx, body: bytes, headers: Mapping[str, str]) -> Answer:
        try:
            return await self._divert(ctx.pool.id, body, headers)  # type: ignore[misc]
        finally:
            self._leave(ctx)

    def _done(
        self, ctx: Ctx, answer: tuple[int, bytes], started: float, headers: Mapping[str, str]
    ) -> tuple[int, bytes]:
        self._leave(ctx)
        return self._books(ctx, "single", 1, answer, started, headers)

    def _leave(self, ctx: Ctx) -> None:
        """A request `start` took is no longer in flight (what `handle` does on its way out)."""
        if ctx.reserved:
            self.upstream.budget.release(ctx)  # type: ignore[union-attr]
        self.inflight -= 1
        ctx.pool.inflight -= 1

    def _quiet(self) -> bool:
        """Whether a whole batch may be answered from the cache without being parsed:
        nothing to trace or log per item (nor to mirror: checked per pool)."""
        return self.tracer is None and not access_log.isEnabledFor(logging.INFO)

    # ---- step 1: parse -------------------------------------------------------------------

    async def _single(self, ctx: Ctx, payload: Any, body: bytes) -> tuple[int, bytes]:
        """One request object: forwarded as the client's bytes, answered with the node's
        bytes unless the attempts ran out or the read-your-writes view needs otherwise."""
        first = self._single_item(ctx, payload, body)
        if type(first) is tuple:
            return first
        return await self._single_sent(ctx, first, body)  # type: ignore[arg-type]

    def _single_item(self, ctx: Ctx, payload: Any, body: bytes) -> Item | tuple[int, bytes]:
        """Steps 1-2 of a request object, synchronous: its Item (with the read path's Plan,
        if any), or its answer when it is invalid or the read path has it ready."""
        bad = check_request(payload)
        if bad is not None:
            self.metrics.request(ctx.chain, UNKNOWN_METHOD, NO_NODE_KEY, "invalid")
            return 200, _dumps_error(_exact_id(payload, body, request_id(payload)), bad)
        method = payload["method"]
        notif = "id" not in payload
        try:
            spec, ref = self.methods.target(method, payload.get("params"))
        except JsonRpcError as exc:
            label = method if method in self.methods.specs else UNKNOWN_METHOD
            self.metrics.request(ctx.chain, label, NO_NODE_KEY, "invalid")
            if notif:
                return 204, b""
            return 200, _dumps_error(_exact_id(payload, body, payload.get("id")), exc)
        ctx.methods.append(method)
        if ctx.pool.mirrors:
            self.mirrors.offer_single(ctx.pool, method, body)
        rid = payload.get("id")
        if type(rid) is float:  # as the client wrote it (`_exact_id`: checked as a dict)
            rid = exact_ids(body)
        if notif or spec.writer or spec.mempool or type(rid) is orjson.Fragment:
            ctx.early = None  # the answer is not the node's bytes as they are (see below)
        item = Item(0, payload, rid, method, spec, ref, notif)
        if self.reads is not None and not notif:
            keyed = len(body) <= MAX_KEYED_BYTES
            try:
                plan = self.reads.plan(self._heads(ctx), method, spec, ref, payload, keyed)
            except JsonRpcError as exc:  # params too deep to key (proxy/nesting.py)
                self.metrics.request(ctx.chain, method, NO_NODE_KEY, "invalid")
                return 200, _dumps_error(rid, exc)
            if plan is not None:
                if type(plan) is not Plan:  # a ready result: cached, or the pinned head
                    self.metrics.request(ctx.chain, method, _source(plan), "ok")
                    return 200, orjson.dumps({"jsonrpc": "2.0", "id": rid, "result": plan})
                item.plan = plan
        return item

    async def _single_sent(self, ctx: Ctx, item: Item, body: bytes) -> tuple[int, bytes]:
        """Steps 2-5 of a checked request object: the read it waits for, or its attempts."""
        answers: list[Any] = [None]
        sent = body
        plan = item.plan
        if plan is not None:
            payload = item.obj
            shared = await self._follow(ctx, item, plan)
            if shared is not None:
                return 200, shared
            sent = body if item.obj is payload else self._pinned_body(ctx, item, answers)
            if type(sent) is tuple:
                return sent
            out = await self._route_planned(ctx, [item], sent, answers, single=True)  # type: ignore[arg-type]
        else:
            out = await self._route(ctx, [item], sent, answers, single=True)
        return self._single_answer(ctx, item, body, out, answers)

    def _pinned_body(self, ctx: Ctx, item: Item, answers: list[Any]) -> bytes | tuple[int, bytes]:
        """The JSON of a single item the read path changed (its block pinned), or its
        answer when it is too deep to write again: -32602, handed to the reads waiting for
        it as none (proxy/nesting.py; the key checked its params, not other members)."""
        try:
            return orjson.dumps(item.obj)
        except TypeError:
            self._landed(item, None, answers)
            self.metrics.request(ctx.chain, item.method, NO_NODE_KEY, "invalid")
            return 200, _dumps_error(item.rid, nesting.invalid())

    def _single_answer(
        self, ctx: Ctx, item: Item, body: bytes | None, out: bytes | None, answers: list[Any]
    ) -> tuple[int, bytes]:
        """A request object's answer: the node's bytes (`out`), else what `answers` holds.
        (`body`: the bytes sent, for an id orjson would change; None only where none is.)"""
        notif, rid, spec = item.notif, item.rid, item.spec
        if out is None:
            answer = answers[0]
            if answer is None:  # a notification
                return 204, b""
            out = answer if type(answer) is bytes else orjson.dumps(answer)
            if spec.standard and out.find(b"-390") >= 0:  # (a node's code: proxy/face.py)
                out = public_raw(spec, out, lambda: self._held(ctx.pool, item.ref))
        else:
            if item.method in UNMINED_FIELDS:
                out = self._readable_view(ctx.pool, item.method, out)
            if spec.standard and out.find(b"-390") >= 0:  # (a node's code: proxy/face.py)
                out = public_raw(spec, out, lambda: self._held(ctx.pool, item.ref))
            if type(rid) is orjson.Fragment:  # as the client wrote it, not as parsed
                out = restore_ids(body, out)  # (last: the steps above decode the answer)
        return (204, b"") if notif or not out else (200, out)

    # ---- step 2: the read path (one head per request, cache, coalescing) -----------------

    def _heads(self, ctx: Ctx) -> Any:
        """The request's heads, made on first use (each tag is resolved once per request)."""
        heads = ctx.heads
        if heads is None:
            heads = ctx.heads = self.reads.request(ctx.pool, ctx.least)  # type: ignore[union-attr]
        return heads

    async def _follow(self, ctx: Ctx, it: Item, plan: Plan) -> bytes | None:
        """A single read the read path planned: the answer of an identical read in flight
        (None when there is none, or its leader got none: `it` is then set up to be sent,
        its block pinned)."""
        reads: Reads = self.reads  # type: ignore[assignment]
        if plan.flight is not None:
            answer = reads.shared(ctx.pool, await plan.flight.wait(), it.rid)
            if answer is not None:
                public(it.spec, answer, lambda: self._held(ctx.pool, it.ref))
                result = "error" if "error" in answer else "ok"
                self.metrics.request(ctx.chain, it.method, COALESCED, result)
                return orjson.dumps(answer)
            plan = reads.unfollow(plan)
        if type(it.rid) is orjson.Fragment:  # the id as the client wrote it
            plan.obj = {**plan.obj, "id": it.rid}
            if plan.fallback is not None:
                plan.fallback = {**plan.fallback, "id": it.rid}
        it.plan, it.obj, it.ref = plan, plan.obj, plan.ref
        return None

    def _plan_items(
        self, ctx: Ctx, rows: list[Row], answers: list[Any]
    ) -> tuple[list[Row], list[Item], list[Item], bool]:
        """The read path for every item of a batch (proxy/reads.py): items answered at once
        get their answer; (items it does not touch, still rows; items it planned, to send;
        items waiting for an identical read in flight; whether any item changed or left, so
        the client's bytes can no longer go as they are)."""
        reads: Reads = self.reads  # type: ignore[assignment]
        heads = self._heads(ctx)
        plan_of = reads.plan
        plain: list[Row] = []
        send: list[Item] = []
        waiting: list[Item] = []
        changed = False
        ready: dict[tuple[str, str], int] = {}  # (method, source) → items answered at once
        # (method, block) pairs the read path leaves as they are: that depends on nothing
        # else within a request (the same method and block, the same heads), so each pair
        # is asked about once (a batch at random heights repeats a third of them).
        untouched: set[tuple[str, int]] = set()
        for row in rows:
            if row[6]:
                plain.append(row)
                continue
            pair = (row[3], id(row[5]))
            if pair in untouched:
                plain.append(row)
                continue
            try:
                plan = plan_of(heads, row[3], row[4], row[5], row[1])
            except JsonRpcError as exc:  # params too deep to key (proxy/nesting.py)
                self.metrics.request(ctx.chain, row[3], NO_NODE_KEY, "invalid")
                answers[row[0]] = error_response(row[2], exc.code, exc.message)
                changed = True
                continue
            if plan is None:
                untouched.add(pair)
                plain.append(row)
                continue
            if type(plan) is not Plan:  # a ready result
                answers[row[0]] = {"jsonrpc": "2.0", "id": row[2], "result": plan}
                counted = (row[3], _source(plan))
                ready[counted] = ready.get(counted, 0) + 1
                changed = True
                continue
            it = Item(*row)
            it.plan = plan
            if plan.obj is not it.obj:
                it.obj, it.ref, changed = plan.obj, plan.ref, True
            if plan.flight is not None:
                waiting.append(it)
                changed = True
            else:
                send.append(it)
        for (method, source), n in ready.items():
            self.metrics.request(ctx.chain, method, source, "ok", n)
        return plain, send, waiting, changed

    async def _wait_items(self, ctx: Ctx, waiting: list[Item], answers: list[Any]) -> None:
        """Batch items that share an identical read's answer; those whose leader got none
        are sent themselves."""
        reads: Reads = self.reads  # type: ignore[assignment]
        again = []
        for it in waiting:
            flight = it.plan.flight  # type: ignore[union-attr]
            answer = reads.shared(ctx.pool, await flight.wait(), it.rid)  # type: ignore[union-attr]
            if answer is None:
                it.plan = plan = reads.unfollow(it.plan)  # type: ignore[arg-type]
                it.obj, it.ref = plan.obj, plan.ref
                again.append(it)
                continue
            public(it.spec, answer, lambda: self._held(ctx.pool, it.ref))  # noqa: B023
            result = "error" if "error" in answer else "ok"
            self.metrics.request(ctx.chain, it.method, COALESCED, result)
            answers[it.pos] = answer
        if again:
            await self._route_planned(ctx, again, None, answers, single=False)

    async def _route_planned(
        self,
        ctx: Ctx,
        items: list[Item],
        body: bytes | None,
        answers: list[Any],
        single: bool,
        first: int = 1,
        chosen: dict[Node, Group] | None = None,
    ) -> bytes | None:
        """`_route` for items of a request the read path planned: whatever happens, each
        item's final answer is stored when it may be and handed to the reads waiting for
        it (`Reads.land`; None when there is none: they then ask a node themselves)."""
        out = None
        try:
            out = await self._route(ctx, items, body, answers, single, first, chosen)
        finally:
            reads: Reads = self.reads  # type: ignore[assignment]
            for it in items:
                plan = it.plan
                if plan is not None and (plan.lead or plan.store):
                    reads.land(plan, out if single and out is not None else answers[it.pos])
        return out

    async def _cached_batch(self, ctx: Ctx, body: bytes) -> tuple[int, bytes]:
        """A batch body answered as a whole from the cache when the same bytes were answered
        at the request's `latest` block before (a dapp polling the same batch every block);
        else parsed and answered item by item, and kept as a whole when every item's answer
        was the one of the block its key names."""
        reads: Reads = self.reads  # type: ignore[assignment]
        key = None if ctx.pool.mirrors else reads.batch_key(self._heads(ctx), body)
        if key is not None:
            found = reads.cache.get_batch(key)
            if found is not None:
                out, methods = found
                for method, n in methods:
                    self.metrics.request(ctx.chain, method, "cache", "ok", n)
                return 200, out
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            msg = f"Parse error: {cut(str(exc))}"
            return 200, _dumps_error(None, JsonRpcError(PARSE_ERROR, msg))
        if not isinstance(payload, list):
            return await self._single(ctx, payload, body)
        epoch = reads.cache.epochs.get(ctx.pool.id, 0)
        status, out = await self._batch(ctx, payload, body, key)
        keep = ctx.keep
        if keep is not None and reads.cache.epochs.get(ctx.pool.id, 0) == epoch:
            reads.cache.put_batch(key, out, keep)  # type: ignore[arg-type]
        return status, out

    async def _batch(
        self, ctx: Ctx, payload: list[Any], body: bytes, key: Any = None
    ) -> tuple[int, bytes]:
        """A batch: every valid item through the loop, answers in the client's order."""
        if not payload:
            return 200, _dumps_error(
                None, JsonRpcError(INVALID_REQUEST, "Invalid Request: empty batch")
            )
        if len(payload) > self._max_batch:
            msg = f"batch has {len(payload)} items, more than max_batch_items={self._max_batch}"
            return 200, _dumps_error(None, JsonRpcError(INVALID_REQUEST, msg))
        answers: list[Any] = [None] * len(payload)
        rows, exact, notified = self._parse_items(ctx, payload, answers, body)
        if self.tracer is not None or access_log.isEnabledFor(logging.INFO):
            ctx.methods.extend(row[3] for row in rows)  # for the span and the access log
        if rows and ctx.pool.mirrors:
            self.mirrors.offer_batch(ctx.pool, [(row[3], row[1]) for row in rows])
        ctx.own_ids = exact and _unique_ids(rows)
        whole = len(rows) == len(payload) and ctx.own_ids
        plain, planned, waiting, changed = rows, [], [], False
        if self.reads is not None and rows:
            plain, planned, waiting, changed = self._plan_items(ctx, rows, answers)
        if not (planned or waiting or notified or self.tracer) and ctx.own_ids:
            # Nothing the read path follows: the plain items go without per-item objects.
            sent = body if whole and not changed else None
            out = await self._send_plain(ctx, plain, sent, answers)
            if out is not None:
                return 200, out
            out = [a for a in answers if a is not None]
            self._keep(ctx, key, rows, len(payload), out, [])
            return (200, orjson.dumps(out)) if out else (204, b"")
        items = _merged(plain, planned)
        sent = body if whole else None
        route = self._route
        pinned = False
        if self.reads is not None and rows:
            if whole and changed:
                # Only blocks were pinned (every item goes, none waits): the pinned items
                # with the client's ids, in its order, are the body, and the node's answer
                # may still be the client's as it is (`_raw_answer`).
                pinned = not waiting and len(items) == len(payload)
                sent = _dumps_or_none([it.obj for it in items]) if pinned else None
                pinned = sent is not None  # (else an item is too deep: `_send_group`)
            route = self._route_planned
        if items:
            out = await route(ctx, items, sent, answers, single=False)
            if out is not None:
                if pinned:
                    done = [a for a in answers if a is not None]
                    self._keep(ctx, key, rows, len(payload), done, items)
                return (200, out) if out else (204, b"")
        if waiting:
            await self._wait_items(ctx, waiting, answers)
        out = [a for a in answers if a is not None]
        self._keep(ctx, key, rows, len(payload), out, [*items, *waiting])
        return (200, orjson.dumps(out)) if out else (204, b"")

    def _keep(
        self, ctx: Ctx, key: Any, rows: list[Row], size: int, out: list[Any], items: list[Item]
    ) -> None:
        """Sets what to cache of the whole batch (`_cached_batch`; `key`: None when it is
        not cached), when every item was valid and answered at a block the request's
        `latest` determines, none asked by height after all (`items`: those planned)."""
        if key is not None and len(rows) == size and ctx.heads.mixed is False and _exact(items):
            ctx.keep = _kept_as_a_whole([row[3] for row in rows], out)

    async def _send_plain(
        self, ctx: Ctx, rows: list[Row], body: bytes | None, answers: list[Any]
    ) -> bytes | None:
        """A batch's items the read path does not touch, every one with its own id and an
        answer, sent as one body to one node with no `Item` per item: their answer, when it
        comes one per item in their order with nothing to retry or hide (`_answered_in_order`),
        is taken as it is; `body` (the client's bytes, when every item is here unchanged)
        is then the answer's. Anything else (items for several nodes, none eligible, a
        failed attempt, an answer to match or classify item by item) goes on in the one
        loop (`_route`) with the items made then, from the same step."""
        if not rows:
            return None
        found = self._one_node(ctx.pool, rows)
        if found is None:
            return await self._route(ctx, [Item(*row) for row in rows], body, answers, False)
        data = body
        if data is None:
            try:
                data = orjson.dumps([row[1] for row in rows])
            except TypeError:  # items too deep to write again: -32602 (proxy/nesting.py)
                rest = self._deep_rows(ctx, rows, answers)
                return await self._send_plain(ctx, rest, None, answers)
        node, cands = found
        sent = _Sent(node)
        group = Group(node, [sent], cands, BATCH if len(rows) > 1 else rows[0][3])
        try:
            node, raw = await self.attempts.exchange(ctx, group, data, _usable_batch)
        except UpstreamError as exc:
            items = _items(rows, sent.tried)
            return await self._go_on(ctx, self._transport_failed(ctx, items, exc, answers), answers)
        rids = [row[2] for row in rows]
        methods = [row[3] for row in rows]
        parsed = _loads(raw)
        if _answered_in_order(rids, methods, parsed, raw):
            self._count_answers(ctx, node, methods, None, parsed, raw)
            if body is not None:
                return raw
            _place([row[0] for row in rows], rids, parsed, answers)
            return None
        items = _items(rows, sent.tried)
        if not isinstance(parsed, list | dict):
            parsed = self._decode(ctx, node, items, raw)  # penalises the node
        pending = items if parsed is None else []
        if parsed is not None:
            pending = self._take_answers(ctx, node, items, rids, parsed, answers)
        return await self._go_on(ctx, pending, answers)

    def _deep_rows(self, ctx: Ctx, rows: list[Row], answers: list[Any]) -> list[Row]:
        """The rows of a write that failed, but those too deep to write: answered -32602."""
        deep = set(nesting.deep([row[1] for row in rows]))
        for i in deep:
            self._refuse_deep(ctx, rows[i][0], rows[i][2], rows[i][3], rows[i][6], answers)
        return [row for i, row in enumerate(rows) if i not in deep]

    def _refuse_deep(
        self, ctx: Ctx, pos: int, rid: Any, method: str, notif: bool, answers: list[Any]
    ) -> None:
        self.metrics.request(ctx.chain, method, NO_NODE_KEY, "invalid")
        if not notif:
            answers[pos] = error_response(rid, INVALID_PARAMS, nesting.MESSAGE)

    async def _go_on(self, ctx: Ctx, pending: list[Item], answers: list[Any]) -> None:
        """The one loop from its second round, for the items a first attempt left."""
        if pending:
            await self._route(ctx, pending, None, answers, single=False, first=2)

    def _one_node(self, pool: Pool, rows: list[Row]) -> tuple[Node, list[Node]] | None:
        """The node every item of `rows` goes to on its first attempt, with the eligible
        nodes (`_first_choice` for items no read plan keeps off a node), or None when they
        do not all have the same eligible nodes, or none is eligible."""
        routes = self.routes.routes(pool)
        candidates = self.routes.candidates
        seen: dict[int, str] = {}  # id of a block → the method it was looked up with
        first: list[Node] | None = None
        for row in rows:
            method = row[3]
            if seen.get(id(row[5])) == method:
                continue
            seen[id(row[5])] = method
            nodes = candidates(pool, routes, method, row[4], row[5])[0]
            if nodes is None:
                return None
            if first is None:
                first = nodes
            elif nodes is not first and nodes != first:
                return None
        assert first is not None
        return (first[0] if len(first) == 1 else self.selector.pick(first)), first

    def _parse_items(
        self, ctx: Ctx, payload: list[Any], answers: list[Any], body: bytes
    ) -> tuple[list[Row], bool, bool]:
        """Step 1 for every item: valid items to route, as `Row`s (invalid ones answered at
        once), whether every id is as orjson read it (else they are read from `body`), and
        whether a valid item is a notification."""
        rows = self._uniform_rows(payload)
        if rows is not None:
            return rows, True, False
        rows = []
        notified = False
        target = self.methods.target
        rids: list[Any] | None = None
        for pos, obj in enumerate(payload):
            bad = check_request(obj)
            rid = obj.get("id") if type(obj) is dict else None
            if type(rid) is float:  # as written in the body, not as a float
                rids = rids or exact_ids(body)
                rid = rids[pos]
            if bad is not None:
                self.metrics.request(ctx.chain, UNKNOWN_METHOD, NO_NODE_KEY, "invalid")
                if type(rid) is not orjson.Fragment:
                    rid = request_id(obj)
                answers[pos] = error_response(rid, bad.code, bad.message)
                continue
            method = obj["method"]
            notif = "id" not in obj
            try:
                spec, ref = target(method, obj.get("params"))
            except JsonRpcError as exc:
                label = method if method in self.methods.specs else UNKNOWN_METHOD
                self.metrics.request(ctx.chain, label, NO_NODE_KEY, "invalid")
                if not notif:
                    answers[pos] = error_response(rid, exc.code, exc.message, exc.data)
                continue
            rows.append((pos, obj, rid, method, spec, ref, notif))
            notified = notified or notif
        return rows, rids is None, notified

    # ---- the one loop: choose, send, classify, retry -------------------------------------

    def _uniform_rows(self, payload: list[Any]) -> list[Row] | None:
        """`_parse_items`' rows, made with C loops over the items (no Python step per item),
        for the common batch: request objects of one method, each with `"jsonrpc": "2.0"`,
        an int or string id and a list of as many params, none null, whose block text (the
        last param) the method table remembers (`MethodTable.known_targets`); None for any
        other batch (then item by item, with the same checks and rows)."""
        try:
            methods = list(map(_METHOD, payload))
            method = methods[0]
            n = len(payload)
            if type(method) is not str or methods.count(method) != n:
                return None
            if list(map(_JSONRPC, payload)).count("2.0") != n:
                return None
            rids = list(map(_ID, payload))
            params = list(map(_PARAMS, payload))
            sizes = set(map(len, params))
            if not set(map(type, rids)) <= _ID_TYPES or set(map(type, params)) != {list}:
                return None
            if len(sizes) != 1 or any(map(_HAS_NONE, params, repeat(None))):
                return None
            if set(map(type, map(_LAST, params))) != {str}:
                return None
        except (TypeError, KeyError, IndexError):  # (not a dict, a key missing, no params)
            return None
        known = self.methods.known_targets(method, sizes.pop(), params)
        if known is None:
            return None
        return list(
            zip(
                range(n),
                payload,
                rids,
                repeat(method),
                map(_SPEC, known),
                map(_REF, known),
                repeat(False),
            )
        )

    async def _route(
        self,
        ctx: Ctx,
        items: list[Item],
        body: bytes | None,
        answers: list[Any],
        single: bool,
        first: int = 1,
        chosen: dict[Node, Group] | None = None,
    ) -> bytes | None:
        """Steps 3-5 for the items of one client request, in rounds: choose a node per
        pending item, send one body per chosen node, classify each answer, and retry what
        the outcomes say, for at most `max_attempts` rounds.

        `body` is the client's bytes when they may go as they are (a single request, or a
        batch whose ids tell the answers apart) to a round whose items all go to one node;
        the node's bytes are then returned when they are the whole answer as they are.
        Otherwise (None) the answers are in `answers`. `first`: the round to start with
        (`start` made round 1); `chosen`: its groups, when they were chosen already."""
        pending = items
        sent = items[0].obj  # the object `body` holds, for a single request
        for attempt in range(first, self._rounds + 1):
            groups = chosen or self._choose(ctx, pending, attempt, answers)
            chosen = None
            if not groups:
                return None
            if body is not None and len(groups) == 1:
                (group,) = groups.values()
                if single and group.items[0].obj is not sent:
                    sent = group.items[0].obj  # asked by height after all (`_retry_choice`)
                    body = orjson.dumps(sent)
                pending, out = await self._send_raw(ctx, group, body, answers, single)
                if out is not None:
                    return out
                if not single:
                    body = None  # a batch's retry sends only the items it retries
            else:
                body = None
                sent = [self._send_group(ctx, group, answers) for group in groups.values()]
                pending = [it for retry in await _gather(sent) for it in retry]
            if not pending:
                return None
        for it in pending:
            self._give_up(ctx, it, answers, None)
        return None

    # ---- step 3: choose ------------------------------------------------------------------

    def _choose(
        self, ctx: Ctx, pending: list[Item], attempt: int, answers: list[Any]
    ) -> dict[Node, Group]:
        """A node for every pending item, grouped by node. On the first attempt, items that
        name the same block the same way have the same eligible nodes, and items with the
        same eligible nodes go to one node picked once: a batch becomes as few sub-batches as
        the rules allow. A retried item is chosen alone, away from the nodes it tried."""
        groups: dict[Node, Group] = {}
        pool = ctx.pool
        # The candidates of a first attempt per (method, block class), kept across requests
        # (proxy/routes.py); one pick per candidate list per request.
        routes = self.routes.routes(pool) if attempt == 1 else None
        picked: dict[tuple[Node, ...], tuple[Node, list[Node]]] = {}
        # Within the request, items naming the same block the same way (block refs are
        # shared per text by blockref's cache, and alive while the request is) with the same
        # method and spec have the same node: looked up once.
        chosen: dict[tuple[str, int, bool], tuple[Node, list[Node]] | NoEligibleNode] = {}
        batch = len(pending) > 1
        for it in pending:
            if routes is None:
                self.metrics.retry(ctx.chain, it.reason)
                found = self._retry_choice(pool, it)
            else:
                key = (it.method, id(it.ref), it.plan is not None and bool(it.plan.avoid))
                found = chosen.get(key)  # type: ignore[assignment]
                if found is None:
                    found = chosen[key] = self._first_choice(pool, routes, it, picked)
            if type(found) is NoEligibleNode:
                self._give_up(ctx, it, answers, found)
                continue
            node, cands = found  # type: ignore[misc]
            it.tried.append(node)
            group = groups.get(node)
            if group is None:
                lkey = BATCH if batch else it.method
                groups[node] = Group(node, [it], cands, lkey, attempt)
            else:
                group.add(it, cands)
        return groups

    def _first_group(
        self, ctx: Ctx, it: Item, answers: list[Any], chosen: Node | None = None
    ) -> Group | None:
        """`_choose` for the one item of a single request on its first attempt (no grouping
        to do: `start`'s path); None when no node is eligible (`it` is answered then).
        `chosen`: picked already among the same candidates (`_quick`)."""
        pool = ctx.pool
        found = self._first_choice(pool, self.routes.routes(pool), it, None, chosen)
        if type(found) is NoEligibleNode:
            self._give_up(ctx, it, answers, found)
            return None
        node, cands = found  # type: ignore[misc]
        it.tried.append(node)
        return Group(node, [it], cands, it.method)

    def _first_choice(
        self,
        pool: Pool,
        routes: PoolRoutes,
        it: Item,
        picked: dict[tuple[Node, ...], tuple[Node, list[Node]]] | None,
        chosen: Node | None = None,
    ) -> tuple[Node, list[Node]] | NoEligibleNode:
        """The node for an item on its first attempt (one pick per set of eligible nodes in
        `picked`; None: a single item), with the eligible nodes. Nodes off the chain the
        read path follows are avoided."""
        avoid = () if it.plan is None else it.plan.avoid
        nodes = None
        if not avoid:
            nodes = self.routes.candidates(pool, routes, it.method, it.spec, it.ref)[0]
        if nodes is None:  # none eligible (the selector says why), or some to avoid
            try:
                nodes, _ = self.selector.candidates(pool, it.method, it.spec, it.ref, avoid)
            except NoEligibleNode as exc:
                return exc
        if len(nodes) == 1:
            node = nodes[0]
            if node.budget.rate and chosen is None:  # (`Selector.pick` takes it in a choice)
                node.budget.spend()
            return node, nodes
        if picked is None:
            return chosen or self.selector.pick(nodes), nodes
        ids = tuple(nodes)
        found = picked.get(ids)
        if found is None:
            found = picked[ids] = (self.selector.pick(nodes), nodes)
        return found

    def _retry_choice(self, pool: Pool, it: Item) -> tuple[Node, list[Node]] | NoEligibleNode:
        """The node for a retried item, away from the nodes it tried. An item pinned to a
        block by hash goes to another node that may hold it; when none is left, it is asked
        by height of the nodes that did not know the hash (a reorg the proxy has not seen
        yet: the nodes' chain answers; not cached). Asking a node that is behind by height
        first could answer from a block a reorg dropped."""
        found = self._retry_candidates(pool, it)
        plan = it.plan
        # No reader left that may hold the transaction: the Leader's client may (pending).
        if type(found) is NoEligibleNode and it.spec.mempool and self._to_leader(pool, it):
            found = self._retry_candidates(pool, it)
        if type(found) is NoEligibleNode and plan is not None and plan.missing:
            missing = plan.missing
            if plan.unpin() is not None:
                it.obj = plan.obj
                it.tried = [n for n in it.tried if n not in missing]
                found = self._retry_candidates(pool, it)
        return found

    def _retry_candidates(self, pool: Pool, it: Item) -> tuple[Node, list[Node]] | NoEligibleNode:
        avoid = () if it.plan is None else it.plan.avoid
        try:
            nodes, _ = self.selector.candidates(
                pool,
                it.method,
                it.spec,
                it.ref,
                [*it.tried, *avoid] if avoid else it.tried,
                it.prefer_archive,
            )
        except NoEligibleNode as exc:
            return exc
        return self.selector.pick(nodes), nodes

    # ---- steps 4 and 5: send and classify -------------------------------------------------

    async def _send_raw(
        self, ctx: Ctx, group: Group, body: bytes, answers: list[Any], single: bool
    ) -> tuple[list[Item], bytes | None]:
        """Send the client's bytes unchanged to one node: (items to retry, and the node's
        bytes when they are the answer as they are: for a batch, every item answered, in
        order, no retryable error, no transaction to show as pending)."""
        items = group.items
        try:
            node, raw = await self.attempts.exchange(
                ctx, group, body, _usable_single if single else _usable_batch
            )
        except UpstreamError as exc:
            return self._transport_failed(ctx, items, exc, answers), None
        return self._raw_answer(ctx, group, node, raw, answers, single)

    def _raw_answer(
        self, ctx: Ctx, group: Group, node: Node, raw: bytes, answers: list[Any], single: bool
    ) -> tuple[list[Item], bytes | None]:
        """Step 5 for the client's bytes answered by `node`: `_send_raw`'s result."""
        items = group.items
        if single:
            it = items[0]
            result = outcome.of_raw(raw)
            if not result.retry:
                if it.spec.mempool and _not_held_raw(raw) and self._to_leader(ctx.pool, it):
                    it.retry_later(node, raw, outcome.NOT_HELD)
                    return [it], None
                self.metrics.request(ctx.chain, it.method, node.key, result.name)
                return [], raw
            it.retry_later(node, raw, result)
            return [it], None
        parsed = self._decode(ctx, node, items, raw)
        if parsed is None:
            return [it for it in items if not it.notif], None
        if _answered_in_order(*_rids_methods(items), parsed, raw):
            self._count_answers(ctx, node, *_methods_notifs(items), parsed, raw)
            if self.reads is not None:  # the answers to store and share (`_route_planned`)
                _fill(items, parsed, answers)
            return [], raw
        keys = [None if it.notif else it.rid for it in items]
        return self._take_answers(ctx, node, items, keys, parsed, answers), None

    async def _send_group(self, ctx: Ctx, group: Group, answers: list[Any]) -> list[Item]:
        """Send one sub-batch with the client's ids when they tell the answers apart, else
        with ids rewritten to positions; returns the items to retry."""
        items = group.items
        if ctx.own_ids:
            sub = [it.obj for it in items]
            keys = [None if it.notif else it.rid for it in items]
        else:
            sub = [it.obj if it.notif else {**it.obj, "id": j} for j, it in enumerate(items)]
            keys = [None if it.notif else j for j, it in enumerate(items)]
        try:
            data = orjson.dumps(sub)
        except TypeError:  # items too deep to write again: -32602 (proxy/nesting.py)
            deep = set(nesting.deep(sub))
            for i in deep:
                it = items[i]
                self._refuse_deep(ctx, it.pos, it.rid, it.method, it.notif, answers)
            group.items = [it for i, it in enumerate(items) if i not in deep]
            return await self._send_group(ctx, group, answers) if group.items else []
        try:
            node, raw = await self.attempts.exchange(ctx, group, data, _usable_batch)
        except UpstreamError as exc:
            return self._transport_failed(ctx, items, exc, answers)
        parsed = self._decode(ctx, node, items, raw)
        if parsed is None:
            return [it for it in items if not it.notif]
        if ctx.own_ids and _answered_in_order(*_rids_methods(items), parsed, raw):
            # The common case needs no item matched by its id or classified on its own.
            self._count_answers(ctx, node, *_methods_notifs(items), parsed, raw)
            _fill(items, parsed, answers)
            return []
        return self._take_answers(ctx, node, items, keys, parsed, answers)

    def _transport_failed(
        self, ctx: Ctx, items: list[Item], exc: UpstreamError, answers: list[Any]
    ) -> list[Item]:
        """Step 5 for a group whose attempt got no answer: the items to retry (all of them,
        unless the outcome is final: then each is answered with the error now)."""
        result = outcome.of_failure(exc.kind)
        for it in items:
            it.err, it.reason = exc, result.name
        if result.retry:
            return items
        for it in items:
            self._give_up(ctx, it, answers, None)
        return []

    def _decode(self, ctx: Ctx, node: Node, items: list[Item], raw: bytes) -> Any:
        """A batch answer decoded, or None when it is not JSON-RPC (the node is penalised
        and every item retried)."""
        parsed = _loads(raw)
        if isinstance(parsed, list | dict):
            return parsed
        why = f"{node.key} answered a batch with non-JSON-RPC"
        self.attempts.penalise(ctx, node, outcome.BAD_RESPONSE, why)
        bad = UpstreamError("bad_response", why)
        for it in items:
            it.err, it.reason = bad, outcome.BAD_RESPONSE.name
        return None

    def _take_answers(
        self,
        ctx: Ctx,
        node: Node,
        group: list[Item],
        keys: list[Any],
        parsed: Any,
        answers: list[Any],
    ) -> list[Item]:
        """Step 5 for a sub-batch: each item's answer (found by its key: its position in the
        sub-batch, or its own id) classified; the ones to retry are returned."""
        by_key = _by_key(keys, parsed)
        retry = []
        counts: dict[tuple[str, str], int] = {}  # (method, outcome) → answers: metrics
        readable: int | bool | None = False  # looked up once, when an answer needs it
        for it, key in zip(group, keys, strict=True):
            if it.notif:
                counted = (it.method, "ok")
                counts[counted] = counts.get(counted, 0) + 1
                continue
            answer = by_key.get(key)
            if answer is None:
                it.err = UpstreamError("bad_response", f"{node.key} gave no answer for the item")
                it.reason = outcome.MISSING.name
                retry.append(it)
                continue
            answer["id"] = it.rid
            result = outcome.of_answer(answer)
            if result.retry:
                it.retry_later(node, answer, result)
                retry.append(it)
                continue
            if it.spec.mempool and _not_held(answer) and self._to_leader(ctx.pool, it):
                it.retry_later(node, answer, outcome.NOT_HELD)
                retry.append(it)
                continue
            if result is outcome.ERROR:
                public(it.spec, answer)  # (not a -39006: that one is retried)
            counted = (it.method, result.name)
            counts[counted] = counts.get(counted, 0) + 1
            if it.method in UNMINED_FIELDS:
                if readable is False:
                    readable = self._readable(ctx.pool)
                hide_unreadable(it.method, answer, readable)  # type: ignore[arg-type]
            answers[it.pos] = answer
        for (method, name), n in counts.items():
            self.metrics.request(ctx.chain, method, node.key, name, n)
        return retry

    def _count_answers(
        self,
        ctx: Ctx,
        node: Node,
        methods: list[str],
        notifs: list[bool] | None,
        parsed: list[Any],
        raw: bytes,
    ) -> None:
        """Metrics of a batch answered as it is (`_answered_in_order`; `notifs`: which
        items are notifications, when any is): one increment per method and outcome."""
        if raw.find(b'"error"') < 0:  # every item ok: count by method alone (find: of_raw)
            for method, n in Counter(methods).items():
                self.metrics.request(ctx.chain, method, node.key, "ok", n)
            return
        answered = iter(parsed)
        outcomes = [
            (method, "ok" if notif or "error" not in next(answered) else "error")
            for method, notif in zip(methods, notifs or [False] * len(methods), strict=True)
        ]
        for (method, result), n in Counter(outcomes).items():
            self.metrics.request(ctx.chain, method, node.key, result, n)

    # ---- giving up -----------------------------------------------------------------------

    def _give_up(self, ctx: Ctx, it: Item, answers: list[Any], exc: JsonRpcError | None) -> None:
        """Final answer of an item no further attempt will serve: the last answer a node
        gave, else an error saying why no node answered (or why none was eligible)."""
        node_key = it.tried[-1].key if it.tried else NO_NODE_KEY
        if it.last is not None:
            answer, result = it.last, "error"
            if type(answer) is dict:  # (a single's bytes: `_single_answer`)
                public(it.spec, answer, lambda: self._held(ctx.pool, it.ref))
        elif it.err is not None or exc is None:
            answer = error_response(it.rid, INTERNAL_ERROR, "")
            answer["error"] = self._failed(ctx.pool, it.method, it.tried, it.err).to_obj()
            result = "upstream_failed"
        else:
            answer, result = error_response(it.rid, exc.code, exc.message), "no_node"
        self.metrics.request(ctx.chain, it.method, node_key, result)
        if not it.notif:
            answers[it.pos] = answer

    @staticmethod
    def _failed(
        pool: Pool, method: str, tried: list[Node], failure: UpstreamError | None
    ) -> JsonRpcError:
        last = tried[-1] if tried else None
        if last is not None and last.entry.kind == "writer":
            msg = (
                f"{method}: the Leader write node {last.key} ({last.entry.url}) did not answer: "
                f"{failure}; if it stays down, switch the Leader: "
                f"POST /{pool.id}/writers/switchLeader"
            )
        else:
            msg = f"{method}: no node answered after {len(tried)} attempt(s); last error: {failure}"
        return JsonRpcError(INTERNAL_ERROR, msg)

    @staticmethod
    def _to_leader(pool: Pool, it: Item) -> bool:
        """A transaction the state nodes do not hold (`null`) is asked of the Leader next (a
        pending one lives only in its execution client); False when there is none, or the
        Leader answered already."""
        if it.spec.writer or pool.leader_node() is None:
            return False
        it.spec = LEADER_FALLBACK[it.method]
        return True

    def _readable(self, pool: Pool) -> int | None:
        """The highest block a `latest` read is answered at now (`Selector.readable_head`),
        never below the one the pool's `latest` reached (proxy/heads.py): a transaction in
        a block up to it is shown as mined."""
        readable = self.selector.readable_head(pool)
        view = None if self.reads is None else self.reads.heads.views.get(pool.id)
        floor = None if view is None else view.floor
        if readable is None or floor is None:
            return readable
        return max(readable, floor)

    def _held(self, pool: Pool, ref: BlockRef | None) -> bool:
        """Whether the block `ref` names exists on the pool's chain as far as the proxy knows
        (a height up to the known head, a hash it has seen, a tag): a -39006 for it then
        means no node holds it, not that there is no such block (proxy/face.py)."""
        if ref is None:
            return False  # a transaction by hash: unknown means null
        if ref.tag is not None:
            return True
        view = None if self.reads is None else self.reads.heads.views.get(pool.id)
        if ref.hash is not None:
            if view is not None and ref.hash in view.heights:
                return True
            return self.selector.hashes.get(ref.hash) is not None
        tip = pool.head()
        if view is not None and view.tip is not None:
            tip = view.tip if tip is None else max(tip, view.tip)
        return tip is not None and ref.number is not None and ref.number <= tip

    def _readable_view(self, pool: Pool, method: str, raw: bytes) -> bytes:
        """`raw` with a transaction whose block the pool cannot read yet shown as pending."""
        if method not in UNMINED_FIELDS:
            return raw
        try:
            answer = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return raw
        readable = self._readable(pool)
        if isinstance(answer, dict) and hide_unreadable(method, answer, readable):
            return orjson.dumps(answer)
        return raw

    # ---- observability -------------------------------------------------------------------

    def _annotate(self, span: Any, ctx: Ctx, size: int, headers: Mapping[str, str]) -> None:
        span.set_attribute("chain", ctx.chain)
        span.set_attribute("pool", ctx.pool.id)
        span.set_attribute("rpc.methods", sorted(set(ctx.methods)))
        span.set_attribute("batch.size", size)
        client_id = headers.get("client-id")
        if client_id:
            span.set_attribute("client_id", client_id[:MAX_HEADER_VALUE])
        for name in SOURCE_HEADERS:
            value = headers.get(name)
            if value:
                span.set_attribute(name.replace("-", "_"), value[:MAX_HEADER_VALUE])

    def _log(
        self, ctx: Ctx, size: int, status: int, elapsed: float, headers: Mapping[str, str]
    ) -> None:
        extra: dict[str, Any] = {
            "chain": ctx.chain,
            "pool": ctx.pool.id,
            "methods": sorted(set(ctx.methods)),
            "nodes": ctx.nodes,
            "items": size,
            "status": status,
            "ms": round(elapsed * 1000, 3),
            "client_id": _cut(headers.get("client-id")),
        }
        for name in SOURCE_HEADERS:
            extra[name.replace("-", "_")] = _cut(headers.get(name))
        access_log.info("request", extra=extra)


_METHOD, _JSONRPC, _ID, _PARAMS = (
    itemgetter("method"),
    itemgetter("jsonrpc"),
    itemgetter("id"),
    itemgetter("params"),
)
_SPEC, _REF, _LAST = itemgetter(0), itemgetter(1), itemgetter(-1)
_ID_TYPES = frozenset((int, str))  # (a float id is read from the body: item by item)
_HAS_NONE = operator.contains


def _has_inproc(pool: Pool) -> bool:
    """Whether a reader of `pool` is a node in this process (`inproc://`)."""
    return any(is_inproc(node.entry.url) for node in pool.readers)


def _inexact(obj: Any) -> bool:
    return type(obj) is dict and type(obj.get("id")) is float


def _exact_id(payload: Any, body: bytes, rid: Any) -> Any:
    """`rid`, or the id as the client wrote it when orjson's float would change it."""
    return exact_ids(body) if _inexact(payload) else rid


def _by_key(keys: list[Any], parsed: Any) -> dict[Any, Any]:
    """A sub-batch's answers by the key each item was sent with (None: a notification)."""
    if isinstance(parsed, dict):  # the node rejected the whole sub-batch with one error
        return {k: dict(parsed) for k in keys if k is not None}
    return {a.get("id"): a for a in parsed if type(a) is dict}


def _answered_in_order(rids: list[Any], methods: list[str], parsed: Any, raw: bytes) -> bool:
    """Whether a node's answer to items sent with the client's ids (`rids`: theirs, but
    notifications'; `methods`: every item's) is one answer per id in their order, none
    asking for another attempt (`-3900x`, outcome.RETRYABLE_CODES) and none a transaction to
    show as pending (UNMINED_FIELDS): every answer is then final as it is, with no item to
    match by id or classify alone."""
    if type(parsed) is not list or raw.find(b"-3900") >= 0 or len(parsed) != len(rids):
        return False
    try:
        ids = [answer["id"] for answer in parsed]
    except (KeyError, TypeError):  # an answer without an id, or not an object
        return False
    return ids == rids and UNMINED_FIELDS.keys().isdisjoint(methods)


def _rids_methods(items: list[Item]) -> tuple[list[Any], list[str]]:
    """`_answered_in_order`'s view of `items`."""
    return [it.rid for it in items if not it.notif], [it.method for it in items]


def _methods_notifs(items: list[Item]) -> tuple[list[str], list[bool]]:
    """`_count_answers`' view of `items`."""
    return [it.method for it in items], [it.notif for it in items]


def _fill(items: list[Item], parsed: list[Any], answers: list[Any]) -> None:
    """Each item's answer in its place (`_answered_in_order`; notifications have none)."""
    sent = [it for it in items if not it.notif]
    _place([it.pos for it in sent], [it.rid for it in sent], parsed, answers)


def _place(positions: list[int], rids: list[Any], parsed: list[Any], answers: list[Any]) -> None:
    """The answers `parsed` (`_answered_in_order`: one per id of `rids`, in order) at their
    `positions`, each with the client's id as sent (a node's `1.0` equals the client's `1`
    but would not be written the same)."""
    for pos, rid, answer in zip(positions, rids, parsed, strict=True):
        answer["id"] = rid
        answers[pos] = answer


_HEIGHT_TEXT = re.compile(r"^(0x[0-9a-fA-F]{1,16}|[0-9]{1,19})$")


def _least(text: str, ctx: Ctx) -> JsonRpcError | None:
    """Reads the client's `x-min-block` header (a decimal or 0x height) into `ctx.least`;
    the error to answer when it is not one."""
    value = -1
    if _HEIGHT_TEXT.match(text):
        value = int(text, 16) if text[:2] == "0x" else int(text, 10)
    if not 0 <= value <= MAX_HEIGHT:
        msg = (
            f"invalid {MIN_BLOCK} header {cut(text)!r}: expected a block height (0x hex or decimal)"
        )
        return JsonRpcError(INVALID_REQUEST, msg)
    ctx.least = value
    return None


def _not_held(answer: dict[str, Any]) -> bool:
    """Whether a reader's answer to a transaction lookup says it does not hold it: `null`,
    or "method not found" (a state node that does not serve it: the Leader's client does)."""
    error = answer.get("error")
    if error is None:
        return answer.get("result") is None
    return type(error) is dict and error.get("code") == METHOD_NOT_FOUND


def _not_held_raw(raw: bytes) -> bool:
    """`_not_held` of a single answer's bytes."""
    if raw.find(b"null") < 0 and raw.find(b"-32601") < 0:
        return False
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    return type(answer) is dict and _not_held(answer)


def _loads(raw: bytes) -> Any:
    """A node's batch answer decoded (None: not JSON)."""
    try:
        return orjson.loads(raw) if raw else []
    except orjson.JSONDecodeError:
        return None


def _items(rows: list[Row], tried: list[Node]) -> list[Item]:
    """`rows` as Items that tried `tried` (`_send_plain`, when the loop takes over)."""
    items = [Item(*row) for row in rows]
    for it in items:
        it.tried = list(tried)
    return items


def _merged(rows: list[Row], planned: list[Item]) -> list[Item]:
    """The items to send, in the client's order: `rows` made Items, and `planned`."""
    items = [Item(*row) for row in rows]
    if planned:
        items.extend(planned)
        items.sort(key=_position)
    return items


def _position(it: Item) -> int:
    return it.pos


def _exact(items: list[Item]) -> bool:
    """No item of `items` was asked by height after all (its pinned hash unknown to the
    node): what the whole-batch cache needs (`_kept_as_a_whole`)."""
    return all(it.plan is None or it.plan.exact for it in items)


_OWN_ID_TYPES = {str, int}  # ids a sub-batch may keep (exact types: not bool, not a float)


def _unique_ids(rows: list[Row]) -> bool:
    """Whether the answers of `rows` can be told apart by their ids: every id a string or
    an integer, no two the same (notifications have none and get no answer)."""
    ids = [row[2] for row in rows if not row[6]]
    return {type(rid) for rid in ids} <= _OWN_ID_TYPES and len(set(ids)) == len(ids)


def _settles(done: asyncio.Future[Answer]) -> Callable[[Answer], bool]:
    """An `answer` callback of `Engine.start` that hands the answer to `done`."""

    def answer(result: Answer) -> bool:
        if not done.done():
            done.set_result(result)
        return True

    return answer


def _continues(done: asyncio.Future[Answer]) -> Callable[[Awaitable[Answer]], None]:
    """A `later` callback of `Engine.start` whose task's outcome goes to `done`."""

    def later(step: Awaitable[Answer]) -> None:
        def landed(task: asyncio.Future[Answer]) -> None:
            if done.done():
                return
            if task.cancelled():
                done.cancel()
            elif task.exception() is not None:
                done.set_exception(task.exception())  # type: ignore[arg-type]
            else:
                done.set_result(task.result())

        task = asyncio.ensure_future(step)
        _RUNNING.add(task)  # (the loop keeps only a weak reference to a task)
        task.add_done_callback(_RUNNING.discard)
        task.add_done_callback(landed)

    return later


_RUNNING: set[asyncio.Future[Any]] = set()


def _dumps_or_none(objs: list[Any]) -> bytes | None:
    """The JSON of `objs`, or None when one is too deep to write (proxy/nesting.py)."""
    try:
        return orjson.dumps(objs)
    except TypeError:
        return None


async def _reraise(error: Exception) -> Any:
    raise error


async def _gather(coros: list[Any]) -> list[Any]:
    """gather() without a task when there is one sub-batch (the common case)."""
    if len(coros) == 1:
        return [await coros[0]]
    return list(await asyncio.gather(*coros))


def _source(ready: Any) -> str:
    """The node label of a result answered without a node (metrics)."""
    return "cache" if type(ready) is orjson.Fragment else "head"


def _kept_as_a_whole(methods: list[str], out: list[Any]) -> tuple[tuple[str, int], ...] | None:
    """The items per method of a batch whose every item (of `methods`) was answered at a
    block its `latest` determines (`RequestHeads.mixed`, `_exact`) may be cached as a whole,
    unless an item was a notification (no answer) or got an error: then None."""
    if len(out) != len(methods):
        return None
    for answer in out:
        if type(answer) is not dict or "result" not in answer:
            return None
    return tuple(Counter(methods).items())

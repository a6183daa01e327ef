"""The JSON-RPC engine: where a client body enters the pipeline (proxy/pipeline.py).

`Engine.handle(chain_id, body, headers)` answers one client body, awaited: the in-process
entry (the workspace, the events part, the aiohttp fallback). `Engine.start` is the data
listener's entry: the same steps, run synchronously from the server's callback until one
needs to wait (proxy/firstattempt.py, proxy/firstbatch.py). A body is admitted before its
first attempt (`admit`: its pool, and a place among the pool's requests in flight, or a
refusal at once: proxy/admission.py), unless a node in this process answers it at once
(nothing then waits while it holds the place).

The engine only assembles the steps and holds the entries; docs/architecture.md walks a
request through them.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from opentelemetry import trace

from chainstate.httpserver import Request, Response
from chainstate.jsonrpc import INVALID_REQUEST, JsonRpcError
from proxy import buffers
from proxy.admission import REFRESH_S, Admission
from proxy.answer import Answers
from proxy.attempts import Attempts
from proxy.books import Books
from proxy.choose import Chooser
from proxy.classify import Classifier
from proxy.face import Face
from proxy.firstattempt import FirstAttempt
from proxy.firstbatch import FirstBatch
from proxy.inprocbooks import InprocBooks
from proxy.kept import KeptRoutes
from proxy.methods import MethodTable
from proxy.metrics import ProxyMetrics
from proxy.mirror import Mirrors
from proxy.model import Pool, normalize_pool
from proxy.parse import Parser, dumps_error
from proxy.pipeline import Divert, Pipeline
from proxy.readpath import ReadPath
from proxy.reads import Reads
from proxy.request import Admitted, Answer, Ctx
from proxy.rounds import Rounds
from proxy.routes import RouteCache
from proxy.ryw import ReadYourWrites
from proxy.select import Selector
from proxy.settings import ProxySettings
from proxy.state import RoutingState
from proxy.upstream import Upstream

MAX_CHAIN_IDS = 1024  # distinct raw chain ids whose normalized pool id is remembered
# Bodies this large are parsed in a turn of the event loop of their own (`Engine._large`):
# parsing 1 MiB takes ~1-3 ms, and a client sending many such bodies at once must not hold
# the loop for all of their steps in one go.
LARGE_BODY = 1 << 20

__all__ = ["Admitted", "Answer", "Engine"]


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
        # first attempts' candidates (proxy/routes.py)
        self.routes = RouteCache(selector, upstream.registry)
        self.chooser = Chooser(selector, self.routes, metrics)
        self.attempts = Attempts(settings, upstream, self.chooser.second, metrics, self.tracer)
        self.admission = Admission(
            settings.admission_wait, settings.max_pool_inflight, settings.upstream_connections
        )
        face = Face(selector, reads)
        ryw = ReadYourWrites(selector, reads)
        answers = Answers(face, ryw, metrics)
        classifier = Classifier(self.attempts, answers, face, ryw, metrics, reads is not None)
        rounds = Rounds(settings.max_attempts, self.chooser, self.attempts, classifier, answers)
        readpath = None if reads is None else ReadPath(reads, rounds, face, metrics)
        self.pipeline = Pipeline(
            settings.max_body_bytes,
            settings.max_batch_items,
            Parser(self.methods, metrics, settings.max_batch_items),
            readpath,
            rounds,
            answers,
            Books(metrics, self.tracer),
            mirrors,
            metrics,
            upstream,
        )
        kept = KeptRoutes(self.methods, self.routes, self.chooser, reads, upstream)
        self.books = InprocBooks(self.attempts, metrics)  # an in-process node's answers
        self.first = FirstAttempt(
            self.pipeline,
            kept,
            self.attempts,
            self.books,
            settings.max_answer_bytes,
            self.admit_resolved,
            self.admission.leave,
            self.handle,
        )
        self.batches = FirstBatch(
            self.pipeline,
            kept,
            self.attempts,
            self.methods,
            reads,
            self.books,
            settings.max_batch_items,
            settings.max_answer_bytes,
            self.admit_resolved,
            self.admission.leave,
            self.handle,
        )
        self._max_body = settings.max_body_bytes
        self._pool_ids: dict[str, str | None] = {}  # raw /:chainId → pool id (a pure function)
        self._admitted: dict[str, Admitted] = {}  # pool id → its Admitted (`admit_resolved`)
        self._large_turn = asyncio.Lock()  # one large body parsed per turn (`_large`)

    @property
    def inflight(self) -> int:
        """Client requests in flight in this process."""
        return self.admission.inflight

    def divert(self, methods: frozenset[str], handle: Divert) -> None:
        """Bodies naming one of `methods` (not served by the method table) are answered by
        `handle` instead (the proxy's filters and subscriptions, proxy/events.py). Free for
        other bodies: the table raises LocalMethod only where it would answer "Method not
        found", and the whole body is handed over before anything was forwarded."""
        self.methods.local = methods
        self.pipeline.divert = handle

    # ---- admission -----------------------------------------------------------------------

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
        """The pool a body may go to, its place among the pool's requests in flight taken;
        or the answer at once: 404 for an unknown chain, 503 + Retry-After when the pool
        is over its in-flight limit (proxy/admission.py). Synchronous: the data listener
        answers a refusal without a task."""
        return self.admit_resolved(chain_id, self.resolve(chain_id))

    def admit_resolved(self, chain_id: str, found: tuple[str, Pool] | None) -> Admitted | Answer:
        """`admit` with what `resolve(chain_id)` gave, for a caller that asked already."""
        if found is None:
            return 404, dumps_error(None, JsonRpcError(INVALID_REQUEST, self._unknown(chain_id)))
        chain, pool = found
        budget = self.upstream.budget  # (answers in flight, and those clients have not read)
        if budget is not None and budget.used > budget.limit:  # the process's budget: 503 now
            self.metrics.refused(chain)
            return 503, dumps_error(None, buffers.over_budget(budget)), b"Retry-After: 1\r\n"
        if pool.inflight:  # (nothing in flight is under any limit: none worked out, as at c=1)
            admission, now = self.admission, time.perf_counter()
            # (the limit kept in the pool while it is fresh: `Admission.limit`'s first test
            # without its call; the refusal is worked out only when over it)
            limit = (
                pool.admit_limit if now - pool.admit_at < REFRESH_S else admission.limit(pool, now)
            )
            if limit and pool.inflight >= limit:
                refused = admission.check(pool, now)
                if refused is not None:
                    self.metrics.refused(chain)
                    return 503, dumps_error(None, refused), refused.header
        self.admission.enter(pool)
        # One Admitted per pool (never changed by its users): no object per request.
        admitted = self._admitted.get(pool.id)
        if admitted is None or admitted.pool is not pool or admitted.chain != chain:
            if len(self._admitted) >= MAX_CHAIN_IDS:
                self._admitted.clear()
            admitted = self._admitted[pool.id] = Admitted(chain, pool)
        return admitted

    # ---- entries -------------------------------------------------------------------------

    async def handle(
        self,
        chain_id: str,
        body: bytes,
        headers: Mapping[str, str],
        admitted: Admitted | None = None,
        early: Callable[[bytes], Any] | None = None,
        parsed: Any = None,
        tally: Any = None,
        ctx: Ctx | None = None,
    ) -> Answer:
        """Answer one client body: (HTTP status, response body; b"" with 204), and extra
        header lines when the pool refuses it (`Retry-After` with a 503). `admitted`: what
        `admit(chain_id)` gave, when the caller asked already. `early(body)`: writes a 200
        answer to the client before this returns (a single request's node answer, final
        as the node sent it, goes out from the node connection's callback); the returned
        answer is then the same bytes, which the caller no longer writes. `parsed`: the
        body's batch, when the caller parsed it already (nothing changed it since).
        `tally`: the client's usage tally when tenancy follows the request (each attempt
        sent to a node adds one to its `upstream`: `Ctx.tally`). `ctx`: the request's, made
        by a step of the synchronous start (`Pipeline.cached_now`)."""
        started = time.perf_counter()
        if admitted is None:
            entry = self.admit(chain_id)
            if type(entry) is tuple:
                return entry
            admitted = entry  # type: ignore[assignment]
        try:
            if self.tracer is None:
                return await self.pipeline.run(
                    admitted, body, headers, None, started, early, parsed, tally, ctx
                )
            with self.tracer.start_as_current_span("jsonrpc.request") as span:
                return await self.pipeline.run(
                    admitted, body, headers, span, started, early, parsed, tally, ctx
                )
        finally:
            self.admission.leave(admitted.pool)

    def start(
        self,
        chain_id: str,
        found: tuple[str, Pool] | None,
        request: Request,
        tally: Any = None,
    ) -> Response | Awaitable[Response] | None:
        """`handle` for the data listener (`found`: what `resolve(chain_id)` gave), without a
        task where none is needed: the body's first attempt is made synchronously
        (proxy/firstattempt.py, proxy/firstbatch.py). Its answer when made now; None when
        the first attempt went out, its answer then given to `request.answer_early` from a
        callback, or the rest of its steps to `request.answer_later` as a task; else the
        rest of the pipeline as a coroutine. `tally`: as `handle`'s."""
        body = request.body
        if self.tracer is None and len(body) <= self._max_body:
            if len(body) >= LARGE_BODY:
                return self._large(chain_id, found, request, tally)
            started = time.perf_counter()
            if body[:1] == b"[":  # (parsed there only when a node in process takes it)
                return self.batches.start(chain_id, found, None, request, started, tally)
            try:
                payload = orjson.loads(body)
            except orjson.JSONDecodeError:
                payload = None
            if type(payload) is dict:
                return self.first.start(chain_id, found, payload, request, started, tally)
            if type(payload) is list:
                return self.batches.start(chain_id, found, payload, request, started, tally)
        admitted = self.admit_resolved(chain_id, found)
        if type(admitted) is tuple:
            return admitted
        early = request.answer_early
        return self.handle(chain_id, body, request.headers, admitted, early, tally=tally)  # type: ignore[arg-type]

    async def _large(
        self, chain_id: str, found: tuple[str, Pool] | None, request: Request, tally: Any
    ) -> Response:
        """`start` for a body of LARGE_BODY bytes or more: it is parsed in a turn of the
        event loop of its own, one such body per turn, then its first attempt made as
        `start` makes it. A turn runs every callback ready when it began before it reads the
        sockets again, so eight 5 MB eth_calls arriving together would parse one after
        another before any other client is read; one per turn, the others are served between
        them. The body holds its place among the pool's requests in flight while it waits."""
        admitted = self.admit_resolved(chain_id, found)
        if type(admitted) is tuple:
            return admitted
        try:
            async with self._large_turn:  # (its release wakes the next one a turn later)
                try:
                    payload = orjson.loads(request.body)
                except orjson.JSONDecodeError:
                    payload = None  # (`handle` answers the parse error)
        finally:
            self.admission.leave(admitted.pool)  # (the first attempt takes its own place)
        if type(payload) is not dict and type(payload) is not list:
            return await self.handle(chain_id, request.body, request.headers, tally=tally)  # type: ignore[arg-type]
        settled = Settled(request)
        started = time.perf_counter()
        if type(payload) is dict:
            step = self.first.start(chain_id, found, payload, settled, started, tally)  # type: ignore[arg-type]
        else:
            step = self.batches.start(chain_id, found, payload, settled, started, tally)  # type: ignore[arg-type]
        if step is None:
            return await settled.done
        return await step if inspect.isawaitable(step) else step  # type: ignore[return-value]


class Settled:
    """A request, as `Engine.start` reads one, whose answer (written early, or given to a
    task later) settles a future instead: `Engine._large` awaits it."""

    __slots__ = ("body", "done", "headers")

    def __init__(self, request: Request) -> None:
        self.body = request.body
        self.headers = request.headers
        self.done: asyncio.Future[Response] = asyncio.get_running_loop().create_future()

    def answer_early(self, result: Response) -> bool:
        if not self.done.done():
            self.done.set_result(result)
        return True

    def answer_later(self, step: Awaitable[Response]) -> None:
        task = asyncio.ensure_future(step)
        _RUNNING.add(task)  # (the loop keeps only a weak reference to a task)
        task.add_done_callback(_RUNNING.discard)
        task.add_done_callback(self._landed)

    def _landed(self, task: asyncio.Future[Response]) -> None:
        done = self.done
        if done.done():
            return
        if task.cancelled():
            done.cancel()
        elif task.exception() is not None:
            done.set_exception(task.exception())  # type: ignore[arg-type]
        else:
            done.set_result(task.result())


_RUNNING: set[asyncio.Future[Any]] = set()

"""Step 4 of routing: one exchange with a node, and what it teaches about the node.

`Attempts.exchange` sends one body (a single request, a whole batch or a sub-batch) to the
node chosen for a `Group` of items and returns the node that answered and its bytes, or
raises `UpstreamError`. Around every attempt it keeps the node's books: in-flight count,
latency (peak EWMA for the choice, the pool's window for hedge delays and attempt timeouts),
breaker (success, or a penalised outcome), metrics and the `upstream.attempt` span. When the
group may be hedged (an idempotent read on a plain-http node with another eligible node), a
`Race` (proxy/hedge.py) lets a second node join a slow attempt (its node chosen by
proxy/choose.py). `send_now` is the same first attempt without a task, for the pipeline's
synchronous start when no race is due.

Nothing here decides whether an *answer* is retried: proxy/classify.py classifies answers
(proxy/outcome.py) and proxy/rounds.py runs the one retry loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from opentelemetry import trace

from proxy import latency, outcome
from proxy.breaker import CLOSED, HALF_OPEN
from proxy.hedge import TIMEOUT, HedgeBudget, Race
from proxy.latency import LatencyWindow
from proxy.metrics import ProxyMetrics
from proxy.model import Node, Pool
from proxy.outcome import UpstreamError
from proxy.request import Group
from proxy.settings import ProxySettings
from proxy.transport import SentNow
from proxy.upstream import Upstream

log = logging.getLogger(__name__)
FAILURE_COST_MS = 1000.0  # a failed attempt counts as at least this slow in the node's cost
READ_KINDS = ("state", "archive")  # a lone node of these may be raced with another kind
RATE_LIMITED = outcome.RATE_LIMITED.name
OK = outcome.OK.name


def booked_label(ctx: Any, raw: bytes, label: Callable[[bytes], str] = outcome.answered) -> str:
    """An answer's label in its attempt's books: bytes written early to the client are final
    as they are (`ok`, never scanned again), others are named by `label`."""
    return OK if ctx.written is raw else label(raw)


# A raced attempt as its second attempt needs it: (ctx, group, body, tracing context or None).
Sent = tuple[Any, Group, bytes, contextvars.Context | None]


class Attempts:
    def __init__(
        self,
        settings: ProxySettings,
        upstream: Upstream,
        second: Callable[[Group], Node | None],
        metrics: ProxyMetrics,
        tracer: trace.Tracer | None = None,
    ) -> None:
        s = settings
        self.upstream = upstream
        self.second = second  # a hedge's node (proxy/choose.py `Chooser.second`)
        self.metrics = metrics
        self.tracer = tracer
        self.ceiling = s.upstream_timeout
        self.tau = s.latency_decay
        self.hedge_ratio = s.hedge_budget
        self.hedge_quantile = s.hedge_quantile
        self.hedge_min = s.hedge_min_delay
        self.timeout_factor = s.attempt_timeout_factor
        self.timeout_min = s.attempt_timeout_min

    # ---- one group -----------------------------------------------------------------------

    async def exchange(
        self,
        ctx: Any,
        group: Group,
        body: bytes,
        usable: Callable[[bytes], bool],
        label: Callable[[bytes], str] | None = None,
    ) -> tuple[Node, bytes]:
        """Send `body` for `group` (its node, and maybe a second one): (node, answer).
        `usable(answer)` says whether a second attempt's answer may win the race;
        `label(answer)` names the first attempt's answer in its books (a caller that checks
        the answer anyway checks it there, once; None: `outcome.answered`)."""
        if label is None:
            label = outcome.answered
        node = group.node
        lone = len(group.cands) == 1
        race = None
        if not lone or self._lone(ctx.pool, node):
            race = self._race(ctx, group, body, usable, lone)
        # The client may get the first attempt's answer from its connection's callback
        # (Ctx.answer_early: only an answer step 5 would return as it is). Never a second
        # attempt's: it reaches the rounds through the first one's future, and only then
        # is it known to have won.
        early = ctx.answer_early if ctx.early is not None else None
        if race is None:
            return node, await self.attempt(ctx, node, body, group, None, early, label)
        try:
            raw = await self.attempt(ctx, node, body, group, race, early, label)
            if race.task is not None and race.winner is None and not usable(raw):
                # The first answer asks for a retry while a second attempt runs: the second
                # one's answer serves (its node counts as tried: a retry would skip it).
                with contextlib.suppress(UpstreamError):
                    return await race.second()
        except UpstreamError:
            if race.task is None:
                raise
            race.failed()
            return await race.second()  # the first failed while a second was running
        except asyncio.CancelledError:
            won = race.won_early()  # the second answered before the first was sent
            if won is None:
                raise
            return race.winner, won
        finally:
            race.close()
        return (node, raw) if race.winner is None else (race.winner, raw)

    def _race(
        self, ctx: Any, group: Group, body: bytes, usable: Callable[[bytes], bool], lone: bool
    ) -> Race | None:
        """A race for a hedgeable group (a plain-http node: a second attempt hands its answer
        to the first one's connection future), or None. `lone`: its node is the only one of
        its kind: raced at the attempt timeout alone (proxy/hedge.py). None too when every
        other candidate is the same server (one URL entered under two kinds): a second
        attempt there would wait on the server the first one waits on."""
        node = group.node
        url = node.entry.url
        if not url.startswith("http://"):
            return None
        if not lone and not _elsewhere(group.cands, url):
            return None
        pool: Pool = ctx.pool
        timers = self._timers(pool, group.lkey)
        if lone:  # (no hedge: it would take the budget other nodes' hedges are for)
            timeout = None if timers is None else timers[1]
            if timeout is None:
                return None
            timers = None, timeout
        budget = pool.hedge if lone and pool.hedge is not None else self._earn(pool)
        if timers is None:
            return None
        deadlines = self.upstream.deadlines
        # (traced: the request's context now, the parent of a second attempt's span)
        context = contextvars.copy_context() if self.tracer is not None else None
        return Race(deadlines, budget, self, (ctx, group, body, context), usable, *timers, lone)

    @staticmethod
    def _lone(pool: Pool, node: Node) -> bool:
        """Whether an attempt to `node`, the one eligible node, may be raced with another
        reader (the next that holds the block is found only if the attempt is late): one
        of another server (a URL entered under two kinds is one server)."""
        return node.entry.kind in READ_KINDS and _elsewhere(pool.readers, node.entry.url)

    def _lone_timeout(self, pool: Pool, group: Group) -> float | None:
        """The attempt timeout of a first attempt sent now whose node is the only eligible
        one, when another reader may take over once it passes (`Rescue`), else None."""
        if len(group.cands) != 1 or len(group.items) != 1 or len(pool.readers) < 2:
            return None  # (the last: a reader other than the node, before `_lone`'s loop)
        if not self._lone(pool, group.node):
            return None
        timers = self._timers(pool, group.lkey)
        return None if timers is None else timers[1]

    def _earn(self, pool: Pool) -> HedgeBudget:
        """A first attempt that may be hedged earns the pool's hedge budget its share."""
        budget = pool.hedge
        if budget is None:
            budget = pool.hedge = HedgeBudget(self.hedge_ratio)
        budget.earn()
        return budget

    def _timers(self, pool: Pool, lkey: str) -> tuple[float | None, float | None] | None:
        """(hedge delay, attempt timeout) of a hedgeable attempt, or None when neither
        applies (too few latency samples yet, or both off)."""
        window = pool.latency.get(lkey)
        if window is None or window.p99 is None:
            return None  # too few samples yet: neither delay is known
        hedge = None
        if self.hedge_ratio > 0 and window.hedge_q is not None:
            hedge = max(window.hedge_q, self.hedge_min)
        # Rounded: a deadline lane per distinct value, keep them few. At the ceiling or
        # above: none (the ceiling, a hard deadline, comes first anyway).
        derived = max(self.timeout_factor * window.p99, self.timeout_min)
        timeout = None if derived >= self.ceiling else round(derived, 3)
        if hedge is None and timeout is None:
            return None
        return hedge, timeout

    def send_now(self, ctx: Any, group: Group, body: bytes, landed: Landed) -> bool:
        """`exchange` without a task, when nothing needs one: a first attempt to a
        plain-http node whose breaker is closed, with no hedge or attempt timeout due and an
        idle connection (`Upstream.send_now`); False (nothing done) otherwise. The node's
        books are kept as `attempt` keeps them, then `landed.then(node, raw, error)` runs;
        `then(node, None, None)`: not sent after all (nothing counted). An in-process node
        gets the group's items as objects when it answers them as a future (no race there
        either: only plain-http attempts are hedged or timed by the latency window)."""
        node = group.node
        url = node.entry.url
        if node.breaker.state is not CLOSED:
            return False
        if url.startswith("http://"):
            taken = self.connection_now(ctx.pool, node, group.lkey, group.cands)
            if taken is None:
                return False
            started = time.perf_counter()
            taken[1].transport.write(taken[0].request(body))
            self.sent_now(ctx, group, taken, started, landed, body)
            return True
        items = [it.obj for it in group.items]
        landed.arm(self, ctx, group, False, time.perf_counter())
        early = ctx.answer_early
        if not self.upstream.send_now(url, None, self.ceiling, ctx, early, landed.landed, items):
            return False
        node.inflight += 1  # (the attempt is under way: `_begin`, inline)
        ctx.nodes.append(node.entry.key)
        if ctx.tally is not None:
            ctx.tally.upstream += 1
        return True

    def connection_now(self, pool: Any, node: Node, lkey: str, cands: list[Node]) -> Any:
        """For a first attempt to a plain-http `node` whose breaker is closed, among the
        eligible nodes `cands`: an idle connection to write the request to now (`Upstream.
        take_now`, its slot taken: `sent_now` must follow the write), or None when the
        attempt needs `exchange` (a hedge or attempt timeout is due, no idle connection)."""
        url = node.entry.url
        if len(cands) > 1 and self._timers(pool, lkey) is not None and _elsewhere(cands, url):
            return None  # a race is due: `exchange` runs it
        return self.upstream.take_now(url)

    def sent_now(
        self,
        ctx: Any,
        group: Group,
        taken: Any,
        started: float,
        landed: Landed,
        body: bytes | None = None,
    ) -> None:
        """The books of a first attempt written at `started` on `connection_now`'s
        connection, and its answer's wait: kept as `attempt` keeps them, then `landed.
        then(node, raw, error)` runs. A single request (`body`) to the only node of its kind
        with another reader beside it is raced at its attempt timeout (`Rescue`)."""
        node = group.node
        url = node.entry.url
        pool = ctx.pool  # (a pool of one reader has no rescue: `_lone_timeout` not called)
        soft = None if body is None or len(pool.readers) < 2 else self._lone_timeout(pool, group)
        landed.arm(self, ctx, group, len(group.cands) > 1, started)  # (its `then` reads them)
        if soft is None:
            early = ctx.answer_early
            self.upstream.expect_now(taken, url, self.ceiling, ctx, early, landed.landed)
        else:
            then = landed.then
            rescue = Rescue(self, ctx, group, body, soft, started, then, landed.label)  # type: ignore[arg-type]
            early = ctx.answer_early
            self.upstream.expect_now(
                taken, url, self.ceiling, ctx, early, rescue.landed, soft, rescue.slow
            )
        node.inflight += 1  # (the attempt is under way: `_begin`, inline)
        ctx.nodes.append(node.entry.key)
        if ctx.tally is not None:
            ctx.tally.upstream += 1

    def launch(self, sent: Sent, trigger: str) -> asyncio.Task[tuple[Node, bytes]] | None:
        """A race's second attempt of what `sent` holds (`trigger`: why), in a task on
        another node, or None when none is eligible now."""
        ctx, group, body, context = sent
        second = self.second(ctx.pool, group)
        if second is None:
            return None
        for it in group.items:
            it.tried.append(second)
        coro = self._second(ctx, second, body, group, trigger)
        return self.upstream.deadlines.loop.create_task(coro, context=context)

    async def _second(
        self, ctx: Any, node: Node, body: bytes, group: Group, trigger: str
    ) -> tuple[Node, bytes]:
        # Counted once it runs: a first attempt answering in the same loop turn cancels the
        # second before it sends anything.
        self.metrics.hedge(ctx.chain, trigger)
        return node, await self.attempt(ctx, node, body, group)

    # ---- one attempt ---------------------------------------------------------------------

    def attempt(
        self,
        ctx: Any,
        node: Node,
        body: bytes,
        group: Group,
        race: Race | None = None,
        early: Callable[[int, bytes], Any] | None = None,
        label: Callable[[bytes], str] = outcome.answered,
    ) -> Awaitable[bytes]:
        """One upstream try with its bookkeeping, to await: the raw answer, or
        UpstreamError. `early(status, body)` sees the answer first (Upstream.send);
        `label(answer)` names it in the books. Untraced, the send's own coroutine (no
        coroutine around it)."""
        if self.tracer is None:
            return self._send(ctx, node, body, group.lkey, race, None, early, label)
        return self._traced(ctx, node, body, group, race, early, label)

    async def _traced(
        self,
        ctx: Any,
        node: Node,
        body: bytes,
        group: Group,
        race: Race | None,
        early: Callable[[int, bytes], Any] | None,
        label: Callable[[bytes], str],
    ) -> bytes:
        assert self.tracer is not None
        with self.tracer.start_as_current_span("upstream.attempt") as span:
            span.set_attribute("node", node.key)
            span.set_attribute("attempt", group.round)
            span.set_attribute("items", len(group.items))
            return await self._send(ctx, node, body, group.lkey, race, span, early, label)

    async def _send(
        self,
        ctx: Any,
        node: Node,
        body: bytes,
        lkey: str,
        race: Race | None,
        span: Any,
        early: Callable[[int, bytes], Any] | None = None,
        label: Callable[[bytes], str] = outcome.answered,
    ) -> bytes:
        breaker = node.breaker
        if breaker.state is HALF_OPEN:
            breaker.start_probe()
        self._begin(ctx, node)
        started = time.perf_counter()
        try:
            raw = await self.upstream.send(node.entry.url, body, self.ceiling, race, ctx, early)
        except UpstreamError as exc:
            self._failed(ctx, node, exc, time.perf_counter() - started, span)
            raise
        except asyncio.CancelledError:  # the other attempt won, or the client's task ended
            self._cut_short(ctx, node, time.perf_counter() - started, "cancelled", span)
            raise
        finally:
            self._end(node)
        elapsed = time.perf_counter() - started
        if race is not None and race.winner is not None:  # the second attempt answered first
            self._cut_short(ctx, node, elapsed, "lost", span)
            if not race.struck:  # (a timeout was counted against it already)
                why = f"slow: another node answered first after {elapsed:.3f}s (hedged)"
                node.breaker.failure(node.key, why)
            return raw
        self.answered(ctx, node, lkey, elapsed, booked_label(ctx, raw, label), span)
        return raw

    @staticmethod
    def _begin(ctx: Any, node: Node) -> None:
        """An attempt to `node` is on its way: counted in flight (a node's in-flight count,
        which the selector's choice weighs, is kept by this class alone: here, and inline
        where a first attempt is sent now), named in the log and counted in the client's
        upstream calls when tenancy follows the request."""
        node.inflight += 1
        ctx.nodes.append(node.key)
        if ctx.tally is not None:
            ctx.tally.upstream += 1

    @staticmethod
    def _end(node: Node) -> None:
        """The attempt `_begin` counted ended, answered or not."""
        node.inflight -= 1

    def answered(
        self, ctx: Any, node: Node, lkey: str, elapsed: float, label: str, span: Any = None
    ) -> None:
        """The node answered (whatever the answer says, it works): its books, and the
        attempt counted as `label`."""
        breaker = node.breaker  # (`_in_rotation`'s tests first: a healthy node needs no call)
        if node.fails or not node.healthy or breaker.failures or breaker.state is not CLOSED:
            _in_rotation(node)
        budget = node.budget
        if label == RATE_LIMITED:
            budget.rate_limited()
        elif budget.strikes:
            budget.answered()
        ms = elapsed * 1000
        latency.observe(node, ms, time.monotonic(), self.tau)
        node.observe_latency(ms)
        window = ctx.pool.latency.get(lkey)  # (`_window`, inline)
        if window is None:
            window = self._window(ctx.pool, lkey)
        window.add(elapsed)
        self.metrics.attempt(ctx.chain, node.entry.key, label, elapsed)
        if span is not None:
            span.set_attribute("outcome", label)

    def answered_ok(
        self,
        ctx: Any,
        node: Node,
        lkey: str,
        samples: list[float],
        ordered: list[float] | None = None,
    ) -> None:
        """`answered(ctx, node, lkey, s, "ok")` for each of `samples` (seconds, in order),
        folded in together at one instant (proxy/inprocbooks.py; `ordered`: `sorted(samples)`
        when the caller has it). Not the breaker or health: each answer came through a node
        with no failure and a closed breaker, where it changed neither; folded in later, it
        must not close a breaker opened since."""
        # The samples sorted once, for the window's and the histogram's buckets and the
        # slowest: `observe_many` looks at the first sample and the slowest of the rest
        # only, and the slowest of all does the same (the first is at most the cost it
        # leaves); the max of `s * 1000` is the max of `s`, times 1000.
        if ordered is None:
            ordered = sorted(samples)
        ms = [samples[0] * 1000, ordered[-1] * 1000]
        latency.observe_many(node, ms, time.monotonic(), self.tau)
        node.observe_latencies(samples)
        self._window(ctx.pool, lkey).add_many(samples, ordered)
        self.metrics.attempts_ok(ctx.chain, node.key, samples, ordered)

    def _window(self, pool: Pool, lkey: str) -> LatencyWindow:
        """The pool's latency window of `lkey` (a method, or `batch`)."""
        window = pool.latency.get(lkey)
        if window is None:
            window = pool.latency[lkey] = LatencyWindow(self.hedge_quantile)
        return window

    def _failed(self, ctx: Any, node: Node, exc: UpstreamError, elapsed: float, span: Any) -> None:
        result = exc.outcome
        if result is outcome.RATE_LIMITED:
            node.budget.rate_limited()
        if result.penalise:
            node.breaker.failure(node.key, str(exc))
            ms = max(elapsed * 1000, FAILURE_COST_MS)
            latency.observe(node, ms, time.monotonic(), self.tau)
        else:
            node.breaker.end_probe()
        self.metrics.attempt(ctx.chain, node.key, exc.kind, elapsed)
        self.metrics.upstream_error(node.key, exc.kind)
        if span is not None:
            span.set_attribute("outcome", exc.kind)

    def _cut_short(self, ctx: Any, node: Node, elapsed: float, why: str, span: Any) -> None:
        """An attempt ended without its own answer: it took at least `elapsed`."""
        node.breaker.end_probe()
        latency.observe(node, elapsed * 1000, time.monotonic(), self.tau)
        self.metrics.attempt(ctx.chain, node.key, why, elapsed)
        if span is not None:
            span.set_attribute("outcome", why)

    def late(self, ctx: Any, node: Node, timeout: float | None) -> None:
        """A sent attempt passed its attempt timeout: a timeout against its node."""
        node.breaker.failure(node.key, f"timeout: no answer within the attempt timeout {timeout}s")
        latency.observe(node, (timeout or self.ceiling) * 1000, time.monotonic(), self.tau)
        self.metrics.upstream_error(node.key, "timeout")

    def penalise(self, ctx: Any, node: Node, result: outcome.Outcome, why: str) -> None:
        """An answer the classify step found unusable (e.g. a batch answer that is not JSON)."""
        if result.penalise:
            node.breaker.failure(node.key, why)
        self.metrics.upstream_error(node.key, result.name)


class Rescue:
    """A first attempt sent now (no task) to the only eligible node of its kind, raced at its
    attempt timeout: when it is late (`slow`, at the soft deadline of its exchange), a
    second attempt goes in a task to the next node that holds the block (`Chooser.second`);
    the first answer usable wins, as in a `Race` (proxy/hedge.py). Until then it costs no
    task, no timer and no deadline entry more than any first attempt sent now."""

    __slots__ = (
        "attempts",
        "body",
        "ctx",
        "group",
        "held",
        "label",
        "sent",
        "soft",
        "started",
        "task",
        "then",
        "winner",
    )

    def __init__(
        self,
        attempts: Attempts,
        ctx: Any,
        group: Group,
        body: bytes,
        soft: float,
        started: float,
        then: Callable[[Node, Any, Any], Any],
        label: Callable[[bytes], str] = outcome.answered,
    ) -> None:
        self.attempts = attempts
        self.ctx = ctx
        self.group = group
        self.body = body
        self.label = label  # names the first answer in its books (`Landed.label`)
        self.soft = soft  # the attempt timeout
        self.started = started
        self.then = then
        self.sent: SentNow | None = None  # the first attempt's exchange, once late
        self.task: asyncio.Task[tuple[Node, bytes]] | None = None  # the second attempt
        self.winner: Node | None = None  # the second attempt's node, when it won
        self.held: tuple[bytes | None, UpstreamError | None] | None = None  # the first's

    def slow(self, sent: SentNow) -> None:
        """The first attempt passed its attempt timeout: the rest of the ceiling scheduled,
        and a second attempt started when a node can take over (only then is the first
        counted as a timeout against its node)."""
        attempts, ctx, group = self.attempts, self.ctx, self.group
        attempts.upstream.deadlines.schedule(round(attempts.ceiling - self.soft, 3), sent)
        second = attempts.second(ctx.pool, group)
        if second is None:
            return
        attempts.late(ctx, group.node, self.soft)
        for it in group.items:
            it.tried.append(second)
        self.sent = sent
        coro = attempts._second(ctx, second, self.body, group, TIMEOUT)
        self.task = asyncio.get_running_loop().create_task(coro)
        self.task.add_done_callback(self._second_done)

    def landed(self, raw: bytes | None, exc: UpstreamError | None) -> None:
        """The first attempt's outcome (or the second one's answer, handed to its exchange
        when it won), booked as `Landed` books it."""
        attempts, ctx, node = self.attempts, self.ctx, self.group.node
        node.inflight -= 1
        elapsed = time.perf_counter() - self.started
        if self.winner is not None:  # (its timeout was counted when the second started)
            attempts._cut_short(ctx, node, elapsed, "lost", None)
            self.then(self.winner, raw, None)
            return
        task = self.task
        if exc is not None:
            attempts._failed(ctx, node, exc, elapsed, None)
        elif raw is not None:
            attempts.answered(
                ctx, node, self.group.lkey, elapsed, booked_label(ctx, raw, self.label)
            )
        elif task is None:
            ctx.nodes.pop()  # the idle connection was closed: no attempt was made
            if ctx.tally is not None:
                ctx.tally.upstream -= 1
        if task is not None and not task.done():
            if raw is None or outcome.of_raw(raw).retry:
                self.held = (raw, exc)  # the second attempt's answer may serve: wait
                return
            task.cancel()
        self.then(node, raw, exc)

    def _second_done(self, task: asyncio.Task[tuple[Node, bytes]]) -> None:
        if task.cancelled():
            return  # the first attempt answered
        failed = task.exception()
        found = None if failed is not None else task.result()
        usable = found is not None and not outcome.of_raw(found[1]).retry
        held = self.held
        if held is None:  # the first attempt still waits
            sent = self.sent
            if usable and sent is not None and not sent.finished:
                self.winner = found[0]  # type: ignore[index]
                sent.set_result((200, found[1]))  # type: ignore[index]  (ends the first)
            return
        self.held = None
        if usable:
            self.then(found[0], found[1], None)  # type: ignore[index]
        else:
            self.then(self.group.node, *held)


class Landed:
    """What a first attempt `send_now` or `sent_now` made (at `started`) does with its
    outcome: the attempt's books, then `then(node, raw, error)`, a subclass's method: the
    caller's own state and these books are one object per first attempt (one object and
    its bound method cost about half of a closure over as many cells)."""

    __slots__ = ("attempts", "ctx", "group", "hedgeable", "node", "started")
    # names the answer in the attempt's books (a subclass that checks the answer anyway
    # checks it there, once: `Attempts.exchange`'s `label`)
    label: Callable[[bytes], str] = staticmethod(outcome.answered)  # type: ignore[assignment]

    def arm(
        self, attempts: Attempts, ctx: Any, group: Group, hedgeable: bool, started: float
    ) -> None:
        """The attempt's books to keep once it lands (set by `Attempts` when it is sent)."""
        self.attempts = attempts
        self.ctx = ctx
        self.group = group
        self.node = group.node  # (the node it was sent to, whatever the group holds later)
        self.hedgeable = hedgeable
        self.started = started

    def then(self, node: Node, raw: bytes | None, exc: UpstreamError | None) -> None:
        """What follows the attempt's books."""
        raise NotImplementedError

    def landed(self, raw: bytes | None, exc: UpstreamError | None) -> None:
        attempts, ctx, node = self.attempts, self.ctx, self.node
        node.inflight -= 1  # (`_end`, inline)
        elapsed = time.perf_counter() - self.started
        if exc is not None:
            attempts._failed(ctx, node, exc, elapsed, None)
        elif raw is not None:
            attempts.answered(
                ctx, node, self.group.lkey, elapsed, booked_label(ctx, raw, self.label)
            )
        else:
            ctx.nodes.pop()  # the idle connection was closed: no attempt was made
            if ctx.tally is not None:
                ctx.tally.upstream -= 1
        if self.hedgeable and (raw is not None or exc is not None):
            attempts._earn(ctx.pool)  # an attempt made earns its share, as `_race`'s does
        self.then(node, raw, exc)


class LandedThen(Landed):
    """`Landed` whose `then` is a callable given (its slot shadows the method)."""

    __slots__ = ("then",)

    def __init__(self, then: Callable[[Node, Any, Any], Any]) -> None:
        self.then = then  # type: ignore[assignment]


def _elsewhere(nodes: list[Node], url: str) -> bool:
    """Whether one of `nodes` is another server than `url`'s (a loop, not `any()` over a
    generator: this runs for every raced attempt)."""
    for other in nodes:
        if other.entry.url != url:
            break
    else:
        return False
    return True


def _in_rotation(node: Node) -> None:
    """A node that answered is healthy and its breaker counts a success."""
    if (node.fails or not node.healthy) and node.succeeded():
        log.warning("node %s back in rotation (answered a request)", node.key)
    breaker = node.breaker
    if breaker.failures or breaker.state is not CLOSED:
        breaker.success(node.key)

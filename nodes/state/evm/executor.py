"""The Executor: turns validated requests into worker jobs and answers into results.

A job carries everything a worker needs (state URL, height, block env, chain id, spec, the
calls), so workers are stateless apart from their warm caches. Single calls on the same
block are coalesced: while the workers are busy, eth_calls for one block queue up and the
next free worker runs them together as one job (each still isolated), which spreads the
per-job cost (pipe, pickling, thread hop) over many calls.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict
from typing import Any

from chainstate.jsonrpc import JsonRpcError
from nodes.state.evm.pool import Overrun, WorkerPool
from nodes.state.evm.settings import EvmSettings
from nodes.state.evm.worker import WarmKey, warm_key

Pending = tuple[dict[str, Any], asyncio.Future[dict[str, Any]]]
AFFINITY_WAIT = 0.25  # seconds a block's calls may wait while a worker runs blocks it has warm
AFFINITY_SCAN = 64  # pending blocks looked at when choosing what a free worker runs
# A call of a combined job that overran, running for this share of the limit or more when
# stopped, overran by its own cost (`Executor._after_failure`): it had (nearly) the whole
# limit to itself, and would spend the same again.
OWN_COST = 0.9


class Waiting(list[Pending]):
    """The calls waiting at one block (one coalescing key), with when the first came and
    the warm EVM they run on (`warm_key`), taken once: a block's calls are looked up by
    their key once when queued and once when taken."""

    __slots__ = ("since", "warm")

    since: float
    warm: WarmKey | None


def raise_error(err: dict[str, Any]) -> None:
    raise JsonRpcError(err["code"], err["message"], err.get("data"))


def _coalesce_key(job: dict[str, Any]) -> tuple[Any, ...]:
    """Calls with equal keys run together as one job. The block env is compared by
    identity: the node hands the same (cached) env object to every call at one block, and
    a pending call keeps its env alive, so an id is never reused while it is a key."""
    flags = (job.get("fresh"), job.get("disable_cache"))
    return (
        job["fork_url"],
        job["height"],
        id(job["block"]),
        job["chain_id"],
        job["spec_id"],
        flags,
    )


class Executor:
    """Runs calls, sequences, estimates and traces on the worker pool."""

    def __init__(self, settings: EvmSettings) -> None:
        self.settings = settings
        self.pool = WorkerPool(settings)
        self._pending: OrderedDict[tuple[Any, ...], Waiting] = OrderedDict()
        self._pending_count = 0
        self._drainers = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        await self.pool.start()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.pool.close()

    def job(
        self,
        kind: str,
        fork_url: str,
        height: int,
        block: dict[str, Any],
        calls: list[dict[str, Any]],
        **extra: Any,
    ) -> dict[str, Any]:
        return {
            "kind": kind,
            "fork_url": fork_url,
            "height": height,
            "block": block,
            "chain_id": self.settings.chain_id,
            "spec_id": self.settings.spec_id,
            "calls": calls,
            **extra,
        }

    def _limit(self, job: dict[str, Any]) -> float:
        tracing = job["kind"] in ("trace", "replay", "trace_call", "access_list")
        return self.settings.trace_timeout if tracing else self.settings.call_timeout

    async def run(self, job: dict[str, Any]) -> dict[str, Any]:
        answer = await self.pool.run(job, self._limit(job))
        if "error" in answer:
            raise_error(answer["error"])
        return answer

    async def call(self, job: dict[str, Any]) -> dict[str, Any]:
        """One call (coalesced with others at its block); its failure is raised."""
        result = await self._coalesced(job)
        if not result["ok"]:
            raise_error(result["error"])
        return result

    async def calls(self, job: dict[str, Any], parallel: bool) -> list[dict[str, Any]]:
        """Independent calls; with `parallel`, split in chunks over the workers."""
        calls = job["calls"]
        chunks = 1
        if parallel and self.pool.size > 1 and len(calls) > 1:
            chunks = min(self.pool.size, len(calls))
        if chunks == 1:
            return (await self.run(job))["results"]
        size = -(-len(calls) // chunks)
        parts = [calls[i : i + size] for i in range(0, len(calls), size)]
        answers = await asyncio.gather(*(self.run({**job, "calls": p}) for p in parts))
        out: list[dict[str, Any]] = []
        for answer in answers:
            out.extend(answer["results"])
            if job.get("fast_fail") and any(not r["ok"] for r in answer["results"]):
                break
        return out

    # -- coalescing -------------------------------------------------------------------

    async def _coalesced(self, job: dict[str, Any]) -> dict[str, Any]:
        return await self.enqueue(job)

    def enqueue(self, job: dict[str, Any], sink: Any = None) -> asyncio.Future[dict[str, Any]]:
        """Queue one call (coalesced with others at its block): the future of its result
        dict (`{"ok", "output" | "error", …}`); -32005 when too many wait. `sink`: the
        caller's own receiver in place of the future (`done`, `set_result`,
        `set_exception`, as a future has them), given the result when it comes rather than
        through a callback the loop runs later."""
        if self._pending_count >= self.settings.queue_limit:
            raise JsonRpcError(-32005, "EVM executor busy: too many queued calls")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, Any]] = loop.create_future() if sink is None else sink
        key = _coalesce_key(job)
        waiting = self._pending.get(key)
        if waiting is None:
            waiting = self._pending[key] = Waiting()
            waiting.since = loop.time()
            waiting.warm = warm_key(job)
        waiting.append((job, future))
        self._pending_count += 1
        if self._drainers < self.pool.size:
            self._drainers += 1
            task = asyncio.create_task(self._drain())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return future

    def _pick(self, worker: Any) -> tuple[Any, ...]:
        """The pending block to run next on `worker`. A cold block costs one feed read per
        account and slot, a warm one runs in memory, so: a block warm on this worker first,
        else one warm on no worker (so each block warms on one worker only, and the workers'
        caches add up), else the oldest; the oldest always once it has waited AFFINITY_WAIT
        (no block starves). Only the AFFINITY_SCAN oldest blocks are looked at (bounded cost
        per job in the event loop)."""
        oldest = next(iter(self._pending))
        if worker is None or self._age(oldest) >= AFFINITY_WAIT:
            return oldest
        others = [w.warm for w in self.pool.workers() if w is not worker]
        unclaimed = None
        for key, waiting in itertools.islice(self._pending.items(), AFFINITY_SCAN):
            wanted = waiting.warm
            if wanted in worker.warm:
                return key
            if unclaimed is None and not any(wanted in o for o in others):
                unclaimed = key
        return oldest if unclaimed is None else unclaimed

    def _age(self, key: tuple[Any, ...]) -> float:
        return asyncio.get_running_loop().time() - self._pending[key].since

    def _take(self, worker: Any = None, key: tuple[Any, ...] | None = None) -> list[Pending]:
        """One block's waiting calls (see `_pick`), at most `coalesce_max` of them."""
        if not self._pending:
            return []
        if key is None:
            key = self._pick(worker)
        return self._taken(key, self._pending[key])

    def _taken(self, key: tuple[Any, ...], items: Waiting) -> list[Pending]:
        """`_take` of the calls `items` waiting under `key`."""
        limit = self.settings.coalesce_max
        taken: list[Pending]
        if len(items) <= limit:  # (the usual case: no copies)
            taken = items
            del self._pending[key]
        else:
            taken = items[:limit]
            del items[:limit]
        self._pending_count -= len(taken)
        for _, future in taken:
            if future.done():  # (a caller left: its call is not run)
                return [(j, f) for j, f in taken if not f.done()]
        return taken

    def _take_groups(self, worker: Any) -> tuple[list[list[Pending]], list[WarmKey | None]]:
        """What a free worker runs next as one job: the calls of one block (`_take`), then
        of more blocks while they fit in `coalesce_max` calls: blocks warm on `worker` or
        on no other worker (so blocks keep their worker), in one pass over the AFFINITY_SCAN
        oldest. Calls at many heights (old blocks read at random) then share one pipe round
        trip instead of paying one each. With each group's warm key (`pool._Worker.note`)."""
        share = -(-len(self._pending) // self.pool.size)  # leave the other workers theirs
        groups = []
        keys: list[WarmKey | None] = []  # their warm keys
        if self._pending:
            key = self._pick(worker)
            waiting = self._pending[key]
            first = self._taken(key, waiting)
            if first:
                groups.append(first)
                keys.append(waiting.warm)
        else:
            first = []
        room = self.settings.coalesce_max - len(first)
        if len(groups) >= share or room <= 0 or not self._pending:
            return groups, keys
        others = [w.warm for w in self.pool.workers() if w is not worker]
        mine = worker.warm
        for key, waiting in list(itertools.islice(self._pending.items(), AFFINITY_SCAN)):
            wanted = waiting.warm
            if wanted not in mine:
                claimed = False
                for warm in others:  # (a loop, not any(): no generator per block)
                    if wanted in warm:
                        claimed = True
                        break
                if claimed:
                    continue
            if len(waiting) > room:
                break
            more = self._taken(key, waiting)
            if more:
                groups.append(more)
                keys.append(wanted)
                room -= len(more)
                if len(groups) >= share or room <= 0:
                    break
        return groups, keys

    async def _drain(self) -> None:
        """Hand waiting calls to free workers until none wait."""
        try:
            while self._pending:
                oldest = next(iter(self._pending.values())).warm
                worker = await self.pool.acquire(prefer=oldest)
                groups, warm = self._take_groups(worker)
                if not groups:
                    self.pool.release(worker)
                    continue
                # (a pending job holds its one call: a block's single call goes as it is)
                jobs = [
                    g[0][0] if len(g) == 1 else {**g[0][0], "calls": [j["calls"][0] for j, _ in g]}
                    for g in groups
                ]
                # ("warm": the groups' warm keys, as taken, for `pool._Worker.note`)
                job = jobs[0] if len(jobs) == 1 else {"kind": "groups", "jobs": jobs, "warm": warm}
                try:
                    answer = await self.pool.run_on(worker, job, self._limit(jobs[0]))
                except JsonRpcError as exc:
                    self._after_failure([item for g in groups for item in g], exc)
                    continue
                # (`wire.pack_answer`: a list of each group's answer; a dict for a whole
                # job the worker failed)
                if len(jobs) == 1:
                    self._deliver(groups[0], answer)
                    continue
                if answer.__class__ is not list:
                    answer = [answer] * len(groups)
                for i, items in enumerate(groups):  # (an answer per group sent)
                    self._deliver(items, answer[i])
        except JsonRpcError as exc:  # acquire refused: fail what waits
            while self._pending:
                for _, future in self._take():
                    future.set_exception(exc)
        finally:
            self._drainers -= 1

    @staticmethod
    def _deliver(items: list[Pending], answer: Any) -> None:
        """Each call's result to its future, from its group's answer: its results (a tuple,
        `wire.pack_answer`, or a `results` dict) or an error for them all."""
        if answer.__class__ is dict:
            if "error" in answer:
                for _, future in items:
                    if not future.done():
                        future.set_result({"ok": False, "error": answer["error"], "gas_used": 0})
                return
            answer = answer["results"]
        for i, (_, future) in enumerate(items):  # (a result per call sent)
            if not future.done():
                result = answer[i]
                if result.__class__ is tuple:  # (`wire.result_of`, inline: one per call)
                    result = {"ok": True, "output": result[0], "gas_used": result[1], "logs": []}
                future.set_result(result)

    def _after_failure(self, items: list[Pending], exc: JsonRpcError) -> None:
        """A combined job overran or crashed. Overran: the call it was running when it had
        run (nearly) the whole limit is the culprit by its own cost, answered so and never
        run again; the others only shared its time: queued again, that call first when it
        was cut short (it then has the limit to itself). Crashed: each call runs alone, so
        only its culprit fails."""
        if len(items) == 1:
            if not items[0][1].done():
                items[0][1].set_exception(exc)
            return
        if isinstance(exc, Overrun) and 0 <= exc.running < len(items):
            culprit = items[exc.running]
            rest = items[: exc.running] + items[exc.running + 1 :]
            if exc.ran >= OWN_COST * exc.limit:
                if not culprit[1].done():
                    culprit[1].set_exception(Overrun(exc.limit))
                self._requeue(rest)
            else:
                self._requeue([culprit, *rest])
            return
        for job, future in items:
            task = asyncio.create_task(self._alone(job, future))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _requeue(self, items: list[Pending]) -> None:
        """Calls of a job that overran for another call's cost, waiting again at the head of
        their blocks' queues, in order (`enqueue` without a new future)."""
        loop = asyncio.get_running_loop()
        for job, future in reversed(items):
            if future.done():  # (its caller left)
                continue
            key = _coalesce_key(job)
            waiting = self._pending.get(key)
            if waiting is None:
                waiting = self._pending[key] = Waiting()
                self._pending.move_to_end(key, last=False)
                waiting.since = loop.time()
                waiting.warm = warm_key(job)
            waiting.insert(0, (job, future))
            self._pending_count += 1
        if self._pending and self._drainers < self.pool.size:
            self._drainers += 1
            task = asyncio.create_task(self._drain())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _alone(self, job: dict[str, Any], future: asyncio.Future[dict[str, Any]]) -> None:
        try:
            answer = await self.pool.run(job, self._limit(job))
        except JsonRpcError as exc:
            if not future.done():
                future.set_exception(exc)
            return
        self._deliver([(job, future)], answer)

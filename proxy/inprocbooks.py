"""The books of the proxy's in-process answers, folded in per FOLD_EVERY answers.

Why: an in-process read is answered in a few µs, and keeping its books one answer at a time
(`Attempts.answered`: the node's latency cost and average, the pool's latency window, the
attempt's counter and histogram; then the request's latency histogram) cost about as much as
the proxy's own routing of it (a py-spy profile of the in-process path). Here an
answer only appends its time to a list (a single request answered without an error, the
commonest body, with one lookup for all of its books: `single`); the lists are folded into
the same books, sample by sample in order, when FOLD_EVERY answers are pending, FOLD_AFTER_S
after the first pending one (a timer on the loop), and before anything reads them: a
/metrics scrape and the admin API's node views call `ProxyMetrics.settle` (so their totals
are exact when read).

What waits up to FOLD_AFTER_S (or FOLD_EVERY answers): the selector's latency costs and the
pool's hedge/timeout quantiles as the engine's own requests see them, the admission limit's
latency, and the node's own count of the singles and the batches of one method it answered
(its request_seconds, told through `ItemsAnswered` in one call per fold instead of one per
answer: ~1.9k instructions per single less, a call per entry per batch; a scrape of the node's own
/metrics, which does not fold the proxy's books, may miss the answers of the last
FOLD_AFTER_S). Breakers and health see nothing new from these answers: the in-process path
only answers through a node that has not failed lately and whose breaker is closed with no
failure counted (`InprocPath._path`), where an answer changes neither.
"""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple

from chainstate.inproc import ItemsAnswered
from proxy.attempts import Attempts
from proxy.metrics import ProxyMetrics
from proxy.model import Node, Pool
from proxy.request import BATCH, Admitted, maker
from proxy.transport import NodePath


class Took(NamedTuple):
    """One synchronous call of an in-process node, booked once its answers are kept."""

    node: Node
    path: NodePath
    lkey: str  # the latency window: the method of a single request, or BATCH
    items: list[Any]  # the items it answered
    errors: list[int]  # positions of its error answers among them
    elapsed: float  # seconds
    method: str | None  # the method of every item (None: several)


make_took = maker(Took)

FOLD_EVERY = 64  # pending answers that are folded in at once
FOLD_AFTER_S = 0.05  # the longest an answer's books wait, with fewer pending


class InprocBooks:
    """`single` per answered request object without an error; `attempt` and `request` per
    other answer; `fold` folds every pending sample in."""

    def __init__(self, attempts: Attempts, metrics: ProxyMetrics) -> None:
        self.attempts = attempts
        self.metrics = metrics
        # (id of the pool, node, latency key) → [Admitted(chain, pool) (kept alive while
        # pending), the node, the latency key, attempt times]
        self._attempts: dict[tuple[int, Node, str], list[Any]] = {}
        # (chain, shape) → request times (the client's latency histogram)
        self._requests: dict[tuple[str, str], list[float]] = {}
        # node → {method → [Admitted(chain, pool), the node, the method, attempt times,
        # request times, the node's own count (`ItemsAnswered`) or None]}: a single request
        # answered without an error, the commonest body (its requests count is len(attempt
        # times); the node is told those times at the fold, in one call). Two lookups with
        # no key tuple to build and hash cost less than one with it; the pool is checked on
        # the entry (a node of another pool object: `_single_entry`).
        self._singles: dict[Node, dict[str, list[Any]]] = {}
        # (id of the pool, method) → [Admitted(chain, pool), the method, (node, items, attempt
        # time) per entry of each batch answered by one call on entries of one node]
        self._shared: dict[tuple[int, str], list[Any]] = {}
        self.pending = 0  # answers pending (requests)
        self._timer: asyncio.TimerHandle | None = None
        metrics.on_read(self.fold)

    def single(
        self,
        chain: str,
        pool: Pool,
        node: Node,
        counted: ItemsAnswered | None,
        method: str,
        elapsed: float,
        seconds: float,
    ) -> None:
        """`attempt(chain, pool, node, method, elapsed)`, the request counted `ok` for
        `method` at `node`, `request(chain, "single", seconds)` and the node's own count of
        the answer (`counted`, its path's `ItemsAnswered`, told `elapsed`): folded in
        later."""
        methods = self._singles.get(node)
        entry = None if methods is None else methods.get(method)
        if entry is None or entry[0].pool is not pool:
            entry = self._single_entry(chain, pool, node, counted, method)
        entry[3].append(elapsed)
        entry[4].append(seconds)
        self.pending += 1  # (`_answered`, inline: this is the commonest answer)
        if self.pending >= FOLD_EVERY:
            self.fold()
        elif self._timer is None:
            self._answered_later()

    def _single_entry(
        self, chain: str, pool: Pool, node: Node, counted: ItemsAnswered | None, method: str
    ) -> list[Any]:
        """A new pending entry of `single`; what is pending for the node and method under
        another pool object first folded in (each entry books one pool)."""
        methods = self._singles.get(node)
        if methods is None:
            methods = self._singles[node] = {}
        elif method in methods:
            self.fold()
            return self._single_entry(chain, pool, node, counted, method)
        entry = methods[method] = [Admitted(chain, pool), node, method, [], [], counted]
        return entry

    def attempt(self, chain: str, pool: Pool, node: Node, lkey: str, elapsed: float) -> None:
        """`Attempts.answered(Admitted(chain, pool), node, lkey, elapsed, "ok")`, folded in
        later."""
        key = (id(pool), node, lkey)
        entry = self._attempts.get(key)
        if entry is None:
            self._attempts[key] = [Admitted(chain, pool), node, lkey, [elapsed]]
        else:
            entry[3].append(elapsed)

    def shared(
        self,
        chain: str,
        pool: Pool,
        method: str,
        elapsed: float,
        counted: list[Any],
        seconds: float,
    ) -> None:
        """A batch of `method` answered by one call (`elapsed` seconds) of a node entered
        under several entries (`InprocPath._shared`); `counted`: each entry's node, its path
        (its [1] the node's own count, `items_answered`, or None) and number of items. Per
        entry: `attempt(chain, pool, node, BATCH, its share of elapsed by items)` and its
        items counted `ok` for `method`, folded in later, with one lookup for all entries
        (with no attempt tuples built first: ~8.5k of a 10-item batch's ~318k instructions
        less than an `attempt` and a count per entry); the node's own count too, once per
        entry as the engine's calls count, told at the fold in one call per node as the
        singles' are (`_fold_shared`: one Python call per entry per batch less). And the
        client's request, `request(chain, "batch", seconds)`, here (inline: two Python calls
        per batch less)."""
        key = (id(pool), method)
        entry = self._shared.get(key)
        if entry is None:
            entry = self._shared[key] = [Admitted(chain, pool), method, []]
        samples = entry[2]
        if len(counted) == 1:  # (one entry: the call's time)
            node, path, n = counted[0]
            samples.append((node, n, elapsed, path[1]))
        else:
            total = 0
            for one in counted:
                total += one[2]
            share = elapsed / total  # (the items of all the entries: the call's)
            for node, path, n in counted:
                samples.append((node, n, share * n, path[1]))
        times = self._requests.get((chain, "batch"))  # (`request`, inline)
        if times is None:
            self._requests[(chain, "batch")] = [seconds]
        else:
            times.append(seconds)
        self.pending += 1  # (`_answered`, inline)
        if self.pending >= FOLD_EVERY:
            self.fold()
        elif self._timer is None:
            self._answered_later()

    def took(self, chain: str, pool: Pool, done: list[Took]) -> None:
        """The books of calls whose answers were kept: the attempts, the requests per
        method and outcome, and the node's own count of what it answered."""
        request = self.metrics.request
        for node, path, lkey, sent, errors, elapsed, method in done:
            self.attempt(chain, pool, node, lkey, elapsed)
            if method is not None and not errors:  # one method, no error: one count
                request(chain, method, node.key, "ok", len(sent))
            else:
                counts: dict[tuple[str, str], int] = {}
                failed = set(errors)
                for i, item in enumerate(sent):
                    key = (item["method"], "error" if i in failed else "ok")
                    counts[key] = counts.get(key, 0) + 1
                for (name, outcome), n in counts.items():
                    request(chain, name, node.key, outcome, n)
            if path.answered is not None:
                path.answered([elapsed])  # the node's own count (`items_answered`)

    def request(self, chain: str, shape: str, seconds: float) -> None:
        """`ProxyMetrics.observe(chain, shape, seconds)`, folded in later; one answer."""
        key = (chain, shape)
        samples = self._requests.get(key)
        if samples is None:
            self._requests[key] = [seconds]
        else:
            samples.append(seconds)
        self._answered()

    def _answered(self) -> None:
        """One more answer pending: fold now, or within FOLD_AFTER_S."""
        self.pending += 1
        if self.pending >= FOLD_EVERY:
            self.fold()
        elif self._timer is None:
            self._answered_later()

    def _answered_later(self) -> None:
        """The first answer pending: a timer folds it in within FOLD_AFTER_S."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop to wait on: now
            self.fold()
            return
        self._timer = loop.call_later(FOLD_AFTER_S, self._timed)

    def fold(self) -> None:
        """Every pending sample into the books, in the order they came (per book)."""
        if not self.pending and not self._attempts and not self._shared:
            return
        attempts, self._attempts = self._attempts, {}
        shared, self._shared = self._shared, {}
        requests, self._requests = self._requests, {}
        singles, self._singles = self._singles, {}
        self.pending = 0
        answered = self.attempts.answered_ok
        observe = self.metrics.observe_all
        count = self.metrics.request
        for methods in singles.values():
            for admitted, node, method, elapsed, seconds, counted in methods.values():
                ordered = sorted(elapsed)  # (once, for the attempts' books and the node's)
                answered(admitted, node, method, elapsed, ordered)
                count(admitted.chain, method, node.key, "ok", len(elapsed))
                observe(admitted.chain, "single", seconds)
                if counted is not None:
                    counted(ordered)  # the node's own count (`ItemsAnswered`: any order)
        for admitted, node, lkey, samples in attempts.values():
            answered(admitted, node, lkey, samples)
        for admitted, method, entries in shared.values():
            self._fold_shared(admitted, method, entries)
        for (chain, shape), samples in requests.items():
            observe(chain, shape, samples)

    def _fold_shared(self, admitted: Admitted, method: str, entries: list[Any]) -> None:
        """`shared`'s entries into the books: each node's attempt times in order (after its
        other batch attempts pending, as a single's are folded before them) and its items;
        each entry's time told to what counts the node's own answers (its `ItemsAnswered`,
        one call per node for all of them)."""
        times: dict[Node, list[float]] = {}
        counts: dict[Node, int] = {}
        told: dict[ItemsAnswered, list[float]] = {}
        for node, n, took, counted in entries:
            samples = times.get(node)
            if samples is None:
                times[node] = [took]
                counts[node] = n
            else:
                samples.append(took)
                counts[node] += n
            if counted is not None:
                node_times = told.get(counted)
                if node_times is None:
                    told[counted] = [took]
                else:
                    node_times.append(took)
        count = self.metrics.request
        for node, samples in times.items():
            self.attempts.answered_ok(admitted, node, BATCH, samples)
            count(admitted.chain, method, node.key, "ok", counts[node])
        for counted, samples in told.items():
            counted(samples)  # the node's own count (`ItemsAnswered`: any order)

    def _timed(self) -> None:
        self._timer = None
        self.fold()

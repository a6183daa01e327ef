"""The JSON-RPC engine: parse → target block → choose node → forward → classify → retry.

`Engine.handle(chain_id, body, headers)` answers one client body and is the in-process entry
point (the workspace calls it). A single request going to one node is forwarded as the
client's raw bytes and the node's raw answer is returned without re-encoding; the answer is
only peeked at for the retryable codes (-39006, -39008). Batches are split by chosen node,
sent as concurrent sub-batches with ids rewritten to positions (client ids may repeat, be
strings or null), and reassembled in the client's order.
"""

from __future__ import annotations

import asyncio
import logging
import time
from bisect import bisect_right
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from opentelemetry import trace

from chainstate.blockref import BlockRef
from chainstate.jsonrpc import (
    BLOCK_NOT_FOUND,
    INTERNAL_ERROR,
    INVALID_REQUEST,
    PARSE_ERROR,
    RETRYABLE_CODES,
    JsonRpcError,
    check_request,
    cut,
    error_response,
    exact_ids,
    request_id,
    restore_ids,
)
from proxy.methods import LocalMethod, MethodSpec, MethodTable
from proxy.metrics import ProxyMetrics
from proxy.mirror import Mirrors
from proxy.model import Node, Pool, normalize_pool
from proxy.select import NoEligibleNode, Selector
from proxy.settings import ProxySettings
from proxy.state import RoutingState
from proxy.upstream import Upstream, UpstreamError

log = logging.getLogger(__name__)
access_log = logging.getLogger("chainstate.proxy.access")
SOURCE_HEADERS = ("x-vendor-biz", "x-vendor-source", "x-vendor-source-host", "x-vendor-env")
RETRY_REASONS = {BLOCK_NOT_FOUND: "block_not_found", -39008: "unsupported_precompile"}
NO_NODE_KEY = "-"  # node label of items no node answered
UNKNOWN_METHOD = "unknown"  # method label of items whose method is not served
MAX_HEADER_VALUE = 256  # longer client header values are cut in logs and spans
MAX_CHAIN_IDS = 1024  # distinct raw chain ids whose normalized pool id is remembered
# Answers a whole client body the engine hands over: (chain id, body, headers) -> (status, body).
Divert = Callable[[str, bytes, Mapping[str, str]], Awaitable[tuple[int, bytes]]]


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


def retry_code(raw: bytes) -> int | None:
    """The retryable error code of a single response, peeking before decoding anything."""
    if b"-3900" not in raw:
        return None
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return _error_code(obj) if isinstance(obj, dict) else None


def _error_code(obj: dict[str, Any]) -> int | None:
    err = obj.get("error")
    if isinstance(err, dict) and err.get("code") in RETRYABLE_CODES:
        return err["code"]
    return None


def single_outcome(raw: bytes) -> tuple[str, int | None]:
    """Step 5 for one answer: (attempt outcome, the retryable code or None)."""
    code = retry_code(raw)
    return ("ok", None) if code is None else ("retryable", code)


def batch_outcome(raw: bytes) -> tuple[str, Any]:
    """Step 5 for a sub-batch answer: (attempt outcome, the decoded answer or None)."""
    try:
        return "ok", (orjson.loads(raw) if raw else [])
    except orjson.JSONDecodeError:
        return "bad_response", None


class Ctx:
    """One client request as it goes through the steps."""

    __slots__ = ("chain", "methods", "nodes", "pool")

    def __init__(self, chain: str, pool: Pool) -> None:
        self.chain = chain
        self.pool = pool
        self.methods: list[str] = []
        self.nodes: list[str] = []  # every node tried (access log)


class Item:
    """One request object of a batch and its retry bookkeeping."""

    __slots__ = (
        "err",
        "last",
        "method",
        "notif",
        "obj",
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
        self.last: dict[str, Any] | None = None  # last (retryable) answer
        self.err: UpstreamError | None = None  # last transport failure
        self.reason = ""


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
    ) -> None:
        self.settings = settings
        self.state = state
        self.upstream = upstream
        self.selector = selector
        self.metrics = metrics
        self.mirrors = mirrors
        self.methods = MethodTable(settings.extra_methods)
        self.tracer = None if tracer is None or isinstance(tracer, trace.NoOpTracer) else tracer
        self.inflight = 0
        self._timeout = settings.upstream_timeout
        self._attempts = settings.max_attempts
        self._max_body = settings.max_body_bytes
        self._max_batch = settings.max_batch_items
        self._unhealthy_after = settings.unhealthy_after
        self._pool_ids: dict[str, str | None] = {}  # raw /:chainId → pool id (a pure function)
        self._divert: Divert | None = None

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

    async def handle(
        self, chain_id: str, body: bytes, headers: Mapping[str, str]
    ) -> tuple[int, bytes]:
        """Answer one client body: (HTTP status, response body; b"" with 204)."""
        started = time.perf_counter()
        self.inflight += 1
        try:
            if self.tracer is None:
                return await self._handle(chain_id, body, headers, None, started)
            with self.tracer.start_as_current_span("jsonrpc.request") as span:
                return await self._handle(chain_id, body, headers, span, started)
        finally:
            self.inflight -= 1

    async def _handle(
        self,
        chain_id: str,
        body: bytes,
        headers: Mapping[str, str],
        span: Any,
        started: float,
    ) -> tuple[int, bytes]:
        found = self.resolve(chain_id)
        if found is None:
            return 404, _dumps_error(None, JsonRpcError(INVALID_REQUEST, self._unknown(chain_id)))
        chain, pool = found
        ctx = Ctx(chain, pool)
        self.metrics.client(headers.get("client-id"))
        shape = "single"
        size = 1
        if len(body) > self._max_body:
            msg = f"request body larger than max_body_bytes={self._max_body} bytes"
            status, out = 413, _dumps_error(None, JsonRpcError(INVALID_REQUEST, msg))
        else:
            try:
                payload = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                payload = None
                msg = f"Parse error: {cut(str(exc))}"
                status, out = 200, _dumps_error(None, JsonRpcError(PARSE_ERROR, msg))
            else:
                try:
                    if isinstance(payload, list):
                        shape, size = "batch", len(payload)
                        status, out = await self._batch(ctx, payload, body)
                    else:
                        status, out = await self._single(ctx, payload, body)
                except LocalMethod:  # raised only once divert() has set the handler
                    assert self._divert is not None
                    return await self._divert(chain_id, body, headers)
        elapsed = time.perf_counter() - started
        self.metrics.observe(chain, shape, elapsed)
        if span is not None:
            self._annotate(span, ctx, size, headers)
        if access_log.isEnabledFor(logging.INFO):
            self._log(ctx, size, status, elapsed, headers)
        return status, out

    # ---- single --------------------------------------------------------------------------

    async def _single(self, ctx: Ctx, payload: Any, body: bytes) -> tuple[int, bytes]:
        """Steps 1-5 for one request object: forwarded as the client's bytes, answered with
        the node's bytes unless a retry or the read-your-writes view needs otherwise."""
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
        out = await self._forward_single(ctx, method, spec, ref, payload, body)
        return (204, b"") if notif or not out else (200, out)

    async def _forward_single(
        self,
        ctx: Ctx,
        method: str,
        spec: MethodSpec,
        ref: BlockRef | None,
        payload: dict[str, Any],
        body: bytes,
    ) -> bytes:
        tried: list[Node] = []
        prefer_archive = False
        last: bytes | None = None
        failure: UpstreamError | None = None
        reason = ""
        for attempt in range(1, self._attempts + 1):
            try:
                nodes, _ = self.selector.candidates(
                    ctx.pool, method, spec, ref, tried, prefer_archive
                )
            except NoEligibleNode as exc:
                if last is None and failure is None:
                    self.metrics.request(ctx.chain, method, NO_NODE_KEY, "no_node")
                    return _dumps_error(_exact_id(payload, body, payload.get("id")), exc)
                break
            node = self.selector.pick(nodes)
            if attempt > 1:
                self.metrics.retry(ctx.chain, reason)
            tried.append(node)
            try:
                if self.tracer is None:  # (one coroutine less on the common path)
                    raw, code = await self._exchange(ctx, node, body, single_outcome, None)
                else:
                    raw, code = await self._attempt(ctx, node, body, 1, attempt, single_outcome)
            except UpstreamError as exc:
                failure, reason = exc, exc.kind
                continue
            if code is None:
                outcome = "error" if b'"error"' in raw else "ok"
                self.metrics.request(ctx.chain, method, node.key, outcome)
                if type(payload.get("id")) is float:  # as the client wrote it, not as parsed
                    raw = restore_ids(body, raw)
                return self._readable_view(ctx.pool, method, raw) if spec.writer else raw
            last, reason = raw, RETRY_REASONS.get(code, "retryable")
            prefer_archive = code == BLOCK_NOT_FOUND
        node_key = tried[-1].key if tried else NO_NODE_KEY
        if last is not None:
            self.metrics.request(ctx.chain, method, node_key, "error")
            return last
        self.metrics.request(ctx.chain, method, node_key, "upstream_failed")
        rid = _exact_id(payload, body, payload.get("id"))
        return _dumps_error(rid, self._failed(ctx.pool, method, tried, failure))

    def _readable_view(self, pool: Pool, method: str, raw: bytes) -> bytes:
        """`raw` with a transaction whose block the pool cannot read yet shown as pending."""
        if method not in UNMINED_FIELDS:
            return raw
        try:
            answer = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return raw
        readable = self.selector.readable_head(pool)
        if isinstance(answer, dict) and hide_unreadable(method, answer, readable):
            return orjson.dumps(answer)
        return raw

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

    # ---- upstream attempt ----------------------------------------------------------------

    async def _attempt(
        self,
        ctx: Ctx,
        node: Node,
        body: bytes,
        items: int,
        attempt: int,
        classify: Callable[[bytes], tuple[str, Any]],
    ) -> tuple[bytes, Any]:
        """Step 4, one upstream try: (the raw answer, what `classify` made of it)."""
        if self.tracer is None:
            return await self._exchange(ctx, node, body, classify, None)
        with self.tracer.start_as_current_span("upstream.attempt") as span:
            span.set_attribute("node", node.key)
            span.set_attribute("attempt", attempt)
            span.set_attribute("items", items)
            return await self._exchange(ctx, node, body, classify, span)

    async def _exchange(
        self,
        ctx: Ctx,
        node: Node,
        body: bytes,
        classify: Callable[[bytes], tuple[str, Any]],
        span: Any,
    ) -> tuple[bytes, Any]:
        """Send and receive, with the node's in-flight count, health and latency, and the
        attempt's metrics; nothing is formatted or logged on success."""
        node.inflight += 1
        ctx.nodes.append(node.key)
        started = time.perf_counter()
        try:
            raw = await self.upstream.send(node.entry.url, body, self._timeout)
        except UpstreamError as exc:
            if node.failed(self._unhealthy_after):
                log.warning(
                    "node %s taken out of rotation after %d failed requests: %s",
                    node.key,
                    node.fails,
                    exc,
                )
            self.metrics.attempt(ctx.chain, node.key, exc.kind, time.perf_counter() - started)
            self.metrics.upstream_error(node.key, exc.kind)
            if span is not None:
                span.set_attribute("outcome", exc.kind)
            raise
        finally:
            node.inflight -= 1
        elapsed = time.perf_counter() - started
        if (node.fails or not node.healthy) and node.succeeded():
            log.warning("node %s back in rotation (answered a request)", node.key)
        node.observe_latency(elapsed * 1000)
        outcome, info = classify(raw)
        self.metrics.attempt(ctx.chain, node.key, outcome, elapsed)
        if span is not None:
            span.set_attribute("outcome", outcome)
        return raw, info

    # ---- batch ---------------------------------------------------------------------------

    async def _batch(self, ctx: Ctx, payload: list[Any], body: bytes) -> tuple[int, bytes]:
        """Steps 1-5 for a batch: items grouped by chosen node, one sub-batch per node,
        retried items regrouped, answers put back in the client's order."""
        if not payload:
            return 200, _dumps_error(
                None, JsonRpcError(INVALID_REQUEST, "Invalid Request: empty batch")
            )
        if len(payload) > self._max_batch:
            msg = f"batch has {len(payload)} items, more than max_batch_items={self._max_batch}"
            return 200, _dumps_error(None, JsonRpcError(INVALID_REQUEST, msg))
        answers: list[Any] = [None] * len(payload)
        items, exact = self._parse_items(ctx, payload, answers, body)
        if self.tracer is not None or access_log.isEnabledFor(logging.INFO):
            ctx.methods.extend(it.method for it in items)  # for the span and the access log
        if items and ctx.pool.mirrors:
            self.mirrors.offer_batch(ctx.pool, [(it.method, it.obj) for it in items])
        whole = len(items) == len(payload) and exact and _unique_ids(items)
        pending = items
        for attempt in range(1, self._attempts + 1):
            if not pending:
                break
            groups = self._group(ctx, pending, attempt, answers)
            if whole and len(groups) == 1:
                # Every item goes to one node and the ids tell the answers apart: the client's
                # bytes go as they are, and come back as they are when nothing needs changing.
                whole = False  # a retry sends only the items it retries
                ((node, group),) = groups.items()
                pending, out = await self._send_whole(ctx, node, group, body, answers)
                if out is not None:
                    return (200, out) if out else (204, b"")
                continue
            whole = False
            results = await _gather(
                [self._send_group(ctx, n, group, attempt, answers) for n, group in groups.items()]
            )
            pending = [it for retry in results for it in retry]
        for it in pending:
            self._give_up(ctx, it, answers, None)
        out = [a for a in answers if a is not None]
        return (200, orjson.dumps(out)) if out else (204, b"")

    def _parse_items(
        self, ctx: Ctx, payload: list[Any], answers: list[Any], body: bytes
    ) -> tuple[list[Item], bool]:
        """Step 1 for every item: valid items to route (invalid ones answered at once), and
        whether every id is as orjson read it (else the ids are read again from `body`)."""
        items = []
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
            items.append(Item(pos, obj, rid, method, spec, ref, notif))
        return items, rids is None

    def _group(
        self, ctx: Ctx, pending: list[Item], attempt: int, answers: list[Any]
    ) -> dict[Node, list[Item]]:
        """Step 3 for every pending item. On the first attempt, items that name the same
        block the same way have the same eligible nodes, and items with the same eligible
        nodes go to one node picked once: a batch becomes as few sub-batches as the rules
        allow (a retried item is chosen alone, away from the nodes it tried)."""
        groups: dict[Node, list[Item]] = {}
        pool = ctx.pool
        selector = self.selector
        chosen: dict[Any, Node | NoEligibleNode] = {}  # first attempt: per (route, spec, block)
        picked: dict[tuple[Node, ...], Node] = {}  # per set of eligible nodes
        head = pool.head()
        routes = pool.routes
        points = selector.breakpoints(pool, head) if attempt == 1 else []
        for it in pending:
            if attempt > 1:
                self.metrics.retry(ctx.chain, it.reason)
                try:
                    nodes, _ = selector.candidates(
                        pool, it.method, it.spec, it.ref, it.tried, it.prefer_archive
                    )
                except NoEligibleNode as exc:
                    self._give_up(ctx, it, answers, exc)
                    continue
                node = selector.pick(nodes)
            else:
                # A height is chosen for by its range between breakpoints (same candidates);
                # other block refs by identity (shared per text by blockref's cache, and
                # alive while the batch is). Specs are shared: their ids are keys too.
                routed = it.method if routes and it.method in routes else None
                ref = it.ref
                if ref is not None and ref.number is not None and not ref.contains:
                    key = (routed, id(it.spec), bisect_right(points, ref.number))
                else:
                    key = (routed, id(it.spec), id(ref))
                found = chosen.get(key)
                if found is None:
                    found = chosen[key] = self._first_choice(pool, it, head, picked)
                if type(found) is NoEligibleNode:
                    self._give_up(ctx, it, answers, found)
                    continue
                node = found  # type: ignore[assignment]
            it.tried.append(node)
            group = groups.get(node)
            if group is None:
                groups[node] = [it]
            else:
                group.append(it)
        return groups

    def _first_choice(
        self, pool: Pool, it: Item, head: int | None, picked: dict[tuple[Node, ...], Node]
    ) -> Node | NoEligibleNode:
        """The node for an item on its first attempt: one pick per set of eligible nodes."""
        try:
            nodes, _ = self.selector.candidates(pool, it.method, it.spec, it.ref, head=head)
        except NoEligibleNode as exc:
            return exc
        ids = tuple(nodes)
        node = picked.get(ids)
        if node is None:
            node = picked[ids] = self.selector.pick(nodes)
        return node

    def _give_up(self, ctx: Ctx, it: Item, answers: list[Any], exc: JsonRpcError | None) -> None:
        """Final answer of an item no further attempt will serve."""
        node_key = it.tried[-1].key if it.tried else NO_NODE_KEY
        if it.last is not None:
            answer, outcome = it.last, "error"
        elif it.err is not None or exc is None:
            answer = error_response(it.rid, INTERNAL_ERROR, "")
            answer["error"] = self._failed(ctx.pool, it.method, it.tried, it.err).to_obj()
            outcome = "upstream_failed"
        else:
            answer, outcome = error_response(it.rid, exc.code, exc.message), "no_node"
        self.metrics.request(ctx.chain, it.method, node_key, outcome)
        if not it.notif:
            answers[it.pos] = answer

    async def _send_group(
        self, ctx: Ctx, node: Node, group: list[Item], attempt: int, answers: list[Any]
    ) -> list[Item]:
        """Send one sub-batch with ids rewritten to positions; returns the items to retry."""
        sub = [it.obj if it.notif else {**it.obj, "id": j} for j, it in enumerate(group)]
        try:
            _, parsed = await self._attempt(
                ctx, node, orjson.dumps(sub), len(group), attempt, batch_outcome
            )
        except UpstreamError as exc:
            for it in group:
                it.err, it.reason = exc, exc.kind
            return group
        keys = [None if it.notif else j for j, it in enumerate(group)]
        return self._take_answers(ctx, node, group, keys, parsed, answers)

    async def _send_whole(
        self, ctx: Ctx, node: Node, group: list[Item], body: bytes, answers: list[Any]
    ) -> tuple[list[Item], bytes | None]:
        """Send the client's batch unchanged to one node: (items to retry, and the node's
        bytes when they are the answer as they are: every item answered, in order, no
        retryable error, nothing to hide)."""
        try:
            raw, parsed = await self._attempt(ctx, node, body, len(group), 1, batch_outcome)
        except UpstreamError as exc:
            for it in group:
                it.err, it.reason = exc, exc.kind
            return group, None
        keys = [None if it.notif else it.rid for it in group]
        if (
            isinstance(parsed, list)
            and b"-3900" not in raw
            and [a.get("id") if type(a) is dict else a for a in parsed]
            == [k for k in keys if k is not None]
            and not any(it.method in UNMINED_FIELDS for it in group)
        ):
            self._count_answers(ctx, node, group, parsed, raw)
            return [], raw
        return self._take_answers(ctx, node, group, keys, parsed, answers), None

    def _count_answers(
        self, ctx: Ctx, node: Node, group: list[Item], parsed: list[dict[str, Any]], raw: bytes
    ) -> None:
        """Metrics of a batch answered as it is (one increment per method and outcome)."""
        counts: dict[tuple[str, str], int] = {}
        if b'"error"' not in raw:  # every item ok: count by method alone
            for it in group:
                key = (it.method, "ok")
                counts[key] = counts.get(key, 0) + 1
        else:
            answered = iter(parsed)
            for it in group:
                outcome = "ok" if it.notif or "error" not in next(answered) else "error"
                key = (it.method, outcome)
                counts[key] = counts.get(key, 0) + 1
        for (method, outcome), n in counts.items():
            self.metrics.request(ctx.chain, method, node.key, outcome, n)

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
        sub-batch, or its own id), retryable ones kept for the next attempt."""
        if isinstance(parsed, dict):  # the node rejected the whole sub-batch with one error
            by_key = {k: dict(parsed) for k in keys if k is not None}
        elif isinstance(parsed, list):
            by_key = {a.get("id"): a for a in parsed if isinstance(a, dict)}
        else:
            bad = UpstreamError("bad_response", f"{node.key} answered a batch with non-JSON-RPC")
            for it in group:
                it.err, it.reason = bad, bad.kind
            return [it for it in group if not it.notif]
        retry = []
        readable: int | bool | None = False  # looked up once, when an answer needs it
        for it, key in zip(group, keys, strict=True):
            if it.notif:
                self.metrics.request(ctx.chain, it.method, node.key, "ok")
                continue
            answer = by_key.get(key)
            if answer is None:
                it.err = UpstreamError("bad_response", f"{node.key} gave no answer for the item")
                it.reason = "missing_answer"
                retry.append(it)
                continue
            answer["id"] = it.rid
            code = _error_code(answer)
            if code is not None:
                it.last, it.reason = answer, RETRY_REASONS.get(code, "retryable")
                it.prefer_archive = code == BLOCK_NOT_FOUND
                retry.append(it)
                continue
            outcome = "error" if "error" in answer else "ok"
            self.metrics.request(ctx.chain, it.method, node.key, outcome)
            if it.method in UNMINED_FIELDS:
                if readable is False:
                    readable = self.selector.readable_head(ctx.pool)
                hide_unreadable(it.method, answer, readable)  # type: ignore[arg-type]
            answers[it.pos] = answer
        return retry

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


def _inexact(obj: Any) -> bool:
    return type(obj) is dict and type(obj.get("id")) is float


def _exact_id(payload: Any, body: bytes, rid: Any) -> Any:
    """`rid`, or the id as the client wrote it when orjson's float would change it."""
    return exact_ids(body) if _inexact(payload) else rid


def _unique_ids(items: list[Item]) -> bool:
    """Whether the answers of `items` can be told apart by their ids: every id a string or
    an integer, no two the same (notifications have none and get no answer)."""
    ids = [it.rid for it in items if not it.notif]
    return all(type(rid) is str or type(rid) is int for rid in ids) and len(set(ids)) == len(ids)


async def _gather(coros: list[Any]) -> list[Any]:
    """gather() without a task when there is one sub-batch (the common case)."""
    if len(coros) == 1:
        return [await coros[0]]
    return list(await asyncio.gather(*coros))

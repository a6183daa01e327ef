"""The in-process path of a batch of eth_calls (`InprocPath._calls`): one parse, one route.

Why: a batch of 10 eth_calls at old heights through the proxy in process took ~24 µs of the
proxy's Python per item more than the node alone (bench/README.md "Main after session 12":
node 681 µs of CPU per batch, proxy-inproc 924): the engine parsed the body again, checked
and planned every item (`_parse_items`, `_plan_items`), routed it, sent the body through
`Upstream.send`, where the node parsed it twice (`answer_now` declines an eth_call, then
`handle_body`), awaited its gather in a task, dumped the answers, and the engine parsed them
again to see they were in order.

Here the items the in-process path parsed go to the node's future (`answer_later`) by the
engine's own first attempt (`Attempts.send_now`: its deadline, its books of the attempt,
the node's in-flight count), and the node's bytes are the answer. Only the batch the engine
would send as it is, to one node, takes this path: every item an eth_call request object
with `"jsonrpc": "2.0"`, a unique int or string id and two params (no state override) whose
call the method table accepts, at a block height (not a tag) whose hash the proxy does not
know (or eth_call not cached): the read path leaves such an item alone (`Reads.plan` gives
None: no pin, cache or coalescing). Anything else returns None before anything is sent or
counted, and the engine answers the body as before. A whole-batch cache hit
(`ResponseCache.get_batch`) is answered as the engine answers it.

After the node's answer the engine's rules hold as in `Engine._send_plain`: answers with an
error are counted per outcome; an answer asking for another attempt (-3900x), a failure or
the deadline go on in the engine's loop (`_take_answers` / `_transport_failed`, `_go_on`)
with the same items and the node tried, so retries, give-ups and books are the engine's.
"""

from __future__ import annotations

import asyncio
from operator import itemgetter
from time import perf_counter
from typing import TYPE_CHECKING, Any

import orjson

from chainstate.httpserver import Headers, Response
from proxy.model import Node, Pool
from proxy.request import BATCH, Admitted, Ctx, Group, Row, items_of
from proxy.routes import PoolRoutes

if TYPE_CHECKING:
    from proxy.inprocpath import InprocPath

CALL = "eth_call"
_METHOD, _JSONRPC, _ID, _PARAMS = (
    itemgetter("method"),
    itemgetter("jsonrpc"),
    itemgetter("id"),
    itemgetter("params"),
)
_LAST = itemgetter(-1)
_ID_TYPES = frozenset((int, str))
_LIST = {list}


class _Held:
    """An item as `Attempts.send_now` and the engine's loop see it: its object, nodes tried."""

    __slots__ = ("obj", "tried")

    def __init__(self, obj: Any) -> None:
        self.obj = obj
        self.tried: list[Node] = []


def calls(
    path: InprocPath,
    chain: str,
    pool: Pool,
    routes: PoolRoutes,
    items: list[Any],
    body: bytes,
    headers: Headers,
    started: float,
) -> Response | Any | None:
    """The answer of a batch of eth_calls (a coroutine the server runs, or a 503/a cached
    answer at once), or None: the engine's (nothing sent or counted)."""
    engine = path.engine
    targets = _targets(path, items)
    if targets is None:
        return None
    reads = engine.reads
    if reads is not None:
        heads = reads.request(pool)
        # (`Engine._cached_batch`: the same bytes answered whole at this `latest` before)
        key = reads.batch_key(heads, body)
        if key is not None:
            found = reads.cache.get_batch(key)
            if found is not None:
                return _cached(path, chain, pool, found, headers, started)
        if CALL in reads.methods:
            hash_at = heads.hash_at
            for _, ref in targets:
                if hash_at(ref.number) is not None:
                    return None  # pinned by hash, cached, coalesced: the engine's
    node, cands = _one_node(path, pool, routes, targets)
    if node is None:
        return None
    admitted = engine.admit_resolved(chain, (chain, pool))
    if type(admitted) is tuple:
        return admitted  # (refused: as the engine's `admit` would answer it)
    ctx = Ctx(chain, pool)
    held = [_Held(item) for item in items]
    group = Group(node, held, cands, BATCH)
    landed: list[Any] = []
    done = asyncio.get_running_loop().create_future()

    def then(node: Node, raw: bytes | None, exc: Any) -> None:
        landed.append((node, raw, exc))
        if not done.done():
            done.set_result(None)

    if not engine.attempts.send_now(ctx, group, body, then):  # declined: nothing counted
        engine.admission.leave(pool)
        return None
    return _finish(path, ctx, admitted, items, targets, held, landed, done, headers, started)


def _targets(path: InprocPath, items: list[Any]) -> list[Any] | None:
    """Every item's (spec, block ref) when the batch is one this path takes, else None."""
    n = len(items)
    if n < 2:
        return None  # (`Upstream.send_now` answers one item as a request object's answer)
    try:
        if list(map(_METHOD, items)).count(CALL) != n:
            return None
        if list(map(_JSONRPC, items)).count("2.0") != n:
            return None
        rids = list(map(_ID, items))
        if not set(map(type, rids)) <= _ID_TYPES or len(set(rids)) != n:
            return None
        params = list(map(_PARAMS, items))
        if set(map(type, params)) != _LIST or set(map(len, params)) != {2}:
            return None
        if set(map(type, map(_LAST, params))) != {str}:
            return None
    except (KeyError, TypeError, IndexError):  # (not a dict, a key missing, unhashable)
        return None
    methods = path.engine.methods
    known = methods.known_targets(CALL, 2, params)
    if known is None:
        known = []
        for one in params:
            found = path._target(CALL, one)  # (learns the text: `known_targets` next time)
            if found is None:
                return None
            known.append(found)
    for spec, ref in known:
        if ref is None or ref.number is None or ref.contains or spec.writer:
            return None  # a tag (the read path pins it) or a hash: the engine's
    return known


def _one_node(
    path: InprocPath, pool: Pool, routes: PoolRoutes, targets: list[Any]
) -> tuple[Node | None, list[Node]]:
    """`Engine._one_node` for these items: the node picked among the candidates every item
    shares (one list for all, else none here), when it is in process with no failure."""
    candidates = path._routes.candidates
    first: list[Node] | None = None
    seen: set[int] = set()
    for spec, ref in targets:
        if id(ref) in seen:
            continue
        seen.add(id(ref))
        nodes = candidates(pool, routes, CALL, spec, ref)[0]
        if nodes is None:
            return None, []
        if first is None:
            first = nodes
        elif nodes is not first and nodes != first:
            return None, []
    assert first is not None
    node = path.engine.chooser.kept(first)
    if path._path(routes, node) is None:
        return None, []
    if path.registry.resolve_later(node.entry.url) is None:
        return None, []
    return node, first


async def _finish(
    path: InprocPath,
    ctx: Ctx,
    admitted: Admitted,
    items: list[Any],
    targets: list[Any],
    held: list[_Held],
    landed: list[Any],
    done: Any,
    headers: Headers,
    started: float,
) -> Response:
    """The answer once the node's future landed, with the request's books (`Engine.handle`'s
    `_handle` and `_books`): the node's bytes when final, else the engine's loop goes on."""
    engine = path.engine
    try:
        await done
        node, raw, exc = landed[0]
        if raw is not None and raw.find(b"-3900") < 0 and raw.find(b'"error"') < 0:
            # every item answered, none an error: `_count_answers`' count by method
            engine.metrics.request(ctx.chain, CALL, node.key, "ok", len(items))
            status, out = 200, raw
        else:
            status, out = await _general(engine, ctx, items, targets, held, node, raw, exc)
    finally:
        engine.pipeline.release(ctx)
        engine.admission.leave(admitted.pool)
    engine.metrics.observe(ctx.chain, "batch", perf_counter() - started)
    client = headers.raw.get(b"client-id")
    if client:
        engine.metrics.client(client.decode("latin-1"))
    return status, out


async def _general(
    engine: Any,
    ctx: Ctx,
    items: list[Any],
    targets: list[Any],
    held: list[_Held],
    node: Node,
    raw: bytes | None,
    exc: Any,
) -> tuple[int, bytes]:
    """`Rounds.plain`'s rest after its attempt, and the batch's answer from it."""
    answers: list[Any] = [None] * len(items)
    rows = [
        Row(pos, item, item["id"], CALL, spec, ref, False, item["params"][-1])
        for pos, (item, (spec, ref)) in enumerate(zip(items, targets, strict=True))
    ]
    tried = [node]  # (no hedge in process)
    rounds = engine.pipeline.rounds
    if raw is None:  # failed, or timed out (booked by the attempt): retried or given up
        pending = rounds.classifier.failed(ctx, items_of(rows, tried), exc, answers)
        await rounds.go_on(ctx, pending, answers)
    else:
        out = await rounds.plain_answered(ctx, rows, node, tried, raw, True, answers)
        if out is not None:
            return 200, out
    out = [a for a in answers if a is not None]
    return (200, orjson.dumps(out)) if out else (204, b"")


def _cached(
    path: InprocPath, chain: str, pool: Pool, found: Any, headers: Headers, started: float
) -> Response:
    """A whole batch answered from the cache, booked as `Engine._cached_batch` books it
    (admitted first, as the engine's: a pool over its limit refuses it all the same)."""
    engine = path.engine
    admitted = engine.admit_resolved(chain, (chain, pool))
    if type(admitted) is tuple:
        return admitted
    engine.admission.leave(pool)
    out, methods = found
    for method, n in methods:
        engine.metrics.request(chain, method, "cache", "ok", n)
    engine.metrics.observe(chain, "batch", perf_counter() - started)
    client = headers.raw.get(b"client-id")
    if client:
        engine.metrics.client(client.decode("latin-1"))
    return 200, out

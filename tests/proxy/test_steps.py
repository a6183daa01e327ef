"""Each step of the pipeline on its own (proxy/pipeline.py lists them): parse, plan, choose,
send (the transport seam), classify, retry, answer, and the admission counts. Real parts
throughout; the nodes, which lie outside the proxy, are handlers registered in process."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from chainstate.blockref import BlockRef
from chainstate.inproc import InprocRegistry
from chainstate.jsonrpc import BLOCK_NOT_FOUND, INTERNAL_ERROR, JsonRpcError
from proxy import latency, outcome
from proxy.admission import Admission
from proxy.answer import Answers
from proxy.attempts import Attempts
from proxy.cache import ResponseCache
from proxy.choose import Chooser
from proxy.classify import Classifier
from proxy.face import Face
from proxy.heads import Block, Heads
from proxy.kept import KeptRoutes
from proxy.methods import MethodTable
from proxy.metrics import ProxyMetrics
from proxy.model import Node, NodeEntry, Pool
from proxy.outcome import TimedOut, TooLarge
from proxy.parse import Parser, least, unique_ids
from proxy.pipeline import _pinned_rows, _written
from proxy.readpath import ReadPath
from proxy.reads import Plan, Reads, ReadSettings
from proxy.request import Ctx, Group, Item, Rows
from proxy.rounds import Rounds
from proxy.routes import RouteCache
from proxy.ryw import ReadYourWrites
from proxy.select import NoEligibleNode, Selector
from proxy.settings import ProxySettings
from proxy.transport import InprocTransport, NodePath, http_answer
from proxy.upstream import Upstream

ADDR = "0x" + "ab" * 20
OTHER = "0x" + "cd" * 20
TABLE = MethodTable()
HEAD = 1000


def req(method: str, params: list[Any], rid: Any = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}


def node(key: str, kind: str = "state", head: int | None = HEAD, url: str = "") -> Node:
    return Node(NodeEntry(key=key, url=url or f"http://{key}", kind=kind), head=head)


def pool_of(*nodes: Node) -> Pool:
    pool = Pool("1", nodes={n.key: n for n in nodes})
    pool.rebuild()
    return pool


def selector() -> Selector:
    return Selector(state_window=128, known_hashes=16, rng=random.Random(7))


def requests_counted(metrics: ProxyMetrics) -> dict[tuple[str, str, str], int]:
    """(method, node, outcome) → items counted."""
    out: dict[tuple[str, str, str], int] = {}
    for (_, method, node_key, result), n in metrics.hot.requests.items():
        out[(method, node_key, result)] = out.get((method, node_key, result), 0) + n
    return out


# ---- step 1: parse ---------------------------------------------------------------------------


def test_a_request_object_becomes_an_item_or_its_answer() -> None:
    parser = Parser(TABLE, ProxyMetrics())
    ctx = Ctx("1", pool_of(node("s")))
    item = parser.single(ctx, req("eth_getBalance", [ADDR, "0x10"]), b"")
    assert (
        type(item) is Item and item.ref == BlockRef(number=16) and ctx.methods == ["eth_getBalance"]
    )
    status, raw = parser.single(ctx, {"id": 2, "method": "eth_getBalance"}, b"")  # type: ignore[misc]
    assert status == 200 and orjson.loads(raw)["error"]["code"] == -32600
    status, raw = parser.single(ctx, req("eth_nope", []), b"")  # type: ignore[misc]
    assert orjson.loads(raw)["error"]["code"] == -32601
    bad_note = {"jsonrpc": "2.0", "method": "eth_getBalance", "params": ["0x12", "latest"]}
    assert parser.single(ctx, bad_note, b"") == (204, b"")  # a notification has no answer
    body = b'{"jsonrpc":"2.0","id":1.50,"method":"eth_getBalance","params":["0x12"]}'
    _, raw = parser.single(ctx, orjson.loads(body), body)  # type: ignore[misc]
    assert b'"id":1.50' in raw  # the client's id as it wrote it


def test_a_batch_becomes_rows_the_same_with_c_loops_or_item_by_item() -> None:
    parser = Parser(TABLE, ProxyMetrics())
    ctx = Ctx("1", pool_of(node("s")))
    batch = [req("eth_getBalance", [ADDR, hex(900 + i % 3)], i) for i in range(6)]
    answers: list[Any] = [None] * 6
    slow, exact, notified = parser.rows(ctx, [*batch, {"bad": 1}][:6], answers, b"")
    fast = parser.uniform_rows(batch)  # (the texts are remembered now)
    assert list(fast) == slow and exact and not notified
    assert [row.block for row in fast] == [hex(900 + i % 3) for i in range(6)]
    mixed = [*batch[:2], {"id": 9}, req("eth_nope", [], 10)]
    answers = [None] * 4
    rows, _, _ = parser.rows(ctx, mixed, answers, b"")
    assert [row.pos for row in rows] == [0, 1]
    assert [a and a["error"]["code"] for a in answers] == [None, None, -32600, -32601]
    assert unique_ids(rows) and not unique_ids([*rows, rows[0]])


def test_the_min_block_header_is_a_height() -> None:
    ctx = Ctx("1", pool_of(node("s")))
    assert least("0x10", ctx) is None and ctx.least == 16
    assert least("17", ctx) is None and ctx.least == 17
    bad = least("latest", ctx)
    assert isinstance(bad, JsonRpcError) and bad.code == -32600


# ---- step 2: plan ----------------------------------------------------------------------------


def reads_over(pool: Pool, blocks: int) -> Reads:
    """The read path's parts, their chain view holding the last `blocks` blocks up to HEAD,
    every reader's head on it."""
    heads = Heads(Upstream(None), selector())
    view = heads.view(pool.id)
    chain = [Block(h, block_hash(h), block_hash(h - 1)) for h in range(HEAD - blocks, HEAD + 1)]
    view.extend(chain)
    for reader in pool.readers:
        view.tips[reader.key] = chain[-1]
    return Reads(heads, ResponseCache(1 << 20), ReadSettings(frozenset({"eth_getBalance"})))


def block_hash(height: int) -> str:
    return f"0x{height:064x}"


def test_latest_is_the_highest_usable_state_head_then_other_kinds_then_a_blocked_one() -> None:
    """`latest`'s height: the highest head on the known chain among usable state nodes;
    other kinds only when no state node is usable; a node out by its breaker only when no
    other is left; never a node off the known chain, disabled, unhealthy, of weight 0 or
    distrusted; and never below a height resolved before."""
    s1, s2, a, b = (
        node("s1", head=HEAD - 2),
        node("s2", head=HEAD - 1),
        node("a", "archive"),
        node("b"),
    )
    pool = pool_of(s1, s2, a, b)
    heads = reads_over(pool, 4).heads
    view = heads.views[pool.id]
    for n, height in ((s1, HEAD - 2), (s2, HEAD - 1), (a, HEAD), (b, HEAD)):
        view.tips[n.key] = Block(height, block_hash(height), block_hash(height - 1))
    b.blocked = True  # its breaker open: only when no other node is left
    assert heads._highest(pool, view) == HEAD - 1  # state nodes first, not the archive's head
    s2.healthy = False
    assert heads._highest(pool, view) == HEAD - 2
    s1.weight_override = 0
    assert heads._highest(pool, view) == HEAD  # the archive's: no state node usable
    a.diverged = {"at": HEAD}
    assert heads._highest(pool, view) == HEAD  # b, though its breaker is open
    view.tips[b.key] = Block(HEAD, "0x" + "ee" * 32, block_hash(HEAD - 1))  # off the chain
    assert heads._highest(pool, view) is None
    s2.healthy = True
    assert heads.latest(pool, view) == (HEAD - 1, block_hash(HEAD - 1))
    s2.healthy = False
    assert heads.latest(pool, view) == (HEAD - 1, block_hash(HEAD - 1))  # never back


def test_the_read_path_pins_latest_once_per_request_and_asks_once_per_block_text() -> None:
    pool = pool_of(node("s"))
    reads = reads_over(pool, 4)
    metrics = ProxyMetrics()
    parser = Parser(TABLE, metrics)
    readpath = ReadPath(reads, None, Face(selector(), reads), metrics)  # type: ignore[arg-type]
    ctx = Ctx("1", pool)
    batch = [
        req("eth_getBalance", [ADDR, "latest"], 0),
        req("eth_getBalance", [OTHER, "latest"], 1),
        req("eth_getBalance", [ADDR, hex(10)], 2),  # a height whose hash is not known
        req("eth_getBalance", [OTHER, hex(10)], 3),
        req("eth_blockNumber", [], 4),
    ]
    answers: list[Any] = [None] * 5
    rows, _, _ = parser.rows(ctx, batch, answers, b"")
    asked: list[str] = []
    plan = reads.plan

    def counted(heads: Any, method: str, *rest: Any) -> Any:
        asked.append(method)
        return plan(heads, method, *rest)

    reads.plan = counted  # type: ignore[method-assign]
    plain, planned, waiting, changed = readpath.plan_rows(ctx, rows, answers)
    assert [row.pos for row in plain] == [2, 3] and changed and not waiting
    assert len(asked) == 4  # the second item at height 10 shares the first one's decision
    pinned = [it.obj["params"][1] for it in planned]
    assert pinned == [{"blockHash": block_hash(HEAD)}] * 2  # one `latest` for the request
    assert all(type(it.plan) is Plan for it in planned)
    assert answers[4]["result"] == hex(HEAD)  # the pinned head itself


def test_a_node_off_the_known_chain_is_avoided_only_while_another_is_on_it() -> None:
    """A reader whose head is on a fork the known chain dropped gets no item pinned to a
    block of that chain while another reader is on it; a lone reader is never avoided (no
    other node may answer)."""
    on, off = node("on"), node("off")
    for readers, avoided in (([on, off], (off,)), ([off], ())):
        pool = pool_of(*readers)
        reads = reads_over(pool, 4)
        fork = Block(HEAD, "0x" + "ee" * 32, block_hash(HEAD - 1))
        reads.heads.view(pool.id).tips[off.key] = fork
        assert reads.request(pool).avoid() == avoided


def test_a_batch_at_plain_heights_is_planned_as_a_whole_as_it_is_row_by_row() -> None:
    """The common batch's rows kept as columns (`Rows`) get the same plan and the same node
    as the same rows in a list (each asked row by row): the heights whose hash the read
    path knows are pinned, the rest left as they are, in the client's order."""
    pool = pool_of(node("s"))
    reads = reads_over(pool, 4)  # hashes known from HEAD - 4 up
    metrics = ProxyMetrics()
    parser = Parser(TABLE, metrics)
    readpath = ReadPath(reads, None, Face(selector(), reads), metrics)  # type: ignore[arg-type]
    chooser = Chooser(selector(), RouteCache(selector()), metrics)
    heights = [HEAD - 9, HEAD - 2, HEAD - 8, HEAD - 9, HEAD, HEAD - 7]
    batch = [req("eth_getBalance", [ADDR, hex(h)], i) for i, h in enumerate(heights)]
    parser.rows(Ctx("1", pool), batch, [None] * 6, b"")  # (the texts remembered)
    rows, exact, _ = parser.rows(Ctx("1", pool), batch, [None] * 6, b"")
    assert type(rows) is Rows and exact and len(rows) == 6 and rows[-1].pos == 5
    scanned = parser.batch(orjson.dumps(batch))  # (the same rows read from their bytes)
    assert type(scanned) is Rows and scanned.found is not None
    outcomes = []
    for given in (rows, list(rows), scanned):
        ctx = Ctx("1", pool)
        plain, planned, waiting, changed = readpath.plan_rows(ctx, given, [None] * 6)
        reads.coalescer.flights.clear()  # type: ignore[union-attr]
        assert changed and not waiting and ctx.heads.mixed is None
        both = _pinned_rows(plain, planned)
        found = chooser.one_node(pool, both)
        assert found is not None
        objs = [row.obj for row in both]
        if given is scanned:  # (the body sent: the client's bytes, the pinned items in)
            assert _written(both) == orjson.dumps(objs)
            assert (both.heights, both.bounds()) == (heights, (HEAD - 9, HEAD))
        outcomes.append(
            (
                [row.pos for row in plain],
                [(it.pos, it.obj, it.rid, it.ref, it.block) for it in planned],
                objs,
                found[1],
            )
        )
    assert outcomes[0] == outcomes[1] == outcomes[2]
    assert outcomes[0][0] == [0, 2, 3, 5]  # (no hash known at those heights)
    assert [planned[1]["params"][1] for planned in outcomes[0][1]] == [
        {"blockHash": block_hash(HEAD - 2)},
        {"blockHash": block_hash(HEAD)},
    ]


# ---- step 3: choose --------------------------------------------------------------------------


def test_items_with_the_same_candidates_share_one_pick_and_a_retry_goes_elsewhere() -> None:
    s1, s2, archive = node("s1"), node("s2"), node("a", "archive")
    pool = pool_of(s1, s2, archive)
    metrics = ProxyMetrics()
    chooser = Chooser(selector(), RouteCache(selector()), metrics)
    ctx = Ctx("1", pool)
    items = [
        Item(
            i,
            {},
            i,
            "eth_getBalance",
            TABLE.spec("eth_getBalance"),
            BlockRef(number=h),
            False,
            hex(h),
        )
        for i, h in enumerate((HEAD, HEAD - 1, HEAD, 5))
    ]
    refused: list[Any] = []
    groups = chooser.groups(ctx, items, 1, lambda it, why: refused.append(it))
    assert not refused and len(groups) == 2  # recent heights on one state node, 5 on archive
    recent = next(g for n, g in groups.items() if n is not archive)
    assert [it.pos for it in recent.items] == [0, 1, 2] and groups[archive].items[0].pos == 3
    first = items[0].tried[0]
    items[0].reason = "block_not_found"
    again = chooser.groups(ctx, [items[0]], 2, lambda it, why: refused.append(it))
    assert first not in again and list(again) != []  # away from the node it tried
    labels = {"chain": "1", "reason": "block_not_found"}
    assert metrics.registry.get_sample_value("chainstate_proxy_retries_total", labels) == 1
    lost = Item(
        9, {}, 9, "eth_getBalance", TABLE.spec("eth_getBalance"), BlockRef(number=HEAD + 50), False
    )
    lost.tried = [s1, s2, archive]
    assert type(chooser.retry(pool, lost)) is NoEligibleNode


def test_the_only_node_of_its_kind_is_raced_with_the_next_that_holds_the_block() -> None:
    s1, archive = node("s1"), node("a1", "archive")
    pool = pool_of(s1, archive)
    chooser = Chooser(selector(), RouteCache(selector()), ProxyMetrics())
    spec = TABLE.spec("eth_getBalance")

    def lone(ref: BlockRef, method: str = "eth_getBalance") -> Node | None:
        it = Item(0, {}, 0, method, TABLE.spec(method), ref, False)
        it.tried = [s1]
        return chooser.second(pool, Group(s1, [it], [s1], method))

    assert lone(BlockRef(number=HEAD)) is archive  # the archive node holds recent blocks too
    assert lone(BlockRef(tag="latest")) is archive
    archive.head = HEAD - 10  # (its last poll) it does not hold the block yet
    assert lone(BlockRef(number=HEAD)) is None
    assert lone(BlockRef(number=HEAD - 20)) is archive
    archive.healthy = False
    assert lone(BlockRef(number=HEAD - 20)) is None
    archive.healthy = True
    for _ in range(5):  # its breaker open: a retry would try it anyway, a race does not
        archive.breaker.failure("a1", "test")
    assert lone(BlockRef(number=HEAD - 20)) is None
    # the Leader's: never sent twice, never raced with a reader
    leader = node("w1", "writer")
    it = Item(0, {}, 0, "eth_getBalance", spec, BlockRef(tag="pending"), False)
    it.tried = [leader]
    assert chooser.second(pool, Group(leader, [it], [leader], "eth_getBalance")) is None


def test_a_hedge_goes_to_a_node_no_item_tried_and_one_node_takes_a_whole_batch() -> None:
    s1, s2 = node("s1"), node("s2")
    pool = pool_of(s1, s2)
    chooser = Chooser(selector(), RouteCache(selector()), ProxyMetrics())
    it = Item(
        0, {}, 0, "eth_getBalance", TABLE.spec("eth_getBalance"), BlockRef(number=HEAD), False
    )
    it.tried = [s1]
    assert chooser.second(pool, Group(s1, [it], [s1, s2], "eth_getBalance")) is s2
    s2.healthy = False
    assert chooser.second(pool, Group(s1, [it], [s1, s2], "eth_getBalance")) is None
    s2.healthy = True
    parser = Parser(TABLE, ProxyMetrics())
    rows, _, _ = parser.rows(
        Ctx("1", pool),
        [req("eth_getBalance", [ADDR, hex(HEAD - i)], i) for i in range(3)],
        [None] * 3,
        b"",
    )
    found = chooser.one_node(pool, rows)
    assert found is not None and found[0] in (s1, s2) and found[1] == [s1, s2]


def test_one_node_takes_a_batch_only_when_every_row_has_the_same_candidates() -> None:
    """A batch of plain heights goes to one node when its heights are in one class of
    candidates, whatever their order or repeats; heights on either side of the state
    window (the state node does not hold the older ones) or a row at a tag among heights
    the archive node alone holds leave it to the rounds (None), the same for the batch's
    columns (`Rows`) and for its rows in a list."""
    s, archive = node("s"), node("a", "archive")
    pool = pool_of(s, archive)
    chooser = Chooser(selector(), RouteCache(selector()), ProxyMetrics())
    parser = Parser(TABLE, ProxyMetrics())

    def found(blocks: list[str]) -> Any:
        batch = [req("eth_getBalance", [ADDR, b], i) for i, b in enumerate(blocks)]
        parser.rows(Ctx("1", pool), batch, [None] * len(batch), b"")  # (texts remembered)
        rows, _, _ = parser.rows(Ctx("1", pool), batch, [None] * len(batch), b"")
        both = [chooser.one_node(pool, given) for given in (rows, list(rows))]
        assert [None if f is None else f[1] for f in both] == [
            None if f is None else f[1] for f in reversed(both)
        ]
        return both[0]

    recent = found([hex(HEAD - 3), hex(HEAD), hex(HEAD - 3), hex(HEAD - 100)])
    assert recent is not None and recent[1] == [s] and recent[0] is s  # (the state node's)
    old = found([hex(5), hex(7), hex(5)])
    assert old is not None and old[1] == [archive] and old[0] is archive
    assert found([hex(HEAD), hex(5)]) is None  # two classes: two sub-batches
    assert found([hex(HEAD), "latest", hex(HEAD - 1)]) is not None  # (one node holds all)
    assert found([hex(5), "latest"]) is None


def test_one_node_follows_the_nodes_heads_and_health() -> None:
    """The candidates one_node picks among are kept per class of heights only while the
    readers' heads, health and breakers stay as they were: a node whose head falls behind
    a batch's heights, or that turns unhealthy, is no longer chosen for it, and is again
    once it is back."""
    s1, s2 = node("s1"), node("s2")
    pool = pool_of(s1, s2)
    chooser = Chooser(selector(), RouteCache(selector()), ProxyMetrics())
    parser = Parser(TABLE, ProxyMetrics())
    batch = [req("eth_getBalance", [ADDR, hex(HEAD - i % 2)], i) for i in range(4)]
    parser.rows(Ctx("1", pool), batch, [None] * 4, b"")
    rows, _, _ = parser.rows(Ctx("1", pool), batch, [None] * 4, b"")

    def candidates() -> list[str] | None:
        found = chooser.one_node(pool, rows)
        return None if found is None else sorted(n.key for n in found[1])

    assert candidates() == ["s1", "s2"]
    s2.head = HEAD - 2  # (its last poll) it does not hold the newest rows' blocks
    assert candidates() == ["s1"] and chooser.one_node(pool, rows)[0] is s1  # type: ignore[index]
    s2.head = HEAD
    s1.healthy = False
    assert candidates() == ["s2"]
    s1.healthy = True
    assert candidates() == ["s1", "s2"]


def test_the_read_path_plans_the_rows_whose_hash_it_knows_and_no_other() -> None:
    """`planned_at`: which rows of plain heights the read path plans (those whose block
    hash it knows), None when it knows none of them or the method is not one it keeps;
    either way a batch with a row it leaves alone is not cached as a whole."""
    pool = pool_of(node("s"))
    reads = reads_over(pool, 4)  # hashes known from HEAD - 4 up
    spec = TABLE.spec("eth_getBalance")

    def planned(numbers: list[int], method: str = "eth_getBalance") -> Any:
        heads = reads.request(pool)
        heads.mixed = False
        return reads.planned_at(heads, method, spec, numbers), heads.mixed

    assert planned([HEAD, HEAD - 4, HEAD]) == ([True, True, True], False)
    assert planned([HEAD - 9, HEAD, HEAD - 5]) == ([False, True, False], True)
    assert planned([HEAD - 9, HEAD - 5]) == (None, True)
    assert planned([HEAD], "eth_getCode") == (None, True)  # not a method it keeps
    # The rows planned, by their places: a few, or nearly all of a batch's.
    metrics = ProxyMetrics()
    readpath = ReadPath(reads, None, Face(selector(), reads), metrics)  # type: ignore[arg-type]
    parser = Parser(TABLE, metrics)
    for known in ([3, 7], [i for i in range(12) if i != 5]):
        heights = [HEAD - i % 3 if i in known else HEAD - 9 for i in range(12)]
        batch = [
            req("eth_getBalance", [f"0x{i + 1:040x}", hex(h)], i) for i, h in enumerate(heights)
        ]
        parser.rows(Ctx("1", pool), batch, [None] * 12, b"")  # (the texts remembered)
        rows = parser.batch(orjson.dumps(batch))
        plain, planned_items, _, _ = readpath.plan_rows(Ctx("1", pool), rows, [None] * 12)
        reads.coalescer.flights.clear()  # type: ignore[union-attr]
        assert [it.pos for it in planned_items] == known
        assert [row.pos for row in plain] == [i for i in range(12) if i not in known]


# ---- steps 1-3 by kept routes ----------------------------------------------------------------


def test_a_plain_reads_route_is_kept_by_its_block_text_and_nothing_else_is() -> None:
    registry = InprocRegistry()
    s = node("s")
    pool = pool_of(s)
    cache = RouteCache(selector(), registry)
    kept = KeptRoutes(
        TABLE, cache, Chooser(selector(), cache, ProxyMetrics()), None, Upstream(registry)
    )
    routes = kept.routes(pool)
    route = kept.single(pool, routes, req("eth_getBalance", [ADDR, hex(HEAD)]))
    assert route is not None and route.nodes == [s] and route.ref == BlockRef(number=HEAD)
    again = kept.single(pool, routes, req("eth_getBalance", [OTHER, hex(HEAD)], "x"))
    assert again is route  # the same text, another account: the kept route
    for other in (
        req("eth_getBalance", [ADDR, "latest"]),  # a tag: pinned per request
        req("eth_getBalance", [ADDR, "0x" + "11" * 32]),  # a hash: looked up per request
        req("eth_sendRawTransaction", ["0x00"]),  # a writer
        {"jsonrpc": "2.0", "method": "eth_getBalance", "params": [ADDR, hex(HEAD - 1)]},
    ):
        assert kept.single(pool, routes, other) is None, other
    registry.register("n", lambda body: body)  # (a registry change starts the routes afresh)
    assert kept.routes(pool) is not routes


def test_a_tag_is_found_to_take_the_general_steps_once_per_method_and_text() -> None:
    class Counted(MethodTable):
        targets = 0

        def target(self, method: str, params: Any) -> Any:
            Counted.targets += 1
            return super().target(method, params)

    table = Counted()
    s = node("s")
    pool = pool_of(s)
    cache = RouteCache(selector(), InprocRegistry())
    kept = KeptRoutes(
        table, cache, Chooser(selector(), cache, ProxyMetrics()), None, Upstream(InprocRegistry())
    )
    routes = kept.routes(pool)
    call = {"to": ADDR, "data": "0x70a08231" + "00" * 32}
    for rid in range(3):  # (another account, another id: the same tag text)
        assert (
            kept.single(pool, routes, req("eth_call", [{**call, "from": OTHER}, "latest"], rid))
            is None
        )
    assert Counted.targets == 1
    # an invalid call with that text: still the general steps' (which answer its error)
    assert kept.single(pool, routes, req("eth_call", [{"to": "0x12"}, "latest"])) is None
    # the same method at a height, or another tag, is worked out as before
    route = kept.single(pool, routes, req("eth_call", [call, hex(HEAD)]))
    assert route is not None and route.ref == BlockRef(number=HEAD)
    assert kept.single(pool, routes, req("eth_call", [call, "safe"])) is None
    assert Counted.targets == 3


def test_a_batchs_lanes_have_one_pick_per_candidate_list() -> None:
    registry = InprocRegistry()

    def answer_items(items: list[Any], errors: list[int]) -> list[Any]:
        return [{"jsonrpc": "2.0", "id": it["id"], "result": "0x1"} for it in items]

    url = registry.register("n", lambda body: body, answer_items=answer_items)
    state, archive = node("s", url=url), node("a", "archive", url=url)
    pool = pool_of(state, archive)
    cache = RouteCache(selector(), registry)
    kept = KeptRoutes(
        TABLE, cache, Chooser(selector(), cache, ProxyMetrics()), None, Upstream(registry)
    )
    routes = kept.routes(pool)
    assert set(kept.paths(routes)) == {state, archive}
    items = [req("eth_getBalance", [ADDR, hex(h)], i) for i, h in enumerate((HEAD, 3, HEAD, 4))]
    lanes = kept.lanes(pool, routes, items, None)
    assert lanes is not None and lanes.method == "eth_getBalance" and not lanes.tagged
    placed = {lane.node.key: lane.positions for lane in lanes.lanes}
    assert placed["a"][-2:] == [1, 3]  # the old heights: the archive entry alone
    assert sorted(p for positions in placed.values() for p in positions) == [0, 1, 2, 3]
    seen = kept.seen_all(routes, items)  # every text kept now
    assert seen is not None and [r.ref.number for r in seen] == [HEAD, 3, HEAD, 4]


# ---- step 4: the transport seam --------------------------------------------------------------


async def test_each_node_url_has_its_transport_and_an_in_process_one_follows_the_registry() -> None:
    registry = InprocRegistry()

    async def handler(body: bytes) -> bytes:
        return b'{"jsonrpc":"2.0","id":1,"result":"0x2"}'

    url = registry.register("n", handler)
    upstream = Upstream(registry)
    transport = upstream.transport(url)
    assert type(transport) is InprocTransport and transport.path is None
    assert await upstream.send(url, b"{}", 1.0) == b'{"jsonrpc":"2.0","id":1,"result":"0x2"}'
    registry.register("n", handler, answer_items=lambda items, errors: items)
    assert upstream.transport(url).path is not None  # resolved again after the change
    registry.unregister("n")
    with pytest.raises(outcome.ConnectFailed, match="no such in-process node"):
        await upstream.send(url, b"{}", 1.0)
    assert not upstream.send_now("https://x", b"{}", 1.0, None, print, print)  # no task-less way


def test_a_node_path_answers_checked_items_through_its_checked_path() -> None:
    calls: list[str] = []

    def items(got: list[Any], errors: list[int]) -> list[Any]:
        calls.append("items")
        return got

    def checked(method: str, got: list[Any], errors: list[int]) -> list[Any]:
        calls.append(method)
        return got

    path = NodePath(items, None, checked, None)
    path.answer([1], [], "eth_getBalance")
    path.answer([1], [], None)
    assert calls == ["eth_getBalance", "items"]
    assert http_answer("http://n", 204, b"") == b""
    with pytest.raises(outcome.HttpFailed):
        http_answer("http://n", 502, b"")


# ---- steps 5-7: classify, retry, answer ------------------------------------------------------


def parts(pool: Pool, registry: InprocRegistry) -> tuple[Rounds, Classifier, Answers, ProxyMetrics]:
    settings = ProxySettings()
    metrics = ProxyMetrics()
    sel = selector()
    chooser = Chooser(sel, RouteCache(sel, registry), metrics)
    attempts = Attempts(settings, Upstream(registry), chooser.second, metrics)
    face, ryw = Face(sel, None), ReadYourWrites(sel, None)
    answers = Answers(face, ryw, metrics)
    classifier = Classifier(attempts, answers, face, ryw, metrics, keep_answers=False)
    rounds = Rounds(settings.max_attempts, chooser, attempts, classifier, answers)
    return rounds, classifier, answers, metrics


def item_at(height: int, rid: Any = 1, pos: int = 0) -> Item:
    obj = req("eth_getBalance", [ADDR, hex(height)], rid)
    return Item(
        pos,
        obj,
        rid,
        "eth_getBalance",
        TABLE.spec("eth_getBalance"),
        BlockRef(number=height),
        False,
    )


def test_an_answer_is_final_or_asks_for_another_node() -> None:
    state = node("s")
    pool = pool_of(state)
    _, classifier, _, metrics = parts(pool, InprocRegistry())
    ctx = Ctx("1", pool)
    ok = b'{"jsonrpc":"2.0","id":1,"result":"0x1"}'
    it = item_at(HEAD)
    assert classifier.raw(ctx, Group(state, [it], [state], "x"), state, ok, [None], True) == (
        [],
        ok,
    )
    missing = b'{"jsonrpc":"2.0","id":1,"error":{"code":-39006,"message":"no block"}}'
    pending, out = classifier.raw(
        ctx, Group(state, [it], [state], "x"), state, missing, [None], True
    )
    assert pending == [it] and out is None and it.prefer_archive and it.reason == "block_not_found"
    # a batch answered out of order is matched by id; one without an item's answer retries it
    items = [item_at(HEAD, rid=i, pos=i) for i in range(3)]
    ctx.own_ids = True
    raw = orjson.dumps(
        [{"jsonrpc": "2.0", "id": 2, "result": "0x2"}, {"jsonrpc": "2.0", "id": 0, "result": "0x0"}]
    )
    answers: list[Any] = [None] * 3
    retry = classifier.sub_batch(ctx, state, items, [0, 1, 2], raw, answers)
    assert retry == [items[1]] and items[1].reason == outcome.MISSING.name
    assert [a and a["result"] for a in answers] == ["0x0", None, "0x2"]
    # not JSON: the node is penalised, every item retried
    assert classifier.sub_batch(ctx, state, items, [0, 1, 2], b"<html>", answers) == items
    assert state.breaker.failures == 1 and items[0].reason == "bad_response"
    # a failure carries what it means: a timeout is retried, an answer too large is final
    assert classifier.failed(ctx, items, TimedOut("slow"), answers) == items
    assert classifier.failed(ctx, items[:1], TooLarge("big"), answers) == []
    assert (
        answers[0]["error"]["code"] == INTERNAL_ERROR
        and "too_large" in answers[0]["error"]["message"]
    )
    assert requests_counted(metrics)[("eth_getBalance", "-", "upstream_failed")] == 1


async def test_the_rounds_retry_a_missing_block_on_the_archive_and_give_up_after_the_last() -> None:
    registry = InprocRegistry()
    asked: list[str] = []

    def answering(name: str, body: bytes) -> Any:
        async def handle(got: bytes) -> bytes:
            asked.append(name)
            rid = orjson.loads(got)["id"]
            return orjson.dumps({"jsonrpc": "2.0", "id": rid, **body})  # type: ignore[dict-item]

        return handle

    missing = {"error": {"code": BLOCK_NOT_FOUND, "message": "not held"}}
    state_url = registry.register("s", answering("s", missing))  # type: ignore[arg-type]
    archive_url = registry.register("a", answering("a", {"result": "0x5"}))  # type: ignore[arg-type]
    state, archive = node("s", url=state_url), node("a", "archive", url=archive_url)
    pool = pool_of(state, archive)
    rounds, _, answers, _ = parts(pool, registry)
    it = item_at(HEAD)
    out = await rounds.route(Ctx("1", pool), [it], orjson.dumps(it.obj), [None], single=True)
    assert asked == ["s", "a"] and out is not None and orjson.loads(out)["result"] == "0x5"
    # every node says it lacks the block: the last answer, shown as a client of geth sees it
    registry.register("a", answering("a", missing))  # type: ignore[arg-type]
    asked.clear()
    it = item_at(HEAD)
    got: list[Any] = [None]
    out = await rounds.route(Ctx("1", pool), [it], orjson.dumps(it.obj), got, single=True)
    assert asked == ["s", "a"] and out is None
    status, raw = answers.single(Ctx("1", pool), it, orjson.dumps(it.obj), out, got)
    assert status == 200 and orjson.loads(raw)["error"]["code"] == -32000  # a block it has seen


def test_what_the_client_sees_of_a_final_answer() -> None:
    pool = pool_of(node("s"))
    _, _, answers, _ = parts(pool, InprocRegistry())
    ctx = Ctx("1", pool)
    spec = TABLE.spec("eth_call")
    call = Item(0, {}, 1, "eth_call", spec, BlockRef(number=HEAD), False)
    error = {"code": -39000, "message": "execution reverted", "data": "0x"}
    revert = orjson.dumps({"jsonrpc": "2.0", "id": 1, "error": error})
    _, raw = answers.single(ctx, call, b"", revert, [None])
    assert orjson.loads(raw)["error"] == {"code": 3, "message": "execution reverted", "data": "0x"}
    note = Item(0, {}, None, "eth_call", spec, None, True)
    assert answers.single(ctx, note, b"", None, [None]) == (204, b"")
    writer = Node(NodeEntry(key="w", url="http://w", kind="writer"))  # (the Leader's kind)
    send = Item(
        0, {}, 1, "eth_sendRawTransaction", TABLE.spec("eth_sendRawTransaction"), None, False
    )
    send.tried = [writer]
    send.failed(TimedOut("no answer"))
    got: list[Any] = [None]
    answers.give_up(ctx, send, got, None)
    assert "switchLeader" in got[0]["error"]["message"]


# ---- admission -------------------------------------------------------------------------------


def test_a_requests_place_in_flight_is_counted_in_one_place() -> None:
    admission = Admission(wait=0.5, fixed=2, connections=4)
    pool = pool_of(node("s"))
    admission.enter(pool)
    admission.enter(pool)
    assert pool.inflight == admission.inflight == 2
    refused = admission.check(pool, 0.0)
    assert (
        refused is not None and refused.code == -32005 and refused.header == b"Retry-After: 1\r\n"
    )
    admission.leave(pool)
    assert admission.check(pool, 0.0) is None and pool.inflight == admission.inflight == 1


def test_an_answered_attempt_keeps_the_nodes_latency_figures() -> None:
    """The node's cost (the choice's peak EWMA, decayed over time) and its `latency_ms` (the
    admin view) move with each answer as `latency.observe` and `Node.observe_latency` move
    them: a slower answer raises the cost at once, a faster one pulls it down by its decay."""
    pool = pool_of(node("a"))
    _, _, _, metrics = parts(pool, InprocRegistry())
    attempts = Attempts(ProxySettings(), Upstream(InprocRegistry()), lambda group: None, metrics)
    ctx = Ctx("1", pool, None)
    seen, twin = pool.readers[0], node("b")
    for seconds in (0.004, 0.010, 0.002, 0.002):
        attempts.answered(ctx, seen, "eth_getBalance", seconds, "ok")
        latency.observe(twin, seconds * 1000, seen.cost_at, attempts.tau)
        twin.observe_latency(seconds * 1000)
        assert (seen.cost, seen.latency_ms) == (twin.cost, twin.latency_ms)
    assert seen.cost is not None and 2.0 < seen.cost <= 10.0
    assert seen.latency_ms is not None and 2.0 < seen.latency_ms < 10.0

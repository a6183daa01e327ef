"""Each routing step on its own: method table, target block, node choice, entries, store."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from typing import Any

import orjson
import pytest

from chainstate.blockref import BlockRef
from chainstate.config import ConfigError
from chainstate.jsonrpc import JsonRpcError
from chainstate.txmethods import PENDING_READS, TX_LIFECYCLE
from nodes.writer.service import PASS_THROUGH
from proxy import methods, outcome
from proxy.app import server_limits
from proxy.deadlines import Deadlines
from proxy.events import LOCAL_METHODS
from proxy.hedge import HedgeBudget, Race
from proxy.methods import MethodTable
from proxy.model import (
    EntryError,
    MirrorEntry,
    Node,
    NodeEntry,
    Pool,
    RouteRule,
    normalize_chain,
    normalize_pool,
)
from proxy.rounds import _Checked, _gather
from proxy.ryw import hide_unreadable
from proxy.select import NoEligibleNode, Selector
from proxy.settings import ProxySettings
from proxy.state import RoutingState
from proxy.store import StoreEvent
from proxy.store_file import FileStore

ADDR = "0x" + "ab" * 20
HASH = "0x" + "cd" * 32
TABLE = MethodTable()


# ---- step 1: methods and target blocks ---------------------------------------------------


@pytest.mark.parametrize(
    ("method", "params", "expected"),
    [
        ("eth_getBalance", [ADDR, "0x10"], BlockRef(number=16)),
        ("eth_getBalance", [ADDR], BlockRef(tag="latest")),
        ("eth_getBalance", {"address": ADDR, "blockNumber": "earliest"}, BlockRef(tag="earliest")),
        ("eth_getStorageAt", [ADDR, "0x0", "pending"], BlockRef(tag="pending")),
        ("eth_call", [{"to": ADDR}, {"blockHash": HASH}], BlockRef(hash=HASH)),
        ("eth_call", [{"to": ADDR}, {"blockNumber": "0x5"}], BlockRef(number=5)),
        ("eth_getBlockByNumber", ["0x7", False], BlockRef(number=7)),
        ("eth_getBlockByHash", [HASH, False], BlockRef(hash=HASH)),
        ("eth_baseFee", [], BlockRef(tag="latest")),
        ("getAddressBalance", [ADDR], BlockRef(tag="latest")),
        (
            "getAddressBalance",
            [ADDR, {"block_id": "0x9", "type": "Contains"}],
            BlockRef(number=9, contains=True),
        ),
        ("getStorageAt", [ADDR, "0x1", {"block_id": "12", "type": "Equals"}], BlockRef(number=12)),
        ("getBlockByHeight", [44], BlockRef(number=44)),
        ("getBlockById", [HASH], BlockRef(hash=HASH)),
        ("pre_traceCall", [{"to": ADDR}, "0x3"], BlockRef(number=3)),
        ("eth_blockNumber", [], None),
        ("blockIsValid", [HASH], None),
        ("trace_vendorBlock", ["latest"], None),
    ],
)
def test_target_block_of_every_way_to_name_a_block(method, params, expected) -> None:
    _, ref = TABLE.target(method, params)
    assert ref == expected


@pytest.mark.parametrize(
    ("method", "params", "code"),
    [
        ("eth_getBalance", [], -32602),  # missing address
        ("eth_getBalance", ["0x12", "latest"], -32602),  # bad address
        ("eth_getBalance", [ADDR, "latest", 1], -32602),  # too many
        ("eth_getBalance", {"addr": ADDR}, -32602),  # unknown name
        ("eth_getBalance", [ADDR, "0xzz"], -32602),  # bad block: a bad param (standard API)
        ("getAddressBalance", [ADDR, {"block_id": "latest", "type": "Near"}], -39007),  # vendor
        ("getAddressBalance", [ADDR, {"block_id": "0xzz"}], -39007),
        ("eth_getBlockByHash", ["0x12", False], -32602),
        ("eth_call", ["notanobject"], -32602),
        ("eth_sendRawTransaction", ["nothex"], -32602),
        ("eth_getTransactionReceipt", ["0x12"], -32602),  # not a 32-byte hash
        ("eth_getTransactionReceipt", [], -32602),
        ("eth_getTransactionByHash", [HASH[:-2]], -32602),
        ("eth_estimateGas", ["notanobject"], -32602),
        ("eth_estimateGas", [{"to": ADDR}, "0xzz"], -32602),
        ("eth_getBlockByNumber", ["0xzz", False], -32602),
        ("eth_getBlockByNumber", [{"blockHash": "0x12"}, False], -32602),
        ("eth_getLogs", [{"fromBlock": "0xzz"}], -32602),
        ("eth_multiCall", [[], "0xzz"], -39007),  # the spec's own method keeps its code
        ("pre_traceCall", [{}, "0xzz"], -39007),
        ("eth_getTransactionByBlockNumberAndIndex", ["0x1"], -32602),  # index missing
        ("eth_getTransactionByBlockNumberAndIndex", ["0x1", "1"], -32602),  # not hex
        ("eth_getTransactionByBlockHashAndIndex", ["0x12", "0x0"], -32602),
        ("eth_getUncleByBlockNumberAndIndex", ["0x1", "0x"], -32602),
        ("eth_getBlockReceipts", [], -32602),
        ("eth_getBlockReceipts", ["0xzz"], -32602),
        ("eth_getStorageValues", [[ADDR], "latest"], -32602),  # not an object
        ("eth_getProof", [ADDR], -32602),  # storage keys missing
        ("eth_getProof", [ADDR, "0x0"], -32602),  # not a list
        ("eth_getProof", ["0x12", [], "latest"], -32602),
        ("eth_createAccessList", ["0x"], -32602),
        ("eth_simulateV1", [[], "latest"], -32602),
        ("debug_traceCall", [{"to": ADDR}, "latest", []], -32602),  # options not an object
        ("debug_traceTransaction", [], -32602),
        ("debug_traceTransaction", [HASH, "callTracer"], -32602),
        ("debug_traceBlockByNumber", ["0xzz"], -32602),
        ("debug_traceBlockByHash", ["0x12"], -32602),
        ("trace_transaction", ["0x12"], -32602),
        ("trace_filter", ["latest"], -32602),  # not an object
        ("trace_filter", [{"fromBlock": "0xzz"}], -32602),
        ("trace_filter", [{"fromBlock": "0x1", "topics": []}], -32602),  # not a field of it
        ("trace_filter", [{"fromBlock": {"blockHash": HASH}}], -32602),  # a number or tag
        ("trace_replayBlockTransactions", ["0x1"], -32602),  # trace types missing
        ("trace_replayBlockTransactions", ["0x1", "trace"], -32602),
        ("web3_sha3", ["hello"], -32602),
        ("eth_sign", [ADDR], -32602),
        ("eth_sign", [ADDR, "hello"], -32602),
        ("eth_signTransaction", ["0x"], -32602),
        ("txpool_contentFrom", ["0x12"], -32602),
        ("debug_getRawTransaction", ["0x12"], -32602),
        ("debug_getRawBlock", ["0xzz"], -32602),
        ("eth_capabilities", [], -32601),  # not served (docs/proxy.md "Method table")
        ("eth_feeHistory", ["0x5"], -32602),  # newestBlock is required
        ("eth_feeHistory", ["0x5", "latest", 50], -32602),  # percentiles are a list
        ("eth_gasPrice", [1], -32602),
        ("web3_clientVersion", ["x"], -32602),
        ("eth_newPendingTransactionFilter", [], -32601),  # not in the table (events.py)
    ],
)
def test_bad_params_and_methods_are_refused(method, params, code) -> None:
    with pytest.raises(JsonRpcError) as err:
        TABLE.target(method, params)
    assert err.value.code == code


def test_addresses_seen_before_are_still_checked_exactly(monkeypatch) -> None:
    """The memo of good address texts only ever holds good ones, stays within its bound,
    and a bad address is refused however many good ones came before (or after it is full)."""
    monkeypatch.setattr(methods, "MAX_ADDRESSES_SEEN", 4)
    monkeypatch.setattr(methods, "_ADDRESSES_SEEN", set())
    bad = ["0x" + "g" * 40, "0x" + "1" * 41, "0X" + "1" * 40, ADDR + " ", 12, None]
    for i in range(10):
        TABLE.target("eth_getBalance", [f"0x{i:040x}", "latest"])
        for value in bad:
            with pytest.raises(JsonRpcError) as err:
                TABLE.target("eth_getBalance", [value, "latest"])
            assert err.value.code == -32602
        assert 0 < len(methods._ADDRESSES_SEEN) <= 4
    assert all(len(a) == 42 and a.startswith("0x") for a in methods._ADDRESSES_SEEN)
    TABLE.target("eth_getBalance", [ADDR.upper().replace("0X", "0x"), "latest"])  # mixed case


def test_a_block_text_seen_before_is_not_parsed_again_but_the_other_params_are(
    monkeypatch,
) -> None:
    """The memo of targets (method, number of params, block text) skips the block's parse
    only: every other param is checked each time, a bad block text is never remembered, and
    the memo stays within its bound."""
    monkeypatch.setattr(methods, "MAX_TARGETS", 3)
    table = MethodTable()
    spec = table.specs["eth_getBalance"]
    parsed: list[str] = []

    def parse(value):
        parsed.append(value)
        return spec.parse_block(value)

    counting = dataclasses.replace(spec, parse_block=parse)
    table.specs["eth_getBalance"] = counting
    for _ in range(3):
        assert table.target("eth_getBalance", [ADDR, "0x10"]) == (counting, BlockRef(number=16))
    assert parsed == ["0x10"]
    for params, code in [
        (["0x12", "0x10"], -32602),  # a bad address at a block seen before
        ([None, "0x10"], -32602),  # a missing one
        ([ADDR, "0x10", "0x10"], -32602),  # too many params
        ([ADDR, "0xzz"], -32602),  # a bad block, twice: never remembered
        ([ADDR, "0xzz"], -32602),
    ]:
        with pytest.raises(JsonRpcError) as err:
            table.target("eth_getBalance", params)
        assert err.value.code == code, params
    for n in range(10):
        assert table.target("eth_getBalance", [ADDR, hex(n)])[1] == BlockRef(number=n)
    assert sum(map(len, table._known.values())) <= 3


def test_extra_methods_setting_allows_more() -> None:
    table = MethodTable(("eth_getUncleByBlockHashAndIndex", "eth_mining"))
    spec, ref = table.target("eth_getUncleByBlockHashAndIndex", ["0x" + "00" * 32, "0x0"])
    assert ref == BlockRef(hash="0x" + "00" * 32) and spec.missing_null  # served already
    spec, ref = table.target("eth_mining", ["anything"])
    assert ref is None and not spec.writer


def test_writer_methods() -> None:
    for method in (*TX_LIFECYCLE, "trace_vendorBlock"):
        spec = TABLE.spec(method)
        assert spec.writer or spec.mempool, method  # (by hash: state nodes, then the Leader)
    for method in PENDING_READS:
        assert TABLE.spec(method).pending and not TABLE.spec(method).writer, method
    # Whatever the proxy may send to the Leader, the write node passes on to its client
    # (writer methods, `pending` reads, a transaction no reader holds, a trie without full
    # nodes), reading params by the same names.
    passed = {**TX_LIFECYCLE, **PASS_THROUGH}
    for method, spec in TABLE.specs.items():
        if spec.writer or spec.mempool or spec.trie:
            assert method in passed or method == "trace_vendorBlock", method
        if spec.pending and method not in PENDING_READS:
            assert method in passed, method
    for method, names in {**passed, **PENDING_READS}.items():
        if method in LOCAL_METHODS:  # the proxy's own filters ask the Leader for these
            continue
        assert TABLE.spec(method).params == names, method
    for method in ("eth_multiCall", "eth_baseFee", "getAddressNonce", "web3_clientVersion"):
        assert not TABLE.spec(method).pending and not TABLE.spec(method).writer, method
    TABLE.target("eth_feeHistory", ["0x4", "latest", [25, 75]])
    TABLE.target("eth_estimateGas", {"transaction": {"to": ADDR}})


@pytest.mark.parametrize(
    ("raw", "chain", "pool"),
    [
        ("1", "1", "1"),
        ("0x1", "1", "1"),
        ("0x539", "1337", "1337"),
        ("0X539", "1337", "1337"),
        ("1337-blue", None, "1337-blue"),
        ("0x539-blue", None, "1337-blue"),
        ("01", None, None),
        ("abc", None, None),
        ("-1", None, None),
        ("1-", None, None),
        ("1-bl/ue", None, None),
    ],
)
def test_chain_and_pool_ids_are_normalized(raw, chain, pool) -> None:
    assert normalize_chain(raw) == chain
    assert normalize_pool(raw) == pool


# ---- steps 2 and 3: kind and node ---------------------------------------------------------


def pool_with(*nodes: Node) -> Pool:
    pool = Pool("1", nodes={n.key: n for n in nodes})
    pool.rebuild()
    return pool


def node(key: str, kind: str, head: int | None = 1000, weight: int = 1, **kw) -> Node:
    entry = NodeEntry(key=key, url=f"http://{key}", kind=kind, weight=weight, **kw)
    return Node(entry, head=head)


SPEC = TABLE.spec("eth_getBalance")


@pytest.fixture
def selector() -> Selector:
    return Selector(state_window=128, known_hashes=16, rng=random.Random(7))


@pytest.mark.parametrize(
    ("ref", "kind"),
    [
        (None, "state"),
        (BlockRef(tag="latest"), "state"),
        (BlockRef(tag="safe"), "state"),
        (BlockRef(tag="finalized"), "state"),
        (BlockRef(tag="pending"), "state"),
        (BlockRef(tag="earliest"), "archive"),
        (BlockRef(number=1000 - 127), "state"),
        (BlockRef(number=1000 - 128), "archive"),
        (BlockRef(number=5, contains=True), "state"),
        (BlockRef(hash=HASH), "archive"),  # unknown hash
    ],
)
def test_kind_rules(selector: Selector, ref, kind) -> None:
    pool = pool_with(node("s", "state"), node("a", "archive"))
    assert selector.need(pool, ref).kind == kind
    assert selector.choose(pool, "eth_getBalance", SPEC, ref).node.entry.kind == kind


def test_known_hash_routes_by_its_height(selector: Selector) -> None:
    pool = pool_with(node("s", "state"), node("a", "archive"))
    selector.remember_hash(HASH, 999)
    assert selector.choose(pool, "eth_getBalance", SPEC, BlockRef(hash=HASH)).node.key == "s"


def test_unhealthy_disabled_behind_and_zero_weight_nodes_are_skipped(selector: Selector) -> None:
    sick = node("sick", "state")
    sick.healthy = False
    off = node("off", "state", enabled=False)
    behind = node("behind", "state", head=900)
    drained = node("drained", "state", weight=0)
    good = node("good", "state")
    pool = pool_with(sick, off, behind, drained, good)
    ref = BlockRef(number=950)
    for _ in range(20):
        assert selector.choose(pool, "eth_getBalance", SPEC, ref).node is good


def test_falls_back_to_the_other_kind_and_says_so(selector: Selector) -> None:
    pool = pool_with(node("a", "archive"))
    choice = selector.choose(pool, "eth_getBalance", SPEC, BlockRef(tag="latest"))
    assert choice.node.key == "a" and "falling back to archive" in choice.reason


def test_no_eligible_node_says_why(selector: Selector) -> None:
    pool = pool_with(node("s", "state", enabled=False))
    with pytest.raises(NoEligibleNode) as err:
        selector.choose(pool, "eth_getBalance", SPEC, None)
    assert err.value.code == -32603 and "s(state, disabled" in err.value.message


def test_excluded_nodes_and_prefer_archive(selector: Selector) -> None:
    s1, s2, a = node("s1", "state"), node("s2", "state"), node("a", "archive")
    pool = pool_with(s1, s2, a)
    ref = BlockRef(tag="latest")
    assert selector.choose(pool, "eth_getBalance", SPEC, ref, exclude=[s1]).node is s2
    assert selector.choose(pool, "eth_getBalance", SPEC, ref, prefer_archive=True).node is a


def test_method_routes_pin_kind_or_nodes(selector: Selector) -> None:
    s1, s2, a = node("s1", "state"), node("s2", "state"), node("a", "archive")
    pool = pool_with(s1, s2, a)
    pool.routes["eth_getBalance"] = [RouteRule("eth_getBalance", kind="archive")]
    assert selector.choose(pool, "eth_getBalance", SPEC, None).node is a
    pool.routes["eth_getBalance"] = [RouteRule("eth_getBalance", nodes=("s2",))]
    for _ in range(10):
        assert selector.choose(pool, "eth_getBalance", SPEC, None).node is s2
    with pytest.raises(NoEligibleNode):  # pinned nodes only: no fallback
        selector.choose(pool, "eth_getBalance", SPEC, None, exclude=[s2])


def test_weighted_choice_follows_weights_and_inflight(selector: Selector) -> None:
    heavy, light = node("heavy", "state", weight=9), node("light", "state", weight=1)
    pool = pool_with(heavy, light)
    picks = [selector.choose(pool, "eth_getBalance", SPEC, None).node.key for _ in range(2000)]
    assert picks.count("heavy") > 1700
    heavy.inflight = 100  # busy: the light node takes over when both are drawn
    picks = [selector.choose(pool, "eth_getBalance", SPEC, None).node.key for _ in range(2000)]
    assert picks.count("light") > 300


def test_writer_methods_go_to_the_leader(selector: Selector) -> None:
    pool = pool_with(node("s", "state"))
    spec = TABLE.spec("eth_sendRawTransaction")
    with pytest.raises(NoEligibleNode, match="no Leader"):
        selector.choose(pool, "eth_sendRawTransaction", spec, None)
    w1, w2 = node("w1", "writer"), node("w2", "writer")
    pool.writers = {"w1": w1, "w2": w2}
    pool.leader = "w2"
    assert selector.choose(pool, "eth_sendRawTransaction", spec, None).node is w2


def test_pending_reads_go_to_the_leader_when_there_is_one(selector: Selector) -> None:
    pool = pool_with(node("s", "state"))
    pending, latest = BlockRef(tag="pending"), BlockRef(tag="latest")
    nonce = TABLE.spec("eth_getTransactionCount")
    # Without a Leader the state node answers `pending` as `latest`.
    assert selector.choose(pool, "eth_getTransactionCount", nonce, pending).node.key == "s"
    writer = node("w", "writer")
    pool.writers = {"w": writer}
    pool.leader = "w"
    choice = selector.choose(pool, "eth_getTransactionCount", nonce, pending)
    assert choice.node.key == "w" and "Leader" in choice.reason
    assert selector.choose(pool, "eth_getTransactionCount", nonce, latest).node.key == "s"
    multi = TABLE.spec("eth_multiCall")  # a state node method only: never to the Leader
    assert selector.choose(pool, "eth_multiCall", multi, pending).node.key == "s"
    with pytest.raises(NoEligibleNode, match="did not answer"):  # no retry elsewhere
        selector.choose(pool, "eth_getTransactionCount", nonce, pending, exclude=[writer])


def test_readable_head_is_what_latest_reads_can_see(selector: Selector) -> None:
    s1, s2, a = node("s1", "state", head=10), node("s2", "state", head=12), node("a", "archive")
    assert selector.readable_head(pool_with(s1, s2, a)) == 12  # archive heads do not count
    assert selector.readable_head(pool_with(a)) == 1000  # no state node: the archive's
    assert selector.readable_head(pool_with(node("new", "state", head=None))) == -1
    s2.healthy = False
    assert selector.readable_head(pool_with(s1, s2)) == 10
    s1.healthy = False
    assert selector.readable_head(pool_with(s1, s2)) is None  # nobody to wait for
    assert selector.readable_head(pool_with()) is None


def test_a_transaction_is_shown_mined_once_its_block_is_readable() -> None:
    receipt = {"transactionHash": HASH, "blockNumber": "0xb", "status": "0x1"}
    answer = {"jsonrpc": "2.0", "id": 1, "result": dict(receipt)}
    assert not hide_unreadable("eth_getTransactionReceipt", answer, 11)
    assert not hide_unreadable("eth_getTransactionReceipt", answer, None)
    assert answer["result"] == receipt
    assert hide_unreadable("eth_getTransactionReceipt", answer, 10)
    assert answer["result"] is None
    tx = {"hash": HASH, "blockHash": HASH, "blockNumber": "0xb", "transactionIndex": "0x0"}
    answer = {"jsonrpc": "2.0", "id": 1, "result": dict(tx)}
    assert hide_unreadable("eth_getTransactionByHash", answer, -1)
    assert answer["result"] == {
        "hash": HASH,
        "blockHash": None,
        "blockNumber": None,
        "transactionIndex": None,
    }
    for result in (None, {**tx, "blockNumber": None}, "0x"):  # unknown, pending, odd
        answer = {"jsonrpc": "2.0", "id": 1, "result": result}
        assert not hide_unreadable("eth_getTransactionByHash", answer, 0)
    error = {"jsonrpc": "2.0", "id": 1, "error": {"code": -32000, "message": "x"}}
    assert not hide_unreadable("eth_getTransactionReceipt", error, 0)


# ---- entries -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "obj",
    [
        {"url": "http://x"},
        {"key": "a b", "url": "http://x"},
        {"key": "a", "url": "ftp://x"},
        {"key": "a", "url": "http://"},
        {"key": "a", "url": "http://x", "kind": "light"},
        {"key": "a", "url": "http://x", "weight": -1},
        {"key": "a", "url": "http://x", "weight": True},
        {"key": "a", "url": "http://x", "enabled": "yes"},
        {"key": "a", "url": "http://x", "head": 5},
        ["key", "a"],
    ],
)
def test_bad_node_entries(obj) -> None:
    with pytest.raises(EntryError):
        NodeEntry.from_obj(obj)


def test_route_and_mirror_entries() -> None:
    with pytest.raises(EntryError):
        RouteRule.from_obj({"method": "eth_call"})
    with pytest.raises(EntryError):
        RouteRule.from_obj({"method": "eth_call", "kind": "state", "nodes": ["a"]})
    with pytest.raises(EntryError):
        MirrorEntry.from_obj({"url": "http://m", "methods": []})
    m = MirrorEntry.from_obj({"url": "http://m", "methods": ["eth_call"]})
    assert m.wants("eth_call") and not m.wants("eth_getBalance")


def test_one_classification_of_answers_and_failures() -> None:
    assert outcome.of_raw(b'{"jsonrpc":"2.0","id":1,"result":"0x1"}') is outcome.OK
    missing = outcome.of_raw(b'{"jsonrpc":"2.0","id":1,"error":{"code":-39006,"message":"x"}}')
    assert missing is outcome.BLOCK_MISSING and missing.retry and missing.prefer_archive
    assert not missing.penalise  # the node works; it lacks the block
    precompile = outcome.of_raw(b'{"jsonrpc":"2.0","id":1,"error":{"code":-39008,"message":"x"}}')
    assert precompile.retry and not precompile.prefer_archive
    revert = outcome.of_raw(b'{"jsonrpc":"2.0","id":1,"error":{"code":-39000,"message":"x"}}')
    assert revert is outcome.ERROR and revert.final
    assert outcome.of_answer({"id": 1, "error": {"code": -39006}}) is outcome.BLOCK_MISSING
    assert outcome.of_answer({"id": 1, "result": None}) is outcome.OK
    # an EVM time limit the call reached by its own cost: final, not the node's fault
    own = b'{"id":1,"error":{"code":-39004,"message":"x","data":{"reason":"time_limit"}}}'
    assert outcome.of_raw(own) is outcome.CALL_TIMEOUT
    assert outcome.CALL_TIMEOUT.final and not outcome.CALL_TIMEOUT.penalise
    assert outcome.of_raw(b'{"id":1,"error":{"code":-39004,"message":"halted"}}') is outcome.ERROR
    # transport failures carry their outcome
    failures = (outcome.ConnectFailed, outcome.TimedOut, outcome.HttpFailed, outcome.NodeFailed)
    for failure in (*failures, outcome.BadResponse):
        assert failure("x").outcome.retry and failure("x").outcome.penalise
    saturated = outcome.Saturated("x").outcome  # the proxy's own queue: not the node's fault
    assert saturated.retry and not saturated.penalise
    assert outcome.TooLarge("x").outcome.final
    assert outcome.TimedOut("no answer").kind == "timeout"  # (the metrics label)
    # the label of an answered attempt (metrics, spans): what a retryable answer asked
    assert outcome.answered(b'{"jsonrpc":"2.0","id":1,"result":"0x1"}') == "ok"
    assert outcome.answered(b'{"id":1,"error":{"code":-39006,"message":"x"}}') == "block_not_found"
    assert outcome.answered(b'{"id":1,"error":{"code":-39000,"message":"revert"}}') == "ok"
    assert outcome.answered(b'[{"id":0,"result":1},{"id":1,"error":{"code":-39008}}]') == (
        "retryable"
    )
    assert outcome.answered(b'[{"id":0,"error":{"code":-39000,"message":"x"}}]') == "ok"


def test_a_whole_batch_checked_as_its_attempt_is_booked_keeps_the_attempts_label() -> None:
    """A whole batch's answer is matched once, as its attempt is booked: the label is the
    one `outcome.answered` gives, and the match is kept for the same bytes only."""
    results = b'[{"jsonrpc":"2.0","id":1,"result":"0x1"},{"jsonrpc":"2.0","id":2,"result":"0x"}]'
    retry = b'[{"jsonrpc":"2.0","id":1,"result":"0x1"},{"id":2,"error":{"code":-39006}}]'
    error = b'[{"jsonrpc":"2.0","id":1,"result":"0x1"},{"id":2,"error":{"code":-32000}}]'
    limited = b'[{"jsonrpc":"2.0","id":1,"error":{"code":-32005,"message":"rate limit"}}]'
    for raw, label in ((results, "ok"), (retry, "retryable"), (error, "ok"), (limited, None)):
        checked = _Checked([1, 2])
        assert checked.label(raw) == (label or outcome.answered(raw))
        assert checked.raw is raw and (checked.found is not None) == (raw is results)
    assert outcome.answered(limited) == "rate_limited"


# ---- state applied from store events -----------------------------------------------------


def test_state_applies_events_and_ignores_bad_values() -> None:
    state = RoutingState()
    n = orjson.dumps({"key": "s", "url": "http://s", "kind": "state", "weight": 2})
    state.load({"pools/1/nodes/s": n, "pools/1/nodes/bad": b"{not json", "1/version": b"blue"}, 3)
    assert list(state.pools["1"].nodes) == ["s"]
    assert state.versions == {"1": "blue"}
    assert state.pool_for_chain("1") is None  # version mode: pool 1-blue does not exist yet
    state.apply(StoreEvent("pools/1-blue/nodes/s", n, 4))
    assert state.pool_for_chain("1").id == "1-blue"
    state.apply(StoreEvent("1/version", None, 5))
    assert state.pool_for_chain("1").id == "1"
    state.apply(StoreEvent("pools/1/nodes/s", None, 6))
    assert "1" not in state.pools and state.revision == 6


# ---- file store --------------------------------------------------------------------------


async def test_file_store_persists_atomically_and_watches(tmp_path) -> None:
    path = tmp_path / "store.json"
    store = FileStore(path)
    await store.start()
    rev = await store.put("a/1", b'{"x":1}')
    watch = store.watch("a/", rev)
    first = await anext(watch)
    assert first == StoreEvent("a/1", b'{"x":1}', rev)
    await store.put("b/1", b"2")
    rev3 = await store.delete("a/1")
    assert await anext(watch) == StoreEvent("a/1", None, rev3)
    assert await store.delete("missing") == rev3  # unchanged revision
    await store.close()
    assert not list(tmp_path.glob("*.tmp"))
    again = FileStore(path)
    await again.start()
    assert await again.snapshot() == ({"b/1": b"2"}, rev3)
    rev4 = await again.delete_prefix("b/")
    assert await again.snapshot() == ({}, rev4)


async def test_file_store_refuses_unreadable_file(tmp_path) -> None:
    path = tmp_path / "store.json"
    path.write_text("{broken")
    from chainstate.config import ConfigError

    with pytest.raises(ConfigError, match="unreadable"):
        await FileStore(path).start()


def test_upstream_status_handling() -> None:
    from proxy.transport import http_answer as _answer
    from proxy.upstream import UpstreamError

    rpc = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"too large"}}'
    assert _answer("http://n", 200, b"x") == b"x"
    assert _answer("http://n", 204, b"") == b""
    assert _answer("http://n", 413, rpc) == rpc  # the node's own JSON-RPC refusal
    for status, body in ((413, b"too large"), (502, rpc), (503, b"")):
        with pytest.raises(UpstreamError, match=f"HTTP {status}"):
            _answer("http://n", status, body)


def test_lagging_heads_do_not_refuse_an_item(selector: Selector) -> None:
    """Heads are polled: a node whose last poll showed 900 may already hold block 950."""
    behind = node("behind", "state", head=900)
    pool = pool_with(behind)
    choice = selector.choose(pool, "eth_getBalance", SPEC, BlockRef(number=950))
    assert choice.node is behind and "trying anyway" in choice.reason
    behind.entry = NodeEntry(key="behind", url="http://behind", kind="state", enabled=False)
    with pytest.raises(NoEligibleNode):
        selector.choose(pool, "eth_getBalance", SPEC, BlockRef(number=950))


def test_candidates_change_only_at_the_breakpoints(selector: Selector) -> None:
    """A batch chooses once per range of heights between breakpoints: check that every height
    of a range really has the same candidates as its first height."""
    state = node("s", "state", head=1000)
    state.earliest = 900
    lagging = node("l", "state", head=990)
    archive = node("a", "archive", head=1000)
    archive.earliest = 0
    pool = pool_with(state, lagging, archive)
    points = selector.breakpoints(pool, pool.head())
    assert points == [0, 873, 900, 991, 1001]  # 873: the state window, up to head 1000
    for lo, hi in zip([0, *points], [*points, 1010], strict=True):
        first = selector.candidates(pool, "eth_getBalance", SPEC, BlockRef(number=lo))[0]
        for height in range(lo, hi):
            ref = BlockRef(number=height)
            assert selector.candidates(pool, "eth_getBalance", SPEC, ref)[0] == first, height


def test_latency_quantile_of_times_on_a_bucket_bound_is_that_bound() -> None:
    """A time exactly on a bucket's upper bound is counted in that bucket, so the window's
    quantile of such times is the time itself, not the next bound (one bucket high)."""
    from proxy import latency

    for i in (1, 8, 37, 100):
        bound = latency.FLOOR_S * 2 ** (i / latency.BUCKETS_PER_DOUBLING)
        window = latency.LatencyWindow(0.5)
        for _ in range(latency.MIN_SAMPLES):
            window.add(bound)
        assert window.quantile(0.5) == pytest.approx(bound, rel=1e-12)
        assert window.quantile(0.99) == pytest.approx(bound, rel=1e-12)
    above = latency.LatencyWindow(0.5)
    above.add(latency.FLOOR_S * 2 ** (8 / latency.BUCKETS_PER_DOUBLING) * 1.0001)
    assert above.quantile(0.5) > latency.FLOOR_S * 2  # just past a bound: the next bucket
    assert latency.bucket(1e9) == latency.N_BUCKETS - 1  # past the last bound: the overflow


@pytest.mark.parametrize("start", [None, 0.3, 5.0])
def test_latency_samples_folded_together_match_one_at_a_time(start: float | None) -> None:
    """`observe_many` / `add_many` (the in-process answers' books, folded in together) give
    what `observe` / `add` give one sample at a time at the same instant."""
    from types import SimpleNamespace

    from proxy import latency

    rng = random.Random(7)
    samples = [rng.uniform(0.0001, 0.01) for _ in range(300)]
    # and in-process answers' times: at or under the first bucket's bound
    samples += [rng.uniform(0.0, latency.FLOOR_S) for _ in range(100)] + [latency.FLOOR_S] * 3
    rng.shuffle(samples)
    one = SimpleNamespace(cost=start, cost_at=0.0)
    many = SimpleNamespace(cost=start, cost_at=0.0)
    for s in samples:
        latency.observe(one, s * 1000, 2.0, 1.0)
    latency.observe_many(many, [s * 1000 for s in samples], 2.0, 1.0)
    assert many.cost == pytest.approx(one.cost) and many.cost_at == one.cost_at
    # `Attempts.answered_ok` gives it the first and the slowest of all only
    for order in (samples, sorted(samples, reverse=True)):  # (the first the slowest, too)
        ms = [s * 1000 for s in order]
        each = SimpleNamespace(cost=start, cost_at=0.0)
        for m in ms:
            latency.observe(each, m, 2.0, 1.0)
        two = SimpleNamespace(cost=start, cost_at=0.0)
        latency.observe_many(two, [ms[0], max(order) * 1000], 2.0, 1.0)
        assert two.cost == each.cost
    a, b = latency.LatencyWindow(0.9), latency.LatencyWindow(0.9)
    for s in samples:
        a.add(s)
    for chunk in (samples[:64], samples[64:200], samples[200:]):
        b.add_many(chunk)
    assert b.counts == a.counts and b.total == a.total and b.since + b.n == a.since + a.n
    assert b.hedge_q is not None  # refreshed once past MIN_SAMPLES, as `add` does
    ewma_one, ewma_many = node("one", "state"), node("many", "state")
    ewma_one.latency_ms = ewma_many.latency_ms = start
    for s in samples:
        ewma_one.observe_latency(s * 1000)
    for chunk in (samples[:1], samples[1:64], samples[64:]):
        ewma_many.observe_latencies(chunk)
    assert ewma_many.latency_ms == ewma_one.latency_ms  # the same float, not only close


def test_histogram_samples_folded_together_match_one_at_a_time() -> None:
    """`observe_all` (the in-process answers' request times, folded in together: sorted and
    counted per bucket) gives the buckets and sum `observe` gives one sample at a time,
    samples on a bound and above every bound included."""
    from proxy.metrics import LATENCY_BUCKETS, ProxyMetrics

    rng = random.Random(11)
    samples = [rng.uniform(0.0, 0.004) for _ in range(200)]
    samples += [rng.choice(LATENCY_BUCKETS) for _ in range(40)]  # exactly on a bound
    samples += [rng.uniform(10, 20) for _ in range(5)]  # above every bound (+Inf)
    rng.shuffle(samples)
    one, many = ProxyMetrics(), ProxyMetrics()
    for s in samples:
        one.observe("1337", "single", s)
    for chunk in (samples[:1], samples[1:64], samples[64:]):
        many.observe_all("1337", "single", chunk)
    a, b = one.hot.latency[("1337", "single")], many.hot.latency[("1337", "single")]
    assert b.counts == a.counts and sum(a.counts) == len(samples)
    assert b.total == pytest.approx(a.total)
    only_first = ProxyMetrics()  # the common fold: every sample in the first bucket
    only_first.observe_all("1337", "single", [0.00001] * 64)
    assert only_first.hot.latency[("1337", "single")].counts[:2] == [64, 0]


def test_busy_poll_setting_reaches_the_data_listener() -> None:
    """`busy_poll_us` (0 by default: off) becomes the data listener's polling window."""
    assert server_limits(ProxySettings()).busy_poll == 0
    off = ProxySettings.from_config({"proxy": {"busy_poll_us": 0}})
    assert server_limits(off).busy_poll == 0
    on = ProxySettings.from_config({"proxy": {"busy_poll_us": 1000}})
    assert server_limits(on).busy_poll == 1000e-6
    for bad in (-1, 2.5, True, "x"):
        with pytest.raises(ConfigError, match="busy_poll_us"):
            ProxySettings.from_config({"proxy": {"busy_poll_us": bad}})


async def test_sub_batches_are_awaited_in_order_and_cancelled_with_their_request() -> None:
    """A batch's sub-batches (one per node) run at once and give their items in order; when
    the request's task is cancelled, or one sub-batch fails, the ones still running are
    cancelled, not left to the loop."""
    loop = asyncio.get_running_loop()
    cancelled: list[int] = []

    async def sub(i: int, delay: float) -> list[int]:
        try:
            await asyncio.sleep(delay)
        except asyncio.CancelledError:
            cancelled.append(i)
            raise
        return [i]

    assert await _gather([sub(0, 0.02), sub(1, 0.0), sub(2, 0.01)], loop) == [[0], [1], [2]]
    request = loop.create_task(_gather([sub(3, 10), sub(4, 10), sub(5, 10)], loop))
    await asyncio.sleep(0.01)  # every sub-batch started
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    assert sorted(cancelled) == [3, 4, 5]

    async def broken() -> list[int]:
        await asyncio.sleep(0.01)
        raise RuntimeError("a defect in a step")

    with pytest.raises(RuntimeError):
        await _gather([broken(), sub(6, 10)], loop)
    await asyncio.sleep(0)
    assert cancelled[-1] == 6


class _SecondAttempts:
    """What a `Race` asks of `Attempts` when its hedge delay passes: a second attempt, here
    a task answering `b"won"` from node "b" after a short while."""

    def __init__(self) -> None:
        self.launched = 0

    def launch(self, sent: Any, trigger: str) -> asyncio.Task[tuple[Any, bytes]]:
        self.launched += 1

        async def second() -> tuple[Any, bytes]:
            await asyncio.sleep(0.02)
            return "b", b"won"

        return asyncio.get_running_loop().create_task(second())

    def late(self, ctx: Any, node: Any, timeout: float | None) -> None:
        pass


@pytest.mark.parametrize("first_fails", [False, True])
async def test_a_second_attempt_that_wins_ends_an_unsent_first_one_or_is_awaited(
    first_fails: bool,
) -> None:
    """The hedge delay passes while the first attempt is still waiting to be sent: the
    second attempt's win ends the first one's wait (its task cancelled, `won_early` the
    answer); when the first one failed meanwhile (its connection refused), the request's
    task awaits the second one and gets its answer, not a cancellation."""
    attempts = _SecondAttempts()
    deadlines = Deadlines()

    def usable(raw: bytes) -> bool:
        return True

    async def first_attempt() -> tuple[Any, bytes]:  # as `Attempts.exchange` runs a race
        race = Race(deadlines, HedgeBudget(0.1), attempts, (None, None, b"", None), usable,
                    0.005, None)  # fmt: skip
        try:
            await asyncio.sleep(0.01)  # waiting for a connection: the hedge starts
            assert attempts.launched == 1
            if first_fails:
                raise outcome.ConnectFailed("connection refused")
            await asyncio.sleep(10)  # never sent: the second attempt's win ends this
            raise AssertionError("not ended")
        except outcome.UpstreamError:
            race.failed()
            return await race.second()
        except asyncio.CancelledError:
            won = race.won_early()
            if won is None:
                raise
            return race.winner, won
        finally:
            race.close()

    assert await asyncio.wait_for(first_attempt(), 5) == ("b", b"won")
    deadlines.close()

"""The read path (nodes/state/reads.py) and the hot view (nodes/state/hot.py).

Answers through `StateNode.handle_body` are compared with the model state of a synthetic
chain at every height the node holds, while blocks are applied, rolled back (reorgs) and
pruned, with hot views smaller and larger than the window; and every malformed request
answers exactly what the generic dispatcher answers.
"""

from __future__ import annotations

import asyncio
import gc
import random
from pathlib import Path
from typing import Any

import orjson
import pytest

import nodes.state.reads as reads_module
from nodes.state.hot import MISSING, RESTART, HotState
from nodes.state.reads import CacheGate
from nodes.state.service import StateNode
from nodes.state.vendor import parse_vendor_block
from tests.nodes.test_state_chain import Account, SyntheticChain, random_chain

SLOTS = 6


async def make_node(tmp_path: Path, **settings: Any) -> StateNode:
    section = {"key": "reads", "chain_id": 1337, "map_size_mb": 64, **settings}
    node = StateNode.from_config(section, data_dir=tmp_path / "node")
    await node.start()
    return node


def read_batch(addrs: list[str], height: int | str) -> list[dict[str, Any]]:
    block = height if isinstance(height, str) else hex(height)
    items: list[dict[str, Any]] = []
    for addr in addrs:
        items.append({"method": "eth_getBalance", "params": [addr, block]})
        items.append({"method": "eth_getTransactionCount", "params": [addr, block]})
        items.append({"method": "eth_getCode", "params": [addr, block]})
        items.append({"method": "getAddressNonce", "params": {"address": addr}})
        for slot in range(SLOTS):
            items.append({"method": "eth_getStorageAt", "params": [addr, hex(slot), block]})
    return [{"jsonrpc": "2.0", "id": i, **item} for i, item in enumerate(items)]


def expected(chain: SyntheticChain, addrs: list[str], height: int) -> list[Any]:
    model, head = chain.state(height), chain.state(chain.head)
    out: list[Any] = []
    for addr in addrs:
        acct = model.get(addr, Account())
        out += [hex(acct.balance), hex(acct.nonce), "0x" + acct.code.hex()]
        out.append(head.get(addr, Account()).nonce)
        out += ["0x" + acct.storage.get(s, 0).to_bytes(32, "big").hex() for s in range(SLOTS)]
    return out


async def assert_answers(node: StateNode, chain: SyntheticChain, addrs: list[str]) -> None:
    """Every field at every height the node holds, read through handle_body, equals the
    model; also once with "latest"."""
    earliest, head = node.store.range()
    assert head == chain.head
    for height in [*range(earliest, head + 1), "latest"]:
        at = head if height == "latest" else height
        answer = orjson.loads(await node.handle_body(orjson.dumps(read_batch(addrs, height))))
        assert [a["result"] for a in answer] == expected(chain, addrs, at), (height, node.hot.lo)


async def apply(node: StateNode, chain: SyntheticChain, start: int) -> None:
    for raw in chain.blocks[start:]:
        await node.ingest._apply(parse_vendor_block(raw))


@pytest.mark.parametrize(
    ("kind", "window", "hot_blocks", "cache"),
    [
        ("archive", 128, 8, 1000),
        ("archive", 128, 0, 0),  # hot view off
        ("state", 16, 8, 1000),
        ("state", 16, 64, 1000),  # more hot blocks than the window holds
        ("state", 16, 8, 3),  # a base cache smaller than the state: cleared and refilled
        # no base cache: every value below the view read from the store at its earliest
        # height (a `state` view as long as its window; an archive view over all its blocks)
        ("state", 16, 16, 0),
        ("archive", 128, 64, 0),
    ],
)
async def test_answers_equal_the_model_through_reorgs_and_pruning(
    tmp_path: Path, kind: str, window: int, hot_blocks: int, cache: int
) -> None:
    node = await make_node(
        tmp_path, kind=kind, window=window, hot_blocks=hot_blocks, hot_cache_entries=cache
    )
    try:
        chain, addrs = random_chain(seed=21, blocks=40)
        await apply(node, chain, 0)
        await assert_answers(node, chain, addrs)
        rng = random.Random(5)
        for round_ in range(6):
            # a reorg of 1..5 blocks onto a fork that is then extended
            depth = rng.randint(1, 5)
            for _ in range(depth):
                await node.ingest._rollback()
            fork = chain.fork(chain.head - depth, f"fork{round_}")
            for _ in range(depth + rng.randint(0, 6)):
                fork.add_random_block(rng, addrs)
            await apply(node, fork, chain.head - depth + 1)
            chain = fork
            await assert_answers(node, chain, addrs)
    finally:
        await node.close()


async def test_a_rollback_below_the_hot_blocks_empties_the_view(tmp_path: Path) -> None:
    node = await make_node(tmp_path, kind="archive", hot_blocks=4)
    try:
        chain, addrs = random_chain(seed=22, blocks=30)
        await apply(node, chain, 0)
        await assert_answers(node, chain, addrs)  # fills the base cache
        for _ in range(7):  # deeper than the 4 hot blocks
            await node.ingest._rollback()
        assert node.hot.empty
        fork = chain.fork(22, "deep")
        for _ in range(9):
            fork.add_random_block(random.Random(9), addrs)
        await apply(node, fork, 23)
        assert not node.hot.empty
        await assert_answers(node, fork, addrs)
    finally:
        await node.close()


A = "0x" + "11" * 20
BAD_ITEMS: list[Any] = [
    {"jsonrpc": "2.0", "id": 1, "method": "eth_getBalance", "params": ["0x12", "latest"]},
    {"jsonrpc": "2.0", "id": 2, "method": "eth_getBalance", "params": []},
    {"jsonrpc": "2.0", "id": 3, "method": "eth_getBalance", "params": [None, "latest"]},
    {"jsonrpc": "2.0", "id": 4, "method": "eth_getBalance", "params": [A, "bad"]},
    {"jsonrpc": "2.0", "id": 5, "method": "eth_getBalance", "params": [A, "0x99"]},
    {"jsonrpc": "2.0", "id": 6, "method": "eth_getBalance", "params": [A, "0x1", 3]},
    {"jsonrpc": "2.0", "id": 7, "method": "eth_getBalance", "params": "0x11"},
    {"jsonrpc": "2.0", "id": True, "method": "eth_getBalance", "params": []},
    {"jsonrpc": "1.0", "id": 9, "method": "eth_getBalance", "params": []},
    {"jsonrpc": "2.0", "id": 10, "method": "eth_getStorageAt", "params": [A, "x"]},
    {"jsonrpc": "2.0", "id": 11, "method": "eth_getStorageAt", "params": [A]},
    {"jsonrpc": "2.0", "id": 12, "method": "eth_getStorageAt", "params": [A, "0x" + "f" * 65]},
    {"jsonrpc": "2.0", "id": 13, "method": "eth_getCode", "params": [["0x"], "latest"]},
    {"jsonrpc": "2.0", "id": 14, "method": "eth_getBalance", "params": [A, {"x": 1}]},
    {"jsonrpc": "2.0", "id": 15, "method": "eth_getBalance", "params": [A, "0x" + "ab" * 32]},
    {"jsonrpc": "2.0", "id": 16, "method": "getAddressBalance", "params": [A, {"block_id": 99}]},
    {"jsonrpc": "2.0", "id": 17, "method": "getAddressBalance", "params": [A, "latest"]},
    {"jsonrpc": "2.0", "id": 18, "method": "eth_blockNumber", "params": [1]},
    {"jsonrpc": "2.0", "method": "eth_getBalance", "params": ["0x12"]},  # a notification
    {"jsonrpc": "2.0", "id": 20, "method": "no_such_method"},
    {"jsonrpc": "2.0", "id": 21, "method": "eth_getBlockByNumber", "params": ["0x2", False]},
    {"jsonrpc": "2.0", "id": 22, "method": "eth_getBalance", "params": {"address": A}},
    {"jsonrpc": "2.0", "id": [1], "method": "eth_getBalance", "params": []},
    {"jsonrpc": "2.0", "id": 23, "method": ["eth_getBalance"], "params": []},
    {"jsonrpc": "2.0", "id": 24, "method": {"eth_getBalance": 1}},
    "not an object",
]  # fmt: skip


async def test_every_answer_equals_the_generic_dispatchers(tmp_path: Path) -> None:
    """Singles and one mixed batch: the read path answers byte for byte what the generic
    dispatcher answers (codes, messages, ids, order, notifications), before and after the
    node holds blocks."""
    node = await make_node(tmp_path, kind="state", window=16, hot_blocks=4)
    try:
        bodies = [orjson.dumps(item) for item in BAD_ITEMS] + [orjson.dumps(BAD_ITEMS)]
        bodies += [b"[", b"[]", b"{}", orjson.dumps([{"jsonrpc": "2.0", "method": "x"}])]
        for stage in ("empty", "with blocks"):
            for body in bodies:
                generic = await node.dispatcher.handle_body(body)
                assert await node.handle_body(body) == generic, (stage, body)
                now = node.answer_now(body)  # None: not all plain reads, handle_body answers
                assert now is None or now == generic, (stage, body)
            if stage == "empty":
                await apply(node, random_chain(seed=23, blocks=40)[0], 0)
    finally:
        await node.close()


# Plain reads whose envelope is malformed: (the item, the id answered, what is wrong)
MALFORMED: list[tuple[Any, Any, str]] = [
    ({"jsonrpc": "1.0", "id": 1, "method": "eth_getBalance", "params": [A, "latest"]}, 1,
     '"jsonrpc" must be "2.0"'),
    ({"id": 2, "method": "eth_getTransactionCount", "params": [A, "latest"]}, 2,
     '"jsonrpc" must be "2.0"'),
    ({"jsonrpc": 2.0, "id": 3, "method": "eth_blockNumber"}, 3, '"jsonrpc" must be "2.0"'),
    ({"jsonrpc": "2.0", "id": True, "method": "eth_getCode", "params": [A, "latest"]}, None,
     '"id" must be a string, number or null'),
    ({"jsonrpc": "2.0", "id": [5], "method": "eth_getStorageAt", "params": [A, "0x0"]}, None,
     '"id" must be a string, number or null'),
    ({"jsonrpc": "2.0", "id": {"a": 6}, "method": "getAddressBalance", "params": [A]}, None,
     '"id" must be a string, number or null'),
    ({"jsonrpc": "2.0", "id": 7, "method": "getAddressNonce", "params": "0x11"}, 7,
     '"params" must be an array or object'),
    ({"jsonrpc": "2.0", "id": 8, "method": "getAddressCode", "params": 8}, 8,
     '"params" must be an array or object'),
    ({"jsonrpc": "2.0", "id": 9, "method": "getStorageAt", "params": None}, 9,
     '"params" must be an array or object'),
    ({"jsonrpc": "2.0", "method": "eth_blockNumber", "params": "x"}, None,  # no notification
     '"params" must be an array or object'),
    ({"jsonrpc": "2.0", "id": 11, "method": ["eth_getBalance"], "params": [A, "latest"]}, 11,
     '"method" must be a non-empty string'),
    ({"jsonrpc": "2.0", "id": 12, "method": {"eth_blockNumber": 1}}, 12,
     '"method" must be a non-empty string'),
    ({"jsonrpc": "2.0", "id": 13, "params": [A, "latest"]}, 13,
     '"method" must be a non-empty string'),
    ({"jsonrpc": "2.0", "id": 14, "method": "", "params": []}, 14,
     '"method" must be a non-empty string'),
    ("eth_getBalance", None, "expected a JSON object"),
    (15, None, "expected a JSON object"),
    (None, None, "expected a JSON object"),
]  # fmt: skip


async def test_addresses_and_slots_of_the_exact_length_are_checked(tmp_path: Path) -> None:
    """The read path decodes a 42-character address and a 66-character slot itself (the
    parse caches miss on most reads of a large store): one that is not hex, has whitespace
    or starts "0X" gets the parsers' -32602; upper case reads what lower case does."""
    node = await make_node(tmp_path, kind="archive", hot_blocks=0)
    try:
        chain, addrs = random_chain(seed=29, blocks=5)
        await apply(node, chain, 0)
        state = chain.state(4)
        rich = next(a for a in addrs if a in state and state[a].balance)
        holder = next(a for a in addrs if a in state and state[a].storage)
        slot = min(state[holder].storage)

        async def answer(method: str, *params: str) -> Any:
            item = {"jsonrpc": "2.0", "id": 1, "method": method, "params": [*params, "0x4"]}
            out = orjson.loads(await node.handle_body(orjson.dumps(item)))
            return out.get("result", out.get("error"))

        bad_address = {"code": -32602, "message": "invalid address: expected a 20-byte 0x address"}
        for text in (
            "0x" + rich[2:40] + "  ",
            "0x" + rich[2:40] + " a",
            "0x" + rich[2:40] + "zz",
            "0X" + rich[2:],
        ):
            assert await answer("eth_getBalance", text) == bad_address, text
        for text in (rich, "0x" + rich[2:].upper()):
            assert await answer("eth_getBalance", text) == hex(state[rich].balance), text
        bad_slot = {
            "code": -32602,
            "message": "invalid storage position: expected a 0x-prefixed hex quantity",
        }
        word = f"{slot:064x}"
        for text in (
            "0x" + word[:62] + "\t\n",
            "0x" + word[:62] + "zz",
            "0x" + word[:63] + "\u0661",
        ):
            assert await answer("eth_getStorageAt", holder, text) == bad_slot, text
        value = "0x" + f"{state[holder].storage[slot]:064x}"
        assert value != "0x" + "0" * 64
        for text in ("0x" + word, "0x" + word.upper(), hex(slot)):
            assert await answer("eth_getStorageAt", holder, text) == value, text
    finally:
        await node.close()


async def test_malformed_envelopes_of_plain_reads_are_invalid_requests(tmp_path: Path) -> None:
    """A plain read whose envelope is malformed is answered -32600 saying what is wrong,
    with its id when it has a usable one (null otherwise, and a malformed notification is
    answered too): alone, and in a batch between good reads, in order. No synchronous path
    answers it (the node's own port then sends the body on to `handle_body`)."""
    node = await make_node(tmp_path, kind="state", window=16, hot_blocks=4)
    try:
        chain, addrs = random_chain(seed=28, blocks=20)
        await apply(node, chain, 0)
        good = {"jsonrpc": "2.0", "id": "g", "method": "eth_getBalance", "params": [addrs[0]]}
        balance = hex(chain.state(chain.head)[addrs[0]].balance)
        for item, rid, what in MALFORMED:
            want = {"jsonrpc": "2.0", "id": rid,
                    "error": {"code": -32600, "message": f"Invalid Request: {what}"}}  # fmt: skip
            body = orjson.dumps(item)
            assert orjson.loads(await node.handle_body(body)) == want, item
            assert node.answer_now(body) is None, item
            assert node.answer_items([item], []) is None, item
            batch = orjson.dumps([good, item, good])
            ok = {"jsonrpc": "2.0", "id": "g", "result": balance}
            assert orjson.loads(await node.handle_body(batch)) == [ok, want, ok], item
            assert node.answer_now(batch) is None, item
        nested = orjson.dumps([[good]])  # (a batch in a batch)
        for body in (nested, b"[1]", b"1", b"null", b'"x"', b"true"):
            answer = orjson.loads(await node.handle_body(body))
            one = answer[0] if isinstance(answer, list) else answer
            assert one["error"] == {
                "code": -32600,
                "message": "Invalid Request: expected a JSON object",
            }
    finally:
        await node.close()


async def test_plain_reads_are_answered_without_awaiting(tmp_path: Path) -> None:
    node = await make_node(tmp_path, kind="archive")
    try:
        chain, addrs = random_chain(seed=24, blocks=10)
        await apply(node, chain, 0)
        reads = orjson.dumps(read_batch(addrs, 5))
        assert node.answer_now(reads) == await node.dispatcher.handle_body(reads)
        mixed = [*orjson.loads(reads), {"jsonrpc": "2.0", "id": 99, "method": "eth_chainId"}]
        assert node.answer_now(orjson.dumps(mixed)) is None
    finally:
        await node.close()


async def test_answer_items_tells_where_its_error_answers_are(tmp_path: Path) -> None:
    """The proxy in the same process passes a list to `answer_items` and looks only at the
    answers it names: exactly the positions of the error answers (a notification's error
    has no answer and no position), in order."""
    node = await make_node(tmp_path, kind="archive")
    try:
        chain, addrs = random_chain(seed=25, blocks=10)
        await apply(node, chain, 0)
        good = read_batch(addrs, 3)
        bad = {"jsonrpc": "2.0", "id": 7, "method": "eth_getBalance", "params": ["0x12", "0x1"]}
        late = {"jsonrpc": "2.0", "id": 8, "method": "eth_getBalance", "params": [addrs[0], "0x99"]}
        quiet = {"jsonrpc": "2.0", "method": "eth_getBalance", "params": ["0x12", "0x1"]}
        items = [good[0], bad, good[1], quiet, late, good[2]]
        errors: list[int] = []
        answers = node.answer_items(items, errors)
        assert answers is not None and errors == [1, 4]
        assert [i for i, a in enumerate(answers) if a is not None and "error" in a] == errors
        assert answers[3] is None and answers[4]["error"]["code"] == -39006
        errors = []
        assert node.answer_items(good, errors) is not None and errors == []
    finally:
        await node.close()


def checked_groups(items: list[Any]) -> dict[str, list[Any]]:
    """The items `answer_checked` may be given (request objects with a string method and an
    int or string id), per method."""
    out: dict[str, list[Any]] = {}
    for one in items:
        checkable = isinstance(one, dict) and type(one.get("method")) is str
        if checkable and type(one.get("id")) in (int, str):
            out.setdefault(one["method"], []).append(one)
    return out


async def test_answer_checked_answers_as_answer_items(tmp_path: Path) -> None:
    """The proxy's path for items it checked (one method, int or string ids) answers exactly
    what `answer_items` answers for them: the same answers and error positions, and None
    where an item needs `handle_body` (an envelope `answer_items` declines: `"jsonrpc"` not
    "2.0", params neither a list nor an object; a method that is no plain read); each item
    alone and every method's items as one batch, before and after the node holds blocks."""
    node = await make_node(tmp_path, kind="state", window=16, hot_blocks=4)
    try:
        chain, addrs = random_chain(seed=26, blocks=40)
        extra: list[Any] = [
            {"jsonrpc": "2.0", "id": "s", "method": "eth_getBalance", "params": [A, "0x3"]},
            {"jsonrpc": "2.0", "id": 30, "method": "eth_getBalance", "params": [A, "0x3"], "x": 1},
            {"jsonrpc": "1.0", "id": 31, "method": "eth_getCode", "params": [A, "0x3"]},
            {"jsonrpc": "2.0", "id": 32, "method": "eth_getCode"},  # no params: []
            {"jsonrpc": "2.0", "id": 33, "method": "eth_getCode", "params": 7},
            {"jsonrpc": "2.0", "id": 34, "method": "eth_call", "params": [{"to": A}, "0x3"]},
        ]
        for stage in ("empty", "with blocks"):
            items = [*BAD_ITEMS, *extra, *read_batch(addrs[:3], 20), *read_batch(addrs[:2], 3)]
            for method, group in checked_groups(items).items():
                for batch in [[one] for one in group] + [group]:
                    want: list[int] = []
                    answers = node.answer_items(batch, want)
                    got: list[int] = []
                    assert node.answer_checked(method, batch, got) == answers, (stage, batch)
                    if answers is not None:  # (None: the positions are of no use)
                        assert got == want, (stage, batch)
            if stage == "empty":
                await apply(node, chain, 0)
        assert node.answer_checked("eth_getBalance", read_batch(addrs[:1], 3)[:1], []) is not None
    finally:
        await node.close()


def keyed_ok(one: Any, method: str, size: int, keys: dict[str, Any]) -> bool:
    """Whether `answer_keyed(method, size, keys, …)` takes the item: a request object of the
    method with an int or string id, `"jsonrpc": "2.0"` and a list of `size` params whose
    last is a key of `keys` (spelled out here, not as the node checks it)."""
    if not isinstance(one, dict) or one.get("method") != method or one.get("jsonrpc") != "2.0":
        return False
    if type(one.get("id")) not in (int, str):
        return False
    params = one.get("params")
    if type(params) is not list or len(params) != size or not params:
        return False
    return isinstance(params[-1], str) and params[-1] in keys


async def test_answer_keyed_checks_each_item_and_answers_as_answer_checked(
    tmp_path: Path,
) -> None:
    """The proxy's path for items the node checks itself: for a batch whose every item is a
    request object of the method, with an int or string id, `"jsonrpc": "2.0"` and as many
    params as given, the last a key of `keys`, it answers what `answer_checked` answers (the
    same answers and error positions) and gives `keys[last]` of each item in order; any
    other item in the batch (another method or params' length, a block text not a key, a
    bool, float or missing id, an envelope `answer_checked` declines, not an object) makes
    it None. Each item alone and amid good ones, before and after the node holds blocks."""
    node = await make_node(tmp_path, kind="state", window=16, hot_blocks=4)
    try:
        chain, addrs = random_chain(seed=27, blocks=40)
        extra: list[Any] = [
            {"jsonrpc": "2.0", "id": "s", "method": "eth_getBalance", "params": [A, "0x3"]},
            {"jsonrpc": "2.0", "id": 1.5, "method": "eth_getBalance", "params": [A, "0x3"]},
            {"jsonrpc": "2.0", "method": "eth_getBalance", "params": [A, "0x3"]},
            {"jsonrpc": "2.0", "id": None, "method": "eth_getBalance", "params": [A, "0x3"]},
            {"id": 2, "method": "eth_getBalance", "params": [A, "0x3"]},
            {"jsonrpc": "2.0", "id": 3, "method": "eth_getBalance", "params": [A, "0x4"]},
            {"jsonrpc": "2.0", "id": 4, "method": "eth_getBalance", "params": [A, ["0x3"]]},
            {"jsonrpc": "2.0", "id": 5, "method": "eth_getBalance", "params": {"a": A, "b": "0x3"}},
            {"jsonrpc": "2.0", "id": 6, "method": "eth_getBalance", "params": "0x3"},
            {"jsonrpc": "2.0", "id": 7, "method": "eth_getStorageAt", "params": [A, "0x0", "0x3"]},
            {"jsonrpc": "2.0", "id": 8, "method": "eth_getStorageAt", "params": [A, "0x3"]},
            {"jsonrpc": "2.0", "id": 9, "method": "eth_getBalance", "params": [A, "0x0", "0x3"]},
            ["eth_getBalance", A, "0x3"],
        ]
        keys = {text: ("route", text) for text in ("0x3", "0x14", "0x99", "latest", "bad")}
        for stage in ("empty", "with blocks"):
            good = [one for one in read_batch(addrs[:3], 20) if one["method"] == "eth_getBalance"]
            good += read_batch(addrs[:1], 3)[:1]
            items = [*BAD_ITEMS, *extra, *read_batch(addrs[:2], 20)]
            for one in items:
                for method, size in (("eth_getBalance", 2), ("eth_getStorageAt", 3)):
                    batches = [[one], [*good, one, *good[:1]]] if size == 2 else [[one]]
                    for batch in batches:
                        found: list[Any] = []
                        errors: list[int] = []
                        got = node.answer_keyed(method, size, keys, batch, errors, found)
                        if not all(keyed_ok(x, method, size, keys) for x in batch):
                            assert got is None, (stage, batch)
                            continue
                        want: list[int] = []
                        assert got == node.answer_checked(method, batch, want), (stage, batch)
                        assert errors == want and got is not None, (stage, batch)
                        assert found == [keys[x["params"][-1]] for x in batch], (stage, batch)
            if stage == "empty":
                await apply(node, chain, 0)
        found = []
        assert node.answer_keyed("eth_getBalance", 2, keys, good, [], found) is not None
        assert len(found) == len(good) > 3
    finally:
        await node.close()


async def test_batch_longer_than_max_batch_is_refused(tmp_path: Path) -> None:
    node = await make_node(tmp_path, max_batch=3)
    try:
        item = {"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber"}
        answer = orjson.loads(await node.handle_body(orjson.dumps([item] * 4)))
        assert answer["error"]["code"] == -32600
        assert "at most 3" in answer["error"]["message"]
    finally:
        await node.close()


def test_hot_view_keeps_its_bounds() -> None:
    """At most `blocks` blocks and `base_entries` cached values; never the earliest block."""
    hot = HotState(blocks=3, base_entries=2)
    key = [bytes([i]) * 21 for i in range(4)]
    for height in range(10):
        hot.applied(height, [(key[height % 4], bytes([height]))], earliest=0)
    assert (hot.lo, hot.hi) == (7, 9)
    assert len(hot.base) <= 2
    assert hot.value(key[1], 9) == bytes([9])  # written at 9
    assert hot.value(key[3], 7) == bytes([7])
    assert hot.value(key[3], 8) == bytes([7])  # not written at 8: the version of 7
    hot.applied(10, [], earliest=9)  # a state node pruned up to 9: only 10 stays covered
    assert (hot.lo, hot.hi) == (10, 10)
    off = HotState(blocks=0, base_entries=10)
    off.applied(0, [(key[0], b"\x01")], earliest=0)
    assert off.empty and not off.versions


def test_a_full_base_cache_keeps_its_values_then_restarts() -> None:
    """Misses past a full base cache do not evict what it holds (reads spread over far more
    keys than it holds would only churn it); after `RESTART` times its size in such misses
    it starts again empty and learns the keys read since."""
    hot = HotState(blocks=3, base_entries=2)
    hot.applied(1, [], earliest=0)
    key = [bytes([i]) * 21 for i in range(12)]
    hot.remember_base(key[0], b"\x00")
    hot.remember_base(key[1], b"\x01")
    for i in range(2, 2 + RESTART * 2 - 1):
        hot.remember_base(key[i % 10 + 2], b"\xff")
    assert hot.value(key[0], 1) == b"\x00" and hot.value(key[1], 1) == b"\x01"
    assert hot.value(key[2], 1) is MISSING
    hot.remember_base(key[11], b"\x0b")  # the RESTART * 2-th miss: the cache restarts
    assert hot.value(key[0], 1) is MISSING
    hot.remember_base(key[11], b"\x0b")
    assert hot.value(key[11], 1) == b"\x0b"


def test_a_cache_gate_turns_a_cache_off_only_when_a_full_cache_would_not_pay() -> None:
    """The first window's miss share is what reaches the cache; what later windows miss
    less, extrapolated to a full cache, is its hit rate when full: a cache still learning
    a working set that fits stays on; one that answers next to nothing is emptied and off
    for `OFF_TIMES` its capacity in items, then on again and learning afresh."""
    cache = {i: i for i in range(10)}
    gate = CacheGate(cache, capacity=100, floor=0.25)
    gate.misses = 80  # the first window: 80 % of the items reach the cache (and miss)
    assert gate.judge(clock=100, items=100)
    gate.misses += 72  # 8 of those 80 hit with 10 keys held: a full cache would hit all
    assert gate.judge(clock=200, items=100)
    assert len(cache) == 10
    cache.update((i, i) for i in range(50))
    gate.misses += 79  # 1 in 80 hit with 50 keys held: 5 % when full
    assert not gate.judge(clock=300, items=100)
    assert cache == {}
    off_until = 300 + reads_module.OFF_TIMES * 100
    gate.misses += 5  # (an off cache counts nothing; this must not matter)
    assert not gate.judge(clock=off_until - 1, items=100)
    assert gate.judge(clock=off_until, items=100)
    gate.misses += 99  # a first window again: only a reference, never judged
    assert gate.judge(clock=off_until + 100, items=100)


async def test_caches_turned_off_by_spread_reads_answer_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads spread over far more slots than the parse and base caches hold turn those
    caches off; the answers stay the model's while they are off, across a rollback and a
    fork's new head, and after they are on again."""
    monkeypatch.setattr(reads_module, "PARSE_CACHE", 4)
    monkeypatch.setattr(reads_module, "JUDGE_ITEMS", 16)
    monkeypatch.setattr(reads_module, "_TICK", 8)
    monkeypatch.setattr(reads_module, "OFF_TIMES", 50)  # off for 200 items
    node = await make_node(tmp_path, kind="archive", hot_blocks=8, hot_cache_entries=4)
    try:
        chain, addrs = random_chain(seed=23, blocks=30)
        await apply(node, chain, 0)
        head = chain.head
        rng = random.Random(7)
        for _ in range(4):  # windows to learn the share that reaches the caches, then judged
            reads = [  # written slots first (what the base cache then holds), then a spread
                (rng.choice(addrs), rng.randrange(1000 if i >= 30 else SLOTS), head - i % 7)
                for i in range(100)
            ]
            items = [
                {"jsonrpc": "2.0", "id": i, "method": "eth_getStorageAt",
                 "params": [addr, hex(slot), hex(height)]}
                for i, (addr, slot, height) in enumerate(reads)
            ]  # fmt: skip
            answer = orjson.loads(await node.handle_body(orjson.dumps(items)))
            want = [
                "0x" + chain.state(h).get(a, Account()).storage.get(s, 0).to_bytes(32, "big").hex()
                for a, s, h in reads
            ]
            assert [a["result"] for a in answer] == want
        assert not node.reads._slot_gate.on and not node.hot.caching  # off
        await node.ingest._rollback()
        await node.ingest._rollback()
        fork = chain.fork(chain.head - 2, "spread")
        for _ in range(4):
            fork.add_random_block(rng, addrs)
        await apply(node, fork, chain.head - 1)
        for height in (fork.head, fork.head - 3):
            batch = read_batch(addrs[:2], height)  # 20 items: still inside the off period
            answer = orjson.loads(await node.handle_body(orjson.dumps(batch)))
            assert [a["result"] for a in answer] == expected(fork, addrs[:2], height)
        assert not node.reads._slot_gate.on and not node.hot.caching  # (still off)
        assert not node.reads._slots and not node.hot.base  # (and empty)
        for _ in range(10):  # past the off period: on again
            batch = read_batch(addrs, fork.head)
            answer = orjson.loads(await node.handle_body(orjson.dumps(batch)))
            assert [a["result"] for a in answer] == expected(fork, addrs, fork.head)
            if node.reads._slot_gate.on:
                break
        assert node.reads._slot_gate.on and node.hot.caching
        await assert_answers(node, fork, addrs)
    finally:
        await node.close()


@pytest.mark.parametrize(("repeated", "kept"), [(16, True), (2, False)])
async def test_a_base_cache_that_would_answer_few_reads_is_turned_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, repeated: int, kept: bool
) -> None:
    """The hot view's base cache stays on only while, full, it would answer at least half
    the reads that reach it: 2 of a window's 16 balances read again, with 30 of its 64
    entries held, extrapolate to about a quarter (a big store read at random), and it is
    turned off; a working set read again whole keeps it on. Answers are the model's."""
    monkeypatch.setattr(reads_module, "JUDGE_ITEMS", 16)
    monkeypatch.setattr(reads_module, "_TICK", 8)
    node = await make_node(tmp_path, kind="archive", hot_blocks=8, hot_cache_entries=64)
    try:
        chain, _ = random_chain(seed=29, blocks=4)
        await apply(node, chain, 0)
        head = chain.state(chain.head)
        fresh = iter(f"0x{i:040x}" for i in range(1, 1000))  # (never written: all below)
        first = [next(fresh) for _ in range(16)]
        windows = [first, first[:repeated] + [next(fresh) for _ in range(16 - repeated)]]
        windows.append([next(fresh) for _ in range(16)])  # judged as it starts
        for addrs in windows:
            items = [
                {"jsonrpc": "2.0", "id": i, "method": "eth_getBalance",
                 "params": [addr, hex(chain.head)]}
                for i, addr in enumerate(addrs)
            ]  # fmt: skip
            answer = orjson.loads(await node.handle_body(orjson.dumps(items)))
            assert [a["result"] for a in answer] == [
                hex(head.get(addr, Account()).balance) for addr in addrs
            ]
        assert node.hot.caching is kept and bool(node.hot.base) is kept
    finally:
        await node.close()


def test_hot_view_entries_are_not_traversed_by_the_collector() -> None:
    """The view's versions (a block's writes for `blocks` blocks) are tuples the collector
    untracks, so collections during ingest do not walk them; written twice in a block, the
    last value wins, and dropping and rolling back blocks keeps the other versions."""
    hot = HotState(blocks=3, base_entries=10)
    key = [bytes([i]) * 21 for i in range(2)]
    hot.applied(1, [(key[0], b"\x01"), (key[0], b"\x11"), (key[1], b"\x21")], earliest=0)
    hot.applied(2, [(key[0], b"\x02")], earliest=0)
    hot.applied(3, [(key[0], b"\x03"), (key[1], b"\x23")], earliest=0)
    hot.applied(4, [(key[0], b"\x04")], earliest=0)  # block 1 leaves: its values are the base
    gc.collect()
    assert not any(gc.is_tracked(versions) for versions in hot.versions.values())
    assert [hot.value(key[0], h) for h in (2, 3, 4)] == [b"\x02", b"\x03", b"\x04"]
    assert hot.value(key[1], 2) == b"\x21" and hot.value(key[1], 4) == b"\x23"
    hot.rolled_back(4)
    hot.rolled_back(3)
    assert (hot.lo, hot.hi) == (2, 2)
    assert hot.value(key[0], 2) == b"\x02" and hot.value(key[1], 2) == b"\x21"
    assert key[1] not in hot.versions  # its only covered version was rolled back


@pytest.mark.parametrize("kind", ["archive", "state"])
async def test_a_restarted_node_fills_its_hot_view_from_the_store(
    tmp_path: Path, kind: str
) -> None:
    chain, addrs = random_chain(seed=25, blocks=40)
    node = await make_node(tmp_path, kind=kind, window=16, hot_blocks=8)
    try:
        await apply(node, chain, 0)
    finally:
        await node.close()
    node = await make_node(tmp_path, kind=kind, window=16, hot_blocks=8)
    try:
        assert (node.hot.lo, node.hot.hi) == (chain.head - 7, chain.head)
        await assert_answers(node, chain, addrs)
    finally:
        await node.close()


async def test_the_port_answers_eth_calls_from_their_futures(tmp_path: Path) -> None:
    """The node's own port (`answer_port`): plain reads at once, bodies holding eth_calls as
    the future of the answer (no task), with the bytes `handle_body` answers; what it cannot
    answer that way (a float id, a malformed item, another method) goes to `handle_body`."""
    chain, addrs = random_chain(seed=7, blocks=12)
    node = await make_node(tmp_path, kind="archive")
    try:
        for raw in chain.blocks:
            await node.ingest._apply(parse_vendor_block(raw))

        def call(rid: Any, to: str, block: str) -> dict[str, Any]:
            params = [{"to": to, "data": "0x"}, block]
            return {"jsonrpc": "2.0", "id": rid, "method": "eth_call", "params": params}

        balance = {"jsonrpc": "2.0", "id": "b", "method": "eth_getBalance",
                   "params": [addrs[0], "0x3"]}  # fmt: skip
        await node.handle_body(orjson.dumps(call(0, addrs[0], "latest")))  # starts the workers
        poor = call(10, addrs[0], "latest")
        poor["params"][0] |= {"gas": "0x1"}  # (below the intrinsic gas)
        bodies = [
            call(1, addrs[1], "latest"),
            [call(2, addrs[2], "0x4"), balance, call(3, addrs[3], "0x5")],
            [call(4, addrs[0], "0x2"), {"jsonrpc": "2.0", "method": "eth_call",
                                         "params": call(0, addrs[1], "0x2")["params"]}],
            poor,  # run, and failed in the EVM: its error answer
        ]  # fmt: skip
        seen = node.metrics.request_seconds.counts
        for body in bodies:
            raw = orjson.dumps(body)
            before = sum(seen)
            answer = node.answer_port(raw)
            assert isinstance(answer, asyncio.Future), body
            got = await answer
            assert sum(seen) == before + 1, body  # the port's answer timed once
            assert got == await node.handle_body(raw), body
        assert "error" in orjson.loads(got)  # (the last body's: `poor`)
        assert node.answer_port(orjson.dumps(balance)) == node.answer_now(orjson.dumps(balance))
        chain_id = {"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []}
        for declined in (call(1.5, addrs[0], "latest"), [call(1, addrs[0], "latest"), 5], chain_id):
            assert node.answer_port(orjson.dumps(declined)) is None, declined
        bad = node.answer_port(orjson.dumps(call(7, "0x12", "latest")))  # refused, not queued
        assert isinstance(bad, bytes) and orjson.loads(bad)["error"]["code"] == -32602
        # a single eth_call notification: run, nothing answered; one without the version
        # and one with an id of another type go to `handle_body`
        note = {k: v for k, v in call(8, addrs[1], "0x2").items() if k != "id"}
        got = node.answer_port(orjson.dumps(note))
        assert isinstance(got, asyncio.Future) and await got == b""
        unversioned = {k: v for k, v in call(9, addrs[1], "0x2").items() if k != "jsonrpc"}
        for declined in (unversioned, call(True, addrs[0], "0x2"), call([1], addrs[0], "0x2")):
            assert node.answer_port(orjson.dumps(declined)) is None, declined
    finally:
        await node.close()

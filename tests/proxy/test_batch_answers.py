"""A node's answer to a batch, checked without decoding it when it is the common one
(`classify.results_in_order`: a string result per id, in order) and decoded and matched item
by item otherwise: either way the client gets what the decoded checks give. A real proxy
app in front of a fake state node answering each batch with the bytes a test makes."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import orjson
import pytest

from proxy import classify, rounds
from proxy.classify import loads, result_text, results_in_order
from tests.proxy.conftest import req
from tests.proxy.mutate import mutated
from tests.proxy.test_dataport import raw_rpc
from tests.proxy.test_head_pins import item_by_item

N = 10


def reads(ids: list[int] | None = None) -> list[dict[str, Any]]:
    """Balance reads at heights in the fake node's window, with ids 0..N-1 (or `ids`)."""
    ids = list(range(N)) if ids is None else ids
    return [
        req("eth_getBalance", [f"0x{i + 1:040x}", hex(900 + i)], rid) for i, rid in enumerate(ids)
    ]


def results(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"jsonrpc": "2.0", "id": it["id"], "result": hex(7000 + it["id"])} for it in items]


async def test_a_string_result_per_id_in_order_is_the_answer_as_the_node_wrote_it(
    node_api, monkeypatch
) -> None:
    api, node = node_api
    written: list[bytes] = []
    decoded = [0]

    def counted(raw: bytes) -> Any:
        decoded[0] += 1
        return loads(raw)

    monkeypatch.setattr(rounds, "loads", counted)

    def answer(items: list[dict[str, Any]]) -> bytes:
        written.append(orjson.dumps(results(items)) + b"\n")
        return written[-1]

    node.batch_answer = answer
    for ids in (list(range(N)), list(range(1, N + 1))):  # taken by the expression
        status, raw = await raw_rpc(api, orjson.dumps(reads(ids)))
        assert status == 200 and raw == written[-1], raw
    assert decoded[0] == 0
    made = len(classify._SHAPES)
    # ids counted on across requests (as some clients do), or in another order: decoded,
    # and no expression is made for them
    for ids in (list(range(5, 5 + N)), list(range(15, 15 + N)), [0, 2, 4, 6, 8, 1, 3, 5, 7, 9]):
        status, raw = await raw_rpc(api, orjson.dumps(reads(ids)))
        assert status == 200 and raw == written[-1], raw
    assert decoded[0] == 3 and len(classify._SHAPES) == made
    # escaped or non-ASCII texts and other results are decoded: still the node's bytes
    for text in ("0x\\u0031", "caf\u00e9", {"balance": "0x1"}, None, 7):

        def other(items: list[dict[str, Any]], text: Any = text) -> bytes:
            got = results(items)
            got[3]["result"] = text
            written.append(orjson.dumps(got).replace(b"\\\\u", b"\\u"))
            return written[-1]

        node.batch_answer = other
        status, raw = await raw_rpc(api, orjson.dumps(reads()))
        assert status == 200 and raw == written[-1], (text, raw)


@pytest.mark.parametrize(
    "name",
    ["missing", "error", "reversed", "extra member", "float id", "truncated", "control char"],
)
async def test_any_other_answer_is_matched_item_by_item(node_api, name: str) -> None:
    """Each kind of answer the expression does not take gets the decoded steps' answers:
    ids in the client's order, a result or an error for every item, never bytes a client
    cannot decode."""
    api, node = node_api

    def answer(items: list[dict[str, Any]]) -> bytes:
        got: list[Any] = results(items)
        if name == "missing":
            del got[4]
        elif name == "error":
            got[4] = {"jsonrpc": "2.0", "id": 4, "error": {"code": -32000, "message": "no"}}
        elif name == "reversed":
            got.reverse()
        elif name == "extra member":
            got[4]["node"] = "one"
        elif name == "float id":
            return orjson.dumps(got).replace(b'"id":4,', b'"id":4.0,')
        elif name == "truncated":
            return orjson.dumps(got)[:-30]
        elif name == "control char":
            return orjson.dumps(got).replace(b'"0x1b5c"', b'"0x1b\x015c"')
        return orjson.dumps(got)

    node.batch_answer = answer
    sent = reads()
    status, raw = await raw_rpc(api, orjson.dumps(sent))
    answers = orjson.loads(raw)
    assert status == 200 and [a["id"] for a in answers] == list(range(N)), raw
    if name in ("truncated", "control char"):  # not JSON: the node is penalised
        assert all("error" in a for a in answers), raw
        return
    fine = [a for a in answers if a["id"] != 4]
    assert [a["result"] for a in fine] == [hex(7000 + a["id"]) for a in fine], raw
    if name == "missing":
        assert "error" in answers[4]  # given up: the one node had no answer for it
    elif name == "error":
        assert answers[4]["error"]["code"] == -32000
    else:
        assert answers[4]["result"] == hex(7004), raw


def test_the_expression_takes_only_consecutive_int_ids_and_plain_texts() -> None:
    raw = orjson.dumps(results(reads()))
    found = results_in_order(list(range(N)), raw)
    assert found is not None
    assert [result_text(found, k) for k in range(N)] == [hex(7000 + k).encode() for k in range(N)]
    one = orjson.dumps(results(reads()[:1]))
    found = results_in_order([0], one)
    assert found is not None and result_text(found, 0) == b"0x1b58"
    assert results_in_order(list(range(N)), raw + b" \r\n") is not None
    assert results_in_order(list(range(1, N + 1)), raw) is None  # other ids
    shifted = orjson.dumps(results(reads(list(range(5, 5 + N)))))
    assert results_in_order(list(range(5, 5 + N)), shifted) is None  # not 0.. or 1..: decoded
    assert results_in_order([True, *range(1, N)], raw) is None
    assert results_in_order([str(i) for i in range(N)], raw) is None
    assert results_in_order([], b"[]") is None
    last = raw.rindex(b'"jsonrpc"')  # the seams an item repeats, wrong in the last one only
    later = (raw[:last] + raw[last:].replace(seam, to) for seam, to in _LATE_FAULTS)
    for bad in (raw + b"x", raw[:-1], raw.replace(b'"2.0"', b'"1.0"', 1), b" " + raw, *later):
        assert results_in_order(list(range(N)), bad) is None, bad


_LATE_FAULTS = (
    (b'"2.0"', b'"1.0"'),
    (b'"result"', b'"error"'),
    (b'"result":"', b'"result": "'),
    (b'"id"', b'"ID"'),
)


async def test_an_item_pinned_by_hash_hands_its_result_to_an_identical_read_waiting(
    node_api,
) -> None:
    """An item at the head (its hash known: pinned and led by the read path) in a batch
    whose answer the expression took: a single identical read sent meanwhile gets the same
    result without asking the node."""
    api, node = node_api
    node.batch_answer = lambda items: orjson.dumps(results(items))
    node.delay = 0.3
    batch = reads()
    batch[6]["params"][1] = hex(node.head)
    task = asyncio.ensure_future(raw_rpc(api, orjson.dumps(batch)))
    await asyncio.sleep(0.1)
    single = req("eth_getBalance", batch[6]["params"], "single")
    status, raw = await raw_rpc(api, orjson.dumps(single))
    _, whole = await task
    assert orjson.loads(whole)[6]["result"] == hex(7006), whole
    assert status == 200 and orjson.loads(raw) == {
        "jsonrpc": "2.0",
        "id": "single",
        "result": hex(7006),
    }, raw
    assert len(node.bodies) == 1  # the single read was not sent


def test_an_answer_the_expression_takes_decodes_to_a_plain_result_per_id_over_mutations() -> None:
    """Over answers mutated at random (mutate.py): whenever `results_in_order` takes one,
    it decodes to one `{"jsonrpc": "2.0", "id": ID, "result": TEXT}` per id in order, TEXT
    a string without escapes whose bytes `result_text` gives; anything else is decoded."""
    rng = random.Random(36)
    taken = 0
    for _ in range(3000):
        first, n = rng.randint(0, 1), rng.randint(1, 12)
        rids = list(range(first, first + n))
        raw = orjson.dumps(
            [{"jsonrpc": "2.0", "id": rid, "result": hex(rng.getrandbits(64))} for rid in rids]
        )
        assert results_in_order(rids, raw) is not None
        bad = mutated(raw, rng)
        found = results_in_order(rids, bad)
        if found is None:
            continue
        taken += 1
        parsed = orjson.loads(bad)  # (an answer the expression takes is JSON)
        assert type(parsed) is list and len(parsed) == n, bad
        for k, (rid, answer) in enumerate(zip(rids, parsed, strict=True)):
            assert list(answer) == ["jsonrpc", "id", "result"], bad
            assert answer["jsonrpc"] == "2.0" and answer["id"] == rid, bad
            assert type(answer["id"]) is int and type(answer["result"]) is str, bad
            assert result_text(found, k) == answer["result"].encode(), bad
    assert taken > 100  # (mutations of a result's digits, trailing whitespace, ...)


async def test_a_batch_whose_items_wait_for_identical_reads_sends_the_rest_as_one_body(
    node_api, monkeypatch
) -> None:
    """Items of a scanned batch planned item by item (`pin_rows` declined: a node off the
    chain, say) identical to single reads in flight (at the head, whose hash the proxy
    knows) wait for those reads' answers; the other items go as one body,
    and the client gets every id in order with the waiting items' answers in their places,
    the bytes the item-by-item steps would write, without decoding the node's answer."""
    api, node = node_api
    decoded = [0]

    def counted(raw: bytes) -> Any:
        decoded[0] += 1
        return loads(raw)

    monkeypatch.setattr(rounds, "loads", counted)
    monkeypatch.setattr(classify, "loads", counted)
    item_by_item(monkeypatch)
    node.batch_answer = lambda items: orjson.dumps(results(items))
    node.delay = 0.3
    batch = reads()
    head = hex(node.head)
    for k in (0, 4, 5, N - 1):  # (the first, two together, the last)
        batch[k]["params"][1] = head
    singles = [
        asyncio.ensure_future(raw_rpc(api, orjson.dumps(req("eth_getBalance", it["params"], "s"))))
        for it in (batch[0], batch[4], batch[5], batch[N - 1])
    ]
    await asyncio.sleep(0.1)
    status, raw = await raw_rpc(api, orjson.dumps(batch))
    leaders = [orjson.loads((await s)[1])["result"] for s in singles]
    answers = orjson.loads(raw)
    assert status == 200 and [a["id"] for a in answers] == list(range(N)), raw
    assert [answers[k]["result"] for k in (0, 4, 5, N - 1)] == leaders, raw
    assert all(answers[k]["result"] == hex(7000 + k) for k in (1, 2, 3, 6, 7, 8)), raw
    assert raw == orjson.dumps(answers)  # (as the answers dumped one by one are written)
    sent = orjson.loads(node.bodies[-1])
    assert [it["id"] for it in sent] == [1, 2, 3, 6, 7, 8]  # the waiting items left out
    assert len(node.bodies) == 5  # four singles, one batch
    assert decoded[0] == 0


@pytest.mark.parametrize("name", ["error", "missing", "whitespace", "reversed"])
async def test_a_batch_with_waiting_items_takes_any_other_answer_item_by_item(
    node_api, monkeypatch, name: str
) -> None:
    """The rest of such a batch answered otherwise than one result per id in order: the
    decoded steps' answers, the waiting items' answers among them."""
    api, node = node_api
    item_by_item(monkeypatch)

    def answer(items: list[dict[str, Any]]) -> bytes:
        got: list[Any] = results(items)
        if name == "error":
            got[1] = {"jsonrpc": "2.0", "id": got[1]["id"], "error": {"code": -32000, "m": 1}}
        elif name == "missing":
            del got[1]
        elif name == "reversed":
            got.reverse()
        return orjson.dumps(got) + (b"\n" if name == "whitespace" else b"")

    node.batch_answer = answer
    node.delay = 0.3
    batch = reads()
    batch[3]["params"][1] = hex(node.head)
    single = asyncio.ensure_future(
        raw_rpc(api, orjson.dumps(req("eth_getBalance", batch[3]["params"], "s")))
    )
    await asyncio.sleep(0.1)
    status, raw = await raw_rpc(api, orjson.dumps(batch))
    leader = orjson.loads((await single)[1])["result"]
    answers = orjson.loads(raw)
    assert status == 200 and [a["id"] for a in answers] == list(range(N)), raw
    assert answers[3]["result"] == leader, raw
    assert raw == orjson.dumps(answers)
    if name == "error":
        assert answers[1]["error"]["code"] == -32000, raw
    elif name == "missing":
        assert "error" in answers[1], raw  # given up: the one node had no answer for it
    else:
        assert answers[1]["result"] == hex(7001), raw
    rest = [a for a in answers if a["id"] not in (1, 3)]
    assert [a["result"] for a in rest] == [hex(7000 + a["id"]) for a in rest], raw


def test_an_answer_around_waiting_items_is_joined_only_when_the_expression_takes_it() -> None:
    """Over answers to a batch less some items, mutated at random: whenever `Followed`
    takes one, the joined bytes are the node's answers decoded, the waiting items' answers
    put in their places, dumped; anything else is left to the decoded steps."""
    rng = random.Random(37)
    taken = 0
    for _ in range(2000):
        first, n = rng.randint(0, 1), rng.randint(2, 12)
        rids = list(range(first, first + n))
        gaps = sorted(rng.sample(range(n), rng.randint(1, n - 1)))
        sent = [rid for k, rid in enumerate(rids) if k not in gaps]
        raw = orjson.dumps([{"jsonrpc": "2.0", "id": r, "result": hex(r * 77)} for r in sent])
        if rng.random() < 0.8:
            raw = mutated(raw, rng)
        followed = rounds.Followed(rids, None, gaps)  # type: ignore[arg-type]
        found = followed.check(raw)
        if found is None:
            continue
        taken += 1
        waiting = {k: {"jsonrpc": "2.0", "id": rids[k], "result": {"k": k}} for k in gaps}
        answers: list[Any] = [waiting.get(k) for k in range(n)]
        node = iter(orjson.loads(raw))
        whole = [answers[k] if k in waiting else next(node) for k in range(n)]
        assert next(node, None) is None and [a["id"] for a in whole] == rids, raw
        assert followed.joined(answers) == orjson.dumps(whole), raw
        for k in range(n):
            if k not in waiting:
                assert result_text(found, k) == whole[k]["result"].encode(), raw
    assert taken > 300

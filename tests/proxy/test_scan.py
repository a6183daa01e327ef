"""A batch read from its bytes (`proxy/scan.py`): the common compact batch of address reads
becomes the rows the parser's checks make, without parsing it into objects; any other body
is declined and parsed. Either way the client's answers and the bytes a node receives are
those of the parsed path."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from proxy.methods import MethodTable
from proxy.metrics import ProxyMetrics
from proxy.parse import Parser
from proxy.request import Rows
from proxy.scan import Scanner
from tests.proxy.conftest import req
from tests.proxy.mutate import mutated
from tests.proxy.test_batch_rows import answered_both_ways, plain, solo  # noqa: F401

ADDR = "0x" + "ab" * 20


def batch(n: int, first: int = 0, method: str = "eth_getBalance") -> list[dict[str, Any]]:
    return [req(method, [f"0x{i + 1:040x}", hex(900 + i % 7)], first + i) for i in range(n)]


def scanner(*bodies: list[dict[str, Any]]) -> tuple[Scanner, Parser]:
    """A scanner whose method table remembers the block texts of `bodies` (the parser's
    checks of a first batch remember them)."""
    table = MethodTable()
    for body in bodies:
        for it in body:
            table.target(it["method"], it["params"])
    return Scanner(table, 1000), Parser(table, ProxyMetrics())


@pytest.mark.parametrize(
    ("n", "first", "method"),
    [
        (1, 0, "eth_getBalance"),
        (2, 1, "eth_getCode"),
        (100, 0, "eth_getBalance"),
        (100, 1, ""),
        (3, 0, "eth_getBlockReceipts"),
    ],
)
def test_a_compact_batch_becomes_the_rows_the_parsers_checks_make(
    n: int, first: int, method: str
) -> None:
    if method == "eth_getBlockReceipts":  # (the block alone)
        items = [req(method, [hex(900 + i % 7)], first + i) for i in range(n)]
    elif method:
        items = batch(n, first, method)
    else:  # (a position the method table does not check, before the block)
        items = [
            req("eth_getStorageAt", [f"0x{i:040x}", hex(i), hex(900 + i % 7)], first + i)
            for i in range(n)
        ]
    scan, parser = scanner(items)
    body = orjson.dumps(items)
    rows = scan.scan(body)
    assert type(rows) is Rows
    checked = parser.uniform_rows(orjson.loads(body))
    assert checked is not None
    for column in ("rids", "refs", "texts", "heights"):
        assert getattr(rows, column) == getattr(checked, column), column
    assert (rows.method, rows.spec, len(rows)) == (checked.method, checked.spec, n)
    assert [rows[i].obj for i in range(n)] == items  # each row's object alone
    assert [row.obj for row in rows] == items  # all of them, parsed once
    # The parser takes the rows as they are: ids exact, no notification.
    assert parser.rows(None, rows, [], body) == (rows, True, False)  # type: ignore[arg-type]


@pytest.mark.parametrize("blocks", [["0x385"], ["latest"], ["0x385", "0x386"], ["0x386", "latest"]])
@pytest.mark.parametrize("n", [1, 2, 100])
def test_a_scanned_batchs_bounds_are_the_parsed_ones(blocks: list[str], n: int) -> None:
    """The lowest and highest height of a batch read from its bytes (what the node choice
    decides a batch by): those of its parse, for a batch at one block (found with its one
    text), at one tag (none), and at several blocks."""
    items = [req("eth_getBalance", [ADDR, blocks[i % len(blocks)]], i) for i in range(n)]
    scan, parser = scanner(items)
    body = orjson.dumps(items)
    rows = scan.scan(body)
    checked = parser.uniform_rows(orjson.loads(body))
    assert rows is not None and checked is not None
    assert rows.bounds() == checked.bounds()
    used = [None if b == "latest" else int(b, 16) for b in blocks[:n]]
    assert rows.bounds() == (None if None in used else (min(used), max(used)))  # type: ignore[type-var]


def declined() -> dict[str, bytes]:
    """Bodies the scanner leaves to the parse, each but for one detail the scanned one's."""
    body = orjson.dumps(batch(10))
    hexed = body.replace(b'"0x385"', b'"0x\\u0033385"', 1)  # (an escape in a block text)
    mixed = batch(10)
    mixed[3]["method"] = "eth_getCode"
    return {
        "space after a comma": body.replace(b'","', b'", "', 1),
        "key order": orjson.dumps([{"id": it["id"], **it} for it in batch(10)]),
        "first id 2": orjson.dumps(batch(10, 2)),
        "ids not consecutive": orjson.dumps(batch(5) + batch(5, 6)),
        "an id twice": orjson.dumps(batch(5) + batch(5)),
        "a string id": body.replace(b'"id":4,', b'"id":"4",'),
        "a float id": body.replace(b'"id":4,', b'"id":4.0,'),
        "an escape in a block text": hexed,
        "a short address": body.replace(b'"0x' + b"0" * 39 + b'1"', b'"0x' + b"0" * 38 + b'1"'),
        "a non-hex address": body.replace(b'"0x' + b"0" * 39 + b'3"', b'"0x' + b"0" * 39 + b'g"'),
        "0X": body.replace(b'"0x' + b"0" * 39, b'"0X' + b"0" * 39, 1),
        "a block text not a block": body.replace(b'"0x385"', b'"0xzz"', 1),
        "a tab in a block text": body.replace(b'"0x385"', b'"0x385\t"', 1),
        "a control byte in a block text": body.replace(b'"0x385"', b'"\x010x385"', 1),
        "a non-ASCII block text": body.replace(b'"0x385"', b'"0x385\xc3\xa9"', 1),
        "an escaped backslash in a block text": body.replace(b'"0x385"', b'"0x385\\\\"', 1),
        "a quote in a block text": body.replace(b'"0x385"', b'"0x3\\"85"', 1),
        "two methods": orjson.dumps(mixed),
        "three params": body.replace(b'"0x385"]', b'"0x385","0x1"]', 1),
        "a notification": body.replace(b'"id":4,', b""),
        "another key": body.replace(b'"0x385"]}', b'"0x385"],"x":1}', 1),
        "a trailing newline": body + b"\n",
        "jsonrpc 1.0": body.replace(b'"2.0"', b'"1.0"', 1),
        "not a batch": orjson.dumps(batch(1)[0]),
        "more than 100 items": orjson.dumps(batch(101)),
        "a method not for it": orjson.dumps(
            [req("eth_getProof", [ADDR, [], "0x385"], i) for i in range(3)]
        ),
        "a position not a string": orjson.dumps(
            [req("eth_getStorageAt", [ADDR, 0, "0x385"], i) for i in range(3)]
        ),
        "an escape in a position": orjson.dumps(
            [req("eth_getStorageAt", [ADDR, "0x\n", "0x385"], i) for i in range(3)]
        ),
        "not JSON": body[:-1],
    }


def test_a_block_text_not_remembered_yet_is_checked_once_and_remembered() -> None:
    """A valid text the method table has not seen: checked alone by its `target` (as the
    parse would check its item) and read from the bytes; an invalid one leaves the body to
    the parse, which answers the item's error."""
    scan, parser = scanner(batch(10))
    table = scan.methods
    items = batch(10)
    items[4]["params"][1] = "0x3e8"
    body = orjson.dumps(items)
    rows = scan.scan(body)
    assert rows is not None and rows.heights[4] == 1000 and rows.texts[4] == "0x3e8"
    assert table.known_targets("eth_getBalance", 2, [it["params"] for it in items], rows.texts)
    checked = parser.uniform_rows(orjson.loads(body))
    assert checked is not None and checked.refs == rows.refs
    items[4]["params"][1] = "0x3e9x"
    assert scan.scan(orjson.dumps(items)) is None


@pytest.mark.parametrize("name", sorted(declined()))
def test_any_other_body_is_left_to_the_parse(name: str) -> None:
    storage = [req("eth_getStorageAt", [ADDR, "0x0", "0x385"], i) for i in range(3)]
    scan, _ = scanner(
        batch(101),
        [req("eth_getBalance", [ADDR, "latest"], 0)],
        storage,
        [req("eth_getProof", [ADDR, [], "0x385"], 0)],
    )
    assert scan.scan(orjson.dumps(batch(10))) is not None  # (the body they differ from)
    assert scan.scan(orjson.dumps(storage)) is not None  # (an unchecked position: a string)
    assert scan.scan(declined()[name]) is None


async def test_the_node_gets_the_parsed_paths_bytes_and_the_client_its_answers(
    solo,  # noqa: F811
    monkeypatch,
) -> None:
    """Through a real proxy app and a fake node: a batch of remembered texts is read from
    its bytes, and the answers and the body sent are the parsed path's, also when the read
    path pins items at the head by hash (their objects written into the client's bytes)."""
    api, node = solo
    scanned = []
    scan = Scanner.scan

    def counted(self: Scanner, body: bytes) -> Rows | None:
        rows = scan(self, body)
        scanned.append(rows is not None)
        return rows

    monkeypatch.setattr(Scanner, "scan", counted)
    items = plain(100)
    await answered_both_ways(api, node, monkeypatch, items)
    assert scanned[0]  # (the twin's scan is switched off)
    tagged = plain(10)
    tagged[2]["params"][1] = tagged[6]["params"][1] = "latest"
    await answered_both_ways(api, node, monkeypatch, tagged)  # ("latest" remembered)
    scanned.clear()
    await answered_both_ways(api, node, monkeypatch, tagged)
    assert scanned == [True]  # (a tag: planned row by row, from the objects then parsed)
    head = hex(node.head)
    items[0]["params"][1] = items[41]["params"][1] = items[99]["params"][1] = head
    await answered_both_ways(api, node, monkeypatch, items)  # (the head's text remembered)
    scanned.clear()
    raw = await answered_both_ways(api, node, monkeypatch, items)
    assert scanned == [True]
    sent = orjson.loads(node.bodies[-1])
    pinned = [i for i, it in enumerate(sent) if it["params"][1] != items[i]["params"][1]]
    assert pinned == [0, 41, 99], sent  # pinned by hash (EIP-1898), the others as sent
    assert [a["id"] for a in orjson.loads(raw)] == list(range(100))


def test_past_the_kept_expressions_a_new_shape_is_parsed(monkeypatch) -> None:
    """The expressions are bounded: once MAX_SHAPES are kept, a batch of a size not seen
    yet is left to the parse (none made per request), and the kept ones still match."""
    monkeypatch.setattr("proxy.scan.MAX_SHAPES", 3)
    scan, _ = scanner(batch(10))
    for n in (1, 2, 3):
        assert scan.scan(orjson.dumps(batch(n))) is not None
    assert scan.scan(orjson.dumps(batch(4))) is None
    assert scan.scan(orjson.dumps(batch(2))) is not None


@pytest.mark.parametrize("answer", ["reversed", "an error", "one missing"])
async def test_a_scanned_batch_whose_answer_is_not_plain_is_matched_as_the_parsed_ones(
    solo,  # noqa: F811
    monkeypatch,
    answer: str,
) -> None:
    """A node answering a scanned batch out of order, with an error or short of an item:
    its items (their objects parsed then, the pinned ones as pinned) are matched, retried
    and answered as the parsed path does."""
    api, node = solo
    items = plain(20)
    items[3]["params"][1] = items[11]["params"][1] = hex(node.head)
    await answered_both_ways(api, node, monkeypatch, items)  # (the head's text remembered)

    def odd(sent: list[dict[str, Any]]) -> bytes:
        out = [{"jsonrpc": "2.0", "id": it["id"], "result": hex(7000 + it["id"])} for it in sent]
        if answer == "reversed":
            out.reverse()
        elif answer == "an error":
            out[5] = {"jsonrpc": "2.0", "id": 5, "error": {"code": -32000, "message": "no"}}
        elif len(out) > 1:
            out.pop(7)
        return orjson.dumps(out)

    node.batch_answer = odd
    scanned = []
    scan = Scanner.scan
    monkeypatch.setattr(Scanner, "scan", lambda self, body: scanned.append(1) or scan(self, body))
    raw = await answered_both_ways(api, node, monkeypatch, items)
    assert scanned == [1]
    got = orjson.loads(raw)
    assert [a["id"] for a in got] == list(range(20)), got
    assert (got[5].get("error") is not None) == (answer == "an error"), got[5]


def fuzz_bodies(rng: random.Random) -> list[dict[str, Any]]:
    """A batch as a library writes it: 1 to 12 balance reads at a few heights, `latest` or
    one block for all, ids from 0 or 1."""
    n, first = rng.randint(1, 12), rng.randint(0, 1)
    blocks = rng.choice([["latest"], ["0x385"], ["0x385", "0x386", "latest", "0x3e8"]])
    return [
        req("eth_getBalance", [f"0x{rng.getrandbits(160):040x}", rng.choice(blocks)], first + i)
        for i in range(n)
    ]


def test_a_scanned_body_is_read_as_its_parse_checks_it_over_mutated_bodies() -> None:
    """Over bodies mutated at random (mutate.py): whenever the scan reads one, it is valid
    JSON whose parse makes the same rows (ids, blocks, heights, objects); anything else is
    left to the parse. Unmutated bodies and most mutated addresses are read."""
    rng = random.Random(36)
    scan, parser = scanner(
        [req("eth_getBalance", [ADDR, block], 0) for block in ("latest", "0x385", "0x386")]
    )
    read = 0
    for _ in range(3000):
        items = fuzz_bodies(rng)
        body = orjson.dumps(items)
        assert scan.scan(body) is not None, body
        bad = edited(items, rng) if rng.random() < 0.3 else mutated(body, rng)
        rows = scan.scan(bad)
        if rows is None:
            continue
        read += 1
        payload = orjson.loads(bad)  # (a body the scan reads is JSON)
        checked = parser.uniform_rows(payload)
        assert checked is not None, bad
        for column in ("rids", "refs", "texts", "heights"):
            assert getattr(rows, column) == getattr(checked, column), (column, bad)
        assert rows.bounds() == checked.bounds(), bad
        assert (rows.method, rows.spec, len(rows)) == (checked.method, checked.spec, len(payload))
        assert [rows[i].obj for i in range(len(rows))] == payload, bad
        assert [(row.ref, row.block) for row in rows] == [(r.ref, r.block) for r in checked]
    assert read > 200  # (edits that keep a valid batch, mutations of a hex digit, ...)


def edited(items: list[dict[str, Any]], rng: random.Random) -> bytes:
    """`items` with one item's id, address or block changed to another valid or invalid
    value (of another type, case, length, ...), or two items swapped, written compactly."""
    items = [dict(it, params=list(it["params"])) for it in items]
    it = rng.choice(items)
    kind = rng.randrange(4)
    if kind == 0:
        it["id"] = rng.choice([it["id"] + 1, str(it["id"]), float(it["id"]), None, True, -1])
    elif kind == 1:
        address = it["params"][0]
        it["params"][0] = rng.choice(
            [address.upper().replace("0X", "0x"), address[:-1], address + "0", address.upper()]
        )
    elif kind == 2:
        it["params"][1] = rng.choice(["0x386", "0x3e8", "latest", "pending", "0x", "0x0385", 7])
    else:
        j, k = rng.randrange(len(items)), rng.randrange(len(items))
        items[j], items[k] = items[k], items[j]
    return orjson.dumps(items)

"""Items at the head in a batch read from its bytes (proxy/scan.py), pinned by hash in the
rows' bytes (`Reads.pin_rows`) rather than each planned as an Item: the node gets the bytes
and the client the answer that planning each item gives, they are not coalesced, and after a
reorg the proxy has not seen they are asked by height. A real proxy app in front of
fake state nodes, the response cache off."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from proxy.methods import MethodTable
from proxy.reads import Reads, with_block
from proxy.scan import Scanner
from tests.proxy.conftest import req
from tests.proxy.test_dataport import raw_rpc

N = 10


def reads(method: str, head: int, at_head: tuple[int, ...]) -> list[dict[str, Any]]:
    """Reads of `method` at heights below the head, those at `at_head` (places) at it."""
    items = []
    for i in range(N):
        block = hex(head if i in at_head else head - 1 - i)
        extra = [hex(i)] if method == "eth_getStorageAt" else []
        items.append(req(method, [f"0x{i + 1:040x}", *extra, block], i))
    return items


def pinned(batch: list[dict[str, Any]], head: int, block_hash: str) -> list[dict[str, Any]]:
    """`batch` as the read path sends it: each item at the head named by its hash."""
    out = []
    for item in batch:
        params = list(item["params"])
        if params[-1] == hex(head):
            params[-1] = {"blockHash": block_hash}
        out.append({**item, "params": params})
    return out


def item_by_item(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every batch planned item by item (`pin_rows` declines); its calls counted."""
    calls = [0]

    def declined(self: Reads, *args: Any) -> None:
        calls[0] += 1

    monkeypatch.setattr(Reads, "pin_rows", declined)
    return calls


def in_rows(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each call of `pin_rows` pinned the items in the rows."""
    pinned_each: list[bool] = []
    real = Reads.pin_rows

    def spied(self: Reads, *args: Any) -> Any:
        rows = real(self, *args)
        pinned_each.append(rows is not None)
        return rows

    monkeypatch.setattr(Reads, "pin_rows", spied)
    return pinned_each


async def scanned(api: Any, method: str, head: int) -> None:
    """A first batch of `method`, parsed (the method table then knows its shape): the
    next ones are read from their bytes (proxy/scan.py)."""
    status, _ = await raw_rpc(api, orjson.dumps(reads(method, head, ())))
    assert status == 200


@pytest.mark.parametrize("method", ["eth_getBalance", "eth_getStorageAt"])
@pytest.mark.parametrize("at_head", [(0,), (6,), (N - 1,), (0, 4, 5, N - 1)])
async def test_items_at_the_head_go_by_hash_as_planning_each_item_writes_them(
    node_api, monkeypatch, method: str, at_head: tuple[int, ...]
) -> None:
    """The node gets the client's bytes with each item at the head named by the head's
    hash, and the client the node's answer: the same bytes both ways."""
    api, node = node_api
    head = node.head
    await scanned(api, method, head)
    batch = orjson.dumps(reads(method, head, at_head))
    pinned_each = in_rows(monkeypatch)
    got = []
    for way in ("in rows", "item by item"):
        if way == "item by item":
            calls = item_by_item(monkeypatch)
        status, raw = await raw_rpc(api, batch)
        assert status == 200
        got.append((node.bodies[-1], raw))
        assert not api.proxy.reads.coalescer.flights  # every read landed
    assert pinned_each == [True] and calls[0] == 1
    assert got[0] == got[1]
    sent = pinned(reads(method, head, at_head), head, node.hash_at(head))
    assert got[0][0] == orjson.dumps(sent)
    answers = orjson.loads(got[0][1])
    assert [a["id"] for a in answers] == list(range(N))
    assert [a["result"]["height"] for a in answers] == [
        head if i in at_head else head - 1 - i for i in range(N)
    ]


@pytest.mark.parametrize("method", ["eth_getBalance", "eth_getStorageAt"])
async def test_an_item_pinned_in_the_rows_is_not_coalesced(
    node_api, monkeypatch, method: str
) -> None:
    """A single read identical to a batch's item at the head, sent while the batch is at
    the node, asks the node itself (an item pinned in its batch's bytes leads no flight),
    and gets the item's answer; nothing is left in flight."""
    api, node = node_api
    await scanned(api, method, node.head)
    pinned_each = in_rows(monkeypatch)
    node.delay = 0.3
    batch = reads(method, node.head, (3,))
    task = asyncio.ensure_future(raw_rpc(api, orjson.dumps(batch)))
    await asyncio.sleep(0.1)
    single = orjson.dumps(req(method, batch[3]["params"], "s"))
    status, raw = await raw_rpc(api, single)
    _, whole = await task
    assert status == 200 and orjson.loads(raw) == {
        "jsonrpc": "2.0",
        "id": "s",
        "result": orjson.loads(whole)[3]["result"],
    }
    assert len(node.bodies) == 3 and pinned_each == [True]  # (the first batch, these two)
    assert not api.proxy.reads.coalescer.flights


async def test_an_item_like_one_before_it_in_the_batch_is_sent_pinned_too(
    node_api, monkeypatch
) -> None:
    """A batch with two identical items at the head goes as the client's bytes pinned (no
    item waits for the other: the batch makes the round trip anyway), each item gets its
    own answer, and no read is left in flight."""
    api, node = node_api
    await scanned(api, "eth_getBalance", node.head)
    pinned_each = in_rows(monkeypatch)
    asked = len(node.received)
    batch = reads("eth_getBalance", node.head, (2, 7))
    batch[7]["params"] = batch[2]["params"]
    status, raw = await raw_rpc(api, orjson.dumps(batch))
    answers = orjson.loads(raw)
    assert status == 200 and [a["id"] for a in answers] == list(range(N))
    assert answers[7]["result"] == answers[2]["result"]
    assert len(node.received) == asked + N and pinned_each == [True]
    assert node.bodies[-1] == orjson.dumps(pinned(batch, node.head, node.hash_at(node.head)))
    assert not api.proxy.reads.coalescer.flights


@pytest.mark.parametrize("batch_first", [False, True])
async def test_a_batch_item_like_a_read_in_flight_goes_and_singles_follow_their_leader(
    node_api, monkeypatch, batch_first: bool
) -> None:
    """A single read and a batch holding the same read at the head, in flight together
    (either first): the batch goes whole, pinned in its bytes, the single read asks the
    node, a second single read follows the first; every read gets the node's answer and
    none stays in flight."""
    api, node = node_api
    await scanned(api, "eth_getBalance", node.head)
    pinned_each = in_rows(monkeypatch)
    batch = reads("eth_getBalance", node.head, (5,))
    single = orjson.dumps(req("eth_getBalance", batch[5]["params"], "s"))
    node.delay = 0.3
    asked = len(node.received)
    sent = [orjson.dumps(batch), single] if batch_first else [single, orjson.dumps(batch)]
    first = asyncio.ensure_future(raw_rpc(api, sent[0]))
    await asyncio.sleep(0.05)
    second = asyncio.ensure_future(raw_rpc(api, sent[1]))
    await asyncio.sleep(0.05)
    follower = asyncio.ensure_future(raw_rpc(api, single))
    done = [orjson.loads(raw) for _, raw in await asyncio.gather(first, second, follower)]
    whole = done[0] if batch_first else done[1]
    result = whole[5]["result"]
    assert [a["id"] for a in whole] == list(range(N)) and result["height"] == node.head
    assert (
        done[1 if batch_first else 0] == done[2] == {"jsonrpc": "2.0", "id": "s", "result": result}
    )
    assert len(node.received) == asked + N + 1  # (the batch's items and the first single)
    assert pinned_each == [True] and not api.proxy.reads.coalescer.flights


async def test_an_item_pinned_in_the_rows_is_asked_by_height_after_an_unseen_reorg(
    node_api, monkeypatch
) -> None:
    """The node replaced the head block before the proxy saw it: it does not know the
    pinned hash (-39006), and the item is asked again by height, as the client sent it."""
    api, node = node_api
    head = node.head
    await scanned(api, "eth_getBalance", head)
    pinned_each = in_rows(monkeypatch)
    old = node.hash_at(head)
    node.poll_delay = 5.0  # (the proxy does not learn the new block meanwhile)
    node.reorg(head, fork=1)
    batch = reads("eth_getBalance", head, (4,))
    status, raw = await raw_rpc(api, orjson.dumps(batch))
    answers = orjson.loads(raw)
    assert status == 200 and [a["id"] for a in answers] == list(range(N)), raw
    assert answers[4]["result"]["height"] == head, raw
    assert pinned_each == [True]
    first = orjson.loads(node.bodies[-2])
    assert first[4]["params"][1] == {"blockHash": old}
    assert node.received[-1] == batch[4]  # by height, the client's object
    assert not api.proxy.reads.coalescer.flights


@pytest.mark.parametrize("method", ["eth_getBalance", "eth_getStorageAt", "eth_getBlockReceipts"])
@pytest.mark.parametrize("n", [1, 3, 20])
def test_rows_pinned_in_their_bytes_read_as_the_read_path_writes_each_item(
    method: str, n: int
) -> None:
    """The rows pinned in their bytes (every other item, each by its own hash) give the
    objects, rows and body that the read path's `with_block` of each item gives (one item:
    the row a lone item's group reads)."""
    table = MethodTable()
    if method == "eth_getBlockReceipts":  # (the block alone)
        items = [req(method, [hex(900 + i)], i) for i in range(n)]
    else:
        items = [req(method, it["params"], i) for i, it in enumerate(reads(method, 1000, ()) * 2)]
        items = items[:n]
    for it in items:
        table.target(it["method"], it["params"])
    rows = Scanner(table, 1000).scan(orjson.dumps(items))
    assert rows is not None
    spec = rows.spec
    picked = list(range(0, n, 2))
    hashes = ["0x" + f"{i:02x}" * 32 for i in picked]
    pinned_rows = rows.pin_by_hash(picked, hashes)
    by_pos = dict(zip(picked, hashes, strict=True))
    sent = [
        with_block(it, spec, {"blockHash": by_pos[i]}) if i in by_pos else it
        for i, it in enumerate(items)
    ]
    assert pinned_rows.raw == orjson.dumps(sent)
    assert [pinned_rows[i].obj for i in range(n)] == sent == pinned_rows.objs
    assert [pinned_rows[i].block for i in range(n)] == [rows[i].block for i in range(n)]
    assert pinned_rows.heights == rows.heights and pinned_rows.pins == picked

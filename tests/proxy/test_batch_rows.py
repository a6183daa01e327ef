"""A batch's items checked with C loops (`Parser.uniform_rows`, `MethodTable.known_targets`).

A batch of one method whose block texts the method table remembers is checked without a
Python step per item; any item that is not such a plain valid request object sends the batch
item by item. Either way the answers and what the node receives must be the bytes the
item-by-item checks give (a real proxy app in front of a fake state node).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.parse import Parser
from proxy.scan import Scanner
from tests.proxy.conftest import fast_settings, req
from tests.proxy.test_dataport import raw_rpc


def plain(n: int) -> list[dict[str, Any]]:
    """`n` balance reads at 50 heights below the fake node's head (no hash known for them)."""
    return [req("eth_getBalance", [f"0x{i + 1:040x}", hex(900 + i % 50)], i) for i in range(n)]


def odd(n: int) -> dict[str, Any]:
    """Items that are not plain valid request objects; each a batch's item `n`."""
    good = plain(n + 1)[n]
    params = good["params"]
    return {
        "bad address": {**good, "params": ["0x12", params[1]]},
        "null address": {**good, "params": [None, params[1]]},
        "one param": {**good, "params": [params[0]]},
        "three params": {**good, "params": [*params, "0x1"]},
        "params object": {**good, "params": {"address": params[0], "blockNumber": params[1]}},
        "no params": {k: v for k, v in good.items() if k != "params"},
        "block int": {**good, "params": [params[0], 900]},
        "float id": {**good, "id": 1.0},
        "bool id": {**good, "id": True},
        "null id": {**good, "id": None},
        "notification": {k: v for k, v in good.items() if k != "id"},
        "jsonrpc 1.0": {**good, "jsonrpc": "1.0"},
        "no jsonrpc": {k: v for k, v in good.items() if k != "jsonrpc"},
        "other method": {**good, "method": "eth_getCode"},
        "unknown method": {**good, "method": "eth_nope"},
        "empty method": {**good, "method": ""},
        "not an object": [good],
        "a number": 7,
    }


@pytest.fixture
async def solo(make_api, fake_nodes):
    """(api, node): one fake state node behind a proxy that knows its head, the block texts
    of `plain` remembered by the method table (a first batch checked item by item). No read
    cache: each twin's items all go to the node, so the bodies it receives compare."""
    node = await fake_nodes("solo", "state")
    api = await make_api(fast_settings(cache_pools=[]))
    await api.add("1337", node)
    await api.heads_known("1337")
    status, raw = await raw_rpc(api, orjson.dumps(plain(100)))
    assert status == 200 and raw.count(b'"result"') == 100, raw
    return api, node


def counting_targets(api, monkeypatch) -> list[int]:
    """Counts the method table's per-item `target` calls."""
    table = api.proxy.engine.methods
    target = table.target
    calls = [0]

    def counted(method: str, params: Any) -> Any:
        calls[0] += 1
        return target(method, params)

    monkeypatch.setattr(table, "target", counted)
    return calls


async def answered_both_ways(api, node, monkeypatch, batch: list[Any]) -> bytes:
    """The batch's answer with the C-loop checks and item by item: the same bytes, and the
    node received the same body."""
    body = orjson.dumps(batch)
    status, raw = await raw_rpc(api, body)
    sent = node.bodies[-1]
    with monkeypatch.context() as m:
        m.setattr(Parser, "uniform_rows", lambda self, payload: None)
        m.setattr(Scanner, "scan", lambda self, body: None)
        status_slow, raw_slow = await raw_rpc(api, body)
    assert (status, raw) == (status_slow, raw_slow), batch
    assert sent == node.bodies[-1], (sent, node.bodies[-1])
    return raw


async def test_a_batch_of_remembered_block_texts_is_checked_without_a_step_per_item(
    solo, monkeypatch
) -> None:
    api, node = solo
    calls = counting_targets(api, monkeypatch)
    batch = plain(100)
    batch[7]["id"] = "seven"  # string ids too
    raw = await answered_both_ways(api, node, monkeypatch, batch)
    assert calls[0] == 100  # the item-by-item twin alone
    answers = orjson.loads(raw)
    assert [a["id"] for a in answers] == [i["id"] for i in batch]
    assert [a["result"]["height"] for a in answers] == [900 + i % 50 for i in range(100)]
    # A text not remembered yet: checked once, alone (and remembered from then on), when
    # the batch is read from its bytes (proxy/scan.py); item by item when it is parsed.
    fresh = [*plain(10), req("eth_getBalance", ["0x" + "ab" * 20, hex(960)], 10)]
    calls[0] = 0
    await answered_both_ways(api, node, monkeypatch, fresh)
    assert calls[0] == 1 + 11
    calls[0] = 0
    await answered_both_ways(api, node, monkeypatch, fresh)
    assert calls[0] == 11  # the twin alone
    fresh[0]["params"][1] = hex(961)
    fresh[0]["id"] = 0.0  # (not read from its bytes: parsed, then checked item by item)
    calls[0] = 0
    await answered_both_ways(api, node, monkeypatch, fresh)
    assert calls[0] == 2 * 11


@pytest.mark.parametrize("where", [0, 5, 9])
async def test_any_other_item_sends_the_batch_item_by_item(solo, monkeypatch, where: int) -> None:
    """Each kind of item that is not a plain valid request object, anywhere in a batch of
    remembered texts: answered (errors included) as item by item answers it."""
    api, node = solo
    for name, item in odd(where).items():
        batch: list[Any] = plain(10)
        batch[where] = item
        raw = await answered_both_ways(api, node, monkeypatch, batch)
        answers = orjson.loads(raw)
        assert len(answers) == 10 - (name == "notification"), (name, raw)


async def test_a_null_param_the_method_table_does_not_check_sends_the_batch_item_by_item(
    solo, monkeypatch
) -> None:
    """`eth_getStorageAt`'s position has no check of its own: a null one among remembered
    block texts is refused (-32602, "missing param") as item by item refuses it, and the
    other items are answered."""
    api, node = solo
    storage = [
        req("eth_getStorageAt", [f"0x{i + 1:040x}", hex(i), hex(900 + i % 50)], i)
        for i in range(10)
    ]
    await answered_both_ways(api, node, monkeypatch, storage)  # (the texts remembered)
    calls = counting_targets(api, monkeypatch)
    await answered_both_ways(api, node, monkeypatch, storage)
    assert calls[0] == 10  # the twin alone: remembered texts, checked with C loops
    storage[4]["params"][1] = None
    calls[0] = 0
    raw = await answered_both_ways(api, node, monkeypatch, storage)
    assert calls[0] == 2 * 10  # item by item both times
    answers = orjson.loads(raw)
    assert answers[4]["error"]["code"] == -32602 and "position" in answers[4]["error"]["message"]
    assert all("result" in a for i, a in enumerate(answers) if i != 4), raw

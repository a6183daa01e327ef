"""Polling filters through the proxy: what geth's eth_newFilter / eth_newBlockFilter /
eth_getFilterChanges / eth_getFilterLogs / eth_uninstallFilter give, over a real state node,
including a reorg, expiry, the limits and bad input."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from chainstate.logfilter import parse_filter
from tests.proxy.events_stack import EMITTERS, TOPIC_POOL, EventsStack, start_stack, stop_stack


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[EventsStack]:
    running = await start_stack(tmp_path, filter_timeout=0.5, max_filters=5, max_filter_changes=50)
    yield running
    await stop_stack(running)


def block_hashes(stack: EventsStack, start: int) -> list[str]:
    return [b["Header"]["hash"] for b in stack.chain.blocks[start:]]


async def error(stack: EventsStack, method: str, *params: Any) -> dict[str, Any]:
    answer = await stack.post({"jsonrpc": "2.0", "id": 7, "method": method, "params": list(params)})
    assert "error" in answer, answer
    return answer["error"]


async def test_a_block_filter_gets_each_new_block_once_in_order(stack: EventsStack) -> None:
    fid = await stack.rpc("eth_newBlockFilter")
    assert fid.startswith("0x") and len(fid) == 34
    start = stack.chain.head + 1
    assert await stack.rpc("eth_getFilterChanges", fid) == []
    await stack.add_blocks(3)
    first = await stack.rpc("eth_getFilterChanges", fid)
    await stack.add_blocks(2)
    second = await stack.rpc("eth_getFilterChanges", fid)
    assert first + second == block_hashes(stack, start)
    assert await stack.rpc("eth_getFilterChanges", fid) == []


async def test_a_log_filter_gets_matching_logs_and_the_removed_ones_after_a_reorg(
    stack: EventsStack,
) -> None:
    criteria = {"address": EMITTERS[:2], "topics": [TOPIC_POOL[0][:3]]}
    fid = await stack.rpc("eth_newFilter", criteria)
    everything = await stack.rpc("eth_newFilter", {})
    start = stack.chain.head + 1
    await stack.add_blocks(6)
    flt = parse_filter(criteria)
    new_logs = [lg for lg in stack.logs(start) if flt.matches(lg)]
    assert len(new_logs) >= 2
    assert await stack.rpc("eth_getFilterChanges", fid) == new_logs
    assert await stack.rpc("eth_getFilterChanges", everything) == stack.logs(start)
    # A reorg: the dropped blocks' logs come back with removed: true (newest first), then
    # the new chain's logs.
    keep = stack.chain.head - 3
    dropped = await stack.reorg(keep, 4, "side")
    removed = [
        {**lg, "removed": True}
        for block in reversed(dropped)
        for lg in reversed([lg for r in block["BlockFile"]["receipts"] for lg in r["logs"]])
    ]
    assert removed, "the reorg must drop logs for this test to mean something"
    added = stack.logs(keep + 1)
    assert await stack.rpc("eth_getFilterChanges", everything) == removed + added
    assert await stack.rpc("eth_getFilterChanges", fid) == [
        lg for lg in removed + added if flt.matches(lg)
    ]


async def test_get_filter_logs_equals_get_logs_and_uninstall_removes(stack: EventsStack) -> None:
    criteria = {"fromBlock": "0x1", "toBlock": "latest", "address": EMITTERS[1]}
    fid = await stack.rpc("eth_newFilter", criteria)
    await stack.add_blocks(2)
    assert await stack.rpc("eth_getFilterLogs", fid) == await stack.rpc("eth_getLogs", criteria)
    assert await stack.rpc("eth_uninstallFilter", fid) is True
    assert await stack.rpc("eth_uninstallFilter", fid) is False
    err = await error(stack, "eth_getFilterChanges", fid)
    assert err["code"] == -32000 and err["message"] == "filter not found: removed, uninstalled"
    block_filter = await stack.rpc("eth_newBlockFilter")
    err = await error(stack, "eth_getFilterLogs", block_filter)
    assert err["code"] == -32000 and "not a log filter" in err["message"]


async def test_an_unpolled_filter_expires(stack: EventsStack) -> None:
    polled = await stack.rpc("eth_newBlockFilter")
    idle = await stack.rpc("eth_newBlockFilter")
    for _ in range(8):  # 0.8 s, filter_timeout is 0.5 s
        await asyncio.sleep(0.1)
        await stack.rpc("eth_getFilterChanges", polled)
    err = await error(stack, "eth_getFilterChanges", idle)
    assert "not polled for 0.5 s (filter_timeout)" in err["message"]
    assert await stack.rpc("eth_getFilterChanges", polled) == []


async def test_limits_on_filters(stack: EventsStack) -> None:
    ids = [await stack.rpc("eth_newBlockFilter") for _ in range(5)]
    err = await error(stack, "eth_newBlockFilter")
    assert err["code"] == -32005 and "max_filters" in err["message"]
    for fid in ids:
        await stack.rpc("eth_uninstallFilter", fid)
    # More unpolled changes than max_filter_changes: the filter is removed and says why.
    flooded = await stack.rpc("eth_newFilter", {})
    start = stack.chain.head + 1
    # (the blocks made at once and waited for once: well within the 0.5 s filter_timeout)
    while len(stack.logs(start)) <= 50:
        stack.chain.add_logs_block(stack.rng, stack.accounts)
    await stack.readable(stack.chain.head)
    err = await error(stack, "eth_getFilterChanges", flooded)
    assert "more than 50 changes were not polled (max_filter_changes)" in err["message"]
    err = await error(stack, "eth_newFilter", {"address": ["0x" + "11" * 20] * 1001})
    assert err["code"] == -32005 and "max_log_query_list" in err["message"]


@pytest.mark.parametrize(
    ("method", "params", "code", "text"),
    [
        ("eth_newFilter", [{"topics": [None] * 5}], -32602, "exceed max topics"),
        ("eth_newFilter", [{"address": "0x12"}], -32602, "invalid address"),
        ("eth_newFilter", [{"fromBlock": "0x5", "toBlock": "0x1"}], -32602, "invalid block range"),
        ("eth_newFilter", ["latest"], -32602, "invalid filter"),
        ("eth_newBlockFilter", [1], -32602, "too many params"),
        ("eth_getFilterChanges", [], -32602, "invalid filter id"),
        ("eth_getFilterChanges", [5], -32602, "invalid filter id"),
        ("eth_getFilterChanges", ["0x1234"], -32000, "filter not found"),
        ("eth_getFilterLogs", ["0x1234"], -32000, "filter not found"),
        ("eth_newPendingTransactionFilter", [], -32601, "no Leader write node"),
        ("eth_subscribe", ["newHeads"], -32601, "notifications not supported"),
        ("eth_unsubscribe", ["0x12"], -32601, "WebSocket"),
    ],
)
async def test_bad_filter_requests(stack: EventsStack, method, params, code, text) -> None:
    err = await error(stack, method, *params)
    assert err["code"] == code and text in err["message"], err


async def test_filter_methods_in_a_batch_with_routed_reads(stack: EventsStack) -> None:
    fid = await stack.rpc("eth_newBlockFilter")
    await stack.add_blocks(1)
    head = hex(stack.chain.head)
    batch = [
        {"jsonrpc": "2.0", "id": "a", "method": "eth_blockNumber", "params": []},
        {"jsonrpc": "2.0", "id": "a", "method": "eth_getFilterChanges", "params": [fid]},
        {"jsonrpc": "2.0", "method": "eth_getFilterChanges", "params": [fid]},  # notification
        5,
        {"jsonrpc": "2.0", "id": 3, "method": "eth_uninstallFilter", "params": [fid]},
        {"jsonrpc": "2.0", "id": 4, "method": "eth_chainId"},
        {"jsonrpc": "2.0", "id": [5], "method": "eth_chainId"},
    ]
    answers = await stack.post(batch)
    assert [a["id"] for a in answers] == ["a", "a", None, 3, 4, None]
    assert answers[0]["result"] == head
    assert answers[1]["result"] == block_hashes(stack, stack.chain.head)
    assert answers[2]["error"]["code"] == -32600
    assert answers[3]["result"] is True
    assert answers[4]["result"] == "0x539"
    assert answers[5]["error"]["code"] == -32600  # a bad id, as the engine answers it


async def test_a_routed_item_nested_too_deep_beside_filter_methods(stack: EventsStack) -> None:
    """A batch with filter methods is split here: an item too deep to write again for the
    engine (and, alone, one the in-process node is given parsed) is -32602 by itself."""
    nested: Any = {"to": EMITTERS[0]}
    for _ in range(260):
        nested = {"a": nested}
    call = {"jsonrpc": "2.0", "id": 2, "method": "eth_call", "params": [nested, "latest"]}
    batch = [{"jsonrpc": "2.0", "id": 1, "method": "eth_newBlockFilter", "params": []}, call]
    async with aiohttp.ClientSession() as http:
        async with http.post(stack.url, data=json.dumps(batch)) as resp:
            assert resp.status == 200
            answers = await resp.json()
        assert answers[0]["id"] == 1 and answers[0]["result"].startswith("0x"), answers
        assert answers[1]["id"] == 2 and answers[1]["error"]["code"] == -32602, answers
        async with http.post(stack.url, data=json.dumps(call)) as resp:
            assert resp.status == 200
            answer = await resp.json()
        assert answer["id"] == 2 and answer["error"]["code"] == -32602, answer


async def test_filter_methods_on_a_connection_aiohttp_serves(stack: EventsStack) -> None:
    """A connection that carried an admin call is served by the aiohttp app from then on
    (docs/http-server.md): the filter methods answer there as on the lean data path."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as http:
        base = stack.url.rsplit("/", 1)[0]
        async with http.get(base + "/getChains") as resp:
            assert resp.status == 200
        new = {"jsonrpc": "2.0", "id": 1, "method": "eth_newBlockFilter", "params": []}
        async with http.post(stack.url, json=new) as resp:
            fid = (await resp.json())["result"]
        body = {"jsonrpc": "2.0", "id": 1, "method": "eth_getFilterChanges", "params": [fid]}
        async with http.post(stack.url, json=body) as resp:
            assert (await resp.json())["result"] == []
        start = stack.chain.head + 1
        await stack.add_blocks(2)
        batch = [body, {"jsonrpc": "2.0", "id": 2, "method": "eth_chainId", "params": []}]
        async with http.post(stack.url, json=batch) as resp:
            answers = await resp.json()
        assert answers[0]["result"] == block_hashes(stack, start)
        assert answers[1]["result"] == "0x539"
        assert len(stack.server.conns) == 0  # the one connection was aiohttp's
    # its filter counts against the client's address, as on the lean path
    assert stack.events.quota.items == {"127.0.0.1": 1}


async def test_in_process_callers_get_the_filter_methods(stack: EventsStack) -> None:
    """The engine hands a body with a filter method to the events part whoever calls it:
    the workspace's in-process forwarding gets filters as HTTP clients do; a subscription
    needs a WebSocket there too."""
    engine = stack.events_engine

    async def call(method: str, *params: Any) -> Any:
        body = orjson.dumps({"jsonrpc": "2.0", "id": 9, "method": method, "params": list(params)})
        status, out = await engine.handle("0x539", body, {"client-id": "workspace"})
        assert status == 200
        return orjson.loads(out)

    fid = (await call("eth_newBlockFilter"))["result"]
    start = stack.chain.head + 1
    await stack.add_blocks(2)
    assert (await call("eth_getFilterChanges", fid))["result"] == block_hashes(stack, start)
    refused = await call("eth_subscribe", "newHeads")
    assert refused["error"]["code"] == -32601 and "WebSocket" in refused["error"]["message"]
    assert (await call("eth_chainId"))["result"] == "0x539"  # the engine's own, not diverted


async def test_the_feed_asks_for_fewer_blocks_when_the_node_limits_logs(tmp_path: Path) -> None:
    """Blocks arriving together whose logs exceed the node's max_logs_per_response: the feed
    asks for the range in halves and every log still arrives once, in order."""
    stack = await start_stack(tmp_path, node={"logs": {"max_logs_per_response": 12}})
    try:
        fid = await stack.rpc("eth_newFilter", {})
        start = stack.chain.head + 1
        for _ in range(12):  # all at once: one feed round sees them together
            stack.chain.add_logs_block(stack.rng, stack.accounts)
        assert len(stack.logs(start)) > 12
        await stack.readable(stack.chain.head)
        assert await stack.rpc("eth_getFilterChanges", fid) == stack.logs(start)
    finally:
        await stop_stack(stack)

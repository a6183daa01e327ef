"""A batch of eth_calls through the proxy to a state node in its own process.

The batch's first attempt (proxy/firstbatch.py `_calls`) gives its parsed items to the node's
future (`answer_later`) through `Attempts.send_now`, instead of the general steps' parse, plan,
route and the body through the node's `handle_body`. Every answer here is compared with the
engine's usual path (`Engine.handle`) and its books with the engine's, on a real state node
(a synthetic chain, its real EVM workers) entered as a state and an archive node.
"""

from __future__ import annotations

from typing import Any

import orjson

from tests.proxy.conftest import client_sees
from tests.proxy.test_dataport import raw_rpc
from tests.proxy.test_inproc_calls import BLOCKS, CHAIN, NO_CACHE, stack  # noqa: F401
from tests.proxy.test_inprocpath import metrics_text, scraped


def call(rid: Any, to: str, block: Any, data: str = "0x", **extra: Any) -> dict[str, Any]:
    params: list[Any] = [{"to": to, "data": data}, block, *extra.get("more", [])]
    return {"jsonrpc": "2.0", "id": rid, "method": "eth_call", "params": params}


def batch(addrs: list[str], blocks: list[int], first: int = 1) -> list[dict[str, Any]]:
    """Calls at old heights (the proxy knows only the head's hash)."""
    return [call(first + i, addrs[i % len(addrs)], hex(b)) for i, b in enumerate(blocks)]


BOOKED = (
    ("chainstate_proxy_requests_total", {"method": "eth_call"}),
    ("chainstate_proxy_requests_total", {"method": "eth_call", "outcome": "ok"}),
    ("chainstate_proxy_requests_total", {"method": "eth_call", "outcome": "error"}),
    ("chainstate_proxy_upstream_attempts_total", {"outcome": "ok"}),
    ("chainstate_proxy_upstream_attempts_total", {"outcome": "timeout"}),
    ("chainstate_proxy_request_seconds_count", {"shape": "batch"}),
)


async def books(api, send) -> tuple[Any, list[float]]:
    """What `send()` answered and how each of BOOKED grew meanwhile."""
    before = await metrics_text(api)
    answer = await send()
    after = await metrics_text(api)
    grown = [scraped(after, name, **kw) - scraped(before, name, **kw) for name, kw in BOOKED]
    return answer, grown


async def compare(api, counted, body: bytes) -> tuple[int, bytes]:
    """The data port's answer and books equal the engine's; (status, answer)."""
    bodies = counted.bodies
    got, grown = await books(api, lambda: raw_rpc(api, body))
    taken = counted.bodies - bodies
    usual, usual_grown = await books(api, lambda: api.proxy.engine.handle(CHAIN, body, {}))
    assert got == usual, (got, usual)
    assert grown == usual_grown, (grown, usual_grown)
    assert counted.bodies - bodies > taken  # (the engine's own sent the body)
    assert api.proxy.state.pools[CHAIN].inflight == 0 and api.proxy.engine.inflight == 0
    return got


async def test_a_batch_goes_to_the_nodes_future_once(stack) -> None:  # noqa: F811
    api, node, addrs, counted = await stack(**NO_CACHE)
    items = batch(addrs, [3, 5, 3, 7, 1, 9, 2, 4, 6, 8])
    body = orjson.dumps(items)
    status, raw = await raw_rpc(api, body)
    assert status == 200 and raw == client_sees(body, await node.handle_body(body))
    assert counted.later == 1 and counted.bodies == 0  # one call of the future, no body
    later = counted.later
    status, raw = await compare(api, counted, body)
    assert counted.later == later + 1
    assert [a["id"] for a in orjson.loads(raw)] == list(range(1, 11))
    # string ids
    two = orjson.dumps([call("a", addrs[0], "0x2"), call("b", addrs[1], "0x2")])
    assert (await compare(api, counted, two))[1] == client_sees(two, await node.handle_body(two))
    assert counted.later == later + 2


async def test_an_error_answer_is_kept_a_retryable_one_goes_on_in_the_loop(stack) -> None:  # noqa: F811
    api, _, addrs, counted = await stack(**NO_CACHE)
    bad = [*batch(addrs, [3, 4]), call(9, "0x12", "0x3")]  # -32602 from the node: final
    later, bodies = counted.later, counted.bodies
    _, raw = await compare(api, counted, orjson.dumps(bad))
    assert orjson.loads(raw)[2]["error"]["code"] == -32602
    assert counted.later == later + 1 and counted.bodies == bodies + 1  # (+1: compare's)
    # A height above the node's head: -39006 from the node, retried by the engine's loop
    # (the other entry of the same node), then given up with the node's answer.
    lacking = [*batch(addrs, [3]), call(5, addrs[0], hex(BLOCKS + 50))]
    later, bodies = counted.later, counted.bodies
    _, raw = await compare(api, counted, orjson.dumps(lacking))
    assert orjson.loads(raw)[1]["error"]["code"] == -32000  # (-39006)
    assert "result" in orjson.loads(raw)[0]
    assert counted.later == later + 1  # the first attempt: the future; the retry: a body
    assert counted.bodies > bodies + 1


async def test_what_the_path_does_not_take_goes_to_the_engine(stack) -> None:  # noqa: F811
    api, _, addrs, counted = await stack(**NO_CACHE)
    head = hex(BLOCKS - 1)  # the proxy knows its hash: pinned by hash (the read path's)
    declined = {
        "state override": [*batch(addrs, [3]), call(2, addrs[0], "0x3", more=[{}])],
        "three params": [*batch(addrs, [3]), call(2, addrs[0], "0x3", more=["0x3"])],
        "a tag": [*batch(addrs, [3]), call(2, addrs[0], "latest")],
        "a known hash": [*batch(addrs, [3]), call(2, addrs[0], head)],
        "mixed": [
            *batch(addrs, [3]),
            {"jsonrpc": "2.0", "id": 2, "method": "eth_getBalance", "params": [addrs[0], "0x3"]},
        ],
        "one id twice": batch(addrs, [3, 4], first=1) + batch(addrs, [5], first=1),
        "one item": [call(1, addrs[0], "0x3")],
        "a float id": [*batch(addrs, [3]), call(1.5, addrs[0], "0x3")],
        "a notification": [
            *batch(addrs, [3]),
            {k: v for k, v in call(2, addrs[0], "0x3").items() if k != "id"},
        ],
    }
    for why, items in declined.items():
        later = counted.later
        await compare(api, counted, orjson.dumps(items))
        assert counted.later == later, why  # not given to the future
    # A node that failed lately: the engine's.
    for reader in api.proxy.state.pools[CHAIN].readers:
        reader.breaker.failure(reader.key, "test")
    later = counted.later
    await compare(api, counted, orjson.dumps(batch(addrs, [3, 4])))
    assert counted.later == later


async def test_a_batch_that_hangs_times_out_and_goes_on_in_the_loop(stack) -> None:  # noqa: F811
    api, node, addrs, counted = await stack(**NO_CACHE, upstream_timeout=0.5)
    counted.hang = True
    body = orjson.dumps(batch(addrs, [3, 4, 5]))
    answer, grown = await books(api, lambda: raw_rpc(api, body))
    assert answer == (200, client_sees(body, await node.handle_body(body)))
    assert len(counted.hanging) == 1 and counted.hanging[0].cancelled()
    assert counted.bodies == 1  # the retry: the engine's, with a body
    assert grown[4] == 1 and grown[3] == 1  # a timeout, then an ok attempt
    assert api.proxy.state.pools[CHAIN].inflight == 0 and api.proxy.engine.inflight == 0


async def test_a_batch_cached_whole_is_answered_from_the_cache(stack) -> None:  # noqa: F811
    """A batch of calls the proxy no longer knows the block hash of, but answered whole at
    the same `latest` before (kept by `_cached_batch`), is answered from the cache as the
    engine answers it, not given to the node."""
    api, node, addrs, counted = await stack()
    height = BLOCKS - 2
    got = await node.handle_body(
        orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "eth_getBlockByNumber",
                      "params": [hex(height), False]})
    )  # fmt: skip
    view = api.proxy.reads.heads.views[CHAIN]
    view.hashes[height] = orjson.loads(got)["result"]["hash"]  # (as if the proxy saw it)
    body = orjson.dumps(batch(addrs, [height, height]))
    status, raw = await raw_rpc(api, body)  # pinned by hash (the engine's), kept whole
    assert status == 200 and raw.count(b'"result"') == 2
    assert api.proxy.reads.cache.stats_of(CHAIN).batches == 1
    del view.hashes[height]  # (dropped from the proxy's window; `latest` the same)
    later = counted.later
    answer, grown = await books(api, lambda: raw_rpc(api, body))
    assert answer == (status, raw) and counted.later == later  # not given to the node
    usual, usual_grown = await books(api, lambda: api.proxy.engine.handle(CHAIN, body, {}))
    assert usual == answer and grown == usual_grown
    assert grown[0] == 2 and grown[3] == 0  # two requests, no attempt: the cache's

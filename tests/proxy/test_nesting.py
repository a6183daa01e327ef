"""Items nested deeper than 253 levels (orjson writes 254, a batch adds one) are answered
-32602 with their own id on every route where the proxy writes an item again, and the
other items of a batch are answered as usual; none of them reaches a node, and no route
answers HTTP 500."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.proxy.conftest import ADDR, balance, req

DEPTH = 260


def deep(depth: int = DEPTH) -> Any:
    value: Any = {"to": ADDR}
    for _ in range(depth):
        value = {"a": value}
    return value


def raw(value: Any) -> bytes:
    """JSON as a client writes it (the stdlib writes deeper than orjson)."""
    return json.dumps(value).encode()


def invalid_params(answer: Any, rid: Any) -> bool:
    error = answer.get("error") or {}
    return answer["id"] == rid and error.get("code") == -32602 and "253" in error["message"]


def received_deep(*nodes: Any) -> bool:
    return any('"a":{"a":{"a"' in body.decode() for node in nodes for body in node.bodies)


async def test_a_single_read_nested_too_deep(two) -> None:
    """Planned reads (their key is the params written again), and a read whose params are
    fine but another member is too deep (its block is pinned: the item is written again).
    (A single item the proxy forwards as the client's bytes, at a height whose hash it
    does not know, say, goes to the node as it is: the node answers it.)"""
    api, state, archive = two
    status, answer = await api.rpc("1337", raw(req("eth_call", [deep(), "latest"], rid=7)))
    assert status == 200 and invalid_params(answer, 7), answer
    item = {**balance(rid="x"), "extra": deep()}
    status, answer = await api.rpc("1337", raw(item))
    assert status == 200 and invalid_params(answer, "x"), answer
    assert not received_deep(state, archive)
    assert (await api.call("1337", "eth_getBalance", [ADDR, "latest"]))["result"]


FITS = 250  # the deepest `deep` an item holds: 253 levels with the item and its params


@pytest.mark.parametrize("depth", [DEPTH, FITS])
async def test_a_batch_with_an_item_nested_too_deep(two, depth: int) -> None:
    """The deep item is refused alone on each batch route: planned (eth_call at `latest`),
    plain items written again for one node (an invalid item beside them: an eth_call at
    a height whose hash the proxy does not know, so not planned), and a batch whose
    planned item changed (written again whole, else per node). Nested as deep as fits,
    every item goes on."""
    api, state, archive = two
    plain = req("eth_call", [deep(depth), hex(10)], rid=2)
    batches = [  # (the batch, the id of its deep item)
        ([req("eth_call", [deep(depth), "latest"], rid=1), req("eth_chainId", rid=2)], 1),
        ([{"jsonrpc": "2.0", "id": 1, "method": 5}, plain], 2),
        ([plain, balance("latest", rid=3)], 2),
    ]
    for batch, deep_id in batches:
        status, answers = await api.rpc("1337", raw(batch))
        assert status == 200 and len(answers) == 2, answers
        refused = [a["id"] for a in answers if invalid_params(a, a["id"])]
        assert refused == ([deep_id] if depth == DEPTH else []), answers
        others = [a for a in answers if a["id"] not in refused]
        assert all("result" in a or a["error"]["code"] == -32600 for a in others), answers
    assert received_deep(state, archive) == (depth != DEPTH)


async def test_the_limit_is_what_orjson_writes(two) -> None:
    """An eth_call object of 251 containers is the deepest an item holds (253 with the item
    and its params: orjson writes 254, and a batch adds one); one more level is -32602."""
    api = two[0]
    fits = (await api.rpc("1337", raw(req("eth_call", [deep(FITS), "latest"]))))[1]
    assert "result" in fits, fits
    over = (await api.rpc("1337", raw(req("eth_call", [deep(FITS + 1), "latest"]))))[1]
    assert invalid_params(over, 1), over

"""eth_getLogs routing: the oldest block of the range (or the named block) picks the node
kind, and a malformed filter is refused by the proxy before any node is asked."""

from __future__ import annotations

import random

import pytest

from chainstate.blockref import BlockRef
from chainstate.jsonrpc import JsonRpcError
from proxy.methods import MethodTable
from proxy.model import Node, NodeEntry, Pool
from proxy.select import Selector

TABLE = MethodTable()
HASH = "0x" + "ab" * 32


def pool(head: int) -> Pool:
    nodes = {
        key: Node(NodeEntry(key=key, url=f"http://{key}", kind=key), head=head)
        for key in ("state", "archive")
    }
    out = Pool("1", nodes=nodes)
    out.rebuild()
    return out


@pytest.mark.parametrize(
    ("flt", "ref", "kind"),
    [
        ({}, BlockRef(tag="latest"), "state"),
        ({"toBlock": "0x1"}, BlockRef(tag="latest"), "state"),
        ({"fromBlock": "0x3e8"}, BlockRef(number=1000), "state"),
        ({"fromBlock": "0x3e8", "toBlock": "latest"}, BlockRef(number=1000), "state"),
        ({"fromBlock": "0x320", "toBlock": "0x3e8"}, BlockRef(number=800), "archive"),
        ({"fromBlock": "0x0", "toBlock": "latest"}, BlockRef(number=0), "archive"),
        ({"fromBlock": "earliest"}, BlockRef(tag="earliest"), "archive"),
        ({"fromBlock": "safe"}, BlockRef(tag="safe"), "state"),
        ({"blockHash": HASH}, BlockRef(hash=HASH), "archive"),  # unknown hash
    ],
)
def test_the_oldest_block_of_the_range_decides(flt, ref, kind) -> None:
    selector = Selector(state_window=128, known_hashes=16, rng=random.Random(1))
    spec, got = TABLE.target("eth_getLogs", [flt])
    assert got == ref
    assert selector.need(pool(1000), got).kind == kind
    assert selector.choose(pool(1000), "eth_getLogs", spec, got).node.key == kind


def test_a_known_block_hash_routes_by_its_height() -> None:
    selector = Selector(state_window=128, known_hashes=16, rng=random.Random(1))
    selector.remember_hash(HASH, 990)
    _, ref = TABLE.target("eth_getLogs", {"filter": {"blockHash": HASH}})
    assert selector.need(pool(1000), ref).kind == "state"


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ([], -32602),
        ([{"fromBlock": "0x5", "toBlock": "0x2"}], -32602),
        ([{"blockHash": HASH, "fromBlock": "0x1"}], -32602),
        ([{"topics": [None] * 5}], -32602),
        ([{"address": "0x12"}], -32602),
        ([{"fromBlock": "0xzz"}], -32602),  # a bad block id: a bad param (standard API)
        ([{}, {}], -32602),
        (["latest"], -32602),
    ],
)
def test_a_malformed_filter_is_refused_by_the_proxy(params, code) -> None:
    with pytest.raises(JsonRpcError) as err:
        TABLE.target("eth_getLogs", params)
    assert err.value.code == code

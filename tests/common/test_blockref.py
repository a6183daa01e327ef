"""Every way a request names a block parses to one BlockRef, and bad ids are -39007."""

from __future__ import annotations

import pytest

from chainstate.blockref import (
    BlockRef,
    parse_block_ctx,
    parse_block_id,
    parse_block_number_param,
)
from chainstate.jsonrpc import JsonRpcError

H = "0x" + "ab" * 32


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("latest", BlockRef(tag="latest")),
        ("earliest", BlockRef(tag="earliest")),
        ("0x10", BlockRef(number=16)),
        (H, BlockRef(hash=H)),
        ({"blockNumber": "0x2"}, BlockRef(number=2)),
        (
            {"blockHash": H.upper().replace("0X", "0x"), "requireCanonical": True},
            BlockRef(hash=H, require_canonical=True),
        ),
        (None, BlockRef(tag="latest")),
    ],
)
def test_block_number_param(value, expected):
    assert parse_block_number_param(value) == expected


@pytest.mark.parametrize(
    "value", ["0x", "10", "0x010", "newest", 5, {"blockHash": "0x12"}, {}, [1], "0x" + "f" * 17]
)
def test_block_number_param_rejects(value):
    with pytest.raises(JsonRpcError) as err:
        parse_block_number_param(value)
    assert err.value.code == -39007


def test_block_ctx():
    assert parse_block_ctx(None) == BlockRef(tag="latest")
    assert parse_block_ctx({"block_id": "12", "type": "Equals"}) == BlockRef(number=12)
    assert parse_block_ctx({"block_id": "0xc", "type": "Contains"}) == BlockRef(
        number=12, contains=True
    )
    assert parse_block_id(3) == BlockRef(number=3)
    for bad in ({"block_id": "x"}, {"type": "Near"}, "latest", {"block_id": True}):
        with pytest.raises(JsonRpcError) as err:
            parse_block_ctx(bad)
        assert err.value.code == -39007

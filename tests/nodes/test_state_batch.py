"""Blocks applied together (ingest catching up: one store transaction for several blocks),
and the parse of large storage diffs."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from nodes.state.service import StateNode
from nodes.state.store import PreStateMismatch, StateStore
from nodes.state.vendor import (
    VendorBlockError,
    _checked_side,
    compute_validation_hash,
    parse_vendor_block,
)
from tests.nodes.test_state_chain import random_chain
from tests.nodes.test_state_store import assert_state


def tampered(raw: dict[str, Any], addr: str) -> dict[str, Any]:
    """The block with a `pre` balance of `addr` the store does not hold (hash kept valid)."""
    bad = copy.deepcopy(raw)
    bad["StateDiff"]["pre"].setdefault(addr, {})["balance"] = "0x1234567"
    bad["StateDiff"]["post"].setdefault(addr, {})["balance"] = "0x1"
    bad["ValidationHash"] = compute_validation_hash(bad["Header"], bad["StateDiff"])
    return bad


def test_apply_many_applies_all_blocks_or_none(tmp_path: Path) -> None:
    chain, addrs = random_chain(seed=31, blocks=40)
    store = StateStore(tmp_path, kind="state", window=8, map_size_mb=64)
    store.open()
    store.apply_many([parse_vendor_block(raw) for raw in chain.blocks[:30]])
    assert store.range() == (22, 29)  # pruned to the window as blocks one by one would be
    for height in range(22, 30):
        assert_state(store, chain, height, addrs)
    batch = [parse_vendor_block(raw) for raw in chain.blocks[30:35]]
    batch[3] = parse_vendor_block(tampered(chain.blocks[33], addrs[0]))
    with pytest.raises(PreStateMismatch):
        store.apply_many(batch)
    assert store.range() == (22, 29)  # none of the five
    assert_state(store, chain, 29, addrs)
    store.apply_many([parse_vendor_block(raw) for raw in chain.blocks[30:]])
    assert store.range() == (32, 39)
    for height in range(32, 40):
        assert_state(store, chain, height, addrs)


async def test_ingest_keeps_the_blocks_before_a_failing_one(tmp_path: Path) -> None:
    chain, addrs = random_chain(seed=32, blocks=12)
    section = {"key": "batch", "chain_id": 1337, "map_size_mb": 64, "kind": "archive"}
    node = StateNode.from_config(section, data_dir=tmp_path / "node")
    await node.start()
    try:
        blocks = [parse_vendor_block(raw) for raw in chain.blocks[:6]]
        await node.ingest.apply_blocks(blocks)
        assert node.store.range() == (0, 5)
        batch = [parse_vendor_block(raw) for raw in chain.blocks[6:10]]
        batch[2] = parse_vendor_block(tampered(chain.blocks[8], addrs[1]))
        with pytest.raises(PreStateMismatch, match="block 8"):
            await node.ingest.apply_blocks(batch)
        assert node.store.range() == (0, 7)  # blocks 6 and 7 are kept
        assert_state(node.store, chain, 7, addrs)
        # the hot view followed the commits: reads at the new heights are the model's
        for height in (6, 7):
            balance = node.store.balance(addrs[0], height)
            assert balance == chain.state(height).get(addrs[0]).balance  # type: ignore[union-attr]
    finally:
        await node.close()


def test_a_bad_slot_among_many_is_named() -> None:
    chain, _ = random_chain(seed=33, blocks=2)
    raw = copy.deepcopy(chain.blocks[1])
    addr = "0x" + "ab" * 20
    storage = {f"0x{i:064x}": f"0x{i + 1:064x}" for i in range(500)}
    raw["StateDiff"]["post"][addr] = {"storage": storage}
    raw["ValidationHash"] = compute_validation_hash(raw["Header"], raw["StateDiff"])
    assert len(parse_vendor_block(raw).post[addr].storage) == 500
    for bad_slot, bad_value in (
        (f"0x{0xAB:064X}", "0x" + "00" * 32),  # uppercase
        (f"0x{7:063x}", "0x" + "00" * 32),  # 31.5 bytes
        ("0x" + "00" * 32, "0x_" + "0" * 63),  # what int() would take
        ("0x" + "00" * 32, None),
    ):
        bad = copy.deepcopy(raw)
        bad["StateDiff"]["post"][addr]["storage"][bad_slot] = bad_value
        bad["ValidationHash"] = compute_validation_hash(bad["Header"], bad["StateDiff"])
        with pytest.raises(VendorBlockError, match="slot"):
            parse_vendor_block(bad)
    for storage_value in (None, []):
        bad = copy.deepcopy(raw)
        bad["StateDiff"]["post"][addr]["storage"] = storage_value
        bad["ValidationHash"] = compute_validation_hash(bad["Header"], bad["StateDiff"])
        with pytest.raises(VendorBlockError, match="storage must be an object"):
            parse_vendor_block(bad)


def test_the_bulk_check_decodes_as_the_account_by_account_one() -> None:
    chain, _ = random_chain(seed=34, blocks=20)
    with_code = copy.deepcopy(chain.blocks[1])
    with_code["StateDiff"]["post"]["0x" + "cd" * 20] = {"code": "0x6001", "nonce": "0x1"}
    with_code["ValidationHash"] = compute_validation_hash(
        with_code["Header"], with_code["StateDiff"]
    )
    for raw in [*chain.blocks, with_code]:
        block = parse_vendor_block(raw)
        for name, side in (("pre", block.pre), ("post", block.post)):
            assert side == _checked_side(raw["StateDiff"].get(name, {}), name)


WORD = "0x" + "11" * 32


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"balance": None}, "balance"),
        ({"nonce": None}, "nonce"),
        ({"code": None}, "code"),
        ({"storage": None}, "storage must be an object"),
        ({"balance": "0x1,0x2"}, "balance"),  # two quantities in one value
        ({"balance": "0x01"}, "balance"),
        ({"nonce": "0xA"}, "nonce"),
        ({"code": "0x6"}, "code"),
        ({"code": "0x6G"}, "code"),
        ({"storage": {"": WORD + WORD}}, "slot"),  # an empty key and a double value
        ({"storage": {WORD + WORD: ""}}, "slot"),
        ({"storage": {WORD: 1}}, "slot"),
    ],
)
def test_values_the_bulk_check_must_refuse(fields: dict[str, Any], error: str) -> None:
    chain, _ = random_chain(seed=35, blocks=2)
    for name in ("pre", "post"):
        bad = copy.deepcopy(chain.blocks[1])
        bad["StateDiff"].setdefault(name, {})["0x" + "cd" * 20] = fields
        bad["ValidationHash"] = compute_validation_hash(bad["Header"], bad["StateDiff"])
        with pytest.raises(VendorBlockError, match=error):
            parse_vendor_block(bad)


@pytest.mark.parametrize(
    "addresses",
    [
        ["0x" + "CD" * 20],  # uppercase
        ["0x" + "cd" * 19],  # short
        ["", "0x" + "cd" * 40],  # an empty one and a double one: the right total length
    ],
)
def test_addresses_the_bulk_check_must_refuse(addresses: list[str]) -> None:
    chain, _ = random_chain(seed=36, blocks=2)
    bad = copy.deepcopy(chain.blocks[1])
    for address in addresses:
        bad["StateDiff"]["post"][address] = {"balance": "0x1"}
    bad["ValidationHash"] = compute_validation_hash(bad["Header"], bad["StateDiff"])
    with pytest.raises(VendorBlockError, match="address"):
        parse_vendor_block(bad)


def _contents(store: StateStore) -> dict[str, list[tuple[bytes, bytes]]]:
    with store._reading() as txn:
        return {
            name: list(txn.cursor(db=db))
            for name, db in (
                ("accounts", store._acct),
                ("versions", store._ver),
                ("undo", store._undo),
                ("meta", store._meta),
            )
        }


def test_a_batch_prunes_to_the_same_store_as_blocks_one_by_one(tmp_path: Path) -> None:
    chain, _ = random_chain(seed=37, blocks=60)  # few accounts: most written at many heights
    blocks = [parse_vendor_block(raw) for raw in chain.blocks]
    one = StateStore(tmp_path / "one", kind="state", window=5, map_size_mb=64)
    many = StateStore(tmp_path / "many", kind="state", window=5, map_size_mb=64)
    one.open()
    many.open()
    for block in blocks:
        one.apply(block)
    for start in range(0, len(blocks), 8):  # batches longer than the window
        many.apply_many(blocks[start : start + 8])
    assert many.range() == one.range() == (55, 59)
    assert _contents(many) == _contents(one)
    many.replace(2, blocks[58:])  # a reorg to the same blocks prunes nothing more
    assert _contents(many) == _contents(one)

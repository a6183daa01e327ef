"""A block's hashes, addresses and slots are checked in bulk (nodes/state/hexbulk.py); a
block with one malformed among thousands is still refused, with the error naming it."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from nodes.state.hexbulk import all_hex, quantities
from nodes.state.vendor import VendorBlockError, compute_validation_hash, parse_vendor_block
from tests.nodes.test_state_chain import random_chain

WORD = "0x" + "ab" * 32
BAD_WORDS = [
    "0x" + "AB" * 32,  # uppercase
    "0X" + "ab" * 32,  # uppercase prefix
    "0x" + "ab" * 31 + "a ",  # whitespace (bytes.fromhex would take it)
    "0x" + "ab" * 31 + "aé",  # not ASCII
    "0x" + "ab" * 31 + "ag",  # not hex
    "0x" + "ab" * 31 + "ax",  # an x that is not the prefix
    "00" + "ab" * 32,  # no prefix
    "0x" + "ab" * 31,  # too short
    WORD + WORD[2:],  # too long
]


@pytest.mark.parametrize("bad", BAD_WORDS)
def test_one_bad_word_among_many_fails_the_bulk_check(bad: str) -> None:
    assert all_hex([WORD] * 50, 66)
    assert not all_hex([WORD] * 25 + [bad] + [WORD] * 24, 66)


def test_a_short_and_a_long_word_do_not_pass_as_two() -> None:
    assert not all_hex(["0x" + "ab" * 16, WORD + "ab" * 16], 66)
    with pytest.raises(TypeError):
        all_hex([WORD, 7], 66)  # type: ignore[list-item]


def test_quantities_are_lowercase_without_leading_zeros() -> None:
    assert quantities(["0x0", "0x1a", "0xff00"]) == [0, 26, 0xFF00]
    assert quantities([]) == []
    for bad in ("0x01", "0X1", "0x1A", "1a", "0x", "0x1,0x2", " 0x1", None, 5):
        assert quantities(["0x1", bad]) is None


def _block_with_slot(slot: str, value: str) -> dict[str, Any]:
    chain, _ = random_chain(seed=21, blocks=3)
    raw = copy.deepcopy(chain.blocks[2])
    account = next(iter(raw["StateDiff"]["post"].values()))
    account["storage"] = {WORD: WORD, slot: value}
    raw["ValidationHash"] = compute_validation_hash(raw["Header"], raw["StateDiff"])
    return raw


@pytest.mark.parametrize("bad", BAD_WORDS)
def test_a_block_with_a_malformed_slot_is_refused_naming_it(bad: str) -> None:
    with pytest.raises(VendorBlockError, match="slot: expected a lowercase 32-byte 0x hash"):
        parse_vendor_block(_block_with_slot(bad, WORD))
    with pytest.raises(VendorBlockError, match="slot value: expected a lowercase 32-byte"):
        parse_vendor_block(_block_with_slot("0x" + "cd" * 32, bad))


def test_a_well_formed_slot_is_decoded() -> None:
    block = parse_vendor_block(_block_with_slot("0x" + "00" * 31 + "07", "0x" + "00" * 31 + "2a"))
    storages = [a.storage for a in block.post.values() if a.storage]
    assert {7: 42, int(WORD, 16): int(WORD, 16)} in storages

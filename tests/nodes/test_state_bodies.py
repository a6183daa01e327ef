"""Block bodies in the state store: kept as the execution client gave them, indexed by
transaction hash, checked against the Header, pruned, rolled back and reopened with the
rest of the block."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import lmdb
import orjson
import pytest
from eth.db.trie import make_trie_root_and_nodes
from eth.vm.forks.shanghai.withdrawals import Withdrawal

from chainstate.inproc import InprocRegistry
from nodes.state.blockbody import (
    EMPTY_ROOT,
    pack,
    packed_array,
    packed_count,
    packed_item,
    stored,
    stored_count,
    unstored,
    withdrawals_root,
)
from nodes.state.service import StateNode
from nodes.state.store import DuplicateTransaction, StateStore
from nodes.state.vendor import VendorBlockError, compute_validation_hash, parse_vendor_block
from tests.nodes.test_state_chain import ChainSource, block_object, random_chain
from tests.nodes.test_state_logs import LogChain, log_chain


def open_store(path: Path, kind: str = "archive", window: int = 128) -> StateStore:
    store = StateStore(path, kind=kind, window=window, map_size_mb=64)
    store.open()
    return store


def apply_all(store: StateStore, chain: Any, start: int = 0) -> None:
    for raw in chain.blocks[start:]:
        store.apply(parse_vendor_block(raw))


def expected_body(raw: dict[str, Any]) -> dict[str, Any]:
    block = copy.deepcopy(raw["BlockFile"]["block"])
    if block["number"] == "0x0":
        block["transactions"] = []
    return {"block": block, "receipts": raw["BlockFile"]["receipts"]}


def chain_with_transactions(seed: int, blocks: int) -> LogChain:
    chain, _ = log_chain(seed=seed, blocks=blocks)
    assert sum(len(b["BlockFile"]["receipts"]) for b in chain.blocks) > blocks // 2
    return chain


def test_pack_slices_the_array_and_each_item() -> None:
    raws = [b'{"a":1}', b"[]", b'"x"', b'{"b":[1,2]}']
    blob = pack(raws)
    assert packed_count(blob) == 4
    assert packed_array(blob) == b"[" + b",".join(raws) + b"]"
    assert [packed_item(blob, i) for i in range(4)] == raws
    assert packed_item(blob, 4) is None and packed_item(blob, -1) is None
    assert packed_array(pack([])) == b"[]" and packed_item(pack([]), 0) is None
    big = pack([b'{"logsBloom":"0x%s"}' % (b"0" * 512)] * 10)
    for packed in (blob, big, pack([])):
        record = stored(packed)
        assert unstored(record) == packed and stored_count(record) == packed_count(packed)
    assert len(stored(big)) < len(big) // 10 and len(stored(blob)) == len(blob) + 1


def test_bodies_come_back_as_ingested_with_a_transaction_index(tmp_path: Path) -> None:
    chain = chain_with_transactions(seed=1, blocks=30)
    store = open_store(tmp_path)
    apply_all(store, chain)
    for height, raw in enumerate(chain.blocks):
        body = store.block_body(height)
        assert body == expected_body(raw)
        # the key order of every object is the client's
        assert orjson.dumps(body) == orjson.dumps(expected_body(raw))
        txs = raw["BlockFile"]["block"]["transactions"] if height else []
        assert store.transaction_count(height) == len(txs)
        for index, tx in enumerate(txs):
            assert store.transaction_location(tx["hash"]) == (height, index)
    assert store.block_body(30) is None
    assert store.transaction_location("0x" + "12" * 32) is None
    assert store.transaction_location("0xnothex") is None


def test_block_zero_has_no_transactions(tmp_path: Path) -> None:
    chain = chain_with_transactions(seed=2, blocks=3)
    genesis = chain.blocks[0]
    genesis["BlockFile"]["block"]["transactions"] = [
        {"hash": "0x" + "ab" * 32, "from": "0x" + "00" * 20, "to": "0x" + "11" * 20,
         "value": "0x1", "input": "0x", "synthetic": True}
    ]  # fmt: skip
    store = open_store(tmp_path)
    apply_all(store, chain)
    body = store.block_body(0)
    assert body is not None and body["block"]["transactions"] == [] and body["receipts"] == []
    assert store.transaction_location("0x" + "ab" * 32) is None


def test_a_state_node_prunes_bodies_with_its_window(tmp_path: Path) -> None:
    chain = chain_with_transactions(seed=3, blocks=40)
    store = open_store(tmp_path, kind="state", window=10)
    apply_all(store, chain)
    assert store.range() == (30, 39)
    for height, raw in enumerate(chain.blocks):
        held = height >= 30
        assert (store.block_body(height) is not None) == held, height
        for tx in raw["BlockFile"]["block"]["transactions"] if height else []:
            assert (store.transaction_location(tx["hash"]) is not None) == held
    with store.bodies() as bodies:
        assert not bodies.whole_chain()
    # nothing of the pruned blocks is left behind in the body databases
    store.close()
    env = lmdb.open(str(tmp_path), max_dbs=16, readonly=True)
    with env.begin() as txn:
        for name in (b"blocks", b"txs", b"receipts"):
            keys = list(txn.cursor(db=env.open_db(name, txn=txn)).iternext(values=False))
            assert [int.from_bytes(k, "big") for k in keys] == list(range(30, 40)), name
        held = sum(len(chain.blocks[h]["BlockFile"]["receipts"]) for h in range(30, 40))
        assert txn.stat(env.open_db(b"txhashes", txn=txn))["entries"] == held
    env.close()


def test_rollback_drops_the_body_and_a_reorg_may_move_a_transaction(tmp_path: Path) -> None:
    chain = chain_with_transactions(seed=4, blocks=20)
    store = open_store(tmp_path)
    apply_all(store, chain)
    with store.bodies() as bodies:
        assert bodies.whole_chain()
    moved = next(
        (h, r["transactionHash"])
        for h in range(19, 10, -1)
        for r in chain.blocks[h]["BlockFile"]["receipts"]
    )
    while store.range()[1] >= moved[0]:
        store.rollback()
    assert store.block_body(moved[0]) is None
    assert store.transaction_location(moved[1]) is None
    # the other fork has the same transaction one block later
    fork = chain.fork(moved[0] - 1, "side")
    fork.add_block({})
    fork.add_block({})
    fork.set_receipts(fork.blocks[-1], [{"transactionHash": moved[1], "logs": []}])
    apply_all(store, fork, start=moved[0])
    assert store.transaction_location(moved[1]) == (moved[0] + 1, 0)
    assert store.block_body(moved[0] + 1) == expected_body(fork.blocks[-1])


def test_a_transaction_held_in_another_block_is_refused(tmp_path: Path) -> None:
    chain = chain_with_transactions(seed=5, blocks=12)
    store = open_store(tmp_path)
    apply_all(store, chain)
    tx_hash = next(r["transactionHash"] for b in chain.blocks for r in b["BlockFile"]["receipts"])
    where = store.transaction_location(tx_hash)
    chain.add_block({})
    chain.set_receipts(chain.blocks[-1], [{"transactionHash": tx_hash, "logs": []}])
    with pytest.raises(DuplicateTransaction):
        store.apply(parse_vendor_block(chain.blocks[-1]))
    assert store.range() == (0, 11)
    assert store.transaction_location(tx_hash) == where


def test_a_store_from_before_bodies_holds_them_only_above_its_head(tmp_path: Path) -> None:
    chain = chain_with_transactions(seed=6, blocks=12)
    store = open_store(tmp_path)
    apply_all(store, chain)
    store.close()
    forget_bodies(tmp_path)
    store = open_store(tmp_path)
    assert store.block_body(5) is None
    chain.add_block({})
    chain.set_receipts(chain.blocks[-1], [{"transactionHash": "0x" + "42" * 32, "logs": []}])
    apply_all(store, chain, start=12)
    assert store.block_body(12) == expected_body(chain.blocks[12])
    assert store.transaction_location("0x" + "42" * 32) == (12, 0)
    with store.bodies() as bodies:
        assert not bodies.whole_chain()


def forget_bodies(path: Path) -> None:
    """Make a store what an older version left: no body databases, no `bodies_from`."""
    env = lmdb.open(str(path), max_dbs=16)
    with env.begin(write=True) as txn:
        txn.delete(b"bodies_from", db=env.open_db(b"meta", txn=txn))
        for name in (b"blocks", b"txs", b"receipts", b"txhashes"):
            txn.drop(env.open_db(name, txn=txn), delete=True)
    env.close()


def retag(raw: dict[str, Any]) -> dict[str, Any]:
    raw["ValidationHash"] = compute_validation_hash(raw["Header"], raw["StateDiff"])
    return raw


def _mutations() -> list[Any]:
    def tx(raw: dict[str, Any]) -> dict[str, Any]:
        return raw["BlockFile"]["block"]["transactions"][0]

    def receipt(raw: dict[str, Any]) -> dict[str, Any]:
        return raw["BlockFile"]["receipts"][0]

    return [
        ("no block", lambda b: b["BlockFile"].pop("block"), "BlockFile.block"),
        ("other hash", lambda b: b["BlockFile"]["block"].update(hash="0x" + "11" * 32), "hash"),
        ("other parent", lambda b: b["BlockFile"]["block"].update(parentHash="0x" + "1" * 64),
         "parentHash"),
        ("other number", lambda b: b["BlockFile"]["block"].update(number="0x99"), "number"),
        ("other root", lambda b: b["BlockFile"]["block"].update(stateRoot="0x" + "2" * 64),
         "stateRoot"),
        ("other size", lambda b: b["BlockFile"]["block"].update(size="0x1"), "size"),
        ("hashes only", lambda b: b["BlockFile"]["block"].update(
            transactions=[t["hash"] for t in b["BlockFile"]["block"]["transactions"]]),
         "full transactions"),
        ("tx of another block", lambda b: tx(b).update(blockHash="0x" + "3" * 64), "names block"),
        ("tx index", lambda b: tx(b).update(transactionIndex="0x7"), "index"),
        ("tx twice", lambda b: b["BlockFile"]["block"]["transactions"].append(tx(b)), "twice"),
        ("a receipt missing", lambda b: b["BlockFile"]["receipts"].pop(), "receipts for"),
        ("receipts swapped", lambda b: b["BlockFile"]["receipts"].reverse(), "names"),
        ("receipt of another block", lambda b: receipt(b).update(blockNumber="0x0"),
         "block number"),
        ("receipt sender", lambda b: receipt(b).update(**{"from": "0x" + "5" * 40}), "from"),
        ("receipt gas", lambda b: receipt(b).update(gasUsed="0x1"), "gasUsed"),
        ("header gas", lambda b: b["Header"].update(gasUsed="0x1")
         or b["BlockFile"]["block"].update(gasUsed="0x1"), "gas"),
        ("uncles not hashes", lambda b: b["BlockFile"]["block"].update(uncles=[1]), "uncles"),
        ("withdrawals without a root", lambda b: b["BlockFile"]["block"].update(
            withdrawals=[{"index": "0x0"}]), "withdrawalsRoot"),
    ]  # fmt: skip


@pytest.mark.parametrize(("what", "mutate", "message"), _mutations(), ids=lambda v: str(v)[:30])
def test_bodies_that_do_not_fit_the_header_are_refused(
    what: str, mutate: Any, message: str
) -> None:
    chain, _ = random_chain(seed=7, blocks=3)
    chain.add_block({})
    receipts = [{"transactionHash": "0x" + f"{i:064x}", "logs": []} for i in (1, 2, 3)]
    chain.set_receipts(chain.blocks[-1], receipts)
    raw = copy.deepcopy(chain.blocks[-1])
    parse_vendor_block(raw)
    mutate(raw)
    with pytest.raises(VendorBlockError, match=message):
        parse_vendor_block(retag(raw))


def test_empty_lists_need_the_empty_roots_and_withdrawals_their_root() -> None:
    chain, _ = random_chain(seed=8, blocks=2)
    raw = copy.deepcopy(chain.blocks[1])
    raw["Header"]["transactionsRoot"] = "0x" + "12" * 32
    raw["BlockFile"]["block"] = block_object(raw["Header"], [])
    with pytest.raises(VendorBlockError, match="transactionsRoot"):
        parse_vendor_block(retag(raw))
    # the root as py-evm computes it, for a few withdrawals
    withdrawals = [
        {"index": hex(i), "validatorIndex": hex(7 * i + 1), "address": "0x" + f"{i:02x}" * 20,
         "amount": hex(10**9 * i + 5)}
        for i in range(20)
    ]  # fmt: skip
    theirs = make_trie_root_and_nodes(
        tuple(Withdrawal(i, 7 * i + 1, bytes([i]) * 20, 10**9 * i + 5) for i in range(20))
    )[0]
    assert withdrawals_root(withdrawals, "test") == "0x" + theirs.hex()
    raw = copy.deepcopy(chain.blocks[1])
    raw["Header"]["withdrawalsRoot"] = "0x" + theirs.hex()
    raw["BlockFile"]["block"] = block_object(raw["Header"], []) | {"withdrawals": withdrawals}
    assert parse_vendor_block(retag(raw)).body is not None
    raw["BlockFile"]["block"]["withdrawals"] = [*withdrawals[:-1], withdrawals[0]]
    with pytest.raises(VendorBlockError, match="withdrawalsRoot"):
        parse_vendor_block(raw)
    raw["Header"]["withdrawalsRoot"] = EMPTY_ROOT
    raw["BlockFile"]["block"] = block_object(raw["Header"], []) | {"withdrawals": []}
    assert parse_vendor_block(retag(raw)).body is not None


async def test_a_node_from_before_bodies_fills_them_in_from_its_source(tmp_path: Path) -> None:
    chain = chain_with_transactions(seed=9, blocks=30)
    store = open_store(tmp_path / "old" / "lmdb")
    apply_all(store, chain.fork(19, "main"))
    store.close()
    forget_bodies(tmp_path / "old" / "lmdb")
    source = ChainSource(chain)
    source.fail = True  # the old blocks cannot be fetched yet
    registry = InprocRegistry()
    registry.register("writer", source.handle_body)
    section = {"key": "old", "kind": "archive", "source": "inproc://writer",
               "poll_interval": 0.02, "backoff_initial": 0.02, "backoff_max": 0.05}  # fmt: skip
    node = StateNode.from_config(section, data_dir=tmp_path / "old", registry=registry)
    await node.start()
    try:
        answer = orjson.loads(await node.handle_body(orjson.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": "eth_getBlockByNumber", "params": ["0x5", True]}
        )))  # fmt: skip
        assert answer["error"]["code"] == -39006 and "body" in answer["error"]["message"]
        source.fail = False
        await node.ingest.wait_for_height(chain.head, within=30)
        for _ in range(500):
            if node.body_backfill.done:
                break
            await asyncio.sleep(0.02)
        assert node.body_backfill.done
        for height, raw in enumerate(chain.blocks):
            assert node.store.block_body(height) == expected_body(raw), height
        with node.store.bodies() as bodies:
            assert bodies.whole_chain()
    finally:
        await node.close()


def _lenient_forms() -> list[Any]:
    """Fields an execution client may write another way than the Header does, and that the
    node accepts as the same value."""

    def txs(raw: dict[str, Any]) -> list[dict[str, Any]]:
        return raw["BlockFile"]["block"]["transactions"]

    def receipts(raw: dict[str, Any]) -> list[dict[str, Any]]:
        return raw["BlockFile"]["receipts"]

    return [
        lambda b: txs(b)[-1].update(blockNumber="0x0" + b["Header"]["number"][2:]),
        lambda b: receipts(b)[0].update(blockNumber=b["Header"]["number"].upper()),
        lambda b: txs(b)[1].update(transactionIndex="0x01"),
        lambda b: receipts(b)[-1].update(**{"from": receipts(b)[-1]["from"].upper()}),
        lambda b: [r.pop("gasUsed") for r in receipts(b)],
        lambda b: receipts(b)[0].update(cumulativeGasUsed="0X" + receipts(b)[0]["gasUsed"][2:]),
    ]


@pytest.mark.parametrize("mutate", _lenient_forms())
def test_fields_written_another_way_are_the_same_body(mutate: Any) -> None:
    chain = chain_with_transactions(seed=9, blocks=12)
    raw = next(b for b in chain.blocks[1:] if len(b["BlockFile"]["receipts"]) > 1)
    before = parse_vendor_block(raw).body
    assert before is not None
    raw = copy.deepcopy(raw)
    mutate(raw)
    after = parse_vendor_block(retag(raw)).body
    assert after is not None and after.tx_hashes == before.tx_hashes
    assert packed_count(unstored(after.receipts)) == packed_count(unstored(before.receipts))

"""The state store against a dict model: reads at every height, pruning, reorgs, rejects."""

from __future__ import annotations

import asyncio
import copy
import random
from pathlib import Path

import pytest

from chainstate.jsonrpc import BLOCK_NOT_FOUND, JsonRpcError
from nodes.state.store import (
    FORMAT,
    META_FORMAT,
    OutOfOrder,
    ParentMismatch,
    PreStateMismatch,
    ReorgTooDeep,
    StateStore,
    StoreError,
)
from nodes.state.vendor import (
    VendorBlockError,
    compute_validation_hash,
    parse_vendor_block,
)
from tests.nodes.test_state_chain import Account, SyntheticChain, random_chain


def open_store(path: Path, kind: str = "archive", window: int = 128) -> StateStore:
    store = StateStore(path, kind=kind, window=window, map_size_mb=64)
    store.open()
    return store


def apply_all(store: StateStore, chain: SyntheticChain, start: int = 0) -> None:
    for raw in chain.blocks[start:]:
        store.apply(parse_vendor_block(raw))


def assert_state(store: StateStore, chain: SyntheticChain, height: int, addrs: list[str]) -> None:
    model = chain.state(height)
    for addr in addrs:
        acct = model.get(addr, Account())
        assert store.balance(addr, height) == acct.balance, (addr, height)
        assert store.nonce(addr, height) == acct.nonce, (addr, height)
        assert store.code(addr, height) == acct.code, (addr, height)
        for slot in range(6):
            assert store.storage(addr, slot, height) == acct.storage.get(slot, 0), (addr, slot)


def test_reads_at_every_height_match_the_model(tmp_path: Path) -> None:
    chain, addrs = random_chain(seed=11, blocks=200)
    store = open_store(tmp_path)
    apply_all(store, chain)
    assert store.range() == (0, 199)
    for height in range(200):
        assert_state(store, chain, height, addrs)
        info = store.header(height)
        assert info.hash == chain.blocks[height]["Header"]["hash"]
        assert store.height_of(info.hash) == height
    # an account never touched reads as empty
    assert store.balance("0x" + "ab" * 20, 100) == 0
    assert store.code("0x" + "ab" * 20, 100) == b""


def test_reads_outside_the_range_are_block_not_found(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    with pytest.raises(JsonRpcError) as err:
        store.range()
    assert err.value.code == BLOCK_NOT_FOUND
    chain, addrs = random_chain(seed=12, blocks=5)
    apply_all(store, chain)
    for height in (5, 6, 10**12):
        with pytest.raises(JsonRpcError) as err:
            store.balance(addrs[0], height)
        assert err.value.code == BLOCK_NOT_FOUND
        assert "outside this node's range [0, 4]" in err.value.message


def test_state_kind_keeps_a_window_and_prunes_older_versions(tmp_path: Path) -> None:
    chain, addrs = random_chain(seed=13, blocks=150)
    store = open_store(tmp_path, kind="state", window=16)
    apply_all(store, chain)
    assert store.range() == (134, 149)
    for height in range(134, 150):
        assert_state(store, chain, height, addrs)
    with pytest.raises(JsonRpcError) as err:
        store.balance(addrs[0], 133)
    assert err.value.code == BLOCK_NOT_FOUND
    # Each field keeps at most window + 1 versions (the newest at or below earliest).
    counts: dict[bytes, int] = {}
    with store._reading() as txn:
        for db in (store._acct, store._ver):
            for key, _ in txn.cursor(db=db):
                counts[key[:-8]] = counts.get(key[:-8], 0) + 1
    assert counts and max(counts.values()) <= 17
    # Hashes stay known below the window (blockIsValid), headers do not.
    assert store.height_of(chain.blocks[3]["Header"]["hash"]) == 3
    assert store.hash_at(3) is None
    assert [v["height"] for v in store.validations(0, 1000)] == list(range(134, 150))


def test_an_archive_node_keeps_all_history(tmp_path: Path) -> None:
    chain, addrs = random_chain(seed=14, blocks=60)
    store = open_store(tmp_path, kind="archive", window=4)
    apply_all(store, chain)
    assert store.range() == (0, 59)
    assert_state(store, chain, 1, addrs)


def test_rollback_restores_the_exact_prior_answers(tmp_path: Path) -> None:
    chain, addrs = random_chain(seed=15, blocks=60)
    side = chain.fork(40, "side")
    rng = random.Random(5)
    for _ in range(25):
        side.add_random_block(rng, addrs)
    store = open_store(tmp_path, kind="state", window=32)
    apply_all(store, chain)
    with pytest.raises(OutOfOrder):
        store.apply(parse_vendor_block(side.blocks[41]))
    while store.range()[1] > 41:
        store.rollback()
    # The side chain's block 42 does not fit on the main chain's block 41.
    with pytest.raises(ParentMismatch):
        store.apply(parse_vendor_block(side.blocks[42]))
    assert store.rollback() == 40
    assert store.range() == (28, 40)
    for height in range(28, 41):
        assert_state(store, chain, height, addrs)
    assert store.height_of(chain.blocks[45]["Header"]["hash"]) is None
    apply_all(store, side, start=41)
    assert store.range()[1] == side.head
    for height in range(store.range()[0], side.head + 1):
        assert_state(store, side, height, addrs)
    assert store.height_of(side.blocks[50]["Header"]["hash"]) == 50


def test_rollback_stops_at_the_earliest_block(tmp_path: Path) -> None:
    chain, _ = random_chain(seed=16, blocks=20)
    store = open_store(tmp_path, kind="state", window=4)
    apply_all(store, chain)
    for _ in range(3):
        store.rollback()
    with pytest.raises(ReorgTooDeep):
        store.rollback()
    assert store.range() == (16, 16)


def test_blocks_that_do_not_fit_change_nothing(tmp_path: Path) -> None:
    chain, addrs = random_chain(seed=17, blocks=12)
    store = open_store(tmp_path)
    with pytest.raises(OutOfOrder):
        store.apply(parse_vendor_block(chain.blocks[1]))
    apply_all(store, chain)
    with pytest.raises(OutOfOrder):
        store.apply(parse_vendor_block(chain.blocks[5]))
    # A block whose pre disagrees with the stored state is refused as a whole.
    chain.add_block({addrs[0]: {"balance": 12345}, addrs[1]: {"storage": {2: 99}}})
    bad = copy.deepcopy(chain.blocks[-1])
    bad["StateDiff"]["pre"][addrs[1]]["storage"] = {"0x" + "00" * 31 + "02": "0x" + "11" * 32}
    bad["ValidationHash"] = compute_validation_hash(bad["Header"], bad["StateDiff"])
    with pytest.raises(PreStateMismatch):
        store.apply(parse_vendor_block(bad))
    assert store.range() == (0, 11)
    assert store.balance(addrs[0], 11) == chain.state(11)[addrs[0]].balance
    store.apply(parse_vendor_block(chain.blocks[-1]))
    assert store.balance(addrs[0], 12) == 12345
    assert store.storage(addrs[1], 2, 12) == 99


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b["Header"].update(number="0x01"),
        lambda b: b["Header"].update(hash="0xABC"),
        lambda b: b["Header"].pop("parentHash"),
        lambda b: b.update(ValidationHash="0x" + "11" * 32),
        lambda b: b["StateDiff"].update(post={"0xnotanaddress": {}}),
        lambda b: b["StateDiff"].update(post={"0x" + "aa" * 20: {"balance": "12"}}),
        lambda b: b["StateDiff"].update(post={"0x" + "aa" * 20: {"storage": {"0x1": "0x2"}}}),
        lambda b: b["StateDiff"].update(post={"0x" + "aa" * 20: {"colour": "0x1"}}),
        lambda b: b.pop("Header"),
    ],
)
def test_malformed_vendor_blocks_are_rejected(mutate: object) -> None:
    chain, _ = random_chain(seed=18, blocks=2)
    raw = copy.deepcopy(chain.blocks[1])
    mutate(raw)  # type: ignore[operator]
    with pytest.raises(VendorBlockError):
        parse_vendor_block(raw)


def test_store_survives_reopen_and_refuses_state_to_archive(tmp_path: Path) -> None:
    chain, addrs = random_chain(seed=19, blocks=30)
    store = open_store(tmp_path, kind="state", window=10)
    apply_all(store, chain)
    store.close()
    with pytest.raises(JsonRpcError):
        store.range()
    again = open_store(tmp_path, kind="state", window=10)
    assert again.range() == (20, 29)
    assert_state(again, chain, 25, addrs)
    again.close()
    with pytest.raises(Exception, match="cannot be reopened as `archive`"):
        open_store(tmp_path, kind="archive")


def test_validations_for_the_checker(tmp_path: Path) -> None:
    chain, _ = random_chain(seed=20, blocks=10)
    store = open_store(tmp_path)
    apply_all(store, chain)
    got = store.validations(3, 4)
    assert [v["height"] for v in got] == [3, 4, 5, 6]
    assert got[0] == {
        "height": 3,
        "id": chain.blocks[3]["Header"]["hash"],
        "parent_id": chain.blocks[2]["Header"]["hash"],
        "validation_hash": chain.blocks[3]["ValidationHash"],
    }
    assert store.validations(8, 100)[-1]["height"] == 9
    assert store.validations(10, 5) == []


def test_a_failure_in_the_middle_of_a_block_leaves_no_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chain, addrs = random_chain(seed=21, blocks=40)
    store = open_store(tmp_path, kind="state", window=8)
    apply_all(store, chain.fork(30, "x"))

    def crash(*args: object) -> None:
        raise OSError("disk on fire")  # after every version of the block was written

    monkeypatch.setattr(store, "_prune", crash)
    with pytest.raises(OSError):
        store.apply(parse_vendor_block(chain.blocks[31]))
    monkeypatch.undo()
    assert store.range() == (23, 30)
    assert store.hash_at(31) is None
    assert store.height_of(chain.blocks[31]["Header"]["hash"]) is None
    for height in range(23, 31):
        assert_state(store, chain, height, addrs)
    apply_all(store, chain, start=31)
    for height in range(32, 40):
        assert_state(store, chain, height, addrs)


def test_snapshots_see_their_own_bounds_while_blocks_commit(tmp_path: Path) -> None:
    """A snapshot's bounds are read from the store once per commit and cached: a snapshot
    taken while another thread applies, prunes and rolls back blocks must still carry the
    bounds its own read transaction sees."""
    import threading

    chain, _ = random_chain(seed=41, blocks=400)
    store = open_store(tmp_path, kind="state", window=16)
    store.apply(parse_vendor_block(chain.blocks[0]))
    done = threading.Event()

    def write() -> None:
        try:
            for i, raw in enumerate(chain.blocks[1:], start=1):
                store.apply(parse_vendor_block(raw))
                if i % 50 == 0:
                    store.rollback()
                    store.apply(parse_vendor_block(raw))
        finally:
            done.set()

    writer = threading.Thread(target=write)
    writer.start()
    seen = set()
    try:
        while not done.is_set() or len(seen) < 2:
            snap = store.snapshot()
            try:
                assert snap.bounds == store._bounds(snap.txn)
                seen.add(snap.bounds)
            finally:
                snap.close()
            if done.is_set():
                break
    finally:
        writer.join()
    assert len(seen) > 10  # snapshots were taken between many different commits
    snap = store.snapshot()
    assert snap.bounds == store._bounds(snap.txn) == (400 - 16, 399)
    snap.close()


async def test_a_read_after_a_commit_sees_the_new_block(tmp_path: Path) -> None:
    """On the event loop, reads between two writes share one kept read transaction; a
    commit (here from another thread, as ingest does) must end it: the next read sees the
    new block, and the old version is not held by any reader once the loop has run."""
    chain, addrs = random_chain(seed=43, blocks=12)
    store = open_store(tmp_path, kind="state", window=4)
    try:
        apply_all(store, chain, start=0)
        chain.add_block({addrs[0]: {"balance": 10**20 + 7}})
        first = store.snapshot()
        assert first.bounds == (8, 11)
        first.close()
        again = store.snapshot()
        assert again is first  # no write since: the same transaction
        again.close()
        other = await asyncio.to_thread(store.snapshot)  # another thread: its own
        assert other is not first and other.bounds == first.bounds
        other.close()
        await asyncio.to_thread(store.apply, parse_vendor_block(chain.blocks[12]))
        after = store.snapshot()
        try:
            assert after is not first
            assert after.bounds == (9, 12)
            balance = after.value(bytes.fromhex(addrs[0][2:]) + b"\x01", 12)
            assert balance == (10**20 + 7).to_bytes(9, "big")
        finally:
            after.close()
        assert store.balance(addrs[0], 12) == 10**20 + 7
        await asyncio.to_thread(store.rollback)
        assert store.snapshot().bounds == (9, 11)
        with pytest.raises(JsonRpcError) as exc:
            store.balance(addrs[0], 12)
        assert exc.value.code == BLOCK_NOT_FOUND
        # a commit with no read after it: the loop ends the kept transaction itself
        await asyncio.to_thread(store.apply, parse_vendor_block(chain.blocks[12]))
        for _ in range(3):
            await asyncio.sleep(0)
        assert _reader_count(store) == 0
    finally:
        store.close()


async def test_loop_reads_never_see_a_version_older_than_the_last_commit(
    tmp_path: Path,
) -> None:
    """While another thread applies blocks, every snapshot the loop takes is consistent
    (its bounds are its transaction's) and at least as new as the last commit that
    returned before it was taken."""
    import threading

    chain, _ = random_chain(seed=44, blocks=300)
    store = open_store(tmp_path, kind="state", window=16)
    store.apply(parse_vendor_block(chain.blocks[0]))
    committed = [0]
    done = threading.Event()

    def write() -> None:
        try:
            for i, raw in enumerate(chain.blocks[1:], start=1):
                store.apply(parse_vendor_block(raw))
                committed[0] = i
        finally:
            done.set()

    writer = threading.Thread(target=write)
    writer.start()
    heads = set()
    try:
        while not done.is_set():
            before = committed[0]
            snap = store.snapshot()
            try:
                assert snap.bounds is not None
                assert snap.bounds == store._bounds(snap.txn)
                assert snap.bounds[1] >= before
                heads.add(snap.bounds[1])
            finally:
                snap.close()
            await asyncio.sleep(0)
    finally:
        writer.join()
    assert len(heads) > 10
    snap = store.snapshot()
    assert snap.bounds == (300 - 16, 299)
    snap.close()
    store.close()


def test_snapshots_outside_a_loop_are_their_own(tmp_path: Path) -> None:
    chain, _ = random_chain(seed=45, blocks=3)
    store = open_store(tmp_path)
    try:
        apply_all(store, chain)
        first = store.snapshot()
        second = store.snapshot()
        assert first is not second
        first.close()
        second.close()
        assert _reader_count(store) == 0
    finally:
        store.close()


def _reader_count(store: StateStore) -> int:
    """How many reader slots hold a transaction (LMDB's reader table, as `mdb_stat -r`
    lists it): a slot left open keeps the pages of its version from reuse."""
    assert store._env is not None
    lines = store._env.readers().strip().splitlines()[1:]  # (a header line first)
    return sum(1 for line in lines if line.split()[-1] != "-")


def _as_format_1(store: StateStore) -> None:
    """Put the store back in format 1: every account field's version in `versions`, no
    `format` in `meta` (what a store written before the accounts' own database holds)."""

    def back(txn: object) -> None:
        moved = list(txn.cursor(db=store._acct))  # type: ignore[attr-defined]
        txn.cursor(db=store._ver).putmulti(moved)  # type: ignore[attr-defined]
        txn.drop(store._acct, delete=False)  # type: ignore[attr-defined]
        txn.delete(META_FORMAT, db=store._meta)  # type: ignore[attr-defined]

    store.write(back)


def test_a_store_of_the_earlier_format_is_moved_to_this_one_when_opened(tmp_path: Path) -> None:
    chain, addrs = random_chain(seed=21, blocks=40)
    store = open_store(tmp_path / "s")
    apply_all(store, chain)
    with store._reading() as txn:
        accounts = txn.stat(store._acct)["entries"]
    assert accounts > 0
    _as_format_1(store)
    store.close()
    reader = StateStore(tmp_path / "s", map_size_mb=64)
    with pytest.raises(StoreError, match="format is 1, this program reads 2: open it once"):
        reader.open_readonly()  # (an EVM worker cannot move it: it does not write)
    store = open_store(tmp_path / "s")
    with store._reading() as txn:
        assert txn.stat(store._acct)["entries"] == accounts
        assert all(len(key) == 61 for key, _ in txn.cursor(db=store._ver))
        assert txn.get(META_FORMAT, db=store._meta) == str(FORMAT).encode()
    for height in range(0, 40, 3):
        assert_state(store, chain, height, addrs)
    apply_all(store, random_chain(seed=21, blocks=45)[0], start=40)  # and it takes blocks on
    store.close()
    reader.open_readonly()
    assert reader.snapshot().value(bytes.fromhex(addrs[0][2:]) + b"\x01", 44) is not None


def test_a_store_of_a_newer_format_is_refused(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    apply_all(store, random_chain(seed=22, blocks=3)[0])
    store.write(lambda txn: txn.put(META_FORMAT, b"3", db=store._meta))
    store.close()
    with pytest.raises(StoreError, match="format is 3, newer than this program's"):
        open_store(tmp_path / "s")
    with pytest.raises(StoreError, match="format is 3, newer"):
        StateStore(tmp_path / "s", map_size_mb=64).open_readonly()

"""A worker's direct reads of the store (`worker.StoreReads`), which keep account values with
the heights they hold for: in another process than the store's writer, as a worker reads,
their answers equal the model's at every height, in any order, after new blocks and after
reorgs."""

from __future__ import annotations

import multiprocessing
import random
from pathlib import Path
from typing import Any

from nodes.state.store import StateStore
from nodes.state.vendor import parse_vendor_block
from tests.nodes.test_state_chain import SyntheticChain, random_chain


def serve(conn: Any, path: str) -> None:
    """The reader's process: answer (addresses, heights) with the accounts read at each."""
    from nodes.state.evm.worker import StoreReads

    reads = StoreReads(path, 64)
    while (asked := conn.recv()) is not None:
        addresses, heights = asked
        conn.send([reads.preload(addresses, [], h)[0] for h in heights])


def expected(chain: SyntheticChain, addresses: list[str], height: int) -> list[Any]:
    state = chain.state(height)
    out = []
    for address in addresses:
        account = state.get(address)
        out.append(
            (0, 0, b"") if account is None else (account.balance, account.nonce, account.code)
        )
    return out


def test_kept_account_values_follow_new_blocks_and_reorgs(tmp_path: Path) -> None:
    rng = random.Random(7)
    chain, addresses = random_chain(7, 14, accounts=6)
    store = StateStore(tmp_path / "lmdb", kind="archive", map_size_mb=64)
    store.open()
    for raw in chain.blocks[:9]:
        store.apply(parse_vendor_block(raw))
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    reader = ctx.Process(target=serve, args=(theirs, str(tmp_path / "lmdb")), daemon=True)
    reader.start()

    def check(model: SyntheticChain, head: int) -> None:
        heights = [h for h in range(head + 1) for _ in range(3)]
        rng.shuffle(heights)  # each height several times, in any order: kept values serve
        ours.send((addresses, heights))
        for height, got in zip(heights, ours.recv(), strict=True):
            assert got == expected(model, addresses, height), height

    try:
        check(chain, 8)
        for raw in chain.blocks[9:12]:  # values read at head 8 with no later version
            store.apply(parse_vendor_block(raw))  # must not answer for 9..11
        check(chain, 11)
        fork = chain.fork(7, "other")
        for _ in range(6):
            fork.add_random_block(rng, addresses)
        store.replace(4, [parse_vendor_block(raw) for raw in fork.blocks[8:]])
        check(fork, fork.head)
        store.rollback()  # the head replaced by another block at the same height
        other = fork.fork(fork.head - 1, "third")
        other.add_random_block(rng, addresses)
        store.apply(parse_vendor_block(other.blocks[-1]))
        check(other, other.head)
    finally:
        ours.send(None)
        reader.join(10)
        store.close()

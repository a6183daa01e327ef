"""How jobs travel to an EVM worker (nodes/state/evm/wire.py): each block env once, jobs
and calls compact, and a worker never runs a call with another block's env."""

from __future__ import annotations

import contextlib
import dataclasses
import pickle
import random
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench.nodecalls import CALLER, blocks
from nodes.state.evm.wire import HeldEnvs, WorkerEnvs, pack, unpack
from nodes.state.service import StateNode
from nodes.state.vendor import AccountDiff, VendorBlock


def env(height: int, tag: str = "00") -> dict[str, Any]:
    return {
        "number": height,
        "hash": "0x" + tag * 31 + f"{height:02x}",
        "timestamp": 1_700_000_000 + height,
        "coinbase": "0x" + "00" * 20,
        "basefee": 7,
        "gas_limit": 30_000_000,
        "prevrandao": "0x" + "00" * 32,
        "difficulty": 0,
        "excess_blob_gas": None,
    }


def call(data: bytes) -> dict[str, Any]:
    return {
        "from": "0x" + "03" * 20,
        "to": "0x" + "01" * 20,
        "data": data,
        "value": 0,
        "gas": 30_000_000,
        "max_fee": 0,
        "tip": None,
        "nonce": None,
        "chain_id": None,
        "access_list": [],
    }


def job(block: dict[str, Any], *calls: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "kind": "calls",
        "fork_url": "http://127.0.0.1:1",
        "height": block["number"],
        "block": block,
        "chain_id": 1337,
        "spec_id": "Cancun",
        "calls": list(calls),
        "store": ["/nowhere", 64],
        **extra,
    }


def sent(wire: tuple[Any, ...], held: WorkerEnvs) -> dict[str, Any]:
    """What the worker reads: the wire through pickle, unpacked."""
    return unpack(pickle.loads(pickle.dumps(wire, pickle.HIGHEST_PROTOCOL)), held)


def test_a_job_arrives_as_it_was_sent_and_its_env_goes_once() -> None:
    held, worker = HeldEnvs(), WorkerEnvs()
    a, b = env(5), env(6)
    groups = {"kind": "groups", "jobs": [job(a, call(b"\x01")), job(b, call(b"\x02"))]}
    first = pack(groups, held)
    assert sent(first, worker) == groups
    again = pack(groups, held)
    assert again[1] is None  # no env sent again
    assert len(pickle.dumps(again)) < len(pickle.dumps(first))
    got = sent(again, worker)
    assert got == groups
    single = job(a, call(b"\x03"), call(b"\x04"))
    assert sent(pack(single, held), worker) == single


def test_odd_jobs_and_calls_arrive_unchanged() -> None:
    """A job with other keys than the usual (an overlay's, a trace's) and a call with other
    fields (long calldata handed over as hex) go as they are, their env still named."""
    held, worker = HeldEnvs(), WorkerEnvs()
    odd_call = {**call(b""), "hex": ("request.data", None)}
    odd = job(env(7), call(b"\x01"), odd_call, fresh=True)
    no_store = job(env(8), call(b"\x02"))
    del no_store["store"]
    for one in (odd, no_store, {"kind": "groups", "jobs": [odd, no_store]}):
        assert sent(pack(one, held), worker) == one


def test_plain_and_other_groups_in_one_job_arrive_as_they_were_sent() -> None:
    """Single plain calls travel as their own fields only; a group that differs from the
    job's first in any way (value, fee, access list, state URL, store, two calls) goes
    whole, and every group arrives equal to what was sent."""
    held, worker = HeldEnvs(), WorkerEnvs()
    plain = job(env(1), call(b"\x01"))
    others = [
        job(env(2), {**call(b"\x02"), "value": 5}),
        job(env(3), {**call(b"\x03"), "max_fee": 9, "tip": 1}),
        job(env(4), {**call(b"\x04"), "access_list": [("0x" + "07" * 20, [1])]}),
        {**job(env(5), call(b"\x05")), "fork_url": "http://127.0.0.1:2"},
        {**job(env(6), call(b"\x06")), "store": ["/elsewhere", 64]},
        job(env(7), call(b"\x07"), call(b"\x08")),
        job(env(8), {**call(b"\x09"), "nonce": 3, "chain_id": 1337}),
    ]
    groups = {"kind": "groups", "jobs": [plain, *others, job(env(9), call(b"\x0a"))]}
    wire = pack(groups, held)
    assert [len(g) if g.__class__ is tuple else None for g in wire[3]] == [6, *[8] * 7, 6]
    assert sent(wire, worker) == groups


def test_groups_with_the_usual_number_of_keys_but_others_go_whole() -> None:
    """A group or call with as many keys as the usual but one of them another (long
    calldata's `hex` in place of `data`, `fresh` in place of `store`) is not plain: it goes
    whole and arrives as it was sent."""
    held, worker = HeldEnvs(), WorkerEnvs()
    swapped = call(b"\x01")
    del swapped["data"]
    swapped["hex"] = ("request.data", b"0x01")
    fresh = job(env(2), call(b"\x02"), fresh=True)
    del fresh["store"]
    first = job(env(1), swapped)
    for one in (first, fresh):
        assert len(one) == 8 and len(one["calls"][0]) == 10
    groups = {"kind": "groups", "jobs": [job(env(3), call(b"\x03")), first, fresh]}
    wire = pack(groups, held)
    assert [len(g) if g.__class__ is tuple else None for g in wire[3]] == [6, 8, None]
    assert sent(wire, worker) == groups


def test_a_worker_drops_the_envs_the_node_stops_holding() -> None:
    held, worker = HeldEnvs(size=2), WorkerEnvs()
    envs = [env(h) for h in range(4)]
    for e in envs:
        sent(pack(job(e, call(b"")), held), worker)
    assert set(worker.envs) == set(held.held) == {id(envs[2]), id(envs[3])}
    # the first is sent again when named again (and the oldest held dropped for it)
    wire = pack(job(envs[0], call(b"")), held)
    assert wire[1] == {id(envs[0]): envs[0]} and wire[2] == [id(envs[2])]
    assert sent(wire, worker)["block"] == envs[0]
    assert set(worker.envs) == {id(envs[3]), id(envs[0])}


def test_a_job_never_drops_an_env_it_names() -> None:
    held, worker = HeldEnvs(size=1), WorkerEnvs()
    envs = [env(h) for h in range(3)]
    groups = {"kind": "groups", "jobs": [job(e, call(b"")) for e in envs]}
    assert sent(pack(groups, held), worker) == groups
    assert sent(pack(groups, held), worker) == groups


def test_a_new_env_at_a_known_height_is_sent_not_taken_from_the_old() -> None:
    """After a reorg the node builds a new env dict for the height (another hash, another
    timestamp): it goes to the worker, which runs with it, never with the old one."""
    held, worker = HeldEnvs(), WorkerEnvs()
    old = env(9, "aa")
    assert sent(pack(job(old, call(b"")), held), worker)["block"] == old
    new = {**env(9, "bb"), "timestamp": 1_800_000_000}
    got = sent(pack(job(new, call(b"")), held), worker)
    assert got["block"] == new and got["block"]["hash"] != old["hash"]


def test_an_env_the_worker_was_never_sent_is_an_error() -> None:
    held = HeldEnvs()
    wire = pack(job(env(3), call(b"")), held)
    with pytest.raises(KeyError):
        sent((wire[0], None, *wire[2:]), WorkerEnvs())


# PUSH1 0; CALLDATALOAD; SLOAD; TIMESTAMP; ADD; PUSH1 0; MSTORE; PUSH1 32; PUSH1 0; RETURN:
# a slot plus the block's timestamp (its state and its env in one answer)
SLOT_AND_TIME = bytes.fromhex("6000355442016000526020" + "6000f3")
TARGET = "0x" + "05" * 20


def chain(count: int) -> list[VendorBlock]:
    out = blocks(count, random.Random(3))
    post = {**out[0].post, TARGET: AccountDiff(code=SLOT_AND_TIME, storage={1: 1000})}
    out[0] = dataclasses.replace(out[0], post=post)
    return out


def replaced(block: VendorBlock, slot_value: int, timestamp: int) -> VendorBlock:
    """Another block at the same height: another hash, timestamp and slot value."""
    block_hash = "0x" + "ee" * 31 + f"{block.number % 256:02x}"
    header = {**block.header, "hash": block_hash, "timestamp": hex(timestamp)}
    post = {TARGET: AccountDiff(storage={1: slot_value})}
    return dataclasses.replace(block, hash=block_hash, header=header, post=post)


async def eth_call(node: StateNode, height: int, overrides: dict | None = None) -> int:
    data = "0x" + (1).to_bytes(32, "big").hex()
    params: list[Any] = [{"from": CALLER, "to": TARGET, "data": data}, hex(height)]
    if overrides is not None:
        params += [None, overrides]
    body = {"jsonrpc": "2.0", "id": 1, "method": "eth_call", "params": params}
    answer = orjson.loads(await node.handle_body(orjson.dumps(body)))
    assert "result" in answer, answer
    return int(answer["result"], 16)


@contextlib.asynccontextmanager
async def started(**evm: Any) -> AsyncIterator[StateNode]:
    with tempfile.TemporaryDirectory() as tmp:
        section = {"kind": "archive", "chain_id": 1337, "map_size_mb": 64, "evm": evm}
        node = StateNode.from_config(section, data_dir=Path(tmp))
        await node.start()
        try:
            yield node
        finally:
            await node.close()


@pytest.mark.parametrize("answers", [256, 0])
async def test_calls_after_a_reorg_run_on_the_new_block_env_and_state(answers: int) -> None:
    """Through the node's workers: a height called before and after its block is replaced
    answers from the new block (its timestamp and state), though each worker holds the
    old block's env, a warm EVM of it and (`warm_answers`) the answer of the same call."""
    async with started(warm_answers=answers) as node:
        built = chain(6)
        for block in built:
            await node.ingest._apply(block)
        head = built[-1]
        start = int(head.header["timestamp"], 16)
        for _ in range(4):  # every worker has the block warm
            assert await eth_call(node, head.number) == 1000 + start
            assert await eth_call(node, head.number - 1) == 1000 + start - 1
        await node.ingest._rollback()
        await node.ingest._apply(replaced(head, 2000, start + 77))
        for _ in range(4):
            assert await eth_call(node, head.number) == 2000 + start + 77
            assert await eth_call(node, head.number - 1) == 1000 + start - 1


async def test_a_call_with_block_overrides_is_not_answered_as_without() -> None:
    """The same call at the same block, answered and kept by the worker, then with another
    timestamp (blockOverrides): run with that env, and the plain one answered as before."""
    async with started() as node:
        for block in chain(4):
            await node.ingest._apply(block)
        height = 2
        plain = await eth_call(node, height)
        for _ in range(3):
            assert await eth_call(node, height) == plain
            later = await eth_call(node, height, {"time": hex(1_900_000_000)})
            assert later == 1000 + 1_900_000_000
            assert await eth_call(node, height) == plain

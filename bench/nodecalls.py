"""eth_call through the state node's handler alone, in process: `python -m
bench.nodecalls` (pin it with `taskset -c 1` to see one core's worth).

Builds a store of synthetic blocks holding two contracts — a one-slot read (returns the slot
named by its calldata, the shape of an ERC20 `balanceOf`) and the 64-slot view of
`bench/contracts.py` — with slots rewritten block after block, starts a state node on it
(EVM workers and feed process as in production, no HTTP server), and keeps `--concurrency`
eth_calls in flight through `StateNode.handle_body` for each case: at latest and at random
old heights, single calls and batches of 10. Prints calls/s; `--profile FILE` writes a
cProfile of the node's process for the whole run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import os
import random
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import psutil
from Crypto.Hash import keccak

from bench.contracts import VIEW_RUNTIME
from bench.services import cpu_seconds
from nodes.state.service import StateNode
from nodes.state.vendor import AccountDiff, VendorBlock

# PUSH1 0; CALLDATALOAD; SLOAD; PUSH1 0; MSTORE; PUSH1 32; PUSH1 0; RETURN
ONE_SLOT_RUNTIME = bytes.fromhex("600035546000526020" + "6000f3")
ONE_SLOT = "0x" + "01" * 20
VIEW = "0x" + "02" * 20
CALLER = "0x" + "03" * 20
ERC20 = "0x" + "04" * 20  # OpenZeppelin's ERC20 (`erc20=True`), nonce 1 as once deployed
HOLDERS = 64
BALANCE_OF = "70a08231"  # balanceOf(address)


def holder(i: int) -> bytes:
    """The i-th ERC20 holder's address, as a 32-byte word."""
    return (0x1000 + i).to_bytes(32, "big")


def balance_slot(i: int) -> int:
    """The i-th holder's slot in OpenZeppelin ERC20's `_balances` (mapping at slot 0)."""
    return int.from_bytes(keccak.new(digest_bits=256, data=holder(i) + bytes(32)).digest(), "big")


def erc20_runtime() -> bytes:
    """OpenZeppelin ERC20's runtime code (ERC20PresetFixedSupply: no immutables)."""
    from nodes.devnet.anvil import ensure_openzeppelin

    path = ensure_openzeppelin() / "ERC20PresetFixedSupply.json"
    return bytes.fromhex(orjson.loads(path.read_bytes())["deployedBytecode"][2:])


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of the process `pid` and its children (the EVM workers, the feed)."""
    return cpu_seconds(psutil.Process(pid)) or 0.0


def own_cpu_seconds() -> float:
    """CPU seconds of this process alone (the node's event loop and its threads)."""
    times = psutil.Process().cpu_times()
    return times.user + times.system


def blocks(count: int, rng: random.Random, erc20: bool = False) -> list[VendorBlock]:
    """The synthetic chain; with `erc20`, also the ERC20 with a holder's balance changed
    per block (drawing nothing from `rng`: the other contracts' blocks stay the same)."""
    out = []
    parent = "0x" + "00" * 32
    for height in range(count):
        post = {
            ONE_SLOT: AccountDiff(storage={rng.randrange(HOLDERS): rng.randrange(1, 10**12)}),
            VIEW: AccountDiff(storage={height % 64: height + 1}),
        }
        if erc20:
            post[ERC20] = AccountDiff(storage={balance_slot(height % HOLDERS): height + 1})
        if height == 0:
            post[ONE_SLOT] = AccountDiff(
                code=ONE_SLOT_RUNTIME, storage={i: i for i in range(HOLDERS)}
            )
            post[VIEW] = AccountDiff(code=VIEW_RUNTIME, storage={i: i + 1 for i in range(64)})
            post[CALLER] = AccountDiff(balance=10**20)
            if erc20:
                storage = {balance_slot(i): 10**18 + i for i in range(HOLDERS)}
                post[ERC20] = AccountDiff(nonce=1, code=erc20_runtime(), storage=storage)
        block_hash = "0x" + (height + 1).to_bytes(32, "big").hex()
        header = {
            "hash": block_hash, "parentHash": parent, "number": hex(height),
            "timestamp": hex(1_700_000_000 + height), "miner": "0x" + "00" * 20,
            "gasLimit": hex(30_000_000), "gasUsed": "0x0", "baseFeePerGas": hex(7),
            "mixHash": "0x" + "00" * 32, "difficulty": "0x0",
        }  # fmt: skip
        out.append(VendorBlock(height, block_hash, parent, header, "0x" + "00" * 32, {}, post))
        parent = block_hash
    return out


def call_bodies(to: str, old: bool, head: int, batch: int, rng: random.Random) -> list[bytes]:
    bodies = []
    for _ in range(512):
        items = []
        for i in range(batch):
            block = hex(rng.randint(1, head - 128)) if old else "latest"
            if to == VIEW:
                data = "0x"
            elif to == ERC20:
                data = "0x" + BALANCE_OF + holder(rng.randrange(HOLDERS)).hex()
            else:
                data = "0x" + rng.randrange(HOLDERS).to_bytes(32, "big").hex()
            call = {"from": CALLER, "to": to, "data": data}
            items.append({"jsonrpc": "2.0", "id": i, "method": "eth_call", "params": [call, block]})
        bodies.append(orjson.dumps(items if batch > 1 else items[0]))
    return bodies


async def load(node: StateNode, bodies: list[bytes], concurrency: int, seconds: float) -> int:
    done = 0
    stop = time.perf_counter() + seconds

    async def client(i: int) -> None:
        nonlocal done
        while time.perf_counter() < stop:
            answer = await node.handle_body(bodies[i % len(bodies)])
            assert b'"error"' not in answer, answer[:300]
            done += 1
            i += concurrency

    await asyncio.gather(*(client(i) for i in range(concurrency)))
    return done


@contextlib.asynccontextmanager
async def synthetic_node(
    count: int,
    rng: random.Random,
    map_size_mb: int = 1024,
    evm: dict[str, Any] | None = None,
    erc20: bool = False,
) -> AsyncIterator[StateNode]:
    """An archive state node in a temporary folder holding `blocks(count, rng, erc20)`;
    `evm`: its [evm] settings."""
    with tempfile.TemporaryDirectory() as tmp:
        section = {"kind": "archive", "chain_id": 1337, "map_size_mb": map_size_mb}
        if evm:
            section["evm"] = evm
        node = StateNode.from_config(section, data_dir=Path(tmp))
        await node.start()
        try:
            for block in blocks(count, rng, erc20):
                await node.ingest._apply(block)
            yield node
        finally:
            await node.close()


async def main_async(args: argparse.Namespace) -> None:
    rng = random.Random(0)
    async with synthetic_node(args.blocks, rng) as node:
        head = args.blocks - 1
        profile = cProfile.Profile() if args.profile else None
        print(
            f"{args.blocks} blocks, {args.concurrency} calls in flight; calls/s in process "
            "and the cores the process and its workers used"
        )
        for name, to in (("one-slot", ONE_SLOT), ("view", VIEW)):
            for old in (False, True):
                for batch in (1, 10):
                    label = f"{name}{'x10' if batch > 1 else ''}{'-old' if old else ''}"
                    if args.case and label not in args.case:
                        continue
                    bodies = call_bodies(to, old, head, batch, rng)
                    await load(node, bodies, args.concurrency, 0.5)  # warm-up
                    if profile:
                        profile.enable()
                    started = time.perf_counter()
                    cpu, own = tree_cpu_seconds(os.getpid()), own_cpu_seconds()
                    n = await load(node, bodies, args.concurrency, args.duration)
                    wall = time.perf_counter() - started
                    rate = n * batch / wall
                    cores = (tree_cpu_seconds(os.getpid()) - cpu) / wall
                    own = (own_cpu_seconds() - own) / wall
                    if profile:
                        profile.disable()
                    us = cores * 1e6 / rate if rate else 0.0
                    loop_us = own * 1e6 / rate if rate else 0.0
                    print(
                        f"{label:<16} {rate:>10,.0f}   cores {cores:.2f}   CPU µs per call "
                        f"{us:.1f} (the node's process {loop_us:.1f}, workers and feed "
                        f"{us - loop_us:.1f})"
                    )
        if profile:
            profile.dump_stats(args.profile)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.nodecalls", description=__doc__)
    p.add_argument("--blocks", type=int, default=400, help="chain length (default 400)")
    p.add_argument("-c", "--concurrency", type=int, default=64, help="calls in flight (64)")
    p.add_argument("-d", "--duration", type=float, default=2.0, help="seconds per case")
    p.add_argument("--profile", help="write a cProfile of the run to this file")
    p.add_argument("--case", action="append", help="only this case (repeatable), e.g. one-slot-old")
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()

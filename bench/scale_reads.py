"""The reads of `suite scale` (bench/scale.py): request bodies at random heights and keys of
a synthetic chain, their rate through `StateNode.handle_body`, and a check of answers at
`latest` against the generator's state."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import psutil

from bench.scalegen import BALANCE_OF_SELECTOR, SyntheticChain
from bench.services import cpu_seconds

WARMUP_S = 0.3


def _item(i: int, method: str, params: list[Any]) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params})


def _params(chain: SyntheticChain, method: str, account: int, row: int, block: str) -> list:
    if method == "eth_getBalance":
        return [chain.address(account), block]
    contract = chain.address(int(chain.slot_contract[row]))
    if method == "eth_getStorageAt":
        return [contract, f"0x{chain.slot_key(row):064x}", block]
    holder = chain.address(int(chain.slot_holder[row]))
    data = f"0x{BALANCE_OF_SELECTOR}{holder[2:]:0>64}"
    return [{"to": contract, "data": data}, block]


def read_bodies(
    chain: SyntheticChain, method: str, earliest: int, head: int, count: int
) -> list[bytes]:
    """`count` single requests of `method` at heights drawn from [earliest, head] and keys
    drawn from every account (balances) or every live slot (storage, balanceOf)."""
    heights = chain.rng.integers(earliest, head + 1, count).tolist()
    accounts = chain.random_accounts(count).tolist()
    rows = chain.live_rows(count).tolist()
    return [
        _item(i, method, _params(chain, method, accounts[i], rows[i], hex(heights[i])))
        for i in range(count)
    ]


async def measure(
    node: Any, bodies: list[bytes], seconds: float, concurrency: int
) -> dict[str, float]:
    """Requests per second and per CPU second (this process and its EVM workers) with
    `concurrency` requests in flight. Each body is sent once (warm-up included), so neither
    the EVM's kept answers nor hot pages of a few repeated keys stand in for random reads;
    the measurement ends early when the bodies run out. The warm-up sends at most half of
    them, so a short list (`--bodies`) still leaves the measurement some."""
    _, start = await _load(node, bodies[: len(bodies) // 2], 0, concurrency, WARMUP_S)
    me = psutil.Process()
    cpu, wall = cpu_seconds(me) or 0.0, time.perf_counter()
    done, _ = await _load(node, bodies, start, concurrency, seconds)
    wall = time.perf_counter() - wall
    cpu = (cpu_seconds(me) or 0.0) - cpu
    return {
        "per_s": round(done / wall),
        "per_cpu_s": round(done / cpu) if cpu > 0 else 0,
        "cores": round(cpu / wall, 2),
        "requests": done,
    }


async def _load(
    node: Any, bodies: list[bytes], start: int, concurrency: int, seconds: float
) -> tuple[int, int]:
    """Send bodies from `start` on, each once, for `seconds`: (answered, next body)."""
    done, at = 0, start
    stop = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal done, at
        while at < len(bodies) and time.perf_counter() < stop:
            body = bodies[at]
            at += 1
            answer = await node.handle_body(body)
            if b'"error"' in answer:
                raise RuntimeError(f"read failed: {answer[:300]!r}")
            done += 1

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return done, at


async def check_latest(chain: SyntheticChain, node: Any, count: int) -> None:
    """Balances, slots and balanceOf at `latest` must be the generator's current values."""
    accounts = chain.random_accounts(count).tolist()
    rows = chain.live_rows(count).tolist()
    for i in range(count):
        cases = (
            ("eth_getBalance", hex(int(chain.balance[accounts[i]]))),
            ("eth_getStorageAt", f"0x{int(chain.slot_value[rows[i]]):064x}"),
            ("eth_call", f"0x{int(chain.slot_value[rows[i]]):064x}"),
        )
        for method, expected in cases:
            params = _params(chain, method, accounts[i], rows[i], "latest")
            answer = orjson.loads(await node.handle_body(_item(i, method, params)))
            if answer.get("result") != expected:
                raise RuntimeError(
                    f"{node.key}: {method}{params} answered {answer}, expected {expected}"
                )

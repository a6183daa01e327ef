"""`python -m bench.callpath`: eth_call batches through one path N times in process, for
instruction counts of the proxy's own part.

Why: `bench suite call`'s erc20x10-old (batches of 10 eth_calls at old heights) through the
proxy in process is measured against the state node alone; on the shared VM the wall clock
moves with the load, instructions do not. The EVM runs in the node's worker processes, so a
callgrind of this process (children not traced) counts the node's and the proxy's Python
around the calls, not the EVM. Run it twice with N and 3N bodies and take the difference
per body:

    valgrind --tool=callgrind python -m bench.callpath --path proxy -n 200
    (the same with -n 600; "Collected" on stderr: instructions)

Paths (batches of `--batch` eth_calls at random heights older than the proxy's state window,
one body at a time, to `--to`: the one-slot read, an ERC20 `balanceOf`'s shape, or the 64-slot
view, on `bench.nodecalls`' synthetic chain):

- `node`: the state node's own data port (`answer_now`, then `handle_body`);
- `proxy`: the proxy's data handler with that node in process (`inproc://`, entered as a
  state and an archive node as in `chainstate up`), after `--settle` seconds for its head
  polls: what the proxy adds, with no HTTP either side. Its requests carry a connection
  stand-in, so `--batch 1` (single eth_calls, which the engine answers early from the node's
  future) is measured too.

Every answer is checked to be a batch of results with the request's ids.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.batchpath import check
from bench.nodecalls import ONE_SLOT, VIEW, call_bodies, synthetic_node
from bench.nodereads import proxy_in_front
from chainstate.inproc import InprocRegistry

TARGETS = {"one-slot": ONE_SLOT, "view": VIEW}  # (an ERC20 balanceOf's shape; the view)


async def answer(handle: Callable[[bytes], Any], body: bytes) -> Any:
    """`handle`'s answer, awaited when it is an awaitable."""
    got = handle(body)
    return await got if inspect.isawaitable(got) else got


async def run(handle: Callable[[bytes], Any], payloads: list[bytes], n: int) -> Any:
    """Warm up on every body (checking each answer), then `n` bodies one at a time."""
    for body in payloads:
        check(body, await answer(handle, body))
    got = None
    for i in range(n):
        got = await answer(handle, payloads[i % len(payloads)])
    return got


async def in_process(args: argparse.Namespace) -> Any:
    """The node's port or the proxy's in front of it, on `bench.nodecalls`' synthetic chain."""
    rng = random.Random(0)
    async with synthetic_node(args.blocks, rng, map_size_mb=256) as node:
        payloads = call_bodies(TARGETS[args.to], True, args.blocks - 1, args.batch, rng)[:50]

        async def own_port(body: bytes) -> Any:
            now = node.answer_now(body)
            return now if now is not None else await node.handle_body(body)

        if args.path == "node":
            return await run(own_port, payloads, args.n)
        async with proxy_in_front(node, InprocRegistry(), later=True) as handle:
            await asyncio.sleep(args.settle)
            return await run(handle, payloads, args.n)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.callpath",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--path", choices=("node", "proxy"), required=True)
    p.add_argument("--batch", type=int, default=10, help="eth_calls per body (1: single objects)")
    p.add_argument("--to", choices=tuple(TARGETS), default="one-slot", help="the contract called")
    p.add_argument("-n", type=int, default=200, help="bodies after the warm-up")
    p.add_argument("--blocks", type=int, default=200, help="synthetic chain length")
    p.add_argument("--settle", type=float, default=1.5, help="seconds for the proxy's head polls")
    args = p.parse_args(argv)
    if args.batch < 1 or args.n < 0 or args.blocks < 132:
        p.error("--batch >= 1, -n >= 0, --blocks >= 132 (old heights: older than 128 blocks)")
    started = time.perf_counter()
    got = asyncio.run(in_process(args))
    raw = got[1] if type(got) is tuple else got
    took = time.perf_counter() - started
    print(
        f"{args.path} calls x{args.batch}: {args.n} bodies, last answer {len(raw)} B, {took:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m bench.batchpath`: one body path called N times in process, for instruction counts.

Why: wall-clock figures on the shared 2-core VM move with the load; the instructions a path
executes do not. Run it twice under callgrind with N and 2N bodies and take the difference
per body (start-up, the store's blocks and the warm-up cancel out):

    valgrind --tool=callgrind python -m bench.batchpath --path proxy --batch 10 -n 500
    (the same with -n 1000; "Collected" on stderr: instructions)
    valgrind --tool=callgrind python -m bench.batchpath --path http --node URL \
        --batch 100 --proxy 'cache_pools=[]' -n 100      (and -n 300)

Paths (bodies of `--method` at random heights: eth_getBalance of the chain's accounts, or
eth_getStorageAt of slots 0..16 of its storage contract, as `bench suite state`'s `balance*`
and `storage*` cases send them):

- `node`: the state node's own data port handler (`answer_now`, body in, bytes out) on a
  synthetic store, heights over the whole chain as `bench suite state` reads them;
- `proxy`: the proxy's data handler with that node in process (`inproc://`, entered as a
  state and an archive node as in `chainstate up`; `--settle` seconds for the proxy to
  learn the head, so old heights go to the archive entry): what the proxy adds, with no
  HTTP either side;
- `http`: the proxy's engine (`Engine.handle`) in front of a node over HTTP (`--node URL`,
  e.g. `chainstate bench fake-node --port 8546`), one body at a time, the bodies of `bench
  suite proxy`'s batch case: the proxy's CPU per batch over HTTP (the node runs in its own
  process and is not counted); `--head K`: exactly K items of each body at the head, which
  the proxy pins by hash and coalesces (`--head 0` against `--head 1`: what such an item
  costs a batch).

It prints the bodies answered and the answer of the last one's size; every answer is
checked to be a batch of results with the request's ids (an error answer fails the run).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from bench.bodies import BlockRange, BodyPlan, fake_addresses
from bench.nodereads import STORAGE_CONTRACT, bodies, proxy_in_front, synthetic_node
from bench.suite import parse_toml_setting
from chainstate.inproc import InprocRegistry

FAKE_HEAD = 1_000_000  # `chainstate bench fake-node`'s head and state window (bench/suite.py)
FAKE_WINDOW = 128
METHODS = ("eth_getBalance", "eth_getStorageAt")


def check(body: bytes, answer: Any) -> None:
    """The answer is the body's: every id back in order, each with a result."""
    raw = answer[1] if type(answer) is tuple else answer
    sent, got = orjson.loads(body), orjson.loads(raw)
    if type(sent) is dict:
        sent, got = [sent], [got]
    if [a.get("id") for a in got] != [s["id"] for s in sent] or any("result" not in a for a in got):
        raise SystemExit(f"bad answer: {raw[:300]!r}")


def at_head(body: bytes, k: int, seed: int) -> bytes:
    """`body` with exactly `k` items (spread by `seed`) at the fake node's head and the
    others one block below it: the proxy knows the head's hash, so such an item is pinned
    by hash and coalesced (`--head 0` and `--head 1` counted apart: what one costs)."""
    items = orjson.loads(body)
    for it in items:
        if it["params"][-1] == hex(FAKE_HEAD):
            it["params"][-1] = hex(FAKE_HEAD - 1)
    for i in range(min(k, len(items))):
        items[(seed * 37 + i * 41) % len(items)]["params"][-1] = hex(FAKE_HEAD)
    return orjson.dumps(items)


def run_sync(handle: Callable[[bytes], Any], payloads: list[bytes], n: int) -> Any:
    """Warm up on every body (checking each answer), then call `handle` n times."""
    for body in payloads:
        check(body, handle(body))
    answer = None
    for i in range(n):
        answer = handle(payloads[i % len(payloads)])
    return answer


async def in_process(args: argparse.Namespace) -> Any:
    """The node's own handler or the proxy's in front of it, on a synthetic store."""
    with tempfile.TemporaryDirectory() as tmp:
        section = {"map_size_mb": 256, "hot_blocks": 128}
        node, accounts = await synthetic_node(Path(tmp), args.blocks, section)
        try:
            read = [STORAGE_CONTRACT] if args.method == "eth_getStorageAt" else accounts
            payloads = bodies(args.method, args.batch, args.blocks - 1, read, 50)
            if args.path == "node":
                return run_sync(node.answer_now, payloads, args.n)
            async with proxy_in_front(node, InprocRegistry()) as handle:
                # the proxy learns the node's head from its polls: then heights older than
                # the state window go to the archive entry alone, as in `bench suite state`
                await asyncio.sleep(args.settle)
                return run_sync(handle, payloads, args.n)
        finally:
            await node.close()


async def over_http(args: argparse.Namespace) -> Any:
    """The proxy's engine in front of a node over HTTP, one body at a time."""
    from aiohttp import web

    from proxy.app import PROXY, create_app
    from proxy.settings import ProxySettings
    from proxy.store_file import FileStore

    if not args.node:
        raise SystemExit("--path http needs --node URL (chainstate bench fake-node)")
    nodes = [{"chain": "1337", "key": "bench-state", "url": args.node, "kind": "state"}]
    settings = ProxySettings.from_config({"proxy": {"nodes": nodes, **dict(args.proxy)}})
    app = create_app(settings, store=FileStore(None))
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        engine = app[PROXY].engine
        plan = BodyPlan(
            mix=[(args.method, 1.0)],
            batch=args.batch,
            blocks=BlockRange(FAKE_HEAD - FAKE_WINDOW // 2, FAKE_HEAD),
            addresses=fake_addresses(1000),
        )
        payloads = plan.build()[:50]
        if args.head is not None:
            payloads = [at_head(body, args.head, j) for j, body in enumerate(payloads)]
        headers: dict[str, str] = {}
        for body in payloads:
            check(body, await engine.handle("1337", body, headers))
        answer = None
        for i in range(args.n):
            answer = await engine.handle("1337", payloads[i % len(payloads)], headers)
        return answer
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.batchpath",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--path", choices=("node", "proxy", "http"), required=True)
    p.add_argument("--method", choices=METHODS, default=METHODS[0], help="the reads sent")
    p.add_argument("--batch", type=int, default=10, help="items per body (1: single objects)")
    p.add_argument("-n", type=int, default=200, help="bodies timed after the warm-up")
    p.add_argument("--blocks", type=int, default=200, help="synthetic chain length (in process)")
    p.add_argument(
        "--settle", type=float, default=1.5, help="seconds for the proxy's head polls (proxy)"
    )
    p.add_argument("--node", help="the node's URL for --path http")
    p.add_argument(
        "--head",
        type=int,
        metavar="K",
        help="--path http: exactly K items of each body at the node's head (default: as drawn)",
    )
    p.add_argument(
        "--proxy",
        action="append",
        type=parse_toml_setting,
        default=[],
        metavar="NAME=VALUE",
        help="a [proxy] setting for --path http, as `bench suite proxy --proxy` takes it "
        "(e.g. 'cache_pools=[]': the response cache off; repeatable)",
    )
    args = p.parse_args(argv)
    if args.batch < 1 or args.n < 0:
        p.error("--batch >= 1 and -n >= 0")
    started = time.perf_counter()
    answer = asyncio.run(over_http(args) if args.path == "http" else in_process(args))
    raw = answer[1] if type(answer) is tuple else answer
    size = len(raw) if raw else 0
    took = time.perf_counter() - started
    print(
        f"{args.path} batch {args.batch}: {args.n} bodies, last answer {size} bytes, {took:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

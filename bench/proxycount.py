"""`python -m bench.proxycount`: instructions per request of the whole proxy process, as
`bench suite proxy` runs it.

Why: the suite's per-core figure is the proxy's CPU per request (its user and system time ÷
its requests), and on a shared 2-vCPU VM that moves by ±10 % from run to run. `bench.c1path`
counts the two halves of a request that sit on the client's wait at c=1 (up to each write),
not what follows the writes (the answer's books, the objects made after the write to the
node) nor the event loop's own work. Here `chainstate proxy` runs under callgrind
(instrumentation off until measured) in front of `bench fake-node`, with the suite's
proxy.toml; `bench run` sends the suite's `single` bodies (eth_getBalance at random heights
of the fake node's window) on `-c` connections. After a warm-up the counters are zeroed, the
proxy idles `--idle` seconds (its background work: head polls, sweeps, per second), then
answers `-n` requests; the total less the background for as long as the load ran, ÷ `-n`, is
the instructions per request (system calls not counted: the kernel's share is not seen).

With `--calls` the bodies are `bench suite call`'s erc20x10 shape instead: eth_call
`balanceOf` at `latest` (a pool of `--pool` bodies; the fake node's head never moves, so
each body after its first answer is a whole-batch cache hit), every body's answer checked
against the fake node's own before the warm-up.

    python -m bench.proxycount -n 3000
    python -m bench.proxycount -n 3000 --proxy 'cache_pools=[]' --batch 100
    python -m bench.proxycount -n 3000 --batch 10 --calls

Run it from inside the tree it measures (`cd TREE && PYTHONPATH=$PWD python -m
bench.proxycount`); it needs `valgrind` and `callgrind_control`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import orjson

import bench.suite as suite
from bench.bodies import BlockRange, BodyPlan, fake_addresses
from bench.loadgen import LoadSettings, run_bench
from bench.realprocs import VALGRIND_READY, callgrind_control, callgrind_totals, dump
from bench.services import free_port, running, split_cpus
from bench.suitecli import parse_toml_setting

CALLS_POOL = 256  # `--calls` bodies (each answered by the node once, then from the cache)


def calls_plan(batch: int, pool: int) -> BodyPlan:
    """`suite call`'s erc20 shape on the fake node: balanceOf(account) at latest."""
    token = fake_addresses(1, seed=7)[0]
    return BodyPlan(
        mix=[("eth_call", 1.0)], batch=batch, blocks=BlockRange(),
        addresses=fake_addresses(1000), call_to=token, pool_size=pool,
    )  # fmt: skip


def results(raw: bytes) -> list[tuple[object, object]]:
    """(id, result) of each answer of a body; SystemExit on an error answer."""
    answers = orjson.loads(raw)
    items = answers if type(answers) is list else [answers]
    if any("result" not in a for a in items):
        raise SystemExit(f"an answer without a result: {raw[:300]!r}")
    return sorted((a["id"], a["result"]) for a in items)


def check_answers(plan: BodyPlan, proxy: str, node: str) -> None:
    """Every body of the plan answered by the proxy as by the node itself."""
    for body in plan.build():
        if results(post(proxy, body)) != results(post(node, body)):
            raise SystemExit(f"the proxy's answer differs from the node's: {body[:200]!r}")


def post(url: str, body: bytes) -> bytes:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return resp.read()


def measure(args: argparse.Namespace) -> dict[str, float]:
    out = Path(tempfile.mkdtemp(prefix="proxycount-"))
    proxy_cpus, load_cpus = split_cpus()
    plan = calls_plan(args.batch, args.pool) if args.calls else suite.balance_mix(args.batch)
    with running() as services:
        fake_url, proxy_port = suite.start_fake_node(services, load_cpus), free_port()
        config = services.workdir / "proxy.toml"
        config.write_text(suite.proxy_config(fake_url, extra=suite.setting_lines(dict(args.proxy))))
        tool = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
        tool += [f"--callgrind-out-file={out}/cg.%p"]
        cmd = [*tool, *suite.ProxySuite().proxy_command(proxy_port, config)]
        url = f"http://127.0.0.1:{proxy_port}/{suite.SUITE_CHAIN_ID}"
        proxy = services.start("proxy", cmd, url, proxy_cpus, ready_timeout=VALGRIND_READY)
        pid = str(proxy.proc.pid)  # type: ignore[union-attr]
        if args.calls:
            check_answers(plan, url, fake_url)
        load = {"url": url, "concurrency": args.c, "timeout": 120.0}
        load |= {"cpus": load_cpus, "warmup": 0.0}
        callgrind_control(pid, "-i on")
        run_bench(LoadSettings(requests=args.warmup, **load), plan)
        callgrind_control(pid, "--zero")
        time.sleep(args.idle)
        idle = callgrind_totals(dump(out, pid, "idle"))[0] / args.idle
        started = time.monotonic()
        res = run_bench(LoadSettings(requests=args.n, **load), plan)
        took = time.monotonic() - started
        total = callgrind_totals(dump(out, pid, "load"))[0]
        if res.requests_ok != args.n:
            raise SystemExit(f"{res.requests_ok} of {args.n} requests answered with results")
    background = idle * took
    return {
        "requests": args.n,
        "instructions_per_request": round((total - background) / args.n),
        "background_per_request": round(background / args.n),
        "seconds": round(took, 1),
        "dumps": str(out),
    }


def main(argv: list[str] | None = None) -> int:
    summary = __doc__.split("\n\n")[0]
    parser = argparse.ArgumentParser(prog="python -m bench.proxycount", description=summary)
    parser.add_argument("-n", type=int, default=3000, help="requests measured")
    parser.add_argument("-c", type=int, default=64, help="connections (the suite's 64)")
    parser.add_argument("--batch", type=int, default=1, help="items per request (1: single)")
    parser.add_argument("--warmup", type=int, default=2000, help="requests before measuring")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of idle counted")
    parser.add_argument(
        "--calls", action="store_true", help="eth_call balanceOf at latest (whole-batch hits)"
    )
    parser.add_argument("--pool", type=int, default=CALLS_POOL, help="--calls: bodies in the pool")
    parser.add_argument(
        "--proxy",
        action="append",
        default=[],
        type=parse_toml_setting,
        metavar="NAME=VALUE",
        help="a [proxy] setting, as suite's (e.g. cache_pools=[])",
    )
    args = parser.parse_args(argv)
    for key, value in measure(args).items():
        print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

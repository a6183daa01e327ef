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

    python -m bench.proxycount -n 3000
    python -m bench.proxycount -n 3000 --proxy 'cache_pools=[]' --batch 100

Run it from inside the tree it measures (`cd TREE && PYTHONPATH=$PWD python -m
bench.proxycount`); it needs `valgrind` and `callgrind_control`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import bench.suite as suite
from bench.loadgen import LoadSettings, run_bench
from bench.realprocs import VALGRIND_READY, callgrind_control, callgrind_totals, dump
from bench.services import free_port, running, split_cpus
from bench.suitecli import parse_toml_setting


def measure(args: argparse.Namespace) -> dict[str, float]:
    out = Path(tempfile.mkdtemp(prefix="proxycount-"))
    proxy_cpus, load_cpus = split_cpus()
    plan = suite.balance_mix(args.batch)
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

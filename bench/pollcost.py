"""What busy polling costs a proxy that is not loaded: `python -m bench.pollcost [--rate 1000]`.

Starts a fake node and two `chainstate proxy` processes in front of it, one with
`busy_poll_us = 0` (the default) and one with `--poll-us` (250), the proxies on one core and
the node and this client on the other (as `bench suite proxy`). One client then sends single
reads on one keep-alive connection, paced at `--rate` a second (each sent once the last was
answered and its time slot came), to each proxy in turn for `--rounds` rounds, and prints per
proxy the rate reached, the CPU (cores) the proxy's process used and the p50 latency. Every
answer must carry a result.

A proxy at a modest steady rate is what most deployments see: with busy polling its core
spins after every answer whether or not the next request comes soon; `bench suite proxy`'s
`single-c1` case shows what it buys (the added latency at c=1).
"""

from __future__ import annotations

import argparse
import http.client
import os
import time

import orjson
import psutil

from bench.services import free_port, python_cmd, running, split_cpus
from bench.suite import FAKE_HEAD, SUITE_CHAIN_ID, proxy_config, setting_lines

BODY = orjson.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "eth_getBalance",
        "params": ["0x" + "11" * 20, hex(FAKE_HEAD - 3)],
    }
)


def paced(port: int, proc: psutil.Process, rate: float, seconds: float) -> dict[str, float]:
    """Single reads at `rate` a second on one connection for `seconds`: the rate reached,
    the cores `proc` used meanwhile and the p50 latency in µs."""
    conn = http.client.HTTPConnection("127.0.0.1", port)
    latencies = []
    started = time.perf_counter()
    cpu = sum(proc.cpu_times()[:2])
    due = started
    try:
        while time.perf_counter() - started < seconds:
            sent = time.perf_counter()
            conn.request("POST", f"/{SUITE_CHAIN_ID}", BODY, {"Content-Type": "application/json"})
            answer = conn.getresponse().read()
            if b'"result"' not in answer:
                raise RuntimeError(f"not an answer: {answer[:200]!r}")
            latencies.append(time.perf_counter() - sent)
            due += 1 / rate
            if (wait := due - time.perf_counter()) > 0:
                time.sleep(wait)
    finally:
        conn.close()
    wall = time.perf_counter() - started
    used = sum(proc.cpu_times()[:2]) - cpu
    latencies.sort()
    return {
        "req_per_s": len(latencies) / wall,
        "cores": used / wall,
        "p50_us": latencies[len(latencies) // 2] * 1e6,
    }


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.pollcost", description=__doc__)
    p.add_argument("--rate", type=float, default=1000.0, help="requests a second (1000)")
    p.add_argument("-d", "--duration", type=float, default=5.0, help="seconds per run (5)")
    p.add_argument("--rounds", type=int, default=3, help="runs per proxy, in turn (3)")
    p.add_argument("--poll-us", type=int, default=250, help="the polling proxy's window (250)")
    args = p.parse_args()
    proxy_cpus, load_cpus = split_cpus()
    if load_cpus:
        os.sched_setaffinity(0, load_cpus)
    with running() as services:
        node_port = free_port()
        node = f"http://127.0.0.1:{node_port}"
        services.start(
            "fake-node",
            python_cmd("-m", "bench", "fake-node", "--port", str(node_port)),
            node,
            load_cpus,
        )
        proxies = {}
        for window in (0, args.poll_us):
            port = free_port()
            config = services.workdir / f"proxy-{window}.toml"
            config.write_text(proxy_config(node, extra=setting_lines({"busy_poll_us": window})))
            cmd = python_cmd(
                "-m", "stack.cli", "proxy", "--host", "127.0.0.1", "--port", str(port),
                "--config", str(config), "--store", ":memory:",
            )  # fmt: skip
            url = f"http://127.0.0.1:{port}/{SUITE_CHAIN_ID}"
            svc = services.start(f"proxy-{window}", cmd, url, proxy_cpus)
            proxies[window] = (port, psutil.Process(svc.proc.pid))  # type: ignore[union-attr]
        print(
            f"single reads paced at {args.rate:g}/s on one connection, {args.duration:g} s per run"
        )
        for i in range(args.rounds):
            for window in list(proxies) if i % 2 == 0 else list(reversed(proxies)):
                port, proc = proxies[window]
                got = paced(port, proc, args.rate, args.duration)
                print(
                    f"round {i + 1}  busy_poll_us {window:>4}  {got['req_per_s']:>7,.0f} req/s  "
                    f"proxy {got['cores']:.3f} cores  p50 {got['p50_us']:.0f} µs",
                    flush=True,
                )


if __name__ == "__main__":
    main()

"""`python -m bench.portcalls`: eth_calls through a real state node's HTTP port, the node in
its own process pinned to one CPU (as `bench suite call` pins it) and the load generator on
another, on `bench.nodecalls`' synthetic chain (no anvil, no write node): CPU µs per call of
the node's process and of its EVM workers and feed, and per call the read and write system
calls and the context switches of each (from /proc before and after: nothing is traced, so
nothing is slowed).

    python -m bench.portcalls                          # ERC20 balanceOf at random old heights
    python -m bench.portcalls --latest
    python -m bench.portcalls --tree /work/main --tree .   # trees in turn, each round

With several `--tree`s every round measures each tree in turn on the same chain (a copy of
the store each), so a busy machine weighs on all of them alike; compare the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from bench.nodecalls import ERC20, HOLDERS, blocks, holder
from bench.services import free_port
from nodes.state.service import StateNode

BLOCKS = 400  # the chain's length; old heights are 1..BLOCKS-129, as in bench.nodecalls


async def build_store(path: Path) -> None:
    """The synthetic chain (with the ERC20) in an archive node's store at `path`."""
    section = {"kind": "archive", "chain_id": 1337, "map_size_mb": 256}
    node = StateNode.from_config(section, data_dir=path)
    await node.start()
    try:
        for block in blocks(BLOCKS, random.Random(0), erc20=True):
            await node.ingest._apply(block)
    finally:
        await node.close()


def counters(root: psutil.Process) -> dict[int, tuple[str, float, float, int, int, int, int]]:
    """(name, user s, system s, reads, writes, voluntary and involuntary context switches)
    of the node's process and of each process under it."""
    out = {}
    for i, proc in enumerate((root, *root.children(recursive=True))):
        try:
            t, io, cs = proc.cpu_times(), proc.io_counters(), proc.num_ctx_switches()
        except psutil.Error:
            continue
        name = "node" if i == 0 else f"child {proc.pid}"
        out[proc.pid] = (name, t.user, t.system, io.read_count, io.write_count, *cs[:2])
    return out


def answered(url: str, body: dict[str, Any], seconds: float) -> None:
    """Wait until the node at `url` answers `body` with a result (its workers started)."""
    data = json.dumps(body).encode()
    deadline = time.monotonic() + seconds
    while True:
        try:
            req = urllib.request.Request(url, data, {"content-type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as resp:
                if "result" in json.loads(resp.read()):
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the node at {url} did not answer an eth_call")
        time.sleep(0.2)


def measure(tree: Path, store: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One run of `tree`'s state node on a copy of `store`: the load, then its counters."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "state"
        shutil.copytree(store, data)
        config = Path(tmp) / "node.toml"
        lines = ['[[state_nodes]]\nkey = "bench-calls"\n\n[state_nodes.evm]\n']
        lines += [f"{k} = {v}\n" for k, v in (e.split("=", 1) for e in args.evm)]
        config.write_text("".join(lines))
        node = subprocess.Popen(
            ["taskset", "-c", str(args.node_cpu), sys.executable, "-m", "stack.cli",
             "state-node", "--key", "bench-calls", "--kind", "archive", "--source",
             "http://127.0.0.1:9", "--port", str(port), "--chain-id", "1337", "--data-dir",
             str(data), "--config", str(config)],
            cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            data_hex = "0x70a08231" + holder(0).hex()
            call = {"to": ERC20, "data": data_hex}
            answered(url, {"jsonrpc": "2.0", "id": 1, "method": "eth_call",
                           "params": [call, "latest"]}, 120)  # fmt: skip
            gen = [sys.executable, "-m", "bench", "run", url, "--mix", "eth_call",
                   "--call-to", ERC20, "--blocks", "latest" if args.latest
                   else f"1-{BLOCKS - 129}", "-c", str(args.concurrency), "--cpus",
                   str(args.load_cpu), "--json", "--warmup", "0"]  # fmt: skip
            for i in range(HOLDERS):
                gen += ["--address", "0x" + holder(i)[12:].hex()]
            subprocess.run([*gen, "-d", str(args.warmup)], env=env, check=True,
                           stdout=subprocess.DEVNULL)  # fmt: skip
            root = psutil.Process(node.pid)
            before = counters(root)
            out = subprocess.run([*gen, "-d", str(args.duration)], env=env, check=True,
                                 capture_output=True, text=True).stdout  # fmt: skip
            after = counters(root)
        finally:
            node.terminate()
            node.wait(30)
    report = json.loads(out)
    calls = report["items_ok"]
    if report["items_err"] or not calls:
        raise RuntimeError(f"{tree}: failed calls: {report['errors']}")
    rows = []
    for pid, (name, user, system, reads, writes, vcsw, icsw) in after.items():
        if pid not in before:
            continue
        _, user0, system0, reads0, writes0, vcsw0, icsw0 = before[pid]
        cpu = (user - user0 + system - system0) * 1e6 / calls
        if cpu < 0.05:
            continue
        rows.append({
            "process": name, "cpu_us": cpu, "sys_us": (system - system0) * 1e6 / calls,
            "reads": (reads - reads0) / calls, "writes": (writes - writes0) / calls,
            "vcsw": (vcsw - vcsw0) / calls, "icsw": (icsw - icsw0) / calls,
        })  # fmt: skip
    return {
        "calls_per_s": report["items_per_s"],
        "cpu_us": sum(r["cpu_us"] for r in rows),
        "latency_ms": report["latency_ms"],
        "processes": rows,
    }


def render(tree: str, run: dict[str, Any]) -> str:
    lat = run["latency_ms"]
    lines = [
        f"{tree}: {run['calls_per_s']:,.0f} calls/s, CPU {run['cpu_us']:.1f} µs per call; "
        f"latency ms p50 {lat['p50']:.2f} p99 {lat['p99']:.2f} max {lat['max']:.2f}"
    ]
    for r in run["processes"]:
        lines.append(
            f"  {r['process']:<14} CPU {r['cpu_us']:5.1f} µs (system {r['sys_us']:4.1f})"
            f"  reads {r['reads']:.3f}  writes {r['writes']:.3f}"
            f"  context switches {r['vcsw']:.3f} + {r['icsw']:.3f} involuntary"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.portcalls",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--tree", action="append", help="a source tree to run the node from (.)")
    p.add_argument("--rounds", type=int, default=3, help="rounds (3)")
    p.add_argument("-d", "--duration", type=float, default=4.0, help="seconds measured (4)")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up (2)")
    p.add_argument("-c", "--concurrency", type=int, default=64, help="connections (64)")
    p.add_argument("--latest", action="store_true", help="calls at latest")
    p.add_argument(
        "--evm",
        action="append",
        default=["warm_answers=0"],
        help="an [evm] setting NAME=VALUE (a TOML value; warm_answers=0 is given)",
    )
    p.add_argument("--node-cpu", type=int, default=0, help="the node's CPU (0)")
    p.add_argument("--load-cpu", type=int, default=1, help="the load generator's CPU (1)")
    args = p.parse_args(argv)
    trees = [Path(t).resolve() for t in args.tree or ["."]]
    totals: dict[Path, list[float]] = {t: [] for t in trees}
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        asyncio.run(build_store(store))
        for _ in range(args.rounds):
            for tree in trees:
                run = measure(tree, store, args)
                totals[tree].append(run["cpu_us"])
                print(render(str(tree), run), flush=True)
    for tree in trees:
        runs = ", ".join(f"{v:.1f}" for v in totals[tree])
        print(f"{tree}: median {statistics.median(totals[tree]):.1f} µs per call ({runs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

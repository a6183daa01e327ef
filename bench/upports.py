"""`python -m bench.upports`: `chainstate up`'s proxy port against its archive node's own port.

Issue 14 asks that `bench run` against `chainstate up`'s proxy (`:8663/1337`, the proxy
reaching its state nodes in process) be at least as fast as against the node served over
HTTP. This starts `chainstate up` on a copy of configs/devnet.toml whose ports are moved by
`--port-offset` (so it runs beside a `./dev up`) and whose data lives in a temporary folder,
with one more pool, `1337-http`: the same two state nodes entered by their own HTTP ports
instead of `inproc://` (the same nodes behind HTTP, in the same process; the response cache
off for that pool, as the in-process path does not use it); pinned to one CPU;
sends the devnet workload and mines `--blocks` more blocks; waits until archive-1 holds
anvil's head; checks that the three targets give the same answers; then runs `bench run`
(eth_getBalance of the workload's accounts at random heights) against the proxy's port
(`/1337`, in process), the same port's `/1337-http` pool and archive-1's own port, in turn,
`--rounds` times each, the generator on the other CPU. For each run it prints req/s and the
`up` process's own CPU µs per request (anvil, its child, excluded), and the ratios of the
proxy's in-process pool to the node's port and to the HTTP pool.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench.bodies import BlockRange, BodyPlan
from bench.loadgen import BenchResult, LoadSettings, run_bench
from bench.services import Service, rpc_call, split_cpus

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
DEVNET_PORTS = re.compile(r"\b(8545|866\d)\b")  # anvil's and every component's port
READY_TIMEOUT = 120.0  # seconds for `chainstate up` to answer (anvil installed, stack started)
SYNC_TIMEOUT = 180.0  # seconds for archive-1 to ingest the mined blocks


def devnet_copy(workdir: Path, offset: int) -> Path:
    """configs/ copied into `workdir`, devnet.toml's ports moved by `offset` and its data in
    `workdir/data`: the config to start."""
    folder = workdir / "configs"
    shutil.copytree(CONFIGS, folder)
    text = (folder / "devnet.toml").read_text()
    text = DEVNET_PORTS.sub(lambda m: str(int(m.group(1)) + offset), text)
    text = re.sub(r'^data_dir = ".*?"', f"data_dir = {json.dumps(str(workdir / 'data'))}", text,
                  count=1, flags=re.M)  # fmt: skip
    # The response cache off for `1337-http` (the in-process path does not use it either):
    # it would answer that pool's repeated reads without asking the nodes.
    text = text.replace("\n[proxy]\n", '\n[proxy]\ncache_pools = ["1337"]\n', 1)
    path = folder / "devnet.toml"
    path.write_text(text + http_pool(offset))
    return path


def http_pool(offset: int) -> str:
    """The `1337-http` pool: devnet.toml's two state nodes by their own HTTP ports (the
    response cache off for it, above)."""
    return "".join(
        f'\n[[proxy.nodes]]\nchain = "1337-http"\nkey = "{key}-http"\n'
        f'url = "http://127.0.0.1:{port + offset}"\nkind = "{kind}"\n'
        for key, port, kind in (("state-1", 8665, "state"), ("archive-1", 8666, "archive"))
    )


def start_up(config: Path, workdir: Path, offset: int, cpus: list[int] | None) -> Service:
    """`chainstate up --config CONFIG`, ready when its proxy answers."""
    cmd = [sys.executable, "-m", "stack.cli", "up", "--config", str(config)]
    url = f"http://127.0.0.1:{8663 + offset}/1337"
    service = Service("up", cmd, url, cpus, workdir / "up.log")
    service.start()
    service.wait_ready(READY_TIMEOUT)
    return service


def make_blocks(anvil: str, blocks: int) -> list[str]:
    """The devnet workload, then `blocks` empty blocks; the workload's accounts."""
    cmd = [sys.executable, "-m", "stack.cli", "devnet", "workload", "--url", anvil,
           "--no-reorg", "--json"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"devnet workload failed: {done.stderr[-2000:]}")
    rpc_call(anvil, "anvil_mine", [hex(blocks)])
    return [a for a in json.loads(done.stdout)["accounts"] if int(a, 16) != 0]


def wait_synced(node: str, head: int) -> None:
    deadline = time.monotonic() + SYNC_TIMEOUT
    while time.monotonic() < deadline:
        if int(rpc_call(node, "eth_blockNumber", []), 16) >= head:
            return
        time.sleep(0.2)
    raise RuntimeError(f"{node} did not reach block {head} in {SYNC_TIMEOUT:g} s")


def same_answers(targets: tuple[tuple[str, str], ...], accounts: list[str], head: int) -> None:
    """Every target gives the same balances at a few heights (checked before and after load)."""
    for account in accounts[:3]:
        for height in (1, head // 2, head):
            params = [account, hex(height)]
            answers = {name: rpc_call(url, "eth_getBalance", params) for name, url in targets}
            if len(set(answers.values())) != 1:
                raise RuntimeError(f"eth_getBalance{params}: different answers {answers}")


def cpu_seconds(pid: int) -> float:
    """The `up` process's own CPU seconds (anvil, its child, is not counted)."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def one_run(url: str, plan: BodyPlan, args: argparse.Namespace, pid: int) -> dict[str, Any]:
    _, load_cpus = split_cpus()
    settings = LoadSettings(url=url, concurrency=args.concurrency, duration=args.duration,
                            warmup=0, cpus=load_cpus)  # fmt: skip
    run_bench(LoadSettings(url=url, duration=0.5, warmup=0, cpus=load_cpus), plan)  # warm-up
    before = cpu_seconds(pid)
    result: BenchResult = run_bench(settings, plan)
    used = cpu_seconds(pid) - before
    failed = result.items_err + (result.requests - result.requests_ok)
    return {
        "req_per_s": round(result.req_per_s),
        "cpu_us_per_req": round(used * 1e6 / result.requests, 1) if result.requests else None,
        "failed": failed,
    }


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    service_cpus, _ = split_cpus()
    offset = args.port_offset
    up = start_up(devnet_copy(workdir, offset), workdir, offset, service_cpus)
    try:
        proxy = f"http://127.0.0.1:{8663 + offset}/1337"
        over_http = f"{proxy}-http"
        node = f"http://127.0.0.1:{8666 + offset}"
        targets = (("proxy", proxy), ("proxy-http", over_http), ("node", node))
        anvil = f"http://127.0.0.1:{8545 + offset}"
        accounts = make_blocks(anvil, args.blocks)
        head = int(rpc_call(anvil, "eth_blockNumber", []), 16)
        wait_synced(node, head)
        same_answers(targets, accounts, head)
        plan = BodyPlan(mix=[("eth_getBalance", 1.0)], blocks=BlockRange(1, head),
                        addresses=accounts)  # fmt: skip
        assert up.proc is not None
        pid = up.proc.pid
        rounds = []
        for n in range(args.rounds):
            row = {t: one_run(u, plan, args, pid) for t, u in targets}
            for base in ("node", "proxy-http"):
                ratio = row["proxy"]["req_per_s"] / row[base]["req_per_s"]
                row[f"proxy/{base}"] = round(ratio, 3)
            rounds.append(row)
            print(f"round {n + 1}: {json.dumps(row)}", file=sys.stderr, flush=True)
        same_answers(targets, accounts, head)
        return {"head": head, "load_avg": os.getloadavg()[0], "rounds": rounds}
    finally:
        up.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.upports", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--port-offset", type=int, default=1000, help="added to every devnet port")
    p.add_argument("--blocks", type=int, default=200, help="blocks mined after the workload")
    p.add_argument("--rounds", type=int, default=3, help="runs per port, alternating")
    p.add_argument("-d", "--duration", type=float, default=5.0, help="seconds per run")
    p.add_argument("-c", "--concurrency", type=int, default=64, help="connections")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="chainstate-upports-") as tmp:
        try:
            report = measure(args, Path(tmp))
        except RuntimeError as exc:
            print(f"bench.upports: {exc}", file=sys.stderr)
            return 1
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m bench.realprocs gc|callgrind`: per request, what `bench suite state`'s own
processes do: the state node alone and the proxy with its node in process (`proxy-inproc`).

Why: `bench.batchpath` and `bench.inproccount` count a path in a synthetic harness, but the
suite's wall clock comes from the real processes (their heaps, HTTP layer, background tasks
such as ingest and head polls); these two modes measure those processes themselves, under
the suite's own services and bodies (bench/README.md, "Tools for one path").

- `gc`: the services start with `bench/gcprobe` on PYTHONPATH (its `sitecustomize` counts the
  collector's passes per generation); each case runs on both targets as the suite runs it
  (`--warmup`, then `-d` seconds on 64 pinned connections). Per row: CPU µs per request,
  items per core, the collector's passes and milliseconds per generation (warm-up included),
  the heap's objects per generation, the main thread's context switches per request.
- `http`: the HTTP proxy (`chainstate proxy`) in front of the suite's real state node,
  entered as `state` and `archive` as `bench suite state` enters it (the state node runs
  natively), from each `--tree` in turn (another checkout's proxy, e.g. an older commit:
  its `stack.cli proxy`, or `chainstate.cli proxy` where it has no `stack/`). Per case and
  tree: the proxy's instructions per body under callgrind (counted as in `callgrind`), then,
  natively, its CPU µs per body and its syscalls per body (`strace -c -f` attached for the
  row; the CPU figure depends on the machine's load, the counts do not). `--twin`: the
  archive entry's URL gets a user part (`http://twin@…`), so the proxy takes the two
  entries for two servers (hedges, a lone node's rescue) while one node answers both.
- `callgrind`: the state node and proxy-inproc run under callgrind with instrumentation off;
  per case and target, `-n` bodies after a warm-up are measured with it on
  (`callgrind_control`). Per row: instructions per body, also without the background work
  (the process's instructions per idle second, counted for `--idle` s before the row, times
  the row's length under valgrind), and with `--cache-sim` L1 and last-level misses per body
  (`--LL 1048576,8,64` simulates a 1 MiB L2 as the last level).
  Their stores' LMDB map is 1 GiB (valgrind cannot reserve the default 64 GiB). Counts move
  by ~1 % between runs (requests per loop turn, background work under valgrind's slowness).

Run from the tree measured (`cd TREE && PYTHONPATH=$PWD python -m bench.realprocs …`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

import bench.suite as suite
from bench.loadgen import LoadSettings, run_bench
from bench.services import running, split_cpus

TARGETS = ("state-node", "proxy-inproc")
TWIN_USER = "twin"  # `http --twin`: the archive entry's URL, user part added (ignored by the node)
STRACE_ATTACH = 1.0  # seconds for strace to attach to every thread before a row
SYSCALLS_SHOWN = ("getpid", "epoll_wait", "read", "write", "recvfrom", "sendto")
PROBE_DIR = Path(__file__).parent / "gcprobe"
DUMP_WAIT = 0.3  # seconds for a process to write its GC record after SIGUSR1
VALGRIND_MAP_MB = 1024  # the stores' LMDB map under valgrind
VALGRIND_READY = 600.0  # seconds a service under valgrind has to answer its first request
VALGRIND_SYNC = 1200.0  # seconds for the state nodes under valgrind to reach anvil's head


def gc_record(out: Path, pid: int) -> dict[str, Any]:
    """Ask `pid` for its collector's counts (SIGUSR1) and read the record it appends."""
    os.kill(pid, signal.SIGUSR1)
    time.sleep(DUMP_WAIT)
    lines = (out / f"gc-{pid}.jsonl").read_text().splitlines()
    return json.loads(lines[-1])


def minor_faults(pid: int) -> int:
    """The process's minor page faults so far (all threads; /proc/PID/stat field 10): a
    reader's first touch of each LMDB page it maps costs one."""
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[7])


def gc_row(case: str, label: str, res: Any, used: float, before: dict, after: dict) -> str:
    """One printed row of `gc` mode."""
    passes = " ".join(
        f"g{g}:{after['passes'][g][0] - before['passes'][g][0]}x"
        f"/{(after['passes'][g][1] - before['passes'][g][1]) * 1000:.1f}ms"
        for g in ("0", "1", "2")
    )
    return (
        f"{case:<10} {label:<13} {used * 1e6 / res.requests:7.1f} µs/req "
        f"{res.items_ok / used:9.0f} items/core  gc {passes}  heap {after['objects']}"
    )


def run_gc(args: argparse.Namespace) -> None:
    out = Path(tempfile.mkdtemp(prefix="realprocs-gc-"))
    os.environ["GCPROBE_DIR"] = str(out)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PROBE_DIR), os.environ.get("PYTHONPATH", "")) if p
    )
    opts = suite.SuiteOptions(duration=args.duration, warmup=args.warmup, proxy=args.proxy)
    _, load_cpus = split_cpus()
    with running() as services:
        state = suite.StateSuite()
        targets = state.start(services, opts)
        pids = suite.serving_pids(services, targets)
        for case in state.cases():
            if case.name not in args.case:
                continue
            for label in TARGETS:
                pid = pids[label]
                settings = LoadSettings(
                    url=targets[label], duration=args.duration, warmup=args.warmup, cpus=load_cpus
                )
                before, switches = gc_record(out, pid), psutil.Process(pid).num_ctx_switches()
                faults = minor_faults(pid)
                res, used = suite.measure(settings, case.plan, pid)
                faults = minor_faults(pid) - faults
                after, now = gc_record(out, pid), psutil.Process(pid).num_ctx_switches()
                vol = (now.voluntary - switches.voluntary) / res.requests
                invol = (now.involuntary - switches.involuntary) / res.requests
                row = gc_row(case.name, label, res, used or 0.0, before, after)
                print(
                    f"{row}  switches/req {vol:.3f} vol {invol:.3f} invol"
                    f"  minor faults/req {faults / res.requests:.3f} (warm-up included)",
                    flush=True,
                )


def under_callgrind(cache_sim: bool, last_level: str | None, out: Path) -> suite.Launch:
    """The suite's state-node processes under callgrind (instrumentation off) with a map
    valgrind can reserve, waited for as long as valgrind needs."""
    tool = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
    tool += [f"--cache-sim={'yes' if cache_sim else 'no'}", f"--callgrind-out-file={out}/cg.%p"]
    tool += [f"--LL={last_level}"] if last_level else []
    return suite.Launch(tuple(tool), VALGRIND_MAP_MB, VALGRIND_READY, VALGRIND_SYNC)


def callgrind_totals(path: Path) -> list[int]:
    """The `summary:` events of one callgrind dump."""
    for line in path.read_text().splitlines():
        if line.startswith("summary:"):
            return [int(x) for x in line.split()[1:]]
    raise SystemExit(f"{path}: no summary line")


def callgrind_control(pid: str, *commands: str) -> None:
    """Run `callgrind_control` commands (e.g. "--zero", "-i on") on `pid` in order."""
    for command in commands:
        cmd = ["callgrind_control", *command.split(), pid]
        subprocess.run(cmd, check=True, capture_output=True)


def dump(out: Path, pid: str, name: str) -> Path:
    """Dump `pid`'s counts since the last dump or zeroing; the dump's file."""
    callgrind_control(pid, f"--dump={name}")
    return max(out.glob(f"cg.{pid}.*"), key=lambda p: int(p.suffix[1:]))


def run_callgrind(args: argparse.Namespace) -> None:
    out = Path(tempfile.mkdtemp(prefix="realprocs-cg-"))
    launch = under_callgrind(args.cache_sim, args.LL, out)
    _, load_cpus = split_cpus()
    with running() as services:
        state = suite.StateSuite(launch)
        targets = state.start(services, suite.SuiteOptions(proxy=args.proxy))
        pids = suite.serving_pids(services, targets)
        for case in state.cases():
            if case.name not in args.case:
                continue
            for label in TARGETS:
                pid = str(pids[label])
                base = {"url": targets[label], "concurrency": args.c, "timeout": 120.0}
                load = {**base, "cpus": load_cpus, "warmup": 0.0}
                shown = count_row(out, pid, f"{case.name}-{label}", load, case, args)
                print(f"{case.name:<10} {label:<13} {shown}", flush=True)


def tree_proxy(tree: Path, port: int, config: Path, tool: tuple[str, ...] = ()) -> list[str]:
    """The command running `tree`'s HTTP proxy (under `tool`) with the suite's flags."""
    module = "stack.cli" if (tree / "stack").is_dir() else "chainstate.cli"
    flags = ["--host", "127.0.0.1", "--port", str(port), "--config", str(config)]
    flags += ["--store", ":memory:"]
    # (run from `tree`: `python -m` puts the working directory first on the path)
    return [
        "env",
        "-C",
        str(tree),
        f"PYTHONPATH={tree}",
        *tool,
        *suite.python_cmd("-m", module, "proxy", *flags),
    ]


def http_config(node: str, extra: str, twin: bool) -> str:
    """The suite's proxy.toml (`node` entered as state and archive); `twin`: the archive
    entry's URL with a user part, another server's to the proxy."""
    text = suite.proxy_config(node, kinds=("state", "archive"), extra=extra)
    if not twin:
        return text
    other = node.replace("http://", f"http://{TWIN_USER}@", 1)
    return text.replace(f'url = "{node}"\nkind = "archive"', f'url = "{other}"\nkind = "archive"')


def start_tree_proxy(
    services: Any, name: str, tree: Path, config: Path, tool: tuple[str, ...], ready: float
) -> tuple[str, int]:
    """`tree`'s proxy started (and answering) as service `name`: (its data URL, its pid)."""
    port = suite.free_port()
    url = f"http://127.0.0.1:{port}/{suite.SUITE_CHAIN_ID}"
    svc = services.start(name, tree_proxy(tree, port, config, tool), url, None, ready_timeout=ready)
    return url, svc.proc.pid


def stop_service(services: Any, name: str) -> None:
    """Stop the started service `name` (the rows of the next tree run alone)."""
    for svc in [s for s in services.started if s.name == name]:
        svc.terminate()
        svc.reap(10.0)
        services.started.remove(svc)


def strace_counts(path: Path) -> dict[str, int]:
    """{syscall: calls} from a `strace -c` table."""
    counts: dict[str, int] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0].replace(".", "").isdigit() and parts[-1] != "total":
            counts[parts[-1]] = int(parts[3])
    return counts


def syscalls_row(pid: int, out: Path, name: str, load: dict[str, Any], case: Any, n: int) -> str:
    """CPU µs and syscalls per body of `n` bodies, `strace -c -f` attached to `pid`."""
    proc = psutil.Process(pid)
    cpu = proc.cpu_times()
    res = run_bench(LoadSettings(requests=n, **load), case.plan)
    cpu_us = (sum(proc.cpu_times()[:2]) - sum(cpu[:2])) * 1e6 / n
    if res.requests_ok != n:
        raise SystemExit(f"{name}: {res.requests_ok} of {n} bodies answered")
    table = out / f"strace-{name}.txt"
    cmd = ["strace", "-c", "-f", "-o", str(table), "-p", str(pid)]
    tracer = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    time.sleep(STRACE_ATTACH)
    try:
        res = run_bench(LoadSettings(requests=n, **load), case.plan)
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(30)
    counts = strace_counts(table)
    named = " ".join(f"{k} {counts.get(k, 0) / n:.2f}" for k in SYSCALLS_SHOWN)
    return f"{cpu_us:7.1f} CPU µs/body  syscalls/body {sum(counts.values()) / n:.2f}: {named}"


def run_http(args: argparse.Namespace) -> None:
    out = Path(tempfile.mkdtemp(prefix="realprocs-http-"))
    launch = under_callgrind(args.cache_sim, args.LL, out)
    _, load_cpus = split_cpus()
    trees = [Path(t).resolve() for t in args.tree or ["."]]
    with running() as services:
        state = suite.StateSuite()
        _, node = state.start_chain(services, suite.SuiteOptions(), "archive")
        config = services.workdir / "proxy.toml"
        extra = suite.setting_lines(args.proxy)
        config.write_text(http_config(node, extra, args.twin))
        cases = [c for c in state.cases() if c.name in args.case]
        for i, tree in enumerate(trees):
            label = f"{i}:{tree.name}"
            url, pid = start_tree_proxy(
                services, f"proxy-cg{i}", tree, config, launch.tool, VALGRIND_READY
            )
            for case in cases:
                load = {"url": url, "concurrency": args.c, "timeout": 120.0, "cpus": load_cpus}
                shown = count_row(
                    out, str(pid), f"{case.name}-{i}", {**load, "warmup": 0.0}, case, args
                )
                print(f"{case.name:<10} {label:<16} {shown}", flush=True)
            stop_service(services, f"proxy-cg{i}")
            url, pid = start_tree_proxy(services, f"proxy-{i}", tree, config, (), 60.0)
            for case in cases:
                load = {"url": url, "concurrency": args.c, "timeout": 30.0, "cpus": load_cpus}
                run_bench(LoadSettings(requests=max(1000, args.n), **load, warmup=0.0), case.plan)
                shown = syscalls_row(
                    pid, out, f"{case.name}-{i}", {**load, "warmup": 0.0}, case, args.n
                )
                print(f"{case.name:<10} {label:<16} {shown}", flush=True)
            stop_service(services, f"proxy-{i}")


def count_row(out: Path, pid: str, name: str, load: dict[str, Any], case: Any, args: Any) -> str:
    """Instructions per body of `args.n` bodies through a service under callgrind (`pid`),
    after a warm-up; also without the background work counted per idle second before."""
    run_bench(LoadSettings(requests=max(200, args.n // 5), **load), case.plan)
    callgrind_control(pid, "--zero", "-i on")
    time.sleep(args.idle)
    idle = callgrind_totals(dump(out, pid, f"{name}-idle"))[0] / args.idle
    started = time.monotonic()
    res = run_bench(LoadSettings(requests=args.n, **load), case.plan)
    took = time.monotonic() - started
    totals = [x / args.n for x in callgrind_totals(dump(out, pid, name))]
    callgrind_control(pid, "-i off")
    if res.requests_ok != args.n:
        raise SystemExit(f"{name}: {res.requests_ok} of {args.n} bodies answered")
    background = idle * took / args.n
    shown = f"{totals[0]:9.0f} Ir/body, {totals[0] - background:9.0f} without "
    shown += f"background ({idle / 1e6:.2f}M Ir/s idle over {took:.1f} s)"
    if args.cache_sim:  # Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw
        shown += f"  L1 misses I {totals[3]:.0f} Dr {totals[4]:.0f} Dw {totals[5]:.0f}"
        shown += f"  LL misses {sum(totals[6:9]):.0f}"
    return shown


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.realprocs", description=__doc__)
    sub = p.add_subparsers(dest="mode", required=True)
    gc_p = sub.add_parser("gc", help="collector passes and CPU per request, per row")
    gc_p.add_argument("-d", "--duration", type=float, default=4.0, help="seconds per row")
    gc_p.add_argument("--warmup", type=float, default=1.0, help="seconds of warm-up per row")
    cg_p = sub.add_parser("callgrind", help="instructions (and misses) per body")
    cg_p.add_argument("-n", type=int, default=3000, help="bodies measured per row")
    cg_p.add_argument("-c", type=int, default=16, help="connections")
    cg_p.add_argument("--cache-sim", action="store_true", help="simulate L1 and last level")
    cg_p.add_argument("--LL", help="callgrind's --LL=size,assoc,line (e.g. 1048576,8,64)")
    cg_p.add_argument(
        "--idle", type=float, default=10.0, help="seconds of idle counting before each row"
    )
    http_p = sub.add_parser("http", help="the HTTP proxy in front of the state node")
    http_p.add_argument("-n", type=int, default=2000, help="bodies measured per row")
    http_p.add_argument("-c", type=int, default=16, help="connections")
    http_p.add_argument("--cache-sim", action="store_true", help="simulate L1 and last level")
    http_p.add_argument("--LL", help="callgrind's --LL=size,assoc,line")
    http_p.add_argument("--idle", type=float, default=10.0, help="seconds of idle counting")
    http_p.add_argument(
        "--twin",
        action="store_true",
        help="the archive entry as another URL of the same node (races as with two servers)",
    )
    http_p.add_argument(
        "--tree", action="append", help="a checkout whose proxy is measured (repeatable; .)"
    )
    for each in (gc_p, cg_p, http_p):
        each.add_argument("--case", action="append", help="suite state's case (repeatable)")
        each.add_argument(
            "--proxy",
            action="append",
            type=suite.parse_toml_setting,
            metavar="NAME=VALUE",
            help="a [proxy] setting of proxy-inproc, as `bench suite --proxy`",
        )
    args = p.parse_args(argv)
    args.case = args.case or (
        ["balance10"] if args.mode == "http" else ["balance", "balance10", "storage10"]
    )
    args.proxy = dict(args.proxy or [])
    try:
        {"gc": run_gc, "callgrind": run_callgrind, "http": run_http}[args.mode](args)
    except (RuntimeError, OSError) as exc:
        print(f"bench.realprocs: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

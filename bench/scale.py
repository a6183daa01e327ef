"""`chainstate bench suite scale`: how ingest, disk and reads grow with the chain.

Builds a synthetic chain of mainnet's shape (bench/scalegen.py: by default 1 M accounts and
10 M storage slots over 10 k contracts, then 10 k blocks of ~200 transactions, ~1,500
storage writes and ~400 account changes) and ingests it into a `state` and an `archive`
state node in this process: each block is the write node's `trace_vendorBlock` result as
bytes, decoded and checked by the node's own parse (`Ingest._parsed`) and applied by its own
ingest step (`Ingest.apply_blocks`: the store's write transaction, then the hot view); no network
transport is measured. Block 0 (the allocation) is applied with the store's `apply`, parsed
form only (its JSON would be 1.5 GB).

At 1 %, 10 % and 100 % of the blocks it records the disk each store uses, the memory, the
ingest rate so far, and the read rates of eth_getBalance, eth_getStorageAt and eth_call
`balanceOf` at random heights of each node's range and random keys (through
`StateNode.handle_body`, `--concurrency` requests in flight, per CPU second of the process
and its EVM workers), each as a ratio to the same reads on a small chain built first the
same way. Answers at `latest` are checked against the generator's state. A PNG plot of the
read ratios and the disk size against the chain size is written with matplotlib.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson
import psutil

from bench.services import cpu_seconds

KINDS = ("archive", "state")
METHODS = ("eth_getBalance", "eth_getStorageAt", "eth_call")
CHECKPOINTS = (0.01, 0.1, 1.0)
BODIES = 200_000  # request bodies per read case, each sent once (random heights and keys)
CHECKED = 64  # answers at `latest` compared with the generator's state per checkpoint
PROGRESS_S = 10.0  # seconds between progress lines while ingesting
DEFAULT_PLOT = "docs/scale-growth.png"
SMALL = {"accounts": 5_000, "slots": 50_000, "contracts": 50, "blocks": 200}


def add_scale_options(p: argparse.ArgumentParser) -> None:
    """Sizes of `suite scale` (the suite's other options: --duration, --concurrency, --json,
    --keep-dir)."""
    g = p.add_argument_group("suite scale")
    g.add_argument("--accounts", type=int, default=1_000_000, help="genesis accounts (1 M)")
    g.add_argument("--slots", type=int, default=10_000_000, help="genesis storage slots (10 M)")
    g.add_argument("--contracts", type=int, default=10_000, help="contracts holding them (10 k)")
    g.add_argument("--blocks", type=int, default=10_000, help="blocks after genesis (10 k)")
    g.add_argument("--txs", type=int, default=200, help="transactions per block (200)")
    g.add_argument("--storage-writes", type=int, default=1_500, help="per block (1,500)")
    g.add_argument("--account-changes", type=int, default=400, help="per block (400)")
    g.add_argument("--seed", type=int, default=0, help="the generator's seed (0)")
    g.add_argument(
        "--small",
        default="5000,50000,50,200",
        help="the small chain read rates are compared with: accounts,slots,contracts,blocks "
        "(default 5000,50000,50,200)",
    )
    g.add_argument("--plot", default=DEFAULT_PLOT, help=f"PNG to write ({DEFAULT_PLOT})")
    g.add_argument("--report", help="also write the report as JSON to this file")
    g.add_argument("--window", type=int, default=128, help="the state node's window (128)")
    g.add_argument(
        "--bodies",
        type=int,
        default=BODIES,
        help=f"request bodies drawn per read case ({BODIES:,}); each is sent once, so a "
        "measurement ends early when they run out",
    )
    g.add_argument(
        "--batch",
        type=int,
        default=8,
        help="blocks applied at once, as ingest does while catching up (its fetch_concurrency, "
        "8); 1: a commit per block, as when following the head",
    )


class GcMeter:
    """CPU seconds of the collector's passes (`gc.callbacks`), all of them and those during
    the parse: the parse allocates most of ingest's objects, so most passes start in it, and
    each pass walks what the process holds young (its cost, not the parse's own, is what a
    parse gains when the process holds more)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.in_parse = 0.0
        self.passes = [0, 0, 0]  # per generation
        self.parsing = False
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":  # (a pass runs in one thread: its CPU is that thread's)
            self._started = time.thread_time()
            return
        spent = time.thread_time() - self._started
        self.seconds += spent
        self.in_parse += spent if self.parsing else 0.0
        self.passes[info["generation"]] += 1


@dataclass
class Meter:
    """CPU seconds spent per stage while ingesting, and blocks done."""

    blocks: int = 0
    generate: float = 0.0
    parse: float = 0.0
    apply: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))
    written: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    wall: float = 0.0
    gc: GcMeter = field(default_factory=GcMeter)

    def rates(self, writes_per_block: int) -> dict[str, Any]:
        """Per node: blocks and state writes per CPU second of its ingest (parse + apply)."""
        out: dict[str, Any] = {"blocks": self.blocks}
        for kind in KINDS:
            cpu = self.parse + self.apply[kind]
            per_block = cpu / self.blocks if self.blocks else 0.0
            bps = 1 / per_block if per_block else 0.0
            out[kind] = {
                "blocks_per_cpu_s": round(bps, 1),
                "writes_per_cpu_s": round(bps * writes_per_block),
                "parse_ms": round(1000 * self.parse / max(self.blocks, 1), 2),
                "apply_ms": round(1000 * self.apply[kind] / max(self.blocks, 1), 2),
                "written_per_block": round(self.written[kind] / max(self.blocks, 1)),
            }
        out["generate_ms"] = round(1000 * self.generate / max(self.blocks, 1), 2)
        out["gc"] = {
            "ms": round(1000 * self.gc.seconds / max(self.blocks, 1), 2),
            "in_parse_ms": round(1000 * self.gc.in_parse / max(self.blocks, 1), 2),
            "passes": list(self.gc.passes),
        }
        return out


def _shape(args: argparse.Namespace, small: bool = False) -> Any:
    from bench.scalegen import ChainShape

    per_block = {"txs": args.txs, "storage_writes": args.storage_writes}
    per_block["account_changes"] = args.account_changes
    if small:
        names = ("accounts", "slots", "contracts", "blocks")
        sizes = dict(zip(names, (int(x) for x in args.small.split(",")), strict=True))
        return ChainShape(**sizes, **per_block, seed=args.seed)
    return ChainShape(
        accounts=args.accounts, slots=args.slots, contracts=args.contracts,
        blocks=args.blocks, seed=args.seed, **per_block,
    )  # fmt: skip


def _disk(node: Any) -> dict[str, int]:
    """Bytes the store's file takes on disk, and the pages LMDB uses in it."""
    path = node.store.path / "data.mdb"
    env = node.store._env
    info, stat = env.info(), env.stat()
    out: dict[str, Any] = {
        "file": os.stat(path).st_blocks * 512,
        "used": (info["last_pgno"] + 1) * stat["psize"],
    }
    with env.begin(write=True) as txn:  # (opening a named database's handle needs one)
        names = [key for key, _ in txn.cursor()]
        for name in names:
            db = env.open_db(name, txn=txn, create=False)
            s = txn.stat(db)
            pages = s["branch_pages"] + s["leaf_pages"] + s["overflow_pages"]
            out[name.decode()] = {"entries": s["entries"], "bytes": pages * s["psize"]}
    return out


def _written() -> int:
    """Bytes this process has had written to disk (the page writes and syncs of commits)."""
    return psutil.Process().io_counters().write_bytes


def _memory() -> dict[str, int]:
    """RSS of this process (both nodes and the generator) and of the EVM workers; `shared`
    is the part that is file pages (LMDB maps its store: the pages reads and writes touched,
    which the kernel can drop), so `rss - shared` is the process's own memory. The same for
    the workers (and the feed processes), which read the store too: each counts the store's
    pages it touched, the same pages of the page cache another counts."""
    me = psutil.Process()
    info = me.memory_info()
    children = [c.memory_info() for c in me.children(recursive=True)]
    return {
        "rss": info.rss,
        "shared": info.shared,
        "workers_rss": sum(c.rss for c in children),
        "workers_shared": sum(c.shared for c in children),
    }


class ScaleRun:
    """One chain: its generator, the two nodes, and what was measured on them."""

    def __init__(self, shape: Any, root: Path, args: argparse.Namespace, opts: Any) -> None:
        self.shape, self.root, self.opts = shape, root, opts
        self.window, self.batch, self.say = args.window, args.batch, _say
        self.bodies = args.bodies
        self.nodes: dict[str, Any] = {}
        self.meter = Meter()
        self.points: list[dict[str, Any]] = []
        self.genesis: dict[str, Any] = {}

    async def __aenter__(self) -> ScaleRun:
        from nodes.state.service import StateNode

        for kind in KINDS:
            section = {"key": f"{kind}-1", "kind": kind, "chain_id": 1337}
            if kind == "state":
                section["window"] = self.window
            node = StateNode.from_config(section, data_dir=self.root / kind)
            await node.start()
            self.nodes[kind] = node
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.meter.gc in gc.callbacks:
            gc.callbacks.remove(self.meter.gc)
        for node in self.nodes.values():
            await node.close()

    async def build(self, checkpoints: tuple[float, ...]) -> None:
        from bench.scalegen import SyntheticChain

        started = time.perf_counter()
        self.chain = SyntheticChain(self.shape, self.say)
        self.say(f"generator ready in {time.perf_counter() - started:.0f} s")
        await self._genesis()
        gc.callbacks.append(self.meter.gc)  # (from the first block: the meter is per block)
        targets = sorted({max(1, round(f * self.shape.blocks)) for f in checkpoints})
        for target in targets:
            await self._ingest_to(target)
            await self.checkpoint()

    async def _genesis(self) -> None:
        cpu = time.process_time()
        block = self.chain.genesis()
        writes = sum(
            (d.balance is not None) + (d.code is not None) + len(d.storage)
            for d in block.post.values()
        )
        self.genesis = {"writes": writes, "build_cpu_s": round(time.process_time() - cpu, 1)}
        for kind, node in self.nodes.items():
            cpu, wall = time.process_time(), time.perf_counter()
            await asyncio.to_thread(node.store.apply, block, verify_pre=False)
            self.genesis[kind] = {
                "apply_cpu_s": round(time.process_time() - cpu, 1),
                "apply_wall_s": round(time.perf_counter() - wall, 1),
                "disk": _disk(node),
            }
            self.say(f"genesis ({writes:,} values) into {kind}: {self.genesis[kind]}")
        self.genesis["memory"] = _memory()

    async def _ingest_to(self, target: int) -> None:
        chain, meter = self.chain, self.meter
        started, last = time.perf_counter(), time.perf_counter()
        while chain.height < target:
            batch = []
            while chain.height < target and len(batch) < self.batch:
                t0 = time.process_time()
                raw = chain.next_block()
                t1 = time.process_time()
                meter.generate += t1 - t0
                ingest = self.nodes["archive"].ingest
                meter.gc.parsing = True
                batch.append(await ingest._parsed(orjson.loads(raw), chain.height))
                meter.gc.parsing = False
                meter.parse += time.process_time() - t1
            for kind, node in self.nodes.items():
                # each node encodes the block's writes, as when it parses its own copy
                own = [replace(block) for block in batch]
                before, io = time.process_time(), _written()
                await node.ingest.apply_blocks(own)
                del own
                collect_young()
                meter.apply[kind] += time.process_time() - before
                meter.written[kind] += _written() - io
            meter.blocks += len(batch)
            if time.perf_counter() - last >= PROGRESS_S:
                last = time.perf_counter()
                rates = meter.rates(self.shape.writes_per_block)
                self.say(
                    f"block {chain.height:,}/{self.shape.blocks:,}: archive "
                    f"{rates['archive']['blocks_per_cpu_s']} blocks/CPU s, state "
                    f"{rates['state']['blocks_per_cpu_s']}; parse "
                    f"{rates['archive']['parse_ms']} ms/block (collector "
                    f"{rates['gc']['in_parse_ms']}, in all {rates['gc']['ms']}); generating "
                    f"{rates['generate_ms']} ms/block; rss "
                    f"{_memory()['rss'] / 2**20:,.0f} MiB"
                )
        meter.wall += time.perf_counter() - started

    async def checkpoint(self) -> None:
        height = self.chain.height
        point: dict[str, Any] = {
            "blocks": height,
            "ingest": self.meter.rates(self.shape.writes_per_block),
            "memory": _memory(),
            "gc_objects": [len(gc.get_objects(g)) for g in range(3)],  # per generation
        }
        last = self.points[-1] if self.points else None
        for kind, node in self.nodes.items():
            disk = _disk(node)
            grown = disk["file"] - self.genesis[kind]["disk"]["file"]
            # since the previous checkpoint: a store's first blocks split the pages the
            # genesis filled, so the growth from genesis overstates the lasting cost
            since, blocks = grown, height
            if last is not None:
                since, blocks = disk["file"] - last[kind]["disk"]["file"], height - last["blocks"]
            point[kind] = {
                "disk": disk,
                "bytes_per_block": round(grown / height),
                "bytes_per_change": round(grown / (height * self.shape.writes_per_block), 1),
                "bytes_per_block_lately": round(since / blocks),
                "bytes_per_change_lately": round(since / (blocks * self.shape.writes_per_block), 1),
                "reads": await self.reads(node),
            }
        await self._check_latest()
        self.points.append(point)
        self.say(f"checkpoint at block {height:,}: {json.dumps(point)}")

    async def reads(self, node: Any) -> dict[str, Any]:
        from bench.scale_reads import measure, read_bodies

        out = {}
        earliest, head = node.store.range()
        for method in METHODS:
            bodies = read_bodies(self.chain, method, earliest, head, self.bodies)
            out[method] = await measure(node, bodies, self.opts.duration, self.opts.concurrency)
        return out

    async def _check_latest(self) -> None:
        from bench.scale_reads import check_latest

        for node in self.nodes.values():
            await check_latest(self.chain, node, CHECKED)

    def report(self) -> dict[str, Any]:
        return {
            "shape": asdict(self.shape),
            "genesis": self.genesis,
            "points": self.points,
            "generator_bytes": self.chain.nbytes(),
        }


async def run_scale(args: argparse.Namespace, opts: Any) -> dict[str, Any]:
    say = _say
    try:
        import matplotlib  # noqa: F401
        import numpy  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(
            f"suite scale needs the bench extras ({exc.name} is missing): pip install -e '.[bench]'"
        ) from None
    try:
        small_shape, large_shape = _shape(args, small=True), _shape(args)
        small_shape.check()
        large_shape.check()
    except ValueError as exc:
        raise RuntimeError(f"suite scale: {exc}") from None
    node_gc()
    root = Path(opts.keep_dir or tempfile.mkdtemp(prefix="chainstate-scale-"))
    try:
        say(f"small chain: {asdict(small_shape)}")
        async with ScaleRun(small_shape, root / "small", args, opts) as small:
            await small.build((1.0,))
        say(f"chain: {asdict(large_shape)}")
        async with ScaleRun(large_shape, root / "large", args, opts) as large:
            await large.build(CHECKPOINTS)
        report = {"small": small.report(), "large": large.report()}
        report["ratios"] = ratios(report)
        if args.plot:
            from bench.scale_plot import plot

            plot(report, Path(args.plot))
            say(f"plot written to {args.plot}")
        if args.report:
            await asyncio.to_thread(Path(args.report).write_text, json.dumps(report, indent=2))
        return report
    finally:
        if not opts.keep_dir:
            shutil.rmtree(root, ignore_errors=True)


def collect_young() -> None:
    """Collect the young objects a node's apply left, counted in that node's apply.

    Both nodes share this process and one parse, which counts for each of them; collections
    that started in the parse walked both nodes' new objects (their hot views' entries, the
    writes they encoded) and were charged twice, where a node in its own process pays only
    for its own. Collected here, the young objects of each apply are walked once, by the
    node that made them, and the parse's passes walk the parse's."""
    gc.collect(0)


def node_gc() -> None:
    """Collect young objects as a state node's process does (chainstate/runner.py): with
    Python's default, collections scanning the process's many live objects (the hot view,
    the blocks in flight) cost ingest CPU that the node does not spend."""
    from chainstate.runner import GC_YOUNG_THRESHOLD

    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


def ratios(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Each checkpoint's read rates per CPU second over the small chain's."""
    base = report["small"]["points"][-1]
    out = []
    for point in report["large"]["points"]:
        row: dict[str, Any] = {"blocks": point["blocks"]}
        for kind in KINDS:
            for method in METHODS:
                ours = point[kind]["reads"][method]["per_cpu_s"]
                theirs = base[kind]["reads"][method]["per_cpu_s"]
                row[f"{kind}:{method}"] = round(ours / theirs, 2) if theirs else None
        out.append(row)
    return out


def render(report: dict[str, Any]) -> str:
    from bench.scale_plot import render_text

    return render_text(report)


def _say(text: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def cpu_of_process_tree() -> float:
    return cpu_seconds(psutil.Process()) or 0.0

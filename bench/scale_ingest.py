"""Ingest CPU per block, parse and apply apart, in process (`python -m bench.scale_ingest`).

`suite scale` measures ingest while it also reads, checkpoints and grows a chain for hours;
this measures only what one block costs the state node to ingest, on a chain of the same
shape (bench/scalegen.py), so that a change to the parse or the store can be compared
before and after in minutes. The blocks are generated first (their bytes kept; `--save DIR`
keeps them and the two stores after genesis on disk, `--load DIR` starts from there), then
each repetition ingests all of them into an `archive` and a `state` node (genesis applied
first, not measured), `--batch` blocks at a time through `Ingest.apply_blocks`, as `suite
scale` does. Figures are CPU ms per block of this process (its threads included): parse =
`orjson.loads` + `Ingest._parsed`, apply = `apply_blocks` per node (with, per block, its
page faults, kernel CPU ms and disk writes, and with `--span N` the apply ms of each N
blocks, to see what grows with the store). `--callgrind` counts
instructions per block instead (from `--load DIR`: generating under valgrind takes hours),
which the machine's load does not change; the kernel's share of a commit is not in them.

    python -m bench.scale_ingest --save /tmp/chain --blocks 120     # 100 k accounts, 1 M slots
    python -m bench.scale_ingest --load /tmp/chain --repeat 2
    python -m bench.scale_ingest --load /tmp/chain --callgrind --blocks 48 --window 16
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import mmap
import os
import resource
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import orjson

from bench.marks import MARK, segment_counts
from bench.scale import collect_young, node_gc

KINDS = ("archive", "state")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scale_ingest", description=__doc__)
    p.add_argument("--accounts", type=int, default=100_000)
    p.add_argument("--slots", type=int, default=1_000_000)
    p.add_argument("--contracts", type=int, default=1_000)
    p.add_argument("--blocks", type=int, default=120, help="blocks after genesis (120)")
    p.add_argument("--txs", type=int, default=200)
    p.add_argument("--storage-writes", type=int, default=1_500)
    p.add_argument("--account-changes", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--window", type=int, default=32, help="the state node's window (32)")
    p.add_argument("--batch", type=int, default=8, help="blocks applied at once (8)")
    p.add_argument("--repeat", type=int, default=2, help="ingests of the same blocks (2)")
    p.add_argument("--map-size-mb", type=int, default=16384, help="each store's LMDB map")
    p.add_argument("--save", type=Path, help="generate the chain into this folder and stop")
    p.add_argument("--load", type=Path, help="ingest the chain saved in this folder")
    p.add_argument("--span", type=int, default=0, help="also apply ms per span of N blocks")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--callgrind", action="store_true", help="count instructions (with --load)")
    p.add_argument(
        "--interleave",
        action="store_true",
        help="parse each batch just before applying it, as suite scale does (CPU only)",
    )
    p.add_argument("--marks", action="store_true", help=argparse.SUPPRESS)  # (the run inside)
    args = p.parse_args(argv)
    if args.callgrind:
        if args.interleave:
            raise SystemExit("--interleave counts CPU only: not with --callgrind")
        return callgrind(args)
    node_gc()  # as the node's process collects (bench/scale.py)
    report = asyncio.run(_run(args))
    if args.json:
        print(json.dumps(report))
    elif not (args.save or args.marks):
        for row in report["runs"]:
            print(
                f"parse {row['parse_ms']:.1f} ms/block   apply archive "
                f"{row['apply_ms']['archive']:.1f}   apply state {row['apply_ms']['state']:.1f}"
            )
    return 0


def callgrind(args: argparse.Namespace) -> int:
    """Run one ingest of the saved chain under callgrind; print instructions per block."""
    if args.load is None:
        raise SystemExit("--callgrind needs --load DIR (a chain saved with --save)")
    argv = ["--load", str(args.load), "--blocks", str(args.blocks), "--window", str(args.window)]
    argv += ["--batch", str(args.batch), "--repeat", "1", "--map-size-mb", "2048"]
    with tempfile.TemporaryDirectory() as tmp:
        counts = segment_counts("bench.scale_ingest", argv, Path(tmp))
    # dumps: the set-up, the parse, the archive's apply, the state's apply, the exit
    parse, archive, state = (c / args.blocks / 1e6 for c in counts[1:4])
    print(
        f"M instructions per block: parse {parse:.1f}   apply archive {archive:.1f}   "
        f"apply state {state:.1f}"
    )
    return 0


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    if args.load is not None:
        raws = (args.load / "blocks.jsonl").read_bytes().splitlines()[: args.blocks]
        genesis = None
    else:
        genesis, raws = _generate(args)
    if args.save is not None:
        args.save.mkdir(parents=True, exist_ok=True)
        (args.save / "blocks.jsonl").write_bytes(b"\n".join(raws) + b"\n")
        await _genesis_stores(args, genesis, args.save)
        _say(f"chain saved in {args.save}")
        return {}
    runs = []
    for rep in range(args.repeat):
        runs.append(await _ingest(args, genesis, raws))
        _say(f"run {rep + 1}: {runs[-1]}")
    return {"blocks": len(raws), "runs": runs}


def _generate(args: argparse.Namespace) -> tuple[Any, list[bytes]]:
    from bench.scalegen import ChainShape, SyntheticChain

    shape = ChainShape(
        accounts=args.accounts, slots=args.slots, contracts=args.contracts, blocks=args.blocks,
        txs=args.txs, storage_writes=args.storage_writes,
        account_changes=args.account_changes, seed=args.seed,
    )  # fmt: skip
    _say(f"chain: {asdict(shape)}")
    chain = SyntheticChain(shape, _say)
    genesis = chain.genesis()
    raws = [chain.next_block() for _ in range(shape.blocks)]
    _say(f"{len(raws)} blocks generated, {sum(map(len, raws)) / len(raws) / 1024:.0f} KiB each")
    return genesis, raws


async def _nodes(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """An archive and a state node on the stores under `root` (new or as saved), started."""
    from nodes.state.service import StateNode

    nodes: dict[str, Any] = {}
    for kind in KINDS:
        section: dict[str, Any] = {"key": f"{kind}-1", "kind": kind, "chain_id": 1337}
        section["map_size_mb"] = args.map_size_mb
        if kind == "state":
            section["window"] = args.window
        nodes[kind] = StateNode.from_config(section, data_dir=root / kind)
        try:
            await nodes[kind].start()
        except BaseException:
            del nodes[kind]
            await _close(nodes)
            raise
    return nodes


async def _close(nodes: dict[str, Any]) -> None:
    for node in nodes.values():
        await node.close()


async def _genesis_stores(args: argparse.Namespace, genesis: Any, root: Path) -> None:
    nodes = await _nodes(args, root)
    try:
        for node in nodes.values():
            await asyncio.to_thread(node.store.apply, genesis, verify_pre=False)
    finally:
        await _close(nodes)


async def _ingest(args: argparse.Namespace, genesis: Any, raws: list[bytes]) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="chainstate-ingest-"))
    try:
        if genesis is None:  # saved: a copy of the stores after genesis
            for kind in KINDS:
                shutil.copytree(args.load / kind, root / kind)
                _settle(root / kind)
        else:
            await _genesis_stores(args, genesis, root)
        nodes = await _nodes(args, root)
        try:
            return await _measure(args, nodes, raws)
        finally:
            await _close(nodes)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _settle(folder: Path) -> None:
    """Cache a copied store page by page, as the node's random-access map reads it.

    The copy leaves its file in the page cache as large folios (Linux 6.16+ on ext4), and a
    4 KiB write into a large folio makes the kernel write back all of it (up to MiBs): the
    run would pay for how the copy was made. So the copy is dropped from the cache and read
    back one page at a time (MADV_RANDOM, as LMDB maps it with readahead off), unmeasured."""
    for path in folder.rglob("*.mdb"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            size = os.fstat(fd).st_size
            if size == 0:
                continue
            with mmap.mmap(fd, size, prot=mmap.PROT_READ) as view:
                view.madvise(mmap.MADV_RANDOM)
                sum(view[i] for i in range(0, size, mmap.PAGESIZE))
        finally:
            os.close(fd)


async def _measure(args: argparse.Namespace, nodes: dict[str, Any], raws: list[bytes]) -> Any:
    """Parse every block, then apply them to each node in turn (callgrind: a segment each)."""
    if args.interleave:
        return await _interleaved(args, nodes, raws)
    mark = MARK if args.marks else _nothing
    ingest = nodes["archive"].ingest
    mark()
    started = time.process_time()
    blocks = [await ingest._parsed(orjson.loads(raw), h) for h, raw in enumerate(raws, 1)]
    parse = time.process_time() - started
    apply, spans, io = {}, {}, {}
    for kind, node in nodes.items():
        own = [_own(block) for block in blocks]
        mark()
        before, started = _usage(), time.process_time()
        cpus = []
        for start in range(0, len(own), args.batch):
            await node.ingest.apply_blocks(own[start : start + args.batch])
            cpus.append(time.process_time())
        apply[kind] = time.process_time() - started
        io[kind] = _per_block(before, _usage(), len(own))
        spans[kind] = _spans(args, started, cpus)
    mark()
    n = len(raws)
    report = {
        "parse_ms": round(1000 * parse / n, 2),
        "apply_ms": {kind: round(1000 * cpu / n, 2) for kind, cpu in apply.items()},
        "per_block": io,
    }
    if args.span:
        report["apply_ms_by_span"] = spans
    return report


async def _interleaved(args: argparse.Namespace, nodes: dict[str, Any], raws: list[bytes]) -> Any:
    """Parse each batch just before it is applied to each node, as `suite scale` and a node
    catching up do: the parse then runs while the hot views are full, and pays the
    collections that start in it (the collector's CPU is reported apart, as in the suite)."""
    from bench.scale import GcMeter

    ingest, meter = nodes["archive"].ingest, GcMeter()
    parse, apply = 0.0, dict.fromkeys(nodes, 0.0)
    gc.callbacks.append(meter)
    try:
        for start in range(0, len(raws), args.batch):
            started, meter.parsing = time.process_time(), True
            heights = range(start + 1, min(start + args.batch, len(raws)) + 1)
            batch = [await ingest._parsed(orjson.loads(raws[h - 1]), h) for h in heights]
            parse += time.process_time() - started
            meter.parsing = False
            for kind, node in nodes.items():
                own = [_own(block) for block in batch]
                started = time.process_time()
                await node.ingest.apply_blocks(own)
                del own
                collect_young()  # (as suite scale: each apply pays for its young objects)
                apply[kind] += time.process_time() - started
    finally:
        gc.callbacks.remove(meter)
    n = len(raws)
    return {
        "parse_ms": round(1000 * parse / n, 2),
        "apply_ms": {kind: round(1000 * cpu / n, 2) for kind, cpu in apply.items()},
        "gc": {
            "ms": round(1000 * meter.seconds / n, 2),
            "in_parse_ms": round(1000 * meter.in_parse / n, 2),
            "passes": list(meter.passes),
        },
    }


def _spans(args: argparse.Namespace, started: float, cpus: list[float]) -> list[float]:
    """Apply CPU ms per block over each `--span` blocks (whole batches), to see it grow."""
    per = max(1, args.span // args.batch)
    out, last = [], started
    for i in range(per - 1, len(cpus), per):
        out.append(round(1000 * (cpus[i] - last) / (per * args.batch), 2))
        last = cpus[i]
    return out


def _usage() -> dict[str, float]:
    """The process's page faults, kernel CPU and disk writes so far (/proc/self/io counts
    every page-cache folio a write dirtied, whole: more than the bytes written when the
    folios are large)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    io = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return {
        "minor_faults": ru.ru_minflt,
        "major_faults": ru.ru_majflt,
        "sys_ms": 1000 * ru.ru_stime,
        "mb_written": int(io["write_bytes"]) / 1e6,
    }


def _per_block(before: dict[str, float], after: dict[str, float], n: int) -> dict[str, float]:
    return {key: round((after[key] - before[key]) / n, 2) for key in after}


def _own(block: Any) -> Any:
    """The block without the writes another node encoded: each node encodes its own, as when
    it parses its own copy (a store from before they were kept on the block has none)."""
    return block if getattr(block, "writes", None) is None else replace(block)


def _nothing() -> None:
    return None


def _say(text: str) -> None:
    print(f"[ingest {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())

"""Ingest CPU per block, parse and apply apart, in process (`python -m bench.scale_ingest`).

`suite scale` measures ingest while it also reads, checkpoints and grows a chain for hours;
this measures only what one block costs the state node to ingest, on a chain of the same
shape (bench/scalegen.py), so that a change to the parse or the store can be compared
before and after in minutes: the blocks are generated first (their bytes kept), then each
repetition ingests all of them into a fresh `archive` and a fresh `state` node (genesis
applied first, not measured), `--batch` blocks at a time through `Ingest.apply_blocks`, as
`suite scale` does. Figures are CPU ms per block of this process (its threads included):
parse = `orjson.loads` + `Ingest._parsed`, apply = `apply_blocks` per node.

    python -m bench.scale_ingest --accounts 100000 --slots 1000000 --contracts 1000 \\
        --blocks 120 --window 32 --repeat 2
    py-spy record --format raw -o ingest.txt -- python -m bench.scale_ingest ...   # profile
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson


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
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args(argv)
    report = asyncio.run(_run(args))
    if args.json:
        print(json.dumps(report))
    else:
        for row in report["runs"]:
            print(
                f"parse {row['parse_ms']:.1f} ms/block   apply archive "
                f"{row['apply_ms']['archive']:.1f}   apply state {row['apply_ms']['state']:.1f}"
            )
    return 0


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    from bench.scalegen import ChainShape, SyntheticChain

    shape = ChainShape(
        accounts=args.accounts, slots=args.slots, contracts=args.contracts, blocks=args.blocks,
        txs=args.txs, storage_writes=args.storage_writes,
        account_changes=args.account_changes, seed=args.seed,
    )  # fmt: skip
    chain = SyntheticChain(shape, _say)
    genesis = chain.genesis()
    raws = [chain.next_block() for _ in range(shape.blocks)]
    _say(f"{len(raws)} blocks generated, {sum(map(len, raws)) / len(raws) / 1024:.0f} KiB each")
    runs = []
    for rep in range(args.repeat):
        runs.append(await _ingest(args, genesis, raws))
        _say(f"run {rep + 1}: {runs[-1]}")
    return {"shape": asdict(shape), "runs": runs}


async def _ingest(args: argparse.Namespace, genesis: Any, raws: list[bytes]) -> dict[str, Any]:
    from nodes.state.service import StateNode

    root = Path(tempfile.mkdtemp(prefix="chainstate-ingest-"))
    nodes: dict[str, Any] = {}
    try:
        for kind in ("archive", "state"):
            section: dict[str, Any] = {"key": f"{kind}-1", "kind": kind, "chain_id": 1337}
            if kind == "state":
                section["window"] = args.window
            node = StateNode.from_config(section, data_dir=root / kind)
            await node.start()
            await asyncio.to_thread(node.store.apply, genesis, verify_pre=False)
            nodes[kind] = node
        parse, apply = 0.0, dict.fromkeys(nodes, 0.0)
        ingest = nodes["archive"].ingest
        for start in range(0, len(raws), args.batch):
            batch = []
            for height, raw in enumerate(raws[start : start + args.batch], start + 1):
                t0 = time.process_time()
                batch.append(await ingest._parsed(orjson.loads(raw), height))
                parse += time.process_time() - t0
            for kind, node in nodes.items():
                t0 = time.process_time()
                await node.ingest.apply_blocks(batch)
                apply[kind] += time.process_time() - t0
        n = len(raws)
        return {
            "parse_ms": round(1000 * parse / n, 2),
            "apply_ms": {kind: round(1000 * cpu / n, 2) for kind, cpu in apply.items()},
        }
    finally:
        for node in nodes.values():
            await node.close()
        shutil.rmtree(root, ignore_errors=True)


def _say(text: str) -> None:
    print(f"[ingest {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())

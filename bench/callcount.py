"""`python -m bench.callcount`: instructions per eth_call in the state node's process and in
one EVM worker, counted by callgrind (not timed: a count does not move with the machine's
load).

On `bench.nodecalls`' synthetic chain (EVM workers and feed process as in production), `-c`
clients keep single eth_calls in flight through the node's own port (`answer_port`, as its
HTTP server calls it) at random old heights (`--old`, the default) or at latest, `-n` calls
per segment after a warm-up. The jobs the node sends its workers during the last segment are
recorded and then replayed on a `Runner` in this process, as a worker runs them (the pickled
job read, run, the answer packed and pickled as `worker_main` sends it), once to warm it and
then `--replays` times counted.

    python -m bench.callcount --callgrind              # runs itself under valgrind
    python -m bench.callcount --callgrind -c 1         # one call in flight: a job per call

Under callgrind the node's process runs ~50 times slower while its workers (not traced) do
not, so the workers are idle whenever a job is ready, as when the node's process is the
busy one. Prints instructions per call of each segment: the node's process (workers not
traced), then the worker's (every call of the recorded jobs).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pickle
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.marks import MARK, segment_counts
from bench.nodecalls import ERC20, ONE_SLOT, VIEW, call_bodies, synthetic_node
from nodes.state.evm import pool
from nodes.state.evm.wire import HeldEnvs, WorkerEnvs, pack, pack_answer, unpack
from nodes.state.evm.worker import Runner
from nodes.state.service import StateNode

TARGETS = {"one-slot": ONE_SLOT, "view": VIEW, "erc20": ERC20}


async def segment(node: StateNode, bodies: list[bytes], n: int, concurrency: int) -> None:
    """`n` bodies through the node's port, `concurrency` at a time, every answer checked."""
    sent = 0

    async def client() -> None:
        nonlocal sent
        while sent < n:
            body = bodies[sent % len(bodies)]
            sent += 1
            got: Any = node.answer_port(body)
            if got is None:
                got = await node.handle_body(body)
            elif got.__class__ is not bytes:
                got = await got
            if b'"result"' not in got:
                raise RuntimeError(f"not a result: {got[:300]!r}")

    await asyncio.gather(*(client() for _ in range(concurrency)))


def calls_in(job: dict[str, Any]) -> int:
    if job["kind"] == "groups":
        return sum(len(one["calls"]) for one in job["jobs"])
    return len(job["calls"])


def with_store(job: dict[str, Any], path: str) -> dict[str, Any]:
    for one in job["jobs"] if job["kind"] == "groups" else (job,):
        if one.get("store"):
            one["store"] = [path, one["store"][1]]
    return job


def wires(jobs: list[bytes], held: HeldEnvs, envs: dict[Any, Any]) -> list[bytes]:
    """The recorded jobs as the node sends them to a worker whose envs `held` records; one
    env dict per block, kept in `envs`, as the node has them."""
    out = []
    for raw in jobs:
        job = pickle.loads(raw)
        for one in job["jobs"] if job["kind"] == "groups" else (job,):
            one["block"] = envs.setdefault(tuple(one["block"].items()), one["block"])
        out.append(pickle.dumps(pack(job, held), pickle.HIGHEST_PROTOCOL))
    return out


def replay(runner: Runner, envs: WorkerEnvs, jobs: list[bytes]) -> None:
    """Each job as a worker runs it: read from its bytes, run, its answer packed and
    pickled."""
    for raw in jobs:
        answer = runner.run(unpack(pickle.loads(raw), envs))
        pickle.dumps(pack_answer(answer), pickle.HIGHEST_PROTOCOL)


async def main_async(args: argparse.Namespace) -> None:
    rng = random.Random(0)
    recorded: dict[int, list[bytes]] = {}  # jobs as the node hands them to each worker
    recording = False
    send = pool._Worker.send

    def record(self: pool._Worker, job: dict[str, Any]) -> Any:
        if recording:
            recorded.setdefault(id(self), []).append(pickle.dumps(job))
        return send(self, job)

    pool._Worker.send = record  # type: ignore[method-assign]
    evm = {"warm_answers": args.answers} if args.answers is not None else None
    erc20 = args.to == "erc20"
    async with synthetic_node(args.blocks, rng, map_size_mb=256, evm=evm, erc20=erc20) as node:
        head = args.blocks - 1
        bodies = call_bodies(TARGETS[args.to], args.old, head, 1, rng)
        await segment(node, bodies, max(args.n, len(bodies)), args.concurrency)  # warm-up
        limits = node.evm.executor.pool._limits
        if args.marks:
            MARK()
        profile = cProfile.Profile() if args.profile else None
        for _ in range(args.passes):
            if profile:
                profile.enable()
            await segment(node, bodies, args.n, args.concurrency)
            if profile:
                profile.disable()
            if args.marks:
                MARK()
        recording = True  # a pass of its own: recording costs the node's process
        await segment(node, bodies, args.n, args.concurrency)
        recording = False
        if args.marks:
            MARK()
        if profile:
            profile.dump_stats(args.profile)
        # one worker's jobs (its blocks are warm on it, as the executor steers them)
        jobs = max(recorded.values(), key=len)
        # LMDB opens a store once per process: the workers' direct reads go to a copy
        scratch = tempfile.TemporaryDirectory()
        copy = Path(args.tmp or scratch.name) / "replay-store"
        copy.mkdir()
        node.store._env.copy(str(copy))  # type: ignore[union-attr]
        jobs = [pickle.dumps(with_store(pickle.loads(raw), str(copy))) for raw in jobs]
        runner = Runner(limits, node.evm.settings.worker_warm_blocks)
        held, envs = HeldEnvs(), WorkerEnvs()
        canon: dict[Any, Any] = {}
        replay(runner, envs, wires(jobs, held, canon))
        jobs = wires(jobs, held, canon)  # (every env held now, as by a worker that ran them)
        if args.marks:
            MARK()
        wprofile = cProfile.Profile() if args.worker_profile else None
        for _ in range(args.replays):
            if wprofile:
                wprofile.enable()
            replay(runner, envs, jobs)
            if wprofile:
                wprofile.disable()
            if args.marks:
                MARK()
        if wprofile:
            wprofile.dump_stats(args.worker_profile)
        calls = sum(calls_in(unpack(pickle.loads(raw), envs)) for raw in jobs)
        sizes = {len(v) for v in recorded.values()}
        print(f"replayed {len(jobs)} jobs of {calls} calls (jobs per worker {sizes})")
        if args.tmp:
            (Path(args.tmp) / "calls").write_text(str(calls))
        scratch.cleanup()


def callgrind(args: argparse.Namespace) -> int:
    """This script under callgrind, a dump per segment; instructions per call of each."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = [f"--tmp={tmp}", *(a for a in sys.argv[1:] if a != "--callgrind")]
        counts = segment_counts("bench.callcount", argv, Path(tmp))
        calls = int((Path(tmp) / "calls").read_text())
    # dump 1: the set-up; then the node's passes, the recording pass, the replay's warm-up,
    # the replays; the exit
    node = [c / args.n for c in counts[1 : 1 + args.passes]]
    worker = [c / calls for c in counts[3 + args.passes : 3 + args.passes + args.replays]]
    print(f"instructions per call, the node's process: {', '.join(f'{c:,.0f}' for c in node)}")
    print(f"instructions per call, a worker: {', '.join(f'{c:,.0f}' for c in worker)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.callcount",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-n", type=int, default=2000, help="calls per segment (default 2000)")
    p.add_argument("-c", "--concurrency", type=int, default=64, help="calls in flight (64)")
    p.add_argument("--passes", type=int, default=2, help="segments through the node (2)")
    p.add_argument("--replays", type=int, default=2, help="counted replays of the jobs (2)")
    p.add_argument("--blocks", type=int, default=400, help="chain length (default 400)")
    p.add_argument(
        "--to",
        choices=tuple(TARGETS),
        default="one-slot",
        help="the contract: one-slot (a one-SLOAD read), view (64 SLOADs), erc20 "
        "(OpenZeppelin's balanceOf; its code from npm)",
    )
    p.add_argument("--latest", dest="old", action="store_false", help="calls at latest")
    p.add_argument(
        "--answers",
        type=int,
        help="[evm] warm_answers (default: the setting's); 0: every call runs in the replays",
    )
    p.add_argument("--callgrind", action="store_true", help="count under valgrind")
    p.add_argument("--profile", help="a cProfile of the node's passes to this file")
    p.add_argument("--worker-profile", help="a cProfile of the replays to this file")
    p.add_argument("--marks", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--tmp", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.callgrind:
        return callgrind(args)
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m bench.scancount`: a batch's two byte checks called N times in process.

Why: `Scanner.scan` (the client's body) and `classify.results_in_order` (the node's answer)
are a third of the proxy's instructions per batch of 100 and run with no I/O, so their
counts are taken alone, with no node, loop or polls around them. Run under callgrind with
N and 2N calls and take the difference per call:

    valgrind --tool=callgrind python -m bench.scancount --step scan --batch 100 -n 200
    (the same with -n 400; "Collected" on stderr: instructions)

The bodies are `bench suite proxy`'s batch case (eth_getBalance of the fake node's
addresses at heights in its window), the answers the fake node's to them; `--one-block`
writes every item of a body at its first item's block. `--step rows` is the scan and then
the rows' bounds (`Rows.bounds`: the lowest and highest height, which the node choice
asks of every batch next).
"""

from __future__ import annotations

import argparse
import sys

import orjson

from bench.bodies import BlockRange, BodyPlan, fake_addresses
from bench.fakenode import FakeNodeSettings, FakeRpc
from proxy.classify import results_in_order
from proxy.methods import MethodTable
from proxy.scan import Scanner

FAKE_HEAD, FAKE_WINDOW = 1_000_000, 128  # `chainstate bench fake-node`'s (bench/suite.py)


def bodies(batch: int, count: int, one_block: bool) -> list[bytes]:
    """`count` bodies of `batch` reads, as `bench suite proxy` sends them."""
    plan = BodyPlan(
        mix=[("eth_getBalance", 1.0)],
        batch=batch,
        blocks=BlockRange(FAKE_HEAD - FAKE_WINDOW // 2, FAKE_HEAD),
        addresses=fake_addresses(1000),
    )
    out = plan.build()[:count]
    if one_block:
        out = [_at_one_block(body) for body in out]
    return out


def _at_one_block(body: bytes) -> bytes:
    items = orjson.loads(body)
    for it in items:
        it["params"][-1] = items[0]["params"][-1]
    return orjson.dumps(items)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.scancount",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--step", choices=("scan", "rows", "check"), required=True)
    p.add_argument("--batch", type=int, default=100, help="items per body (2..100)")
    p.add_argument("-n", type=int, default=200, help="calls after the warm-up")
    p.add_argument("--one-block", action="store_true", help="every item at one block")
    args = p.parse_args(argv)
    if not 2 <= args.batch <= 100 or args.n < 0:
        p.error("--batch 2..100 and -n >= 0")
    payloads = bodies(args.batch, 20, args.one_block)
    rpc = FakeRpc(FakeNodeSettings())
    answers = [rpc.answer_body(body) for body in payloads]
    scanner = Scanner(MethodTable(), args.batch)
    for body in payloads:  # (the parse's checks remember the block texts)
        for it in orjson.loads(body):
            scanner.methods.target(it["method"], it["params"])
    rids = list(range(args.batch))
    for body, answer in zip(payloads, answers, strict=True):  # warm-up, each checked
        rows = scanner.scan(body)
        if rows is None or rows.rids != rids or results_in_order(rids, answer) is None:
            raise SystemExit(f"not the common batch: {body[:200]!r}")
    k = len(payloads)
    if args.step == "scan":
        scan = scanner.scan
        for i in range(args.n):
            scan(payloads[i % k])
    elif args.step == "rows":
        scan = scanner.scan
        for i in range(args.n):
            scan(payloads[i % k]).bounds()  # type: ignore[union-attr]
    else:
        for i in range(args.n):
            results_in_order(rids, answers[i % k])
    print(f"{args.step} batch {args.batch}: {args.n} calls")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`chainstate bench …` (and `python -m bench …`): load generator, fake node, suites."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from bench.bodies import (
    DEFAULT_ADDRESSES,
    DEFAULT_POOL_ITEMS,
    DEFAULT_POOL_SIZE,
    DEFAULT_SLOTS,
    BodyError,
    BodyPlan,
    fake_addresses,
    fixed_request,
    load_body_file,
    parse_blocks,
    parse_mix,
)
from bench.fakenode import DEFAULT_CHAIN_ID, DEFAULT_WINDOW, FakeNodeSettings
from bench.loadgen import (
    DEFAULT_CONCURRENCY,
    DEFAULT_DURATION,
    DEFAULT_TIMEOUT,
    DEFAULT_WARMUP,
    BenchResult,
    LoadSettings,
)


def parse_cpus(text: str | None) -> list[int] | None:
    """`0`, `0,1` or `0-3` → CPU ids; None/empty → no pinning."""
    if not text:
        return None
    cpus: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            cpus.extend(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad CPU list {text!r}: use 0, 0,1 or 0-3") from None
    return cpus


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"bad header {text!r}: use 'Name: value'")
    return name.strip(), value.strip()


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def add_load_options(p: argparse.ArgumentParser) -> None:
    """Options shared by `run` and the suites: how much load, from where."""
    p.add_argument(
        "-c",
        "--concurrency",
        type=_positive_int,
        default=DEFAULT_CONCURRENCY,
        help=f"open connections, summed over processes (default {DEFAULT_CONCURRENCY})",
    )
    p.add_argument(
        "-d",
        "--duration",
        type=float,
        default=DEFAULT_DURATION,
        help=f"seconds to measure after warm-up (default {DEFAULT_DURATION:g})",
    )
    p.add_argument(
        "--warmup",
        type=float,
        default=DEFAULT_WARMUP,
        help=f"seconds of unmeasured traffic first (default {DEFAULT_WARMUP:g})",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help=f"seconds before a request counts as a timeout (default {DEFAULT_TIMEOUT:g})",
    )
    p.add_argument(
        "-P",
        "--processes",
        type=_positive_int,
        default=1,
        help="load generator processes, one core each (default 1)",
    )
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")


def add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="JSON-RPC endpoint, e.g. http://127.0.0.1:8663/1337")
    add_load_options(p)
    p.add_argument(
        "-n", "--requests", type=_positive_int, help="stop after N requests instead of a duration"
    )
    body = p.add_argument_group("what to send")
    body.add_argument("--method", help="method of a fixed request (default eth_blockNumber)")
    body.add_argument("--params", help="its params as a JSON array or object")
    body.add_argument("--body-file", help="a file holding a request object or a batch array")
    body.add_argument(
        "--mix",
        help="methods drawn at random by weight, e.g. 'eth_getBalance=3,eth_getStorageAt=1'",
    )
    body.add_argument(
        "--blocks",
        default="latest",
        help="heights for --mix: 'latest' (default), 'H' or 'LO-HI' (uniform)",
    )
    body.add_argument(
        "--addresses",
        type=_positive_int,
        default=DEFAULT_ADDRESSES,
        help=f"distinct accounts for --mix (default {DEFAULT_ADDRESSES})",
    )
    body.add_argument(
        "--address",
        action="append",
        default=[],
        help="an account for --mix (repeatable; replaces the generated ones)",
    )
    body.add_argument(
        "--slots",
        type=_positive_int,
        default=DEFAULT_SLOTS,
        help=f"storage slots 0..N-1 for --mix (default {DEFAULT_SLOTS})",
    )
    body.add_argument(
        "--pool",
        type=_positive_int,
        help=f"distinct bodies pre-built for --mix (default {DEFAULT_POOL_SIZE}, "
        f"fewer for batches: about {DEFAULT_POOL_ITEMS} items)",
    )
    body.add_argument(
        "--batch", type=_positive_int, default=1, help="items per HTTP request (default 1)"
    )
    body.add_argument("--seed", type=int, default=0, help="random seed for --mix (default 0)")
    body.add_argument(
        "--call-to",
        help="eth_call of --mix calls this contract (default: ERC20 balanceOf of the drawn "
        "account, sent to that account itself)",
    )
    body.add_argument(
        "--call-data",
        help="calldata of eth_call in --mix (default: balanceOf(drawn account))",
    )
    p.add_argument(
        "-H",
        "--header",
        type=_header,
        action="append",
        default=[],
        help="extra request header 'Name: value' (repeatable)",
    )
    p.add_argument("--cpus", type=parse_cpus, help="pin the generator to these CPUs, e.g. 1 or 0-1")
    p.add_argument("--wrk", action="store_true", help="drive `wrk` instead (cross-check)")


def plan_from_args(args: argparse.Namespace) -> BodyPlan:
    """The BodyPlan the `run` options describe (BodyError on a bad combination)."""
    if args.mix:
        if args.method or args.params or args.body_file:
            raise BodyError("--mix cannot be combined with --method/--params/--body-file")
        addresses = args.address or fake_addresses(args.addresses, args.seed)
        return BodyPlan(
            mix=parse_mix(args.mix),
            batch=args.batch,
            blocks=parse_blocks(args.blocks),
            addresses=addresses,
            slots=args.slots,
            pool_size=args.pool,
            call_to=args.call_to,
            call_data=args.call_data,
        )
    if args.call_to or args.call_data:
        raise BodyError("--call-to/--call-data need --mix with eth_call")
    if args.body_file:
        if args.method or args.params:
            raise BodyError("--body-file cannot be combined with --method/--params")
        return BodyPlan(fixed=load_body_file(args.body_file), batch=args.batch)
    fixed = fixed_request(args.method or "eth_blockNumber", args.params)
    return BodyPlan(fixed=fixed, batch=args.batch)


def settings_from_args(args: argparse.Namespace) -> LoadSettings:
    return LoadSettings(
        url=args.url,
        concurrency=args.concurrency,
        duration=args.duration,
        requests=args.requests,
        warmup=args.warmup,
        timeout=args.timeout,
        processes=args.processes,
        headers=list(args.header),
        cpus=args.cpus,
        seed=args.seed,
    )


def print_result(result: BenchResult | dict[str, Any], as_json: bool) -> None:
    if isinstance(result, BenchResult):
        text = json.dumps(result.to_json(), indent=2) if as_json else result.render()
    else:
        text = json.dumps(result, indent=2)
    print(text, flush=True)


def cmd_run(args: argparse.Namespace) -> int:
    from bench.loadgen import run_bench
    from bench.wrkdriver import run_wrk

    try:
        plan = plan_from_args(args)
        settings = settings_from_args(args)
        result = run_wrk(settings, plan) if args.wrk else run_bench(settings, plan)
    except (BodyError, ValueError, RuntimeError) as exc:
        print(f"chainstate bench run: {exc}", file=sys.stderr)
        return 2
    print_result(result, args.json)
    return 0 if result.requests_ok else 1  # nothing succeeded: the target is likely wrong


def add_fake_node_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8700, help="listen port (default 8700)")
    p.add_argument("--kind", choices=["state", "archive"], default="state")
    p.add_argument("--head", type=int, default=1_000_000, help="head height (default 1000000)")
    p.add_argument(
        "--window",
        type=_positive_int,
        default=DEFAULT_WINDOW,
        help=f"blocks a state kind keeps (default {DEFAULT_WINDOW})",
    )
    p.add_argument("--chain-id", type=int, default=DEFAULT_CHAIN_ID)
    p.add_argument(
        "--block-time",
        type=float,
        default=0.0,
        help="seconds per new block; 0 (default) keeps the head fixed",
    )
    p.add_argument(
        "--latency-ms", type=float, default=0.0, help="delay added to each response (default 0)"
    )
    p.add_argument(
        "--fail-every",
        type=int,
        default=0,
        help="answer every Nth HTTP request with --fail-status (default 0 = never)",
    )
    p.add_argument("--fail-status", type=int, default=503, help="status of injected failures")
    p.add_argument(
        "--start-time",
        type=float,
        help="unix time at which the head was --head (fake nodes given the same one share "
        "their head as it advances); default: when the node starts",
    )
    p.add_argument(
        "--lie-from",
        type=int,
        help="from this height on, answer wrong state values and validation hashes (a lying "
        "replica, for the fault suite)",
    )
    p.add_argument(
        "--call-bytes", type=_positive_int, default=32, help="bytes of an eth_call result"
    )
    p.add_argument("--cpus", type=parse_cpus, help="pin the fake node to these CPUs")


def cmd_fake_node(args: argparse.Namespace) -> int:
    import uvloop

    from bench.fakenode import serve_forever

    try:
        settings = FakeNodeSettings(
            host=args.host,
            port=args.port,
            kind=args.kind,
            head=args.head,
            window=args.window,
            chain_id=args.chain_id,
            block_time=args.block_time,
            latency_ms=args.latency_ms,
            fail_every=args.fail_every,
            fail_status=args.fail_status,
            start_time=args.start_time,
            lie_from=args.lie_from,
            call_bytes=args.call_bytes,
        )
    except ValueError as exc:
        print(f"chainstate bench fake-node: {exc}", file=sys.stderr)
        return 2
    if args.cpus:
        os.sched_setaffinity(0, args.cpus)

    def announce(url: str) -> None:
        print(f"fake node (FAKE DATA, {settings.kind}) listening on {url}", flush=True)

    try:
        uvloop.run(serve_forever(settings, announce))
    except OSError as exc:
        print(f"chainstate bench fake-node: {exc}", file=sys.stderr)
        return 1
    return 0


def add_commands(parser: argparse.ArgumentParser) -> None:
    """The bench tools as subcommands of `parser`."""
    from bench.suitecli import add_suite_parsers
    from bench.wsheads import add_ws_heads_parser

    sub = parser.add_subparsers(dest="bench_command", metavar="TOOL")
    run_p = sub.add_parser(
        "run",
        help="send JSON-RPC load to a URL and report throughput, errors and latency",
        description="Load generator: keep-alive HTTP/1.1 on raw asyncio (uvloop).",
    )
    add_run_options(run_p)
    run_p.set_defaults(func=cmd_run)
    fake_p = sub.add_parser(
        "fake-node",
        help="a fast FAKE state node (made-up deterministic data) to benchmark against",
        description="Answers state-node read methods with fake deterministic values.",
    )
    add_fake_node_options(fake_p)
    fake_p.set_defaults(func=cmd_fake_node)
    add_suite_parsers(sub)
    add_ws_heads_parser(sub)


def register(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser(
        "bench", help="load generator, fake node and benchmark suites for load testers"
    )
    add_commands(bench)
    bench.set_defaults(func=lambda args: _help(bench))


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2

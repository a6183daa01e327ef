"""Benchmark suites, the command (`chainstate bench suite NAME`, `python -m bench.suitecli`).

The options every suite takes and which suite runs: apart from bench/suite.py so that the
faults suite (bench/faults.py), built on the suites' options, is reached without the suites
importing it back.
"""

from __future__ import annotations

import argparse
import json
import sys

from bench import suite
from bench.suite import (
    MIN_ROUND_S,
    ROUNDS,
    SUITES,
    SuiteOptions,
    parse_setting,
    parse_toml_setting,
    render,
    run_suite,
)


def add_suite_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "suite", choices=sorted([*SUITES, "faults", "cache-tier"]), help="which suite to run"
    )
    p.add_argument("-d", "--duration", type=float, default=5.0, help="seconds per measurement")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds of warm-up per measurement")
    p.add_argument("-c", "--concurrency", type=int, default=64, help="connections (default 64)")
    p.add_argument("--case", action="append", help="run only this case (repeatable)")
    p.add_argument("--no-pin", action="store_true", help="do not pin processes to cores")
    p.add_argument("--keep-dir", help="keep configs and service logs in this folder")
    p.add_argument(
        "--evm",
        action="append",
        type=parse_setting,
        metavar="NAME=VALUE",
        help="an [evm] setting of the state node (state and call suites), e.g. warm_blocks=4",
    )
    p.add_argument(
        "--proxy",
        action="append",
        type=parse_toml_setting,
        metavar="NAME=VALUE",
        help="a [proxy] setting of every proxy the suite starts, e.g. cache_pools=[] "
        "(the value in TOML)",
    )
    p.add_argument(
        "--no-reference",
        action="store_true",
        help="suite proxy: do not build and measure Go's reverse proxy",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=ROUNDS,
        help=f"measure each case's targets in turn this many times, each for its share of "
        f"--duration (at least {MIN_ROUND_S:g} s; default {ROUNDS}); per-core ratios are "
        "the median of the rounds'",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def cmd_suite(args: argparse.Namespace) -> int:
    if args.duration <= 0 or args.concurrency < 1 or args.rounds < 1:
        print(
            "chainstate bench suite: duration must be > 0, concurrency and rounds >= 1",
            file=sys.stderr,
        )
        return 2
    opts = SuiteOptions(
        duration=args.duration,
        warmup=args.warmup,
        concurrency=args.concurrency,
        pin=not args.no_pin,
        cases=args.case,
        keep_dir=args.keep_dir,
        evm=dict(args.evm or []),
        reference=not args.no_reference,
        proxy=dict(args.proxy or []),
        rounds=args.rounds,
    )
    shown = render
    try:
        if args.suite == "faults":  # a suite of its own shape (bench/faults.py)
            from bench import faults

            report, shown = faults.FaultSuite().run(opts), faults.render
        elif args.suite == "cache-tier":  # a cold proxy joining a warm fleet
            from bench import cachetier

            report, shown = cachetier.CacheTierSuite().run(opts), cachetier.render
        else:
            report = run_suite(SUITES[args.suite](), opts)
    except RuntimeError as exc:
        print(f"chainstate bench suite: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2) if args.json else shown(report), flush=True)
    return 0


def add_suite_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "suite",
        help="start services and compare them under the same load (e.g. proxy vs direct)",
        description=__doc__.splitlines()[0],
    )
    add_suite_options(p)
    p.set_defaults(func=cmd_suite)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.suitecli", description=suite.__doc__)
    add_suite_options(parser)
    args = parser.parse_args(argv)
    try:
        return cmd_suite(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""What the servers' young-generation GC threshold buys: `python -m bench.gcthreshold`.

Every server process raises the collector's young-generation threshold from Python's 700
allocations to `chainstate.runner.GC_YOUNG_THRESHOLD` (docs/http-server.md). This suite
measures that choice: a fake node and two `chainstate proxy` processes in front of it, the
same but for the threshold — `proxy` with the servers' own, `proxy-gcN` with `--young N`
(default 700, Python's) — pinned and loaded as `bench suite proxy` does (single requests and
batches of 100 on 64 connections, in rounds). Per-core ratios are `proxy-gcN` ÷ `proxy`:
below 1 means the lower threshold costs CPU per request.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, ClassVar

from bench.services import Services, free_port, python_cmd, split_cpus
from bench.suite import (
    FAKE_HEAD,
    FAKE_WINDOW,
    SUITE_CHAIN_ID,
    Case,
    SuiteOptions,
    balance_mix,
    proxy_config,
    render,
    run_suite,
    setting_lines,
)


def proxy_command(port: int, config: Path, young: int | None) -> list[str]:
    """`chainstate proxy`, with the young-generation threshold `young` when given (set where
    the server sets its own, just before the loop starts)."""
    args = ["proxy", "--host", "127.0.0.1", "--port", str(port), "--config", str(config)]
    args += ["--store", ":memory:"]
    if young is None:
        return python_cmd("-m", "stack.cli", *args)
    code = (
        "import sys, chainstate.runner as r; "
        f"r.GC_YOUNG_THRESHOLD = {young}; "
        "from stack.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    return python_cmd("-c", code, *args)


class GcSuite:
    """The proxy with the servers' threshold (the baseline) and with `young`."""

    name: ClassVar[str] = "gc-threshold"

    def __init__(self, young: int) -> None:
        self.young = young
        self.notes: list[str] = []

    def start(self, services: Services, opts: SuiteOptions) -> dict[str, str]:
        proxy_cpus, load_cpus = split_cpus() if opts.pin else (None, None)
        node_port = free_port()
        node = f"http://127.0.0.1:{node_port}"
        services.start(
            "fake-node",
            python_cmd(
                "-m", "bench", "fake-node", "--port", str(node_port),
                "--head", str(FAKE_HEAD), "--window", str(FAKE_WINDOW),
                "--chain-id", str(SUITE_CHAIN_ID),
            ),
            node,
            load_cpus,
        )  # fmt: skip
        config = services.workdir / "proxy.toml"
        config.write_text(proxy_config(node, extra=setting_lines(opts.proxy)))
        targets: dict[str, str] = {}
        for label, young in (("proxy", None), (f"proxy-gc{self.young}", self.young)):
            port = free_port()
            url = f"http://127.0.0.1:{port}/{SUITE_CHAIN_ID}"
            services.start(label, proxy_command(port, config, young), url, proxy_cpus)
            targets[label] = url
        self.notes.append(f"proxy-gc{self.young}: gc threshold {self.young} for generation 0")
        return targets

    def cases(self) -> list[Case]:
        return [Case("single", balance_mix(1)), Case("batch100", balance_mix(100))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gcthreshold", description=__doc__)
    p.add_argument("--young", type=int, default=700, help="the other threshold (700)")
    p.add_argument("-d", "--duration", type=float, default=5.0, help="seconds per case")
    p.add_argument("-c", "--concurrency", type=int, default=64, help="connections (64)")
    p.add_argument("--rounds", type=int, default=3, help="rounds per case (3)")
    args = p.parse_args(argv)
    opts = SuiteOptions(duration=args.duration, concurrency=args.concurrency, rounds=args.rounds)
    report: dict[str, Any] = run_suite(GcSuite(args.young), opts)
    print(render(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

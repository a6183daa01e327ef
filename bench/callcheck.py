"""Bench of eth_call: state node and proxy vs anvil, at latest and an old block, single and
batched. Starts its own stack (anvil + workload, write node, archive state node, proxy) with
the bench suite's service runner, measures with the bench load generator, prints ratios.

    .venv/bin/python -m bench.callcheck [--duration 3] [--concurrency 16] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from bench.bodies import BodyPlan
from bench.loadgen import LoadSettings, run_bench
from bench.services import running
from bench.suite import StateSuite, SuiteOptions

DEFAULT_DURATION = 3.0  # seconds measured per case and target
DEFAULT_WARMUP = 1.0  # seconds before measuring (warms the EVM workers' caches)
DEFAULT_CONCURRENCY = 16  # connections
BATCH = 10  # calls per batched request


def balance_call(erc20: str, holder: str, block: str, rid: int = 1) -> dict[str, Any]:
    data = "0x70a08231" + holder[2:].rjust(64, "0")
    params = [{"to": erc20, "data": data}, block]
    return {"jsonrpc": "2.0", "id": rid, "method": "eth_call", "params": params}


def cases(erc20: str, holders: list[str], old: str) -> dict[str, Any]:
    def batch(block: str) -> list[dict[str, Any]]:
        return [balance_call(erc20, holders[i % len(holders)], block, i) for i in range(BATCH)]

    return {
        "latest": balance_call(erc20, holders[0], "latest"),
        "old": balance_call(erc20, holders[0], old),
        f"latest-batch{BATCH}": batch("latest"),
        f"old-batch{BATCH}": batch(old),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {"duration_s": args.duration, "concurrency": args.concurrency}
    with running() as services:
        suite = StateSuite()
        targets = suite.start(services, SuiteOptions(pin=False))
        record = json.loads((services.workdir / "workload.json").read_text())
        holders = record["erc20_holders"]
        report["cases"] = {}
        for name, body in cases(record["erc20"], holders, hex(record["last_block"])).items():
            row: dict[str, Any] = {}
            for label, url in targets.items():
                settings = LoadSettings(
                    url=url,
                    concurrency=args.concurrency,
                    duration=args.duration,
                    warmup=args.warmup,
                )
                result = run_bench(settings, BodyPlan(fixed=body))
                row[label] = {
                    "req_per_s": round(result.req_per_s, 1),
                    "calls_per_s": round(result.items_per_s, 1),
                    "p50_ms": round(result.latency_ns["p50"] / 1e6, 3),
                    "errors": result.error_count + result.items_err,
                }
            anvil = row["anvil"]["calls_per_s"] or 1.0
            for label in row:
                row[label]["vs_anvil"] = round(row[label]["calls_per_s"] / anvil, 3)
            report["cases"][name] = row
    return report


def render(report: dict[str, Any]) -> str:
    lines = [
        f"eth_call bench: {report['concurrency']} connections, {report['duration_s']:g} s per "
        "case and target",
        f"{'case':<18}{'target':<12}{'calls/s':>10}{'req/s':>10}{'p50 ms':>9}{'vs anvil':>10}"
        f"{'errors':>8}",
    ]
    for case, row in report["cases"].items():
        for label, r in row.items():
            lines.append(
                f"{case:<18}{label:<12}{r['calls_per_s']:>10,.0f}{r['req_per_s']:>10,.0f}"
                f"{r['p50_ms']:>9.2f}{r['vs_anvil']:>10.3f}{r['errors']:>8}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=DEFAULT_DURATION)
    p.add_argument("--warmup", type=float, default=DEFAULT_WARMUP)
    p.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)
    report = measure(args)
    print(json.dumps(report, indent=2) if args.json else render(report))
    failed = any(r["errors"] for row in report["cases"].values() for r in row.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

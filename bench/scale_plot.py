"""The report of `suite scale` (bench/scale.py) as text and as a PNG plot (matplotlib):
read rates as a ratio to the small chain's, and disk size, against the chain's length."""

from __future__ import annotations

from pathlib import Path
from typing import Any

KINDS = ("archive", "state")
METHODS = ("eth_getBalance", "eth_getStorageAt", "eth_call")
MIB = 2**20


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server
    import matplotlib.pyplot as plt

    points = report["large"]["points"]
    blocks = [p["blocks"] for p in points]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for kind, style in zip(KINDS, ("-", "--"), strict=True):
        for method, marker in zip(METHODS, "os^", strict=True):
            ys = [row[f"{kind}:{method}"] for row in report["ratios"]]
            left.plot(blocks, ys, style, marker=marker, label=f"{kind} {method}")
        right.plot(
            blocks, [p[kind]["disk"]["file"] / MIB for p in points], style, marker="o",
            label=f"{kind} store",
        )  # fmt: skip
    left.axhline(0.7, color="grey", linewidth=0.8, linestyle=":")
    left.set(xscale="log", xlabel="blocks after genesis", ylabel="reads per CPU s / small chain's")
    left.set_title("read rate at random heights and keys")
    left.legend(fontsize=7)
    right.set(xscale="log", xlabel="blocks after genesis", ylabel="MiB on disk")
    right.set_title("store size")
    right.legend(fontsize=7)
    shape = report["large"]["shape"]
    fig.suptitle(
        f"{shape['accounts']:,} accounts, {shape['slots']:,} slots, {shape['blocks']:,} blocks "
        f"of {shape['txs']} txs / {shape['storage_writes']} slot writes / "
        f"{shape['account_changes']} account changes"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def render_text(report: dict[str, Any]) -> str:
    large, small = report["large"], report["small"]
    shape = large["shape"]
    lines = [
        f"chain: {shape['accounts']:,} accounts, {shape['slots']:,} slots over "
        f"{shape['contracts']:,} contracts, {shape['blocks']:,} blocks of {shape['txs']} txs, "
        f"{shape['storage_writes']} slot writes, {shape['account_changes']} account changes",
        f"genesis: {large['genesis']['writes']:,} values; "
        + "; ".join(
            f"{k} applied in {large['genesis'][k]['apply_cpu_s']} CPU s, "
            f"{large['genesis'][k]['disk']['file'] / MIB:,.0f} MiB"
            for k in KINDS
        ),
    ]
    head = f"{'blocks':>7} {'node':<8} {'blk/CPU s':>9} {'writes/CPU s':>12} {'parse ms':>8} "
    head += f"{'apply ms':>8} {'MB written/blk':>14} {'MiB':>7} {'B/block':>9} {'B/change':>8} "
    head += f"{'RSS MiB':>8}"
    head += "  reads/CPU s (ratio)"
    lines.append(head)
    lines.append("(B/block, B/change: disk growth since the previous row; reads: per CPU second)")
    writes = shape["storage_writes"] + shape["account_changes"] + shape["txs"]
    previous: dict[str, Any] = {"blocks": 0}
    previous.update({k: large["genesis"][k] for k in KINDS})
    for point, ratio in zip(large["points"], report["ratios"], strict=True):
        for kind in KINDS:
            ing, at = point["ingest"][kind], point[kind]
            grown = at["disk"]["file"] - previous[kind]["disk"]["file"]
            per_block = grown / (point["blocks"] - previous["blocks"])
            reads = "  ".join(
                f"{m.removeprefix('eth_')} {at['reads'][m]['per_cpu_s']:,} ({ratio[f'{kind}:{m}']})"
                for m in METHODS
            )
            lines.append(
                f"{point['blocks']:>7,} {kind:<8} {ing['blocks_per_cpu_s']:>9} "
                f"{ing['writes_per_cpu_s']:>12,} {ing['parse_ms']:>8} {ing['apply_ms']:>8} "
                f"{ing.get('written_per_block', 0) / 1e6:>14.1f} "
                f"{at['disk']['file'] / MIB:>7,.0f} {per_block:>9,.0f} "
                f"{per_block / writes:>8,.1f} {point['memory']['rss'] / MIB:>8,.0f}  {reads}"
            )
        previous = point
    memory = large["points"][-1]["memory"]
    line = f"memory at the last row: RSS {memory['rss'] / MIB:,.0f} MiB"
    if "shared" in memory:
        line += f", of it {memory['shared'] / MIB:,.0f} MiB the stores' mapped pages"
    line += f"; the generator's arrays {large.get('generator_bytes', 0) / MIB:,.0f} MiB; "
    line += f"EVM workers {memory['workers_rss'] / MIB:,.0f} MiB"
    if "workers_shared" in memory:
        line += f", of it {memory['workers_shared'] / MIB:,.0f} MiB the stores' mapped pages"
    lines.append(line)
    base = small["points"][-1]
    lines.append(
        "small chain reads/CPU s: "
        + "; ".join(
            f"{k} " + ", ".join(f"{m} {base[k]['reads'][m]['per_cpu_s']:,}" for m in METHODS)
            for k in KINDS
        )
    )
    return "\n".join(lines)


def main() -> None:
    """`python -m bench.scale_plot REPORT.json [PNG]`: the text and the plot again from a
    report `suite scale --report` wrote."""
    import json
    import sys

    report = json.loads(Path(sys.argv[1]).read_text())
    print(render_text(report))
    if len(sys.argv) > 2:
        plot(report, Path(sys.argv[2]))


if __name__ == "__main__":
    main()

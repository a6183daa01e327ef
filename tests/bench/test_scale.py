"""`chainstate bench suite scale` at a tiny size, end to end: the synthetic chain's blocks
pass the state node's own checks (hash, body, logs, `pre`), answers at `latest` equal the
generator's state, and the report, its text and the plot are written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numpy")
pytest.importorskip("matplotlib")

TINY = [
    "--accounts", "400", "--slots", "1500", "--contracts", "10", "--blocks", "20",
    "--txs", "20", "--storage-writes", "60", "--account-changes", "50",
    "--small", "300,1000,10,10", "-d", "0.1", "-c", "2", "--batch", "4", "--window", "8",
    "--bodies", "20000",
]  # fmt: skip
# --bodies: drawing the default 200,000 request bodies per read case was most of the run;
# the warm-up sends at most half of them, so each measurement has 10,000 to send.


def test_suite_scale_runs_end_to_end(tmp_path: Path) -> None:
    report_path, plot_path = tmp_path / "scale.json", tmp_path / "scale.png"
    done = subprocess.run(
        [sys.executable, "-m", "bench.suitecli", "scale", *TINY,
         "--report", str(report_path), "--plot", str(plot_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(report_path.read_text())
    points = report["large"]["points"]
    assert [p["blocks"] for p in points] == [1, 2, 20]  # 1 %, 10 %, 100 % (at least 1)
    last = points[-1]
    for kind in ("archive", "state"):
        assert last["ingest"][kind]["blocks_per_cpu_s"] > 0
        assert last[kind]["disk"]["versions"]["entries"] > 1500
        for method in ("eth_getBalance", "eth_getStorageAt", "eth_call"):
            assert last[kind]["reads"][method]["per_cpu_s"] > 0
    # the archive keeps every block's body, the `state` node its window of 8
    assert last["archive"]["disk"]["txs"]["entries"] == 20
    assert last["state"]["disk"]["txs"]["entries"] == 8
    assert len(report["ratios"]) == 3
    # the collector's CPU, the part of it during the parse, and the objects it tracks
    collector = last["ingest"]["gc"]
    assert 0 <= collector["in_parse_ms"] <= collector["ms"] and len(collector["passes"]) == 3
    assert all(passes >= 0 for passes in collector["passes"]) and min(last["gc_objects"]) >= 0
    assert last["gc_objects"][2] > 1000  # at least the modules' functions and classes
    assert plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "eth_getStorageAt" in done.stdout and "archive" in done.stdout
    # the EVM workers' (and feeds') memory, and the part of it that is the stores' pages
    memory = last["memory"]
    assert 0 < memory["workers_shared"] < memory["workers_rss"]
    assert "EVM workers" in done.stdout and done.stdout.count("the stores' mapped pages") == 2


def test_suite_scale_refuses_a_shape_that_cannot_be() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.suitecli", "scale", *TINY, "--contracts", "400"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    assert "contracts < accounts" in done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "bench.suitecli", "scale", *TINY, "--slots", "3000"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    assert "distinct contract and holder pairs" in done.stderr


def test_scale_ingest_measures_a_saved_chain(tmp_path: Path) -> None:
    sizes = ["--accounts", "400", "--slots", "1500", "--contracts", "10", "--blocks", "12"]
    sizes += ["--txs", "20", "--storage-writes", "60", "--account-changes", "50"]
    run = [sys.executable, "-m", "bench.scale_ingest", *sizes, "--map-size-mb", "256"]
    saved = subprocess.run(
        [*run, "--save", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert saved.returncode == 0, saved.stderr[-3000:]
    assert len((tmp_path / "blocks.jsonl").read_bytes().splitlines()) == 12
    done = subprocess.run(
        [*run, "--load", str(tmp_path), "--window", "4", "--batch", "4", "--span", "4", "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["blocks"] == 12 and len(report["runs"]) == 2
    for run_ in report["runs"]:
        assert run_["parse_ms"] > 0
        assert run_["apply_ms"]["archive"] > 0 and run_["apply_ms"]["state"] > 0
        for kind in ("archive", "state"):  # a span per batch of 4 blocks
            assert len(run_["apply_ms_by_span"][kind]) == 3
            assert all(ms > 0 for ms in run_["apply_ms_by_span"][kind])
            usage = run_["per_block"][kind]
            assert set(usage) == {"minor_faults", "major_faults", "sys_ms", "mb_written"}
            assert all(value >= 0 for value in usage.values())
    # parsed a batch at a time, just before it is applied, with the collector's share
    done = subprocess.run(
        [*run, "--load", str(tmp_path), "--window", "4", "--batch", "5", "--repeat", "1",
         "--interleave", "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (run_,) = json.loads(done.stdout)["runs"]
    assert run_["parse_ms"] > 0
    assert run_["apply_ms"]["archive"] > 0 and run_["apply_ms"]["state"] > 0
    assert 0 <= run_["gc"]["in_parse_ms"] <= run_["gc"]["ms"] and len(run_["gc"]["passes"]) == 3
    refused = subprocess.run(
        [*run, "--load", str(tmp_path), "--interleave", "--callgrind"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode != 0 and "not with --callgrind" in refused.stderr

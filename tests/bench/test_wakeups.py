"""`python -m bench.wakeups`: round trips to an echo server on another CPU, the same CPU, and
another CPU busy polling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.wakeups", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_three_cases_are_measured() -> None:
    done = run("-n", "200", "--busy-poll-us", "300", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert list(report) == ["other CPU", "same CPU", "other CPU, busy polling 300 µs"]
    for row in report.values():
        assert 0 < row["p50_us"] <= row["p90_us"] < 1e6


def test_bad_arguments_are_refused() -> None:
    for args in (["-n", "0"], ["--busy-poll-us", "0"]):
        done = run(*args)
        assert done.returncode == 2 and "bench.wakeups" in done.stderr

"""`python -m bench.portcalls`: eth_calls through a real state node's port, per process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_a_short_run_reports_the_node_and_its_worker() -> None:
    """A short run on the synthetic chain: every call answered (a failed one stops it), and
    CPU per call reported for the node's process and for the one worker it runs pinned to
    one core."""
    cpus = sorted(os.sched_getaffinity(0))
    out = subprocess.run(
        [sys.executable, "-m", "bench.portcalls", "--rounds", "1", "-d", "0.5",
         "--warmup", "0.5", "--node-cpu", str(cpus[0]), "--load-cpu", str(cpus[1])],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=True,
    ).stdout  # fmt: skip
    assert re.search(r"calls/s, CPU [\d.]+ µs per call", out), out
    assert len(re.findall(r"^  node\s+CPU", out, re.M)) == 1, out
    assert len(re.findall(r"^  child \d+\s+CPU", out, re.M)) >= 1, out
    assert re.search(r": median [\d.]+ µs per call", out), out

"""`python -m bench.c1path`: the single request's two halves through the proxy, measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_driver_measures_both_halves_of_every_request() -> None:
    """Every request gets a result through the proxy, and each half of each measured request
    is timed (the driver's marks sit on the boundaries the proxy really crosses: a mark that
    never fires leaves its half without figures)."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.c1path", "-n", "40", "--warmup", "10", "--settle", "0.5",
         "--calls", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    figures = json.loads(out.stdout)
    assert figures["results"] == 50
    for half in ("request_half_ns_p50", "server_part_ns_p50", "answer_half_ns_p50"):
        assert figures[half] > 0, figures
    assert figures["server_part_ns_p50"] < figures["request_half_ns_p50"]
    # the engine's first attempt is written from `start` (no task), and answered from the
    # node connection's callback: both show up in the halves' calls
    assert figures["req_calls"].get("engine.Engine.start") == 1.0, figures["req_calls"]
    # the request half ends at the write to the node: what the proxy builds after it (the
    # answer's wait and books, `Attempts.sent_now`) is not in it
    assert "attempts.Attempts.sent_now" not in figures["req_calls"], figures["req_calls"]
    # the answer half runs from the node connection's callback to the client's write
    answer_half = figures["ans_calls"]
    assert answer_half.get("httpclient._Connection.data_received") == 1.0, answer_half
    assert answer_half.get("httpserver._Connection._answer") == 1.0, answer_half


def test_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.c1path", "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "--callgrind" in out.stdout and "--half" in out.stdout

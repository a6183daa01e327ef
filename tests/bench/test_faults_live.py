"""`chainstate bench suite faults` end to end at small scale: real fake-node processes, the
real checker and proxy; a node killed, hung and lying during the load costs no client request
and the liar serves nothing wrong once flagged (counts, not timings)."""

from __future__ import annotations

from pathlib import Path

from bench.faults import FaultSuite, render
from bench.suite import SuiteOptions


def test_kill_hang_and_lies_cost_no_client_request(tmp_path: Path) -> None:
    opts = SuiteOptions(
        duration=4.0,
        warmup=0.5,  # hundreds of requests at c=8: latency windows filled, connections open
        concurrency=8,
        cases=["kill", "hang", "wrong"],
        keep_dir=str(tmp_path),
    )
    report = FaultSuite().run(opts)
    cases = {c["fault"]: c for c in report["cases"]}
    assert list(cases) == ["baseline", "kill", "hang", "wrong"]
    for name, case in cases.items():
        assert case["requests"] > 0, name
        assert case["failed"] == 0 and case["errors"] == {}, (name, case["errors"])
    assert [what for _, what in cases["kill"]["events"]] == ["kill -9", "started again"]
    assert [what for _, what in cases["hang"]["events"]] == ["SIGSTOP", "SIGCONT"]
    wrong = cases["wrong"]["wrong_answers"]
    assert wrong["flagged_after_blocks"] is not None and wrong["flagged_after_blocks"] <= 2
    assert wrong["after_flag"] == 0
    shown = render(report)
    assert "baseline: hedging added" in shown and "wrong answers served before" in shown

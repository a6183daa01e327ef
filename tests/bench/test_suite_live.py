"""The suites end to end with the real services: `chainstate proxy`, state node, anvil."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from bench.services import running
from bench.suite import (
    CallSuite,
    ProxySuite,
    StateSuite,
    SuiteOptions,
    proxy_available,
    render,
    run_suite,
)

pytestmark = pytest.mark.skipif(not proxy_available(), reason="the proxy is not in this tree")


def quick(tmp_path: Path, case: str) -> SuiteOptions:
    return SuiteOptions(duration=0.2, warmup=0, concurrency=4, cases=[case], keep_dir=str(tmp_path))


def test_proxy_suite_through_the_real_proxy(tmp_path: Path) -> None:
    report = run_suite(ProxySuite(), quick(tmp_path, "batch10"))
    [case] = report["cases"]
    direct, proxy = case["targets"]["direct"], case["targets"]["proxy"]
    assert direct["requests"] > 0 and proxy["requests"] > 0
    assert not direct["errors"] and not proxy["errors"]
    assert proxy["items_ok"] == proxy["requests"] * 10
    assert proxy["ratio_req_per_s"] > 0


@pytest.mark.skipif(shutil.which("go") is None, reason="go is not installed")
def test_proxy_suite_measures_go_reverse_proxy_and_added_latency(tmp_path: Path) -> None:
    opts = quick(tmp_path, "single")
    opts.cases = ["single", "single-c1"]
    report = run_suite(ProxySuite(), opts)
    single, c1 = report["cases"]
    go = single["targets"]["go-proxy"]
    assert go["requests"] > 0 and not go["errors"] and go["cpu_us_per_req"] > 0
    assert single["proxy_vs_go"]["req_per_s"] > 0 and single["proxy_vs_go"]["per_core"] > 0
    assert c1["concurrency"] == 1 and "added_p50_us" in c1["targets"]["proxy"]
    # the same proxy with busy polling on, measured at c=1 only, its setting in its config
    on = c1["targets"]["proxy-busy-poll"]
    assert on["requests"] > 0 and not on["errors"] and "added_p50_us" in on
    assert "proxy-busy-poll" not in single["targets"]
    assert "busy_poll_us = 250" in (tmp_path / "proxy-busy-poll.toml").read_text()
    assert "busy_poll_us" not in (tmp_path / "proxy.toml").read_text()  # the default
    assert any("GOMAXPROCS=1" in note for note in report["notes"])
    assert "proxy ÷ go-proxy" in render(report) and "p50 added over direct" in render(report)


def test_state_suite_compares_state_node_proxy_and_anvil(tmp_path: Path) -> None:
    from nodes.devnet.anvil import ensure_anvil

    ensure_anvil()
    report = run_suite(StateSuite(), quick(tmp_path, "balance"))
    [case] = report["cases"]
    # the proxy over HTTP, and in one process with its own state node (`chainstate up`)
    assert list(case["targets"]) == ["state-node", "proxy", "proxy-inproc", "anvil"]
    for label, target in case["targets"].items():
        assert target["requests"] > 0, label
        assert not target["errors"], (label, target["errors"])


def test_call_suite_bodies_get_the_same_answers_everywhere(tmp_path: Path) -> None:
    """Every case of `suite call` asks something real: anvil, the state node and the proxy
    (over HTTP, and in process with its own state node) give the same non-trivial results
    (old heights differ from latest for the view)."""
    from nodes.devnet.anvil import ensure_anvil

    ensure_anvil()
    suite = CallSuite()
    with running(str(tmp_path)) as services:
        targets = suite.start(services, SuiteOptions(pin=False))
        assert list(targets) == ["anvil", "state-node", "proxy", "proxy-inproc"]
        answers: dict[str, list] = {}
        for case in suite.cases():
            body = case.plan.build()[0]
            got = [_post(url, body) for url in targets.values()]
            for label, answer in zip(targets, got, strict=True):  # (anvil's first: the baseline)
                assert answer == got[0], (case.name, label, answer, got[0])
            items = got[0] if isinstance(got[0], list) else [got[0]]
            values = [int(i["result"], 16) for i in items]  # a drained ERC20 holder reads 0
            assert any(values) and len(values) == case.plan.items_per_body, (case.name, items)
            answers[case.name] = items
    assert answers["view"][0]["result"] != answers["view-old"][0]["result"]
    assert len(answers["erc20x10-old"]) == 10


def _post(url: str, body: bytes) -> Any:
    import json
    import urllib.request

    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_suite_stops_its_services(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGINT or SIGTERM stop the suite and every service it started, also when it was
    started as a script's background job is (SIGINT ignored, inherited)."""
    cmd = [sys.executable, "-m", "bench.suitecli", "proxy", "-d", "30", "--warmup", "0"]
    cmd += ["-c", "2", "--no-reference", "--keep-dir", str(tmp_path)]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            children = psutil.Process(proc.pid).children()
            # the fake node, the proxy and the same proxy with busy polling on (for c=1)
            logs = _read(tmp_path / "proxy.log") + _read(tmp_path / "proxy-busy-poll.log")
            if len(children) == 3 and logs.count("listening") == 2:
                break
            time.sleep(0.1)
        assert len(children) == 3, _read(tmp_path / "proxy.log")
        time.sleep(0.5)  # measuring now
        proc.send_signal(sig)
        assert proc.wait(15) == 130
        _gone, alive = psutil.wait_procs(children, timeout=5)
        assert not alive
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for child in children:  # a failed assertion above must not leave services running
            with contextlib.suppress(psutil.Error):
                child.kill()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""

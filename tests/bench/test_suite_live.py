"""The suites end to end with the real services: `chainstate proxy`, state node, anvil."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.suite import ProxySuite, StateSuite, SuiteOptions, proxy_available, run_suite

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


def test_state_suite_compares_state_node_proxy_and_anvil(tmp_path: Path) -> None:
    from nodes.devnet.anvil import ensure_anvil

    ensure_anvil()
    report = run_suite(StateSuite(), quick(tmp_path, "balance"))
    [case] = report["cases"]
    assert list(case["targets"]) == ["state-node", "proxy", "anvil"]
    for label, target in case["targets"].items():
        assert target["requests"] > 0, label
        assert not target["errors"], (label, target["errors"])

"""`chainstate bench suite cache-tier` end to end at small scale: real redis-server, fake-node,
checker and proxy processes; the cold proxy on the warm tier answers from it and sends the
nodes fewer reads than the one on an empty tier (counts, not timings)."""

from __future__ import annotations

from pathlib import Path

from bench.cachetier import CacheTierSuite, render
from bench.suite import SuiteOptions
from tests.tenancy.redisserver import redis_binary


def test_a_cold_proxy_on_the_warm_tier_spares_the_nodes(tmp_path: Path) -> None:
    redis_binary()  # skipped without redis-server locally, failed under CI
    opts = SuiteOptions(concurrency=8, keep_dir=str(tmp_path))
    report = CacheTierSuite(warm_s=2.0, window_s=1.5).run(opts)
    warm, cold, empty = report["warm"], report["cold"], report["empty"]
    for name, run in (("warm", warm), ("cold", cold), ("empty", empty)):
        assert run["items"] > 0 and run["failed"] == 0, (name, run)
    assert cold["tier_hits"] > 0 and empty["tier_hits"] == 0
    # per item: each load serves as many items in its window as the machine lets it
    per_item = "node_requests_per_1000_items"
    assert cold[per_item] < empty[per_item], (cold, empty)
    assert "C's hit ratio / W's" in render(report)

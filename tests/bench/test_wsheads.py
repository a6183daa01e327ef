"""`chainstate bench ws-heads` on a small scale: the real proxy command (`chainstate proxy`,
its lean data listener handing the WebSocket upgrades to aiohttp) fans newHeads out to every
subscriber, each head once and in order, and the report says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.wsheads import Settings, report, run_proxy_target

pytestmark = pytest.mark.timeout(120)


async def test_every_subscriber_gets_every_head_once_in_order(tmp_path: Path) -> None:
    settings = Settings(subscribers=20, blocks=3, block_time=0.3, poll_interval=0.02)
    with open(tmp_path / "proxy.log", "wb") as log:  # noqa: ASYNC230 - before any load
        out = await run_proxy_target(settings, tmp_path, log)
    assert (out["deliveries"], out["missing"], out["duplicates"], out["out_of_order"]) == (
        60,
        0,
        0,
        0,
    ), (tmp_path / "proxy.log").read_text()
    assert out["answer_before"] and out["answer_after"]  # eth_blockNumber answered around it
    assert out["from_announce_ms_p99"] >= 0
    assert "| proxy | 60 | 0 | 0 | 0 |" in report({"proxy": out})

"""Usage survives a restart without Redis: a `chainstate proxy` process counts a key's
requests, stops, and the next one on the same store (a file store; etcd with a data_dir)
answers the same totals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.etcd.conftest import EtcdServer, ProxyProcess
from tests.proxy.fakes import FakeNode

JSON = {"content-type": "application/json"}
BODY = orjson.dumps(
    {"jsonrpc": "2.0", "id": 1, "method": "eth_getBalance", "params": ["0x" + "11" * 20, "0x3e0"]}
)


async def admin(http: aiohttp.ClientSession, base: str, path: str, body: Any = None) -> Any:
    async with http.post(f"{base}{path}", data=orjson.dumps(body or {}), headers=JSON) as resp:
        answer = await resp.json(content_type=None)
        assert resp.status in (200, 201), answer
        return answer


async def usage_of(http: aiohttp.ClientSession, base: str, key_id: str) -> dict[str, Any]:
    async with http.get(f"{base}/tenancy/usage?key={key_id}") as resp:
        answer = await resp.json()
    [row] = answer["usage"]
    return row


@pytest.mark.parametrize("store", ["file", "etcd"])
async def test_usage_is_kept_across_a_restart_without_redis(
    store: str, tmp_path: Path, etcd_server: EtcdServer
) -> None:
    config = tmp_path / "proxy.toml"
    config.write_text(f'data_dir = "{tmp_path / "data"}"\n[proxy]\nhead_poll_interval = 0.2\n')
    prefix = f"/{tmp_path.name}/"
    where = str(tmp_path / "store.json") if store == "file" else etcd_server.url(prefix)
    args = ("--store", where, "--config", str(config))
    node = await FakeNode("state-1", "state").start()
    try:
        first = ProxyProcess(tmp_path, "first", *args).wait_ready()
        async with aiohttp.ClientSession() as http:
            try:
                await admin(http, first.url, "/1337/addNode", node.entry(1))
                await admin(http, first.url, "/tenancy/projects", {"id": "acme"})
                made = await admin(http, first.url, "/tenancy/keys", {"project": "acme"})
                for _ in range(4):
                    async with http.post(f"{first.url}/1337/{made['key']}", data=BODY) as resp:
                        assert resp.status == 200, await resp.text()
            finally:
                first.stop()
            assert (tmp_path / ("tenancy-usage.sqlite" if store == "file" else "data")).exists()
            second = ProxyProcess(tmp_path, "second", *args).wait_ready()
            try:
                row = await usage_of(http, second.url, made["id"])
            finally:
                second.stop()
        assert (row["requests"], row["items"], row["project"]) == (4, 4, "acme")
        assert row["upstream"] >= 1
    finally:
        await node.stop()

"""Write statistics (minute, daily, block) and the chain-state forward."""

from __future__ import annotations

import datetime as dt
import time

import pytest
import requests

from tests.workspace.conftest import FAKE_HEAD, Workspace, uid
from workspace.errors import ApiError
from workspace.rows import write_block_rows


def test_minute_and_daily_counters(ws: Workspace) -> None:
    a = ws.alice
    space = uid("st")
    a.ok("POST", "/v1/space/create", {"id": space})
    t = a.ok("POST", "/v1/table/create", {"space": space, "name": "c", "table_type": "normal"})[
        "id"
    ]
    a.ok("POST", "/v1/table/init", {"id": t})
    for i in range(3):
        a.ok("POST", "/v1/table/row/create", {"table_id": t, "data": {"id": str(i)}})
    a.ok("POST", "/v1/table/row/update", {"table_id": t, "id": "1", "data": {}})
    a.ok("POST", "/v1/table/row/delete", {"table_id": t, "id": "2"})
    status, _ = a.post("/v1/table/row/create", {"table_id": t, "data": {"id": 5}})
    assert status == 400  # failed writes are not counted
    minute = a.ok("GET", "/v1/table/stats/minute", id=t)
    assert len(minute["buckets"]) == 30
    times = [b["time_at"] for b in minute["buckets"]]
    assert times == sorted(times) and all(x % 60 == 0 for x in times)
    assert times[-1] <= time.time() < times[-1] + 120
    assert sum(b["rows"] for b in minute["buckets"]) == 5
    today = dt.datetime.now(dt.UTC).date()
    daily = a.ok("GET", "/v1/table/stats/daily", id=t, year=today.year)["buckets"]
    assert len(daily) in (365, 366) and daily[0]["time_at"] == f"{today.year}-01-01"
    assert {b["time_at"]: b["rows"] for b in daily}[today.isoformat()] == 5
    span = a.ok(
        "GET", "/v1/table/stats/daily", id=t, **{"from": today.isoformat(), "to": today.isoformat()}
    )
    assert span["buckets"] == [{"time_at": today.isoformat(), "rows": 5}]
    detail = a.ok("GET", "/v1/table", id=t)
    assert detail["last_write_at_ms"] / 1000 <= time.time() + 1
    for params in (
        {},
        {"year": 0},
        {"year": 2024, "from": "2024-01-01", "to": "2024-01-02"},
        {"from": "2024-01-01"},
        {"from": "2024-02-30", "to": "2024-03-01"},
        {"from": "2024-03-01", "to": "2024-02-01"},
        {"from": "2020-01-01", "to": "2024-01-01"},
        {"from": "yesterday", "to": "x"},
    ):
        status, env = a.get("/v1/table/stats/daily", id=t, **params)
        assert status == 400 and env["code"] == 40000, params
    for minutes in (0, 61):
        status, _ = a.get("/v1/table/stats/minute", id=t, minutes=minutes)
        assert status == 400
    status, env = a.get("/v1/table/stats/block", id=t)
    assert status == 400 and "block table" in env["message"]


async def test_block_stats(ws: Workspace) -> None:
    a = ws.alice
    space = uid("sb")
    a.ok("POST", "/v1/space/create", {"id": space})
    t = a.ok(
        "POST",
        "/v1/table/create",
        {"space": space, "name": "tx", "table_type": "block_event", "chain_id": "1337"},
    )["id"]
    a.ok(
        "POST",
        "/v1/table/init",
        {"id": t, "columns": [{"id": "v", "name": "value", "type": "UINT256"}]},
    )
    empty = a.ok("GET", "/v1/table/stats/block", id=t)
    assert (
        empty["completeness"] == [] and empty["blocks"] == [] and empty["completeness_count"] == 0
    )
    now = int(time.time())
    for h in (10, 11, 12, 15, 16, 20):
        rows = [{"id": "0x" + f"{h:02x}{i:02x}" * 16, "value": h * i} for i in range(h % 3 + 1)]
        await write_block_rows(ws.db, t, h, "0x" + f"{h:064x}", now - 2, rows)
    with pytest.raises(ApiError) as bad:
        await write_block_rows(ws.db, t, 21, "0x12", now, [])
    assert bad.value.code == 40004
    s = a.ok("GET", "/v1/table/stats/block", id=t, recent=5)
    assert s["completeness"] == [
        {"start": 10, "end": 12},
        {"start": 15, "end": 16},
        {"start": 20, "end": 20},
    ]
    assert s["completeness_count"] == 3 and s["start_height"] == 0
    assert s["chain_height"] == FAKE_HEAD
    assert [b["block_height"] for b in s["blocks"]] == [20, 19, 18, 17, 16]
    assert [b["processed"] for b in s["blocks"]] == [True, False, False, False, True]
    assert s["blocks"][0]["rows"] == 3 and s["blocks"][1]["rows"] == 0
    assert 1000 <= s["blocks"][0]["lag_ms"] < 60_000 and s["blocks"][1]["lag_ms"] is None
    rows = a.ok("GET", "/v1/table/row/list", table_id=t, order_by="block_height", limit=100)
    assert len(rows["rows"]) == sum(h % 3 + 1 for h in (10, 11, 12, 15, 16, 20))
    assert rows["rows"][0]["block_height"] == "20" and rows["rows"][0]["block_timestamp"] == str(
        now - 2
    )
    for recent in (0, 61):
        status, _ = a.get("/v1/table/stats/block", id=t, recent=recent)
        assert status == 400


def test_chainstate_forward(ws: Workspace) -> None:
    body = b'{"jsonrpc":"2.0","id":7,"method":"eth_blockNumber","params":[]}'
    for headers in (
        {"AccessKey": ws.ids["alice_key"]},
        {"AccessKey": ws.ids["alice_key"], "X-Account-ID": ws.ids["alice"]},
        {**ws.alice.headers},
    ):
        r = requests.post(
            f"{ws.base}/v1/chainstate/1337",
            data=body,
            headers={**headers, "Content-Type": "application/json"},
            timeout=10,
        )
        assert r.status_code == 200, r.text
        assert r.json() == {"jsonrpc": "2.0", "id": 7, "result": hex(FAKE_HEAD)}
    batch = (
        b'[{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]},'
        b'{"jsonrpc":"2.0","id":2,"method":"nope","params":[]}]'
    )
    r = requests.post(
        f"{ws.base}/v1/chainstate/0x539",
        data=batch,
        headers={"AccessKey": ws.ids["alice_key"]},
        timeout=10,
    )
    answers = r.json()
    assert [x["id"] for x in answers] == [1, 2] and "error" in answers[1]
    r = requests.post(f"{ws.base}/v1/chainstate/1337", data=body, timeout=10)
    assert r.status_code == 401 and r.json()["code"] == 40100
    r = requests.post(
        f"{ws.base}/v1/chainstate/abc",
        data=body,
        headers={"AccessKey": ws.ids["alice_key"]},
        timeout=10,
    )
    assert r.status_code == 400 and r.json()["code"] == 40000

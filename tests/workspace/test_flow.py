"""The newcomer's path end to end: Space, normal table, init, upserts, filtered list, SQL
query, stats — and a restart that keeps everything."""

from __future__ import annotations

import json
import signal

from tests.workspace.conftest import Workspace, uid


def test_newcomer_flow_and_restart(ws: Workspace) -> None:
    api = ws.alice
    space = uid()
    s = api.ok("POST", "/v1/space/create", {"id": space, "description": "demo"})
    assert s["account_id"] == ws.ids["alice"] and s["visibility"] == "private"
    t = api.ok(
        "POST", "/v1/table/create", {"space": space, "name": "balances", "table_type": "normal"}
    )
    assert t["id"] == f"{space}.balances" and t["chain_id"] is None
    detail = api.ok(
        "POST",
        "/v1/table/init",
        {
            "id": t["id"],
            "columns": [
                {"id": "id", "name": "id", "type": "ADDRESS"},
                {"id": "c1", "name": "amount", "type": "UINT256"},
                {"id": "c2", "name": "label", "type": "STRING"},
            ],
        },
    )
    assert detail["inited"] is True
    assert [c["name"] for c in detail["columns"]] == ["id", "amount", "label"]
    addrs = [f"0x{i:040x}" for i in range(1, 6)]
    for i, a in enumerate(addrs):
        assert (
            api.ok(
                "POST",
                "/v1/table/row/create",
                {
                    "table_id": t["id"],
                    "data": {"id": a, "amount": str(10**30 * i), "label": f"n{i}"},
                },
            )
            is None
        )
    # upsert: same id updates
    api.ok(
        "POST",
        "/v1/table/row/create",
        {"table_id": t["id"], "data": {"id": addrs[0].upper().replace("0X", "0x"), "amount": 7}},
    )
    flt = json.dumps([{"field": "amount", "op": "gte", "value": str(2 * 10**30)}])
    page = api.ok(
        "GET",
        "/v1/table/row/list",
        table_id=t["id"],
        filter=flt,
        order_by="amount",
        direction="asc",
    )
    assert [r["amount"] for r in page["rows"]] == [str(10**30 * i) for i in (2, 3, 4)]
    assert page["total_count"] is None and page["start"] == 0 and page["limit"] == 1000
    q = api.ok(
        "POST",
        "/v1/table/row/query",
        {"table_id": t["id"], "sql": f"SELECT * FROM {t['id']} WHERE amount < 100 ORDER BY id"},
    )
    assert q["rows"] == [{"id": addrs[0], "amount": "7", "label": "n0"}]
    assert q["rows_count"] == 1 and q["truncated"] is False
    minute = api.ok("GET", "/v1/table/stats/minute", id=t["id"], minutes=5)
    assert len(minute["buckets"]) == 5 and sum(b["rows"] for b in minute["buckets"]) == 6
    ws.stop()
    ws.start()
    again = api.ok(
        "GET", "/v1/table/row/list", table_id=t["id"], order_by="amount", direction="asc"
    )
    assert [r["id"] for r in again["rows"]] == [addrs[0], *addrs[1:]]
    assert api.ok("GET", "/v1/space", id=space)["content_count"] == 1
    assert api.ok("GET", "/v1/table", id=t["id"])["table_rows"] == 5


def test_kill_9_keeps_acknowledged_writes(ws: Workspace) -> None:
    """A write answered `ok` survives SIGKILL of the server right after."""
    api = ws.alice
    space = uid()
    api.ok("POST", "/v1/space/create", {"id": space})
    t = api.ok("POST", "/v1/table/create", {"space": space, "name": "k", "table_type": "normal"})
    api.ok("POST", "/v1/table/init", {"id": t["id"]})
    for i in range(20):
        api.ok("POST", "/v1/table/row/create", {"table_id": t["id"], "data": {"id": f"r{i}"}})
    ws.proc.send_signal(signal.SIGKILL)
    ws.proc.wait(10)
    ws.stop()
    ws.start()
    rows = api.ok("GET", "/v1/table/row/list", table_id=t["id"], direction="asc")["rows"]
    assert [r["id"] for r in rows] == sorted(f"r{i}" for i in range(20))
    minute = api.ok("GET", "/v1/table/stats/minute", id=t["id"], minutes=3)
    assert sum(b["rows"] for b in minute["buckets"]) == 20

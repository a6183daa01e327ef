"""Table definition endpoints and their rules."""

from __future__ import annotations

from typing import Any

import pytest

from tests.workspace.conftest import FAKE_HEAD, Api, Workspace, uid
from workspace.rows import write_block_rows


@pytest.fixture(scope="module")
def space(ws: Workspace) -> str:
    sid = uid("t")
    ws.alice.ok("POST", "/v1/space/create", {"id": sid, "visibility": "public"})
    return sid


def create(api: Api, space: str, name: str, table_type: str = "normal", **kw: Any) -> dict:
    return api.ok(
        "POST", "/v1/table/create", {"space": space, "name": name, "table_type": table_type, **kw}
    )


def err(api: Api, path: str, body: dict, status: int = 400, code: int | None = None) -> str:
    got, env = api.post(path, body)
    assert got == status, env
    if code is not None:
        assert env["code"] == code, env
    assert env["data"] is None and env["message"]
    return env["message"]


def test_create_rules(ws: Workspace, space: str) -> None:
    a = ws.alice
    t = create(a, space, "ev", "block_event", chain_id="1337", description="events")
    assert t["id"] == f"{space}.ev.1337" and t["name"] == "ev.1337" and t["chain_id"] == "1337"
    t2 = create(a, space, "st.1337", "block_state", chain_id="1337")
    assert t2["name"] == "st.1337"
    assert create(a, space, "tm", "time")["table_type"] == "time"
    c = "/v1/table/create"
    err(a, c, {"space": space, "name": "ev2", "table_type": "block_event"})
    err(a, c, {"space": space, "name": "n", "table_type": "normal", "chain_id": "1"})
    err(
        a,
        c,
        {"space": space, "name": "ev", "table_type": "block_event", "chain_id": "1337"},
        409,
        40900,
    )
    err(a, c, {"space": space, "name": "x" * (64 - len(space)), "table_type": "normal"})
    err(a, c, {"space": space, "name": "Bad-Name", "table_type": "normal"})
    err(a, c, {"space": space, "name": "trailing\n", "table_type": "normal"})
    err(a, c, {"space": space, "name": "nul\x00", "table_type": "normal"})
    err(a, c, {"space": space, "name": "ev3", "table_type": "block_event", "chain_id": "1\n"})
    err(a, c, {"space": space, "name": "", "table_type": "normal"})
    err(a, c, {"space": space, "name": "n", "table_type": "weird"})
    err(a, c, {"space": space, "name": "n", "table_type": "normal", "description": "d" * 256})
    err(a, c, {"space": "missing-space", "name": "n", "table_type": "normal"}, 404, 40400)
    ok_len = "x" * (64 - len(space) - 1)
    assert len(create(a, space, ok_len)["id"]) == 64


def test_init_rules(ws: Workspace, space: str) -> None:
    a = ws.alice
    t = create(a, space, "users")["id"]
    i = "/v1/table/init"
    err(a, i, {"id": t, "columns": [{"id": "n", "name": "name", "type": "STRING"}]})
    err(a, i, {"id": t, "columns": [{"id": "id", "name": "id", "type": "INT"}]})
    err(
        a,
        i,
        {
            "id": t,
            "columns": [
                {"id": "id", "name": "id", "type": "STRING"},
                {"id": "id", "name": "other", "type": "INT"},
            ],
        },
    )
    err(
        a,
        i,
        {
            "id": t,
            "columns": [
                {"id": "id", "name": "id", "type": "STRING"},
                {"id": "x", "name": "id", "type": "INT"},
            ],
        },
    )
    err(
        a,
        i,
        {
            "id": t,
            "columns": [
                {"id": "id", "name": "id", "type": "STRING"},
                {"id": "x", "name": "Bad Name", "type": "INT"},
            ],
        },
    )
    err(a, i, {"id": t, "columns": [{"id": "id", "name": "id", "type": "NOPE"}]})
    err(a, i, {"id": t, "columns": [{"id": "id", "name": "id"}]})
    err(a, i, {"id": t, "indexes": [{"columns": ["id"]}]})  # normal: index id required
    err(a, i, {"id": t, "view": {"zzz": {"sort": 0}}})
    assert a.ok("GET", "/v1/table", id=t)["inited"] is False
    d = a.ok(
        "POST",
        i,
        {
            "id": t,
            "columns": [
                {"id": "id", "name": "id", "type": "STRING"},
                {"id": "c_age", "name": "age", "type": "int"},
            ],
            "indexes": [{"id": "by_age", "columns": ["age"], "is_primary": True}],
            "view": {"c_age": {"sort": 0}},
        },
    )
    assert d["columns"][1] == {"id": "c_age", "name": "age", "type": "INT", "is_system": False}
    assert d["columns"][0]["is_system"] is True
    assert [x["id"] for x in d["indexes"]] == ["primary", "by_age"]
    assert d["indexes"][1]["is_primary"] is False and d["view"] == {"c_age": {"sort": 0}}
    err(a, i, {"id": t}, 409, 40900)


def test_block_and_time_init(ws: Workspace, space: str) -> None:
    a = ws.alice
    b = create(a, space, "logs", "block_event", chain_id="1337")["id"]
    err(
        a,
        "/v1/table/init",
        {"id": b, "columns": [{"id": "bh", "name": "block_height", "type": "STRING"}]},
    )
    d = a.ok(
        "POST",
        "/v1/table/init",
        {
            "id": b,
            "columns": [{"id": "v", "name": "value", "type": "UINT256"}],
            "indexes": [{"columns": ["value"]}],
        },
    )
    names = [c["name"] for c in d["columns"]]
    assert names == ["id", "block_height", "block_id", "block_timestamp", "value"]
    assert [c["is_system"] for c in d["columns"]] == [True, True, True, True, False]
    assert [x["id"] for x in d["indexes"]] == ["primary", "idx_value"]  # hidden one omitted
    l1 = a.ok("GET", "/v1/table", id=b, is_l1="true")
    assert "block_height" in [x["id"] for x in l1["indexes"]]
    tm = create(a, space, "prices", "time")["id"]
    err(a, "/v1/table/init", {"id": tm, "columns": [{"id": "x", "name": "x", "type": "INT"}]})
    d = a.ok("POST", "/v1/table/init", {"id": tm})
    assert [(c["name"], c["type"]) for c in d["columns"]] == [
        ("id", "STRING"),
        ("time_at", "TIMESTAMP"),
        ("value", "FLOAT"),
    ]


def test_columns_update_rules(ws: Workspace, space: str) -> None:
    a = ws.alice
    t = create(a, space, "cu")["id"]
    base = [
        {"id": "id", "name": "id", "type": "STRING"},
        {"id": "a", "name": "alpha", "type": "INT"},
        {"id": "b", "name": "beta", "type": "STRING"},
    ]
    a.ok(
        "POST",
        "/v1/table/init",
        {"id": t, "columns": base, "indexes": [{"id": "ib", "columns": ["beta"]}]},
    )
    a.ok(
        "POST",
        "/v1/table/row/create",
        {"table_id": t, "data": {"id": "r1", "alpha": 5, "beta": "x"}},
    )
    u = "/v1/table/columns/update"
    m = err(a, u, {"id": t, "columns": [base[0], {**base[1], "type": "STRING"}, base[2]]})
    assert "type cannot change" in m
    m = err(a, u, {"id": t, "columns": base[:2]})
    assert "index" in m
    err(a, u, {"id": t, "columns": base[1:]})  # the system id column cannot go
    # rename alpha -> gamma, drop nothing, add delta; swap-safe renames
    d = a.ok(
        "POST",
        u,
        {
            "id": t,
            "columns": [
                base[0],
                {"id": "a", "name": "gamma", "type": "INT"},
                base[2],
                {"id": "d", "name": "delta", "type": "DECIMAL"},
            ],
        },
    )
    assert [c["name"] for c in d["columns"]] == ["id", "gamma", "beta", "delta"]
    rows = a.ok("GET", "/v1/table/row/list", table_id=t)["rows"]
    assert rows == [{"id": "r1", "gamma": "5", "beta": "x", "delta": None}]
    d = a.ok(
        "POST",
        u,
        {
            "id": t,
            "columns": [
                base[0],
                {"id": "a", "name": "beta", "type": "INT"},
                {"id": "b", "name": "gamma", "type": "STRING"},
            ],
        },
    )
    assert a.ok("GET", "/v1/table/row/list", table_id=t)["rows"] == [
        {"id": "r1", "beta": "5", "gamma": "x"}
    ]
    assert d["indexes"][1]["columns"] == ["gamma"]  # the index followed the rename
    nt = create(a, space, "fresh")["id"]
    err(a, u, {"id": nt, "columns": base}, 409, 40900)


def test_indexes_and_view(ws: Workspace, space: str) -> None:
    a = ws.alice
    t = create(a, space, "ix")["id"]
    cols = [{"id": "id", "name": "id", "type": "STRING"}, {"id": "k", "name": "k", "type": "INT"}]
    a.ok("POST", "/v1/table/init", {"id": t, "columns": cols})
    u = "/v1/table/indexes/update"
    d = a.ok("POST", u, {"id": t, "indexes": [{"id": "by_k", "columns": ["k"]}]})
    assert [x["id"] for x in d["indexes"]] == ["primary", "by_k"]
    d = a.ok("POST", u, {"id": t, "indexes": d["indexes"]})  # round trip keeps them
    assert [x["id"] for x in d["indexes"]] == ["primary", "by_k"]
    err(a, u, {"id": t, "indexes": [{"columns": ["k"]}]})
    err(a, u, {"id": t, "indexes": [{"id": "x", "columns": ["nope"]}]})
    err(a, u, {"id": t, "indexes": [{"id": "x", "columns": []}]})
    err(a, u, {"id": t, "indexes": [{"id": "x", "columns": ["k"]}, {"id": "x", "columns": ["k"]}]})
    d = a.ok("POST", u, {"id": t, "indexes": []})
    assert [x["id"] for x in d["indexes"]] == ["primary"]
    v = a.ok("POST", "/v1/table/view/update", {"id": t, "view": {"k": {"sort": 1}}})
    assert v["view"] == {"k": {"sort": 1}}
    assert a.ok("POST", "/v1/table/view/update", {"id": t, "view": None})["view"] is None
    err(a, "/v1/table/view/update", {"id": t})
    err(a, "/v1/table/view/update", {"id": t, "view": {"k": {"sort": -1}}})
    err(a, "/v1/table/view/update", {"id": t, "view": {"nope": {"sort": 1}}})


def test_catalog_endpoints(ws: Workspace, space: str) -> None:
    a = ws.alice
    assert a.ok("GET", "/v1/table/id_types") == [
        "STRING",
        "ADDRESS",
        "TOKENID",
        "HASH",
        "BLOCKID",
        "CHAINID",
        "TXID",
    ]
    tpl = a.ok("GET", "/v1/table/templates", table_type="block_state")
    assert [c["name"] for c in tpl["columns"]] == [
        "id",
        "block_height",
        "block_id",
        "block_timestamp",
    ]
    assert a.ok("GET", "/v1/table/templates")["columns"][0]["name"] == "id"
    status, _ = a.get("/v1/table/templates", table_type="bogus")
    assert status == 400
    v = a.ok("POST", "/v1/table/columns/validate", {"name": "good_name"})
    assert v == {"is_valid": True, "reason": None}
    v = a.ok("POST", "/v1/table/columns/validate", {"name": "9bad"})
    assert v["is_valid"] is False and v["reason"]
    assert a.ok("POST", "/v1/table/columns/validate", {"name": "x" * 65})["is_valid"] is False


def test_get_list_and_permissions(ws: Workspace, space: str) -> None:
    a, b = ws.alice, ws.bob
    t = create(a, space, "findme_tbl")["id"]
    a.ok("POST", "/v1/table/init", {"id": t})
    a.ok("POST", "/v1/table/row/create", {"table_id": t, "data": {"id": "x"}})
    got = b.ok("GET", "/v1/table", id=t)  # public Space: readable
    assert got["table_rows"] == 1 and got["table_size"] > 0 and got["space_entity"]["id"] == space
    assert got["parent"] == {"id": t, "table_type": "normal"} and got["replica_num"] == 1
    page = b.ok("GET", "/v1/table/list", space=space, name="findme", with_activity="true")
    assert [i["id"] for i in page["items"]] == [t]
    assert page["items"][0]["last_write_at_ms"] > 0 and page["total_count"] == 1
    page = b.ok("GET", "/v1/table/list", space=space, name="findme")
    assert page["items"][0]["last_write_at_ms"] is None
    assert b.ok("GET", "/v1/table/list", space=space, name="%")["items"] == []
    page = a.ok("GET", "/v1/table/list", space=space, order_by="name", direction="asc", limit=100)
    names = [i["name"] for i in page["items"]]
    assert names == sorted(names)
    status, _ = a.get("/v1/table/list", limit=101)
    assert status == 400
    status, env = a.get("/v1/table/list", space="nope-nope")
    assert status == 404
    status, env = b.post("/v1/table/init", {"id": t})
    assert status == 403 and env["code"] == 40300
    status, env = b.post("/v1/table/row/create", {"table_id": t, "data": {"id": "y"}})
    assert status == 403
    status, env = a.get("/v1/table", id=f"{space}.missing")
    assert status == 404 and env["code"] == 40400
    inst = a.ok("GET", "/v1/table/instance/list", id=t, access="read")
    assert inst == {"instances": [], "count": 0}
    status, _ = a.get("/v1/table/instance/list", id=t, access="execute")
    assert status == 400


async def test_start_height(ws: Workspace, space: str) -> None:
    a = ws.alice
    n = create(a, space, "plain")["id"]
    assert a.ok("GET", "/v1/table/start_height/editable", id=n)["editable"] is False
    b = create(a, space, "sh", "block_state", chain_id="1337")["id"]
    e = a.ok("GET", "/v1/table/start_height/editable", id=b)
    assert e["editable"] is False and "not initialized" in e["reason"]
    a.ok("POST", "/v1/table/init", {"id": b})
    assert a.ok("GET", "/v1/table/start_height/editable", id=b) == {
        "editable": True,
        "reason": None,
    }
    err(a, "/v1/table/start_height/update", {"id": b, "start_height": FAKE_HEAD + 1})
    err(a, "/v1/table/start_height/update", {"id": b, "start_height": -1})
    d = a.ok("POST", "/v1/table/start_height/update", {"id": b, "start_height": 100})
    assert d["start_height"] == 100
    await write_block_rows(
        ws.db, b, 100, "0x" + "ab" * 32, 1_700_000_000, [{"id": "0x" + "01" * 32}]
    )
    e = a.ok("GET", "/v1/table/start_height/editable", id=b)
    assert e["editable"] is False and "processed" in e["reason"]
    err(a, "/v1/table/start_height/update", {"id": b, "start_height": 50}, 409, 40900)
    err(a, "/v1/table/start_height/update", {"id": n, "start_height": 1}, 409)


def test_spec_limits(ws: Workspace, space: str) -> None:
    a = ws.alice
    t = create(a, space, "limits")["id"]
    long_col = [
        {"id": "id", "name": "id", "type": "STRING"},
        {"id": "c" * 65, "name": "c", "type": "INT"},
    ]
    err(a, "/v1/table/init", {"id": t, "columns": long_col})
    long_name = [
        {"id": "id", "name": "id", "type": "STRING"},
        {"id": "c", "name": "c" * 65, "type": "INT"},
    ]
    err(a, "/v1/table/init", {"id": t, "columns": long_name})
    err(a, "/v1/table/init", {"id": t, "indexes": [{"id": "i" * 65, "columns": ["id"]}]})
    ok64 = [
        {"id": "id", "name": "id", "type": "STRING"},
        {"id": "c" * 64, "name": "c" * 64, "type": "INT"},
    ]
    a.ok(
        "POST",
        "/v1/table/init",
        {"id": t, "columns": ok64, "indexes": [{"id": "i" * 64, "columns": ["c" * 64]}]},
    )
    err(a, "/v1/table/create", {"space": space, "name": "n" * 256, "table_type": "normal"})
    err(a, "/v1/table/create", {"space": "s" * 65, "name": "n", "table_type": "normal"})
    status, env = a.get("/v1/table", id="x" * 256)
    assert status == 400 and env["code"] == 40000
    status, env = a.get("/v1/table", id="")
    assert status == 400
    b = create(a, space, "lim", "block_event", chain_id="1337")["id"]
    a.ok("POST", "/v1/table/init", {"id": b})
    err(a, "/v1/table/start_height/update", {"id": b, "start_height": 2**63})
    err(a, "/v1/table/start_height/update", {"id": b, "start_height": "5"})
    too_many = [{"id": "id", "name": "id", "type": "STRING"}] + [
        {"id": f"c{i}", "name": f"c{i}", "type": "INT"} for i in range(256)
    ]
    t2 = create(a, space, "wide")["id"]
    assert "at most 256 columns" in err(a, "/v1/table/init", {"id": t2, "columns": too_many})

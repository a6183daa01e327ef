"""Row writes, reads, the JSON filter and its types; bad input leaves the data as it was."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.workspace.conftest import Api, Workspace, uid

COLUMNS = [
    {"id": "id", "name": "id", "type": "STRING"},
    {"id": "n", "name": "n", "type": "INT"},
    {"id": "big", "name": "big", "type": "UINT256"},
    {"id": "dec", "name": "dec", "type": "DECIMAL"},
    {"id": "f", "name": "f", "type": "FLOAT"},
    {"id": "ok", "name": "ok", "type": "BOOLEAN"},
    {"id": "who", "name": "who", "type": "ADDRESS"},
    {"id": "note", "name": "note", "type": "STRING"},
    {"id": "ts", "name": "ts", "type": "TIMESTAMP"},
]
ROWS = [
    {
        "id": "a",
        "n": -5,
        "big": "0",
        "dec": "-1.5",
        "f": 0.5,
        "ok": True,
        "who": "0x" + "AA" * 20,
        "note": "alpha",
        "ts": 1_700_000_000,
    },
    {
        "id": "b",
        "n": 2**40,
        "big": str(2**200),
        "dec": "-1.05",
        "f": 2.0,
        "ok": False,
        "who": "0x" + "bb" * 20,
        "note": None,
        "ts": "1700000001",
    },
    {
        "id": "c",
        "n": 7,
        "big": "0x10",
        "dec": "3.14159",
        "f": -1,
        "ok": True,
        "who": "0x" + "cc" * 20,
        "note": "it's",
        "ts": 0,
    },
    {
        "id": "d",
        "n": 9223372036854775807,
        "big": str(2**256 - 1),
        "dec": 12,
        "f": 1e300,
        "ok": None,
        "who": None,
        "note": "delta",
        "ts": None,
    },
]


@pytest.fixture(scope="module")
def table(ws: Workspace) -> str:
    space = uid("r")
    ws.alice.ok("POST", "/v1/space/create", {"id": space})
    t = ws.alice.ok(
        "POST", "/v1/table/create", {"space": space, "name": "things", "table_type": "normal"}
    )["id"]
    ws.alice.ok("POST", "/v1/table/init", {"id": t, "columns": COLUMNS})
    for row in ROWS:
        ws.alice.ok("POST", "/v1/table/row/create", {"table_id": t, "data": row})
    return t


def listed(api: Api, table: str, **params: Any) -> list[str]:
    if "filter" in params and not isinstance(params["filter"], str):
        params["filter"] = json.dumps(params["filter"])
    return [r["id"] for r in api.ok("GET", "/v1/table/row/list", table_id=table, **params)["rows"]]


def snapshot(api: Api, table: str) -> list[dict]:
    return api.ok("GET", "/v1/table/row/list", table_id=table, direction="asc")["rows"]


def test_values_come_back_typed(ws: Workspace, table: str) -> None:
    got = ws.alice.ok("POST", "/v1/table/row/get", {"table_id": table, "pks": ["d", "a", "zz"]})
    assert got["total_count"] == 2
    assert [c["name"] for c in got["columns"]] == [c["name"] for c in COLUMNS]
    assert got["columns"][1] == {"id": "n", "name": "n", "type": "INT"}
    d, a = got["rows"]
    assert d == {
        "id": "d",
        "n": "9223372036854775807",
        "big": str(2**256 - 1),
        "dec": "12",
        "f": 1e300,
        "ok": None,
        "who": None,
        "note": "delta",
        "ts": None,
    }
    assert a == {
        "id": "a",
        "n": "-5",
        "big": "0",
        "dec": "-1.5",
        "f": 0.5,
        "ok": True,
        "who": "0x" + "aa" * 20,
        "note": "alpha",
        "ts": "1700000000",
    }


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        ([{"field": "n", "op": "gt", "value": 0}], ["b", "c", "d"]),
        ([{"field": "n", "op": "lte", "value": "7"}], ["a", "c"]),
        ([{"field": "big", "op": "gte", "value": "16"}], ["b", "c", "d"]),
        ([{"field": "big", "op": "lt", "value": 2**200}], ["a", "c"]),
        ([{"field": "dec", "op": "lt", "value": "-1.1"}], ["a"]),
        ([{"field": "dec", "op": "gt", "value": -1.5}], ["b", "c", "d"]),
        ([{"field": "dec", "op": "eq", "value": "12.000"}], ["d"]),
        ([{"field": "f", "op": "neq", "value": 2}], ["a", "c", "d"]),
        ([{"field": "ok", "op": "eq", "value": True}], ["a", "c"]),
        ([{"field": "ok", "op": "eq", "value": None}], ["d"]),
        ([{"field": "note", "op": "neq", "value": None}], ["a", "c", "d"]),
        ([{"field": "who", "op": "eq", "value": "0x" + "BB" * 20}], ["b"]),
        ([{"field": "note", "op": "eq", "value": "it's"}], ["c"]),
        ([{"field": "ts", "op": "gte", "value": 1_700_000_000}], ["a", "b"]),
        (
            [{"field": "n", "op": "gt", "value": 0}, {"field": "ok", "op": "eq", "value": True}],
            ["c"],
        ),
        ([], ["a", "b", "c", "d"]),
    ],
)
def test_filter_operators(ws: Workspace, table: str, flt: list, expected: list[str]) -> None:
    assert listed(ws.alice, table, filter=flt, direction="asc") == expected


def test_null_filter_means_no_filter(ws: Workspace, table: str) -> None:
    everything = ["a", "b", "c", "d"]
    for flt in ("null", " null ", "[]", ""):
        assert listed(ws.alice, table, filter=flt, direction="asc") == everything, flt
    assert listed(ws.alice, table, direction="asc") == everything  # no filter parameter at all


def test_order_and_paging(ws: Workspace, table: str) -> None:
    a = ws.alice
    assert listed(a, table) == ["d", "c", "b", "a"]  # default: id desc
    assert listed(a, table, order_by="big", direction="asc") == ["a", "c", "b", "d"]
    assert listed(a, table, order_by="dec", direction="asc") == ["a", "b", "c", "d"]
    assert listed(a, table, order_by="note", direction="asc") == ["b", "a", "d", "c"]
    assert listed(a, table, order_by="n", direction="desc", limit=2, start=1) == ["b", "c"]
    page = a.ok("GET", "/v1/table/row/list", table_id=table, limit=1, start=3)
    assert page["start"] == 3 and page["limit"] == 1 and len(page["rows"]) == 1


def test_bad_filters_and_order(ws: Workspace, table: str) -> None:
    a = ws.alice
    before = snapshot(a, table)
    bad = [
        "not json",
        '{"field": "n"}',
        json.dumps([{"field": "n", "op": "like", "value": 1}]),
        json.dumps([{"field": "n", "op": "gt", "value": None}]),
        json.dumps([{"field": "nope", "op": "eq", "value": 1}]),
        json.dumps([{"field": "n", "op": "eq", "value": "abc"}]),
        json.dumps([{"field": "n", "op": "eq", "value": [1]}]),
        json.dumps([{"field": "n", "op": "eq"}]),
        json.dumps([{"field": "id) OR 1=1 --", "op": "eq", "value": 1}]),
        json.dumps([{"field": "n", "op": "eq; DROP TABLE x", "value": 1}]),
        json.dumps([{"field": "n", "op": "eq", "value": 1}] * 33),
        json.dumps([{"field": "n", "op": "eq", "value": "9" * 5000}]),  # past int()'s limit
        '[{"field": "n", "op": "eq", "value": ' + "9" * 5000 + "}]",
    ]
    for f in bad:
        status, env = a.get("/v1/table/row/list", table_id=table, filter=f)
        assert status == 400 and env["code"] == 40002, (f, env)
    # an injection attempt inside a value is just a value
    assert listed(a, table, filter=[{"field": "note", "op": "eq", "value": "x' OR '1'='1"}]) == []
    for order in ("n; DROP TABLE things", "id DESC", "nope", '"id"'):
        status, env = a.get("/v1/table/row/list", table_id=table, order_by=order)
        assert status == 400 and env["code"] == 40000, order
    for params in ({"limit": 0}, {"limit": 10001}, {"start": -1}, {"direction": "sideways"}):
        status, env = a.get("/v1/table/row/list", table_id=table, **params)
        assert status == 400, params
    assert snapshot(a, table) == before


def test_bad_writes_change_nothing(ws: Workspace, table: str) -> None:
    a = ws.alice
    before = snapshot(a, table)
    c = "/v1/table/row/create"
    bad: list[tuple[str, dict, int]] = [
        (c, {"table_id": table, "data": {"n": 1}}, 40004),  # no id
        (c, {"table_id": table, "data": {"id": "a", "nope": 1}}, 40004),
        (c, {"table_id": table, "data": {"id": "a", "n": "x"}}, 40004),
        (c, {"table_id": table, "data": {"id": "a", "n": 2**63}}, 40004),
        (c, {"table_id": table, "data": {"id": "a", "big": -1}}, 40004),
        (c, {"table_id": table, "data": {"id": "a", "big": str(2**256)}}, 40004),
        # longer than Python converts (4300 digits): a clear refusal, not a 500
        (c, {"table_id": table, "data": {"id": "a", "big": "1" * 5000}}, 40004),
        (c, {"table_id": table, "data": {"id": "a", "n": "-" + "9" * 5000}}, 40004),
        (c, {"table_id": table, "data": {"id": "a", "dec": "1e999"}}, 40004),
        # a float that big is not the number that was sent (1e30 reads 1000000000000000019884…)
        (c, {"table_id": table, "data": {"id": "a", "big": 1e30}}, 40004),
        (c, {"table_id": table, "data": {"id": "a", "n": -1.5e16}}, 40004),
        (c, {"table_id": table, "data": {"id": "a", "ok": 1}}, 40004),
        (c, {"table_id": table, "data": {"id": "a", "who": "0x12"}}, 40004),
        (c, {"table_id": table, "data": {"id": "a", "who": "0x" + "ab" * 20 + "\n"}}, 40004),
        (c, {"table_id": table, "data": {"id": "a", "note": "nul\x00"}}, 40004),
        (c, {"table_id": table, "data": {"id": "a", "f": "1.5"}}, 40004),
        (c, {"table_id": table, "data": {"id": None}}, 40004),
        (c, {"table_id": table, "data": "x"}, 40000),
        (c, {"table_id": table}, 40000),
        (c, {"table_id": table + "x", "data": {"id": "a"}}, 40400),
        ("/v1/table/row/update", {"table_id": table, "id": "a", "data": {"id": "b"}}, 40004),
        ("/v1/table/row/update", {"table_id": table, "id": "zz", "data": {"n": 1}}, 40400),
        ("/v1/table/row/update", {"table_id": table, "id": "", "data": {}}, 40000),
        ("/v1/table/row/delete", {"table_id": table, "id": "zz"}, 40400),
        ("/v1/table/row/get", {"table_id": table, "pks": ["a"] * 10001}, 40000),
        ("/v1/table/row/get", {"table_id": table, "pks": [1]}, 40000),
    ]
    for path, body, code in bad:
        status, env = a.post(path, body)
        assert env["code"] == code and status == code // 100, (body, env)
    assert snapshot(a, table) == before
    status, env = a.post("/v1/table/row/get", {"table_id": table, "pks": ["a"] * 10000})
    assert status == 200 and env["data"]["total_count"] == 1


def test_update_delete_and_other_table_types(ws: Workspace) -> None:
    a = ws.alice
    space = uid("u")
    a.ok("POST", "/v1/space/create", {"id": space})
    t = a.ok("POST", "/v1/table/create", {"space": space, "name": "kv", "table_type": "normal"})[
        "id"
    ]
    status, env = a.post("/v1/table/row/create", {"table_id": t, "data": {"id": "k"}})
    assert status == 409 and "not initialized" in env["message"]
    a.ok(
        "POST",
        "/v1/table/init",
        {
            "id": t,
            "columns": [
                {"id": "id", "name": "id", "type": "HASH"},
                {"id": "v", "name": "v", "type": "STRING"},
                {"id": "w", "name": "w", "type": "INT"},
            ],
        },
    )
    k = "0x" + "Ab" * 32
    a.ok("POST", "/v1/table/row/create", {"table_id": t, "data": {"id": k, "v": "one", "w": 1}})
    a.ok("POST", "/v1/table/row/update", {"table_id": t, "id": k.lower(), "data": {"v": "two"}})
    a.ok("POST", "/v1/table/row/create", {"table_id": t, "data": {"id": k, "w": 3}})
    rows = a.ok("POST", "/v1/table/row/get", {"table_id": t, "pks": [k]})["rows"]
    assert rows == [{"id": k.lower(), "v": "two", "w": "3"}]
    a.ok("POST", "/v1/table/row/update", {"table_id": t, "id": k, "data": {"id": k, "v": None}})
    assert a.ok("POST", "/v1/table/row/get", {"table_id": t, "pks": [k]})["rows"][0]["v"] is None
    a.ok("POST", "/v1/table/row/delete", {"table_id": t, "id": k})
    assert a.ok("POST", "/v1/table/row/get", {"table_id": t, "pks": [k]})["rows"] == []
    b = a.ok(
        "POST",
        "/v1/table/create",
        {"space": space, "name": "ev", "table_type": "block_event", "chain_id": "1"},
    )["id"]
    a.ok("POST", "/v1/table/init", {"id": b})
    status, env = a.post("/v1/table/row/create", {"table_id": b, "data": {"id": "0x" + "1" * 64}})
    assert status == 409 and env["code"] == 40900
    status, env = a.post("/v1/table/row/delete", {"table_id": b, "id": "x"})
    assert status == 409


def test_big_json_integers_stay_exact(ws: Workspace, table: str) -> None:
    """A UINT256 sent as a JSON integer beyond 64 bits is stored digit for digit."""
    a = ws.alice
    n = 123456789012345678901234567890
    a.ok("POST", "/v1/table/row/create", {"table_id": table, "data": {"id": "big1", "big": n}})
    got = a.ok("POST", "/v1/table/row/get", {"table_id": table, "pks": ["big1"]})["rows"]
    assert got[0]["big"] == str(n)
    assert listed(a, table, filter=[{"field": "big", "op": "eq", "value": n}]) == ["big1"]
    a.ok("POST", "/v1/table/row/delete", {"table_id": table, "id": "big1"})

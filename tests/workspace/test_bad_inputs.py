"""Inputs that used to answer HTTP 500 (issue 12, finding 6) answer 400 with the error
envelope, on a real server and both backends, and change nothing: a DECIMAL beyond any
column's range written in exponent form, integers of thousands of digits, JSON nested past
`max_json_depth`, a Function returning a value nested too deeply."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.workspace.conftest import Api, Workspace, uid

HUGE = "9" * 5000
DEEP = "[" * 1000 + "]" * 1000  # JSON text (Python's own json stops near 1000 levels)


@pytest.fixture(scope="module")
def table(ws: Workspace) -> str:
    space = uid()
    ws.alice.ok("POST", "/v1/space/create", {"id": space})
    t = ws.alice.ok(
        "POST", "/v1/table/create", {"space": space, "name": "t", "table_type": "normal"}
    )
    cols = [
        {"id": "id", "name": "id", "type": "STRING"},
        {"id": "d", "name": "d", "type": "DECIMAL"},
        {"id": "n", "name": "n", "type": "INT"},
    ]
    ws.alice.ok("POST", "/v1/table/init", {"id": t["id"], "columns": cols})
    ws.alice.ok(
        "POST", "/v1/table/row/create", {"table_id": t["id"], "data": {"id": "r", "d": "1"}}
    )
    return str(t["id"])


@pytest.fixture(scope="module")
def function(ws: Workspace, table: str) -> str:
    space = table.split(".")[0]
    body = {
        "space": space,
        "name": "f",
        "language": "python",
        "code": "def main(a):\n    return 1\n",
    }
    return str(ws.alice.ok("POST", "/v1/function/create", body)["id"])


@pytest.fixture(scope="module")
def notebook(ws: Workspace, table: str) -> str:
    space = table.split(".")[0]
    params = [{"name": "x", "type": "JSON"}]
    body = {"space": space, "name": "nb", "code": "print(x)", "parameters": params}
    return str(ws.alice.ok("POST", "/v1/notebook/create", body)["id"])


def refused(api: Api, method: str, path: str, body: Any = None, **params: Any) -> dict[str, Any]:
    status, env = api.get(path, **params) if method == "GET" else api.post(path, body)
    assert status == 400, (status, env)
    assert set(env) == {"code", "message", "data"} and env["data"] is None, env
    assert env["code"] // 100 == 400 and env["message"], env
    return env


def digits_message(env: dict[str, Any]) -> None:
    assert "at most 40 integer and 38 fraction digits" in env["message"], env


@pytest.mark.parametrize("value", ["1e1000000", "-1e1000000", "1e-1000000", "1e40"])
def test_a_decimal_beyond_range_is_400_everywhere(ws: Workspace, table: str, value: str) -> None:
    a = ws.alice
    digits_message(
        refused(
            a, "POST", "/v1/table/row/create", {"table_id": table, "data": {"id": "x", "d": value}}
        )
    )
    flt = json.dumps([{"field": "d", "op": "eq", "value": value}])
    digits_message(refused(a, "GET", "/v1/table/row/list", table_id=table, filter=flt))
    sql = f"SELECT * FROM {table} WHERE d = {value}"
    digits_message(refused(a, "POST", "/v1/table/row/query", {"table_id": table, "sql": sql}))
    rows = a.ok("GET", "/v1/table/row/list", table_id=table)["rows"]
    assert [r["id"] for r in rows] == ["r"]  # nothing was written


@pytest.mark.parametrize(
    ("path", "param"),
    [
        ("/v1/table/row/list", "start"),
        ("/v1/table/row/list", "limit"),
        ("/v1/space/list", "start"),
        ("/v1/table/list", "limit"),
        ("/v1/function/list", "start"),
        ("/v1/notebook/instance/list", "limit"),
        ("/v1/table/instance/list", "limit"),
        ("/v1/notebook/instance/logs/history", "timestamp"),
    ],
)
def test_a_5000_digit_integer_parameter_is_400(
    ws: Workspace, table: str, path: str, param: str
) -> None:
    params = {"table_id": table, "id": table, "access": "read"}
    known = {
        "/v1/table/row/list": ["table_id"],
        "/v1/table/instance/list": ["id", "access"],
        "/v1/notebook/instance/logs/history": ["id"],
    }
    given = {k: params[k] for k in known.get(path, [])}
    for value in (HUGE, "-" + HUGE):
        env = refused(ws.alice, "GET", path, **given, **{param: value})
        assert param in env["message"] and HUGE not in env["message"], env


def test_a_5000_digit_limit_in_row_query_is_400(ws: Workspace, table: str) -> None:
    for clause in ("LIMIT", "OFFSET"):
        sql = f"SELECT * FROM {table} {clause} {HUGE}"
        env = refused(ws.alice, "POST", "/v1/table/row/query", {"table_id": table, "sql": sql})
        assert env["message"] == f"{clause} must be at most 9223372036854775807"
    sql = f"SELECT * FROM {table} WHERE n = {HUGE}"  # and as a literal compared with INT
    env = refused(ws.alice, "POST", "/v1/table/row/query", {"table_id": table, "sql": sql})
    assert "64-bit integer" in env["message"]


def deep_body(body: dict[str, Any]) -> bytes:
    """`body` with its "DEEP" string replaced by JSON nested 1000 levels deep."""
    return json.dumps(body).replace('"DEEP"', DEEP).encode()


def test_json_nested_1000_deep_is_400(
    ws: Workspace, table: str, function: str, notebook: str
) -> None:
    run = {"language": "python", "code": "def main(a):\n    return 1\n"}
    deep_arg = [{"name": "x", "value": "DEEP"}]
    param = {"name": "p", "type": "JSON", "default": {"value": "DEEP"}}
    fn = {"space": table.split(".")[0], "name": "g", "language": "python", "parameters": [param]}
    bodies = [
        ("/v1/function/run", {**run, "arguments": [{"value": "DEEP"}]}),
        ("/v1/function/invoke", {"id": function, "arguments": ["DEEP"]}),
        ("/v1/function/testcase/create", {"function_id": function, "arguments": ["DEEP"]}),
        ("/v1/function/create", fn),
        ("/v1/notebook/instance/create", {"notebook_id": notebook, "arguments": deep_arg}),
        (
            "/v1/notebook/schedule/create",
            {"notebook_id": notebook, "cron": "* * * * *", "arguments": deep_arg},
        ),
        ("/v1/table/row/create", {"table_id": table, "data": {"id": "deep", "d": "DEEP"}}),
    ]
    for path, body in bodies:
        status, env = ws.alice.post(path, raw=deep_body(body))
        assert (status, env) == (
            400,
            {
                "code": 40001,
                "message": "body is not valid JSON: nested deeper than 64 levels (max_json_depth)",
                "data": None,
            },
        ), path
    flt = json.dumps([{"field": "d", "op": "eq", "value": "DEEP"}]).replace('"DEEP"', DEEP)
    env = refused(ws.alice, "GET", "/v1/table/row/list", table_id=table, filter=flt)
    assert "nested deeper than 64 levels" in env["message"]
    ok = json.loads("[" * 60 + "]" * 60)  # within the limit: accepted
    rec = ws.alice.ok("POST", "/v1/function/run", {**run, "arguments": [{"value": ok}]})
    assert rec["status"] == "succeeded", rec["output"]


def test_a_deeply_nested_return_value_is_a_failed_run(ws: Workspace) -> None:
    """The code decides what its result holds: too deep is `bad_return`, never a 500."""
    built = "def main():\n    v = []\n    for _ in range(200):\n        v = [v]\n    return v\n"
    forged = (  # written straight to the result pipe, past the harness
        "import os, stat\n\ndef main():\n"
        "    doc = b'{\"ok\": true, \"value\": ' + b'[' * 100000 + b']' * 100000 + b'}'\n"
        "    for fd in map(int, os.listdir('/proc/self/fd')):\n"
        "        try:\n"
        "            if fd > 2 and stat.S_ISFIFO(os.fstat(fd).st_mode):\n"
        "                os.write(fd, doc)\n"
        "        except OSError:\n"
        "            pass  # the listing's own fd, closed by now\n"
        "    os._exit(0)\n"
    )
    for code in (built, forged):
        rec = ws.alice.ok("POST", "/v1/function/run", {"language": "python", "code": code})
        assert rec["status"] == "failed", rec
        assert rec["output"]["failure"]["code"] == "bad_return", rec["output"]
        assert "nested deeper than 64 levels" in rec["output"]["failure"]["message"]

"""Function endpoints over HTTP: CRUD and order rules, list search, test cases and the 409,
invoke (with an access key), run records per language, SQL Functions and the SDK."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pytest
import pytest_asyncio

from tests.compute.conftest import Stack
from workspace.compute.store import table_reader_count
from workspace.compute_api import table_instances

pytestmark = pytest.mark.asyncio(loop_scope="module")

PY_ADD = "def main(a, b=10):\n    return a + b\n"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def space(stack: Stack) -> str:
    sid = f"f{uuid.uuid4().hex[:8]}"
    await stack.alice.ok("POST", "/v1/space/create", {"id": sid})
    return sid


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def tables(stack: Stack, space: str) -> dict[str, str]:
    """Two of alice's tables and one of bob's (public Space) for SQL/SDK tests."""
    a = stack.alice
    cols = [
        {"id": "id", "name": "id", "type": "STRING"},
        {"id": "owner", "name": "owner", "type": "STRING"},
        {"id": "amount", "name": "amount", "type": "INT"},
    ]
    ids = {}
    for name in ("transfers", "people"):
        t = await a.ok(
            "POST", "/v1/table/create", {"space": space, "name": name, "table_type": "normal"}
        )
        await a.ok("POST", "/v1/table/init", {"id": t["id"], "columns": cols})
        ids[name] = t["id"]
    for i, (owner, amount) in enumerate([("ann", 5), ("ann", 7), ("ben", 1)]):
        row = {"id": f"t{i}", "owner": owner, "amount": amount}
        await a.ok("POST", "/v1/table/row/create", {"table_id": ids["transfers"], "data": row})
    for owner in ("ann", "ben"):
        row = {"id": owner, "owner": owner.upper(), "amount": 0}
        await a.ok("POST", "/v1/table/row/create", {"table_id": ids["people"], "data": row})
    bob_space = f"b{uuid.uuid4().hex[:8]}"
    await stack.bob.ok("POST", "/v1/space/create", {"id": bob_space, "visibility": "public"})
    t = await stack.bob.ok(
        "POST", "/v1/table/create", {"space": bob_space, "name": "secret", "table_type": "normal"}
    )
    await stack.bob.ok("POST", "/v1/table/init", {"id": t["id"], "columns": cols})
    ids["bob"] = t["id"]
    return ids


async def make_fn(stack: Stack, space: str, name: str, **kw: Any) -> dict[str, Any]:
    body = {"space": space, "name": name, "language": "python", "code": PY_ADD, **kw}
    return await stack.alice.ok("POST", "/v1/function/create", body)


async def test_create_get_update_rename_delete(stack: Stack, space: str) -> None:
    params = [{"name": "a", "type": "INT"}, {"name": "b", "type": "INT", "default": {"value": 10}}]
    fn = await make_fn(stack, space, "adder", parameters=params, return_type="INT")
    assert fn["id"] == f"{space}.adder" and fn["space_entity"]["id"] == space
    assert [p["order"] for p in fn["parameters"]] == [0, 1]
    assert fn["parameters"][1]["default"] == {"value": 10} and fn["parameters"][0]["id"]
    got = await stack.alice.ok("GET", "/v1/function", id=fn["id"])
    assert got == fn
    upd = await stack.alice.ok(
        "POST",
        "/v1/function/update",
        {"id": fn["id"], "name": "summer", "parameters": [{"name": "x", "type": "INT"}]},
    )
    assert upd["id"] == fn["id"] and upd["name"] == "summer"
    assert [p["name"] for p in upd["parameters"]] == ["x"]
    assert upd["code"] == PY_ADD and upd["return_type"] == "INT"  # omitted fields kept
    assert upd["updated_at"] >= fn["updated_at"]
    await stack.alice.ok("POST", "/v1/function/delete", {"id": fn["id"]})
    assert await stack.alice.fail("GET", "/v1/function", id=fn["id"]) == 404


async def test_parameter_order_rules(stack: Stack, space: str) -> None:
    body = {"space": space, "name": "ordered", "language": "python", "code": PY_ADD}
    ok = await stack.alice.ok(
        "POST",
        "/v1/function/create",
        {
            **body,
            "parameters": [
                {"name": "b", "type": "INT", "order": 1},
                {"name": "a", "type": "INT", "order": 0},
            ],
        },
    )
    assert [p["name"] for p in ok["parameters"]] == ["a", "b"]
    bad = [
        [{"name": "a", "type": "INT", "order": 0}, {"name": "b", "type": "INT"}],
        [{"name": "a", "type": "INT", "order": 0}, {"name": "b", "type": "INT", "order": 2}],
        [{"name": "a", "type": "INT", "order": -1}],
        [{"name": "a", "type": "INT"}, {"name": "a", "type": "INT"}],
        [{"type": "INT"}],
        [{"name": "a"}],
    ]
    for i, params in enumerate(bad):
        status = await stack.alice.fail(
            "POST", "/v1/function/create", {**body, "name": f"bad{i}", "parameters": params}
        )
        assert status == 400


async def test_bad_input_and_permissions(stack: Stack, space: str) -> None:
    a = stack.alice
    base = {"space": space, "name": "perm", "language": "python", "code": PY_ADD}
    assert await a.fail("POST", "/v1/function/create", {**base, "language": "cobol"}) == 400
    assert await a.fail("POST", "/v1/function/create", {**base, "name": "a.b"}) == 400
    assert await a.fail("POST", "/v1/function/create", {**base, "extra": 1}) == 400
    fn = await make_fn(stack, space, "perm")
    assert await a.fail("POST", "/v1/function/create", base) == 409
    # bob cannot see alice's private Space, nor write into it
    assert await stack.bob.fail("GET", "/v1/function", id=fn["id"]) == 404
    assert await stack.bob.fail("POST", "/v1/function/update", {"id": fn["id"], "code": ""}) == 404
    assert await stack.bob.fail("POST", "/v1/function/create", base) == 404
    assert await a.fail("GET", "/v1/function", id="nope.nothing") == 404


async def test_list_name_and_code_search(stack: Stack, space: str) -> None:
    code = "\n".join(f"x{i} = 'needle {i}'" for i in range(14)) + "\ndef main():\n    return 1\n"
    await make_fn(stack, space, "haystack", code=code)
    await make_fn(stack, space, "needle_finder")
    by_code = await stack.alice.ok(
        "GET", "/v1/function/list", space=space, keyword="NEEDLE", match_type="code"
    )
    [item] = by_code["items"]
    assert item["name"] == "haystack" and item["matched_line_count"] == 14
    assert len(item["matched_lines"]) == 10
    assert item["matched_lines"][0] == {"line": 1, "text": "x0 = 'needle 0'"}
    by_name = await stack.alice.ok("GET", "/v1/function/list", space=space, keyword="needle")
    assert [i["name"] for i in by_name["items"]] == ["needle_finder"]
    assert "matched_lines" not in by_name["items"][0]
    page = await stack.alice.ok(
        "GET", "/v1/function/list", space=space, limit=1, order_by="name", direction="asc"
    )
    assert page["limit"] == 1 and len(page["items"]) == 1 and page["total_count"] >= 3
    assert await stack.alice.fail("GET", "/v1/function/list", limit=10001) == 400
    assert await stack.alice.fail("GET", "/v1/function/list", match_type="body") == 400


async def test_testcases_and_duplicate_409(stack: Stack, space: str) -> None:
    fn = await make_fn(stack, space, "cases")
    a = stack.alice
    tc = await a.ok(
        "POST",
        "/v1/function/testcase/create",
        {"function_id": fn["id"], "arguments": [1, {"k": [2]}]},
    )
    assert tc["function_id"] == fn["id"] and tc["arguments"] == [1, {"k": [2]}]
    status, env = await a.post(
        "/v1/function/testcase/create", {"function_id": fn["id"], "arguments": [1, {"k": [2]}]}
    )
    assert status == 409 and env["code"] != 0
    other = await a.ok(
        "POST", "/v1/function/testcase/create", {"function_id": fn["id"], "arguments": [2]}
    )
    status, _ = await a.post(
        "/v1/function/testcase/update", {"id": other["id"], "arguments": [1, {"k": [2]}]}
    )
    assert status == 409
    upd = await a.ok("POST", "/v1/function/testcase/update", {"id": other["id"], "arguments": [3]})
    assert upd["arguments"] == [3] and upd["function_id"] == fn["id"]
    assert (
        await a.fail(
            "POST",
            "/v1/function/testcase/update",
            {"id": other["id"], "function_id": "x.y", "arguments": []},
        )
        == 400
    )
    assert (await a.ok("GET", "/v1/function/testcase", id=tc["id"]))["arguments"] == [1, {"k": [2]}]
    listed = await a.ok(
        "GET",
        "/v1/function/testcase/list",
        function_id=fn["id"],
        order_by="created_at",
        direction="asc",
    )
    assert [t["id"] for t in listed["items"]] == [tc["id"], other["id"]]
    assert listed["total_count"] == 2
    await a.ok("POST", "/v1/function/testcase/delete", {"id": tc["id"]})
    assert await a.fail("GET", "/v1/function/testcase", id=tc["id"]) == 404
    assert await a.fail("GET", "/v1/function/testcase/list", function_id=fn["id"], limit=101) == 400


async def test_invoke_and_access_key(stack: Stack, space: str) -> None:
    params = [{"name": "a", "type": "INT"}, {"name": "b", "type": "INT", "default": {"value": 10}}]
    fn = await make_fn(stack, space, "inv", parameters=params)
    assert (
        await stack.alice.ok("POST", "/v1/function/invoke", {"id": fn["id"], "arguments": [1, 2]})
        == 3
    )
    assert (
        await stack.key.ok("POST", "/v1/function/invoke", {"id": fn["id"], "arguments": [5]}) == 15
    )
    assert await stack.key.fail("GET", "/v1/function", id=fn["id"]) == 403
    # "5" is a valid INT (a decimal string, as in a row) but reaches the code as a string
    status, env = await stack.alice.post(
        "/v1/function/invoke", {"id": fn["id"], "arguments": ["5", 1]}
    )
    assert status == 422 and "exception" in env["message"] and "TypeError" in env["message"]
    # a value its declared type refuses is a request error, before any code runs
    status, env = await stack.alice.post(
        "/v1/function/invoke", {"id": fn["id"], "arguments": ["x", 1]}
    )
    assert (status, env["code"]) == (400, 40000)
    assert env["message"] == (
        "argument 'a' (INT) must be a 64-bit integer (a JSON integer or a decimal string); "
        'got "x"'
    )
    body = {
        "language": "python",
        "code": "def main(n):\n    return n\n",
        "parameters": [{"name": "n", "type": "uint256"}],  # type names in any letter case
        "arguments": [{"value": -1}],
    }
    status, env = await stack.alice.post("/v1/function/run", body)
    assert (status, env["code"]) == (400, 40000) and "'n' (UINT256)" in env["message"]
    body["arguments"] = [{"value": "0x10"}]
    assert (await run_body(stack, body))["return_value"] == "0x10"  # checked, passed as given
    assert await stack.alice.fail("POST", "/v1/function/invoke", {"id": fn["id"]}) == 400
    assert (
        await stack.alice.fail(
            "POST", "/v1/function/invoke", {"id": fn["id"], "arguments": [1, 2, 3]}
        )
        == 400
    )


async def run_body(stack: Stack, body: dict[str, Any]) -> dict[str, Any]:
    return await stack.alice.ok("POST", "/v1/function/run", body)


async def run(stack: Stack, language: str, code: str, **kw: Any) -> dict[str, Any]:
    return await stack.alice.ok(
        "POST", "/v1/function/run", {"language": language, "code": code, **kw}
    )


async def test_run_records(stack: Stack) -> None:
    rec = await run(
        stack,
        "python",
        PY_ADD,
        parameters=[
            {"name": "a", "type": "INT"},
            {"name": "b", "type": "INT", "default": {"value": 10}},
        ],
        arguments=[{"name": "a", "value": 4}],
    )
    assert rec["status"] == "succeeded" and rec["return_value"] == 14 and rec["args"] == [4, 10]
    assert rec["output"]["failure"] is None and rec["started_at"] <= rec["finished_at"]
    assert rec["creator_id"] == stack.ids["alice"]
    fail = await run(stack, "python", "def main():\n    token = 'x'\n    raise KeyError('k')\n")
    assert fail["status"] == "failed" and fail["return_value"] is None
    assert fail["output"]["failure"]["code"] == "exception"
    assert json.loads(fail["output"]["local_vars_json"]) == {"token": "***"}
    slow = await run(stack, "javascript", "function main() { for (;;) {} }")
    assert slow["status"] == "timeout" and slow["output"]["failure"]["retryable"] is True
    go = await run(
        stack,
        "go",
        "func Run(a, b int) int { return a * b }",
        func_name="Run",
        arguments=[{"value": 6}, {"value": 7}],
    )
    assert go["status"] == "succeeded" and go["return_value"] == 42
    assert (
        await stack.alice.fail("POST", "/v1/function/run", {"language": "python", "code": ""})
        == 400
    )
    assert (
        await stack.alice.fail(
            "POST", "/v1/function/run", {"language": "python", "code": "x", "func_name": "a-b"}
        )
        == 400
    )
    assert (
        await stack.alice.fail(
            "POST",
            "/v1/function/run",
            {"language": "python", "code": "x", "arguments": [{"value": 1, "order": 1}]},
        )
        == 400
    )


async def test_abuse_runs_end_cleanly_while_serving(stack: Stack) -> None:
    cases = {
        "fork": "import os\ndef main():\n    while True:\n        try:\n            os.fork()\n"
        "        except OSError:\n            pass\n",
        "loop": "def main():\n    while True:\n        pass\n",
        "alloc": "def main():\n    return len(bytearray(10 * 1024 ** 3))\n",
        "print": "def main():\n    for _ in range(100):\n        print('x' * 1048576)\n",
    }
    tasks = {k: asyncio.create_task(run(stack, "python", c)) for k, c in cases.items()}
    served = []
    while not all(t.done() for t in tasks.values()):
        t0 = time.monotonic()
        await stack.alice.ok("GET", "/v1/notebook/instance/specs")
        served.append(time.monotonic() - t0)
        await asyncio.sleep(0.1)
    recs = {k: t.result() for k, t in tasks.items()}
    assert recs["fork"]["status"] == "timeout"
    assert recs["loop"]["status"] == "timeout"
    assert recs["alloc"]["status"] == "failed"
    assert recs["alloc"]["output"]["failure"]["code"] in ("memory_limit", "exception")
    assert recs["print"]["status"] == "failed"
    assert recs["print"]["output"]["failure"]["code"] == "output_limit"
    assert recs["print"]["output"]["truncated"] is True
    assert recs["print"]["output"]["original_size_bytes"] > len(recs["print"]["output"]["text"])
    assert max(served) < 1.0
    waits = [r["output"]["queue_wait_ms"] for r in recs.values()]
    assert max(waits) > 0  # 4 runs on 2 workers: some waited


async def test_integers_beyond_64_bits_round_trip(stack: Stack) -> None:
    """Arguments and return values are JSON: a 100-bit integer is neither rounded nor a 500."""
    n = 123456789012345678901234567890
    rec = await run(
        stack, "python", "def main(x):\n    return [x, x * 10]\n", arguments=[{"value": n}]
    )
    assert rec["status"] == "succeeded", rec["output"]
    assert rec["args"] == [n] and rec["return_value"] == [n, n * 10]


async def test_sql_functions(stack: Stack, tables: dict[str, str], space: str) -> None:
    t, p = tables["transfers"], tables["people"]
    sql = (
        f"SELECT pe.owner AS who, SUM(tr.amount) AS total, COUNT(*) AS n FROM {t} tr "
        f"JOIN {p} pe ON pe.id = tr.owner WHERE tr.amount >= ? GROUP BY pe.owner "
        "ORDER BY total DESC"
    )
    rec = await run(stack, "sql", sql, arguments=[{"value": 2}])
    assert rec["status"] == "succeeded", rec["output"]
    assert rec["return_value"] == [{"who": "ANN", "total": 12, "n": 2}]
    star = await run(stack, "sql", f"SELECT * FROM {t} WHERE id = 't0'")
    assert star["return_value"] == [{"id": "t0", "owner": "ann", "amount": "5"}]
    for bad, why in [
        (f"DELETE FROM {t}", "read-only"),
        (f"SELECT * FROM {tables['bob']}", "not an initialized table of your account"),
        ("SELECT * FROM ws_credentials", "not an initialized table"),
        (f"SELECT 1; SELECT * FROM {t}", "exactly one statement"),
        (f"SELECT * FROM {t} WHERE amount > ?", "placeholder"),
        ("WITH ws_credentials AS (SELECT 1 AS x) SELECT COUNT(*) FROM ws_credentials", "reserved"),
    ]:
        rec = await run(stack, "sql", bad)
        assert rec["status"] == "failed", bad
        assert why in rec["output"]["failure"]["message"], (bad, rec["output"]["failure"])
    fn = await stack.alice.ok(
        "POST",
        "/v1/function/create",
        {
            "space": space,
            "name": "total_sql",
            "language": "sql",
            "code": f"SELECT SUM(amount) AS s FROM {t}",
        },
    )
    assert await stack.alice.ok(
        "POST", "/v1/function/invoke", {"id": fn["id"], "arguments": []}
    ) == [{"s": 13}]
    endless = (
        f"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
        f"SELECT COUNT(*) AS n FROM c, {t}"
    )
    stack.svc.sql.timeout_ms = 300
    try:
        slow = await run(stack, "sql", endless)
    finally:
        stack.svc.sql.timeout_ms = stack.svc.settings.sql_timeout_ms
    assert slow["status"] == "timeout", slow["output"]
    assert slow["output"]["failure"]["message"] == "the query ran longer than 300 ms"
    # a saved Function reading the tables is a dependency; ad-hoc runs are not
    assert await stack.db.run(lambda c: table_reader_count(c, t)) == 1
    assert await stack.db.run(lambda c: table_reader_count(c, p)) == 0


async def test_sql_functions_compare_typed_columns_by_value(stack: Stack, space: str) -> None:
    """UINT256/DECIMAL/ADDRESS/BOOLEAN columns are stored encoded (zero-padded text, 0/1, …):
    literals and ? arguments compared with them are encoded the same way, and MIN/MAX of such
    a column read back in its logical form, on both backends."""
    a = stack.alice
    t = (
        await a.ok(
            "POST", "/v1/table/create", {"space": space, "name": "bal", "table_type": "normal"}
        )
    )["id"]
    cols = [
        {"id": "id", "name": "id", "type": "ADDRESS"},
        {"id": "amount", "name": "amount", "type": "UINT256"},
        {"id": "price", "name": "price", "type": "DECIMAL"},
        {"id": "ok", "name": "ok", "type": "BOOLEAN"},
    ]
    await a.ok("POST", "/v1/table/init", {"id": t, "columns": cols})
    ids = [f"0x{'ab' * 19}{i:02x}" for i in range(2)]
    for i, (amount, price, ok) in enumerate([(5, "0.5", True), (10**21, "12.25", False)]):
        row = {"id": ids[i], "amount": amount, "price": price, "ok": ok}
        await a.ok("POST", "/v1/table/row/create", {"table_id": t, "data": row})
    cases = [
        (f"SELECT id FROM {t} WHERE amount > 100", [], [ids[1]]),
        (f"SELECT id FROM {t} WHERE amount > ? AND ok = ?", [100, False], [ids[1]]),
        (f"SELECT id FROM {t} b WHERE b.price BETWEEN 0.1 AND 1", [], [ids[0]]),
        (f"SELECT id FROM {t} WHERE id IN ('{ids[1].upper().replace('0X', '0x')}')", [], [ids[1]]),
        (f"SELECT id FROM {t} WHERE ok = TRUE", [], [ids[0]]),
    ]
    for sql, args, want in cases:
        rec = await run(stack, "sql", sql, arguments=[{"value": v} for v in args])
        assert rec["status"] == "succeeded", (sql, rec["output"])
        assert [r["id"] for r in rec["return_value"]] == want, (sql, rec["return_value"])
    rec = await run(stack, "sql", f"SELECT max(amount) AS m, min(price) AS p FROM {t}")
    assert rec["return_value"] == [{"m": str(10**21), "p": "0.5"}], rec["output"]
    rec = await run(stack, "sql", f"SELECT id FROM {t} WHERE amount > ?", arguments=[{"value": -1}])
    assert rec["status"] == "failed" and "UINT256" in rec["output"]["failure"]["message"]


async def test_sql_functions_call_only_plain_functions(
    stack: Stack, tables: dict[str, str]
) -> None:
    """Functions that run SQL of their own, read files or settings, or allocate without bound
    are refused before the query runs (on PostgreSQL query_to_xml read every account's table)."""
    t = tables["transfers"]
    for bad in [
        f"SELECT query_to_xml('SELECT * FROM ws_credentials', true, true, '') AS x FROM {t}",
        f"SELECT * FROM {t}, LATERAL query_to_xml('SELECT 1', true, true, '') AS x",
        "SELECT pg_read_file('/etc/hostname') AS x",
        "SELECT current_setting('data_directory') AS x",
        "SELECT set_config('statement_timeout', '0', true) AS x",
        f"SELECT pg_catalog.lower(owner) AS x FROM {t}",
        "SELECT length(zeroblob(1000000000)) AS x",
        "SELECT load_extension('x') AS x",
    ]:
        rec = await run(stack, "sql", bad)
        assert rec["status"] == "failed", (bad, rec["return_value"])
        assert "is not allowed in a SQL Function" in rec["output"]["failure"]["message"], (
            bad,
            rec["output"]["failure"],
        )
    # a huge statement is refused before parsing (parsing holds a database reader thread)
    items = ",".join(str(i) for i in range(20_000))
    rec = await run(stack, "sql", f"SELECT * FROM {t} WHERE amount IN ({items})")
    assert rec["status"] == "failed", rec["output"]
    assert "longer than 65536 bytes" in rec["output"]["failure"]["message"]
    # printf exists on SQLite only; there it may not build a value beyond the length limit
    # (SQLite answers NULL), PostgreSQL has no such function (failed)
    rec = await run(stack, "sql", "SELECT length(printf('%.*c', 200000000, 'x')) AS n")
    assert rec["return_value"] in (None, [{"n": None}]), rec["return_value"]
    fine = (
        f"SELECT lower(owner) AS o, abs(amount) AS a, coalesce(owner, 'x') AS c, "
        f"round(amount * 1.5) AS r, length(owner) AS l FROM {t} WHERE id = 't0'"
    )
    rec = await run(stack, "sql", fine)
    assert rec["status"] == "succeeded", rec["output"]
    assert rec["return_value"] == [{"o": "ann", "a": 5, "c": "ann", "r": 8, "l": 3}]


async def test_python_sdk_reads_writes_and_calls_chain(
    stack: Stack, tables: dict[str, str]
) -> None:
    t = tables["transfers"]
    code = (
        "import chainstate_sdk as cs\n"
        "def main(table):\n"
        "    rows = cs.query(table, \"SELECT * FROM transfers WHERE owner = 'ben'\")\n"
        "    cs.upsert(table, {'id': 'sdk1', 'owner': 'sdk', 'amount': 99})\n"
        "    head = cs.block_number(1337)\n"
        "    return {'ben': [r['id'] for r in rows], 'head': head}\n"
    )
    rec = await run(stack, "python", code, arguments=[{"value": t}])
    assert rec["status"] == "succeeded", rec["output"]
    assert rec["return_value"]["ben"] == ["t2"] and rec["return_value"]["head"] == 500
    got = await stack.alice.ok("POST", "/v1/table/row/get", {"table_id": t, "pks": ["sdk1"]})
    assert got["rows"][0]["amount"] == "99"
    denied = await run(
        stack,
        "python",
        "import chainstate_sdk as cs\ndef main(t):\n"
        "    cs.upsert(t, {'id': 'x', 'owner': 'alice', 'amount': 1})\n",
        arguments=[{"value": tables["bob"]}],
    )
    # bob's table is in a public Space: alice may read it but never write it
    assert denied["status"] == "failed" and "SdkError" in denied["output"]["failure"]["message"]
    assert "403" in denied["output"]["failure"]["message"]
    net = (
        "import urllib.request\ndef main():\n"
        "    return urllib.request.urlopen('http://127.0.0.1:1', timeout=2).status\n"
    )
    outside = await run(stack, "python", net)
    assert outside["status"] == "failed"  # no network inside the sandbox

    def accesses(conn: Any) -> Any:
        return table_instances(conn, t, "write", 10, stack.ids["alice"])

    assert (await stack.db.run(accesses))["count"] == 0  # Function runs are not instances

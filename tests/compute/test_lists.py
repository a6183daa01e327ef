"""List endpoints show only what the caller may see and read only one page:
table/instance/list shows the caller's own instances (another account's instance, name,
Notebook and exit message stay private), function/list pages in the database."""

from __future__ import annotations

import uuid

import pytest

from tests.compute.conftest import Stack, wait_ended

pytestmark = pytest.mark.asyncio(loop_scope="module")

READER = "import chainstate_sdk as cs\ncs.list_rows(t)\nraise RuntimeError('{who} private text')\n"


async def test_table_instance_list_shows_only_the_callers_instances(stack: Stack) -> None:
    a, b = stack.alice, stack.bob
    space = f"l{uuid.uuid4().hex[:8]}"
    await a.ok("POST", "/v1/space/create", {"id": space, "visibility": "public"})
    t = await a.ok(
        "POST", "/v1/table/create", {"space": space, "name": "t", "table_type": "normal"}
    )
    cols = [{"id": "id", "name": "id", "type": "STRING"}]
    await a.ok("POST", "/v1/table/init", {"id": t["id"], "columns": cols})
    launched = {}
    for who, client in (("alice", a), ("bob", b)):
        own = f"{who[0]}{uuid.uuid4().hex[:8]}"
        await client.ok("POST", "/v1/space/create", {"id": own})
        body = {
            "space": own,
            "name": "reader",
            "code": READER.format(who=who),
            "parameters": [{"name": "t", "type": "STRING"}],
        }
        nb = await client.ok("POST", "/v1/notebook/create", body)
        inst = await client.ok(
            "POST",
            "/v1/notebook/instance/create",
            {"notebook_id": nb["id"], "arguments": [{"name": "t", "value": t["id"]}]},
        )
        await wait_ended(client, inst["id"])
        launched[who] = inst["id"]
    seen = {}
    for who, client in (("alice", a), ("bob", b)):
        got = await client.ok("GET", "/v1/table/instance/list", id=t["id"], access="read")
        seen[who] = [i["id"] for i in got["instances"]]
        assert got["count"] == len(got["instances"])
        other = "bob" if who == "alice" else "alice"
        assert f"{other} private" not in str(got)
    assert seen == {"alice": [launched["alice"]], "bob": [launched["bob"]]}
    huge = await a.ok("GET", "/v1/table/instance/list", id=t["id"], access="read", limit=10**12)
    assert huge["count"] == 1  # any limit reads at most one page (effective maximum 1000)


async def test_function_list_pages_in_the_database(stack: Stack) -> None:
    a = stack.alice
    space = f"fl{uuid.uuid4().hex[:8]}"
    await a.ok("POST", "/v1/space/create", {"id": space})
    names = [f"fn{i:02d}" for i in range(23)]
    for i, name in enumerate(names):
        code = f"def main():\n    # Needle {i}\n    return {i}\n" if i % 3 == 0 else "x = 1\n"
        body = {"space": space, "name": name, "language": "python", "code": code}
        await a.ok("POST", "/v1/function/create", body)

    async def pages(**params: object) -> tuple[list[str], set[int]]:
        seen: list[str] = []
        totals = set()
        for start in range(0, 30, 7):
            page = await a.ok(
                "GET", "/v1/function/list", space=space, start=start, limit=7,
                order_by="name", direction="asc", **params,
            )  # fmt: skip
            seen += [i["name"] for i in page["items"]]
            totals.add(page["total_count"])
        return seen, totals

    assert await pages() == (names, {23})
    assert await pages(keyword="FN1") == ([n for n in names if n.startswith("fn1")], {10})
    needles = [n for i, n in enumerate(names) if i % 3 == 0]
    assert await pages(keyword="nEEDLE", match_type="code") == (needles, {8})
    page = await a.ok(
        "GET",
        "/v1/function/list",
        space=space,
        keyword="needle",
        match_type="code",
        limit=1,
        order_by="name",
        direction="asc",
    )
    assert page["items"][0]["matched_lines"] == [{"line": 2, "text": "    # Needle 0"}]
    assert page["items"][0]["matched_line_count"] == 1

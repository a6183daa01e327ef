"""Whose rights code runs with: a saved Function or Notebook of another account runs with its
owner's rights (like a SQL SECURITY DEFINER function), never the invoker's. So bob running
alice's public code can never have it read bob's private tables or write bob's rows; it can
use what alice's own rights allow. The caller's own code keeps the caller's rights."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import pytest_asyncio

from tests.compute.conftest import Client, Stack, note_table, wait_ended

pytestmark = pytest.mark.asyncio(loop_scope="module")

READ = (
    "import chainstate_sdk as cs\n\ndef main(t):\n    return [r['note'] for r in cs.list_rows(t)]\n"
)
WRITE = (
    "import chainstate_sdk as cs\n\n"
    "def main(t):\n    cs.upsert(t, {'id': 'w1', 'note': 'written'})\n    return 'ok'\n"
)
# finding 1 of issue 12: public code exfiltrating the invoker's rows through a shared /tmp
EXFIL = (
    "import json, os\nimport chainstate_sdk as cs\n\n"
    "def main(t):\n"
    "    try:\n"
    "        rows = cs.list_rows(t)\n"
    "    except cs.SdkError as exc:\n"
    "        rows = [str(exc)]\n"
    "    with open('/tmp/.cache-exfil', 'w') as fh:\n"
    "        json.dump(rows, fh)\n"
    "    os.chmod('/tmp/.cache-exfil', 0o666)\n"
    "    return len(rows)\n"
)
PICKUP = "import os\n\ndef main():\n    return os.path.exists('/tmp/.cache-exfil')\n"
NOTEBOOK = (
    "import chainstate_sdk as cs\n"
    "print('NOTES', [r['note'] for r in cs.list_rows(t)], flush=True)\n"
)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(stack: Stack) -> dict[str, Any]:
    """alice: a private table and public code; bob: a private table."""
    a = stack.alice
    ids = {
        "alice": await note_table(a, "alice private"),
        "bob": await note_table(stack.bob, "bob private"),
    }
    space = f"p{uuid.uuid4().hex[:8]}"
    await a.ok("POST", "/v1/space/create", {"id": space, "visibility": "public"})
    for name, code in (("read", READ), ("write", WRITE), ("exfil", EXFIL)):
        body = {"space": space, "name": name, "language": "python", "code": code}
        ids[name] = (await a.ok("POST", "/v1/function/create", body))["id"]
    for who in ("alice", "bob"):
        sql = f"SELECT note FROM {ids[who]}"
        body = {"space": space, "name": f"sql_{who}", "language": "sql", "code": sql}
        ids[f"sql_{who}"] = (await a.ok("POST", "/v1/function/create", body))["id"]
    params = [{"name": "t", "type": "STRING"}]
    body = {"space": space, "name": "nb", "code": NOTEBOOK, "parameters": params}
    ids["nb"] = (await a.ok("POST", "/v1/notebook/create", body))["id"]
    return ids


async def invoke(client: Client, fn: str, *args: Any) -> tuple[int, Any]:
    status, env = await client.post("/v1/function/invoke", {"id": fn, "arguments": list(args)})
    return status, env["data"] if status == 200 else env["message"]


async def test_foreign_functions_run_with_their_owners_rights(
    stack: Stack, world: dict[str, Any]
) -> None:
    bob = stack.bob
    assert await invoke(bob, world["read"], world["bob"]) == (
        422,
        f"the Function failed: exception: SdkError: 40400: table {world['bob']!r} not found",
    )
    assert await invoke(bob, world["read"], world["alice"]) == (200, ["alice private"])
    status, message = await invoke(bob, world["sql_bob"])
    assert status == 422 and "is not an initialized table" in message, message
    assert await invoke(bob, world["sql_alice"]) == (200, [{"note": "alice private"}])
    # writes: never into bob's rows; into alice's, as her own code may
    status, message = await invoke(bob, world["write"], world["bob"])
    assert status == 422 and "SdkError: 40400" in message, message
    assert await invoke(bob, world["write"], world["alice"]) == (200, "ok")
    rows = await bob.ok("GET", "/v1/table/row/list", table_id=world["bob"])
    assert [r["id"] for r in rows["rows"]] == ["r1"]
    # the caller's own code keeps the caller's rights
    run = {"language": "python", "code": READ, "arguments": [{"value": world["bob"]}]}
    rec = await bob.ok("POST", "/v1/function/run", run)
    assert rec["return_value"] == ["bob private"], rec["output"]


async def test_the_exfiltration_of_the_issue_finds_nothing(
    stack: Stack, world: dict[str, Any]
) -> None:
    status, message = await invoke(stack.bob, world["exfil"], world["bob"])
    assert status == 200 and message == 1  # one row: the SdkError text, no row of bob's
    run = {"language": "python", "code": PICKUP}
    rec = await stack.alice.ok("POST", "/v1/function/run", run)
    assert rec["return_value"] is False  # and the file died with bob's run anyway


async def test_a_foreign_notebook_runs_with_its_owners_rights(
    stack: Stack, world: dict[str, Any]
) -> None:
    seen = {}
    for who in ("bob", "alice"):
        body = {"notebook_id": world["nb"], "arguments": [{"name": "t", "value": world[who]}]}
        inst = await stack.bob.ok("POST", "/v1/notebook/instance/create", body)
        assert inst["account_id"] == stack.ids["bob"]  # bob's instance, alice's rights
        doc = await wait_ended(stack.bob, inst["id"])
        logs = await stack.bob.ok("GET", "/v1/notebook/instance/logs/history", id=inst["id"])
        seen[who] = (doc["display_status"], [r["message"] for r in logs["logs"]])
    status, lines = seen["bob"]
    assert status == "failed" and not any(line.startswith("NOTES") for line in lines), lines
    assert any("SdkError: 40400" in line for line in lines), lines
    assert seen["alice"][0] == "succeeded"
    notes = [line for line in seen["alice"][1] if line.startswith("NOTES")]
    assert len(notes) == 1 and "'alice private'" in notes[0], notes

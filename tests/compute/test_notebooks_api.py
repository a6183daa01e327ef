"""Notebook endpoints over HTTP: notebooks, instances (states, logs cursor, metrics, keepalive,
background, cancel, list filters), schedules (firing, skipping, deletion) and table access."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import pytest_asyncio

from tests.compute.conftest import Stack, wait_ended
from workspace.compute.store import table_reader_count
from workspace.compute_api import table_instances

pytestmark = pytest.mark.asyncio(loop_scope="module")

SLEEPER = "import time\nwhile True:\n    time.sleep(0.05)\n"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def space(stack: Stack) -> str:
    sid = f"n{uuid.uuid4().hex[:8]}"
    await stack.alice.ok("POST", "/v1/space/create", {"id": sid})
    return sid


async def notebook(stack: Stack, space: str, name: str, code: str, **kw: Any) -> dict:
    body = {"space": space, "name": name, "code": code, **kw}
    return await stack.alice.ok("POST", "/v1/notebook/create", body)


async def start(stack: Stack, nb: dict, **kw: Any) -> dict:
    return await stack.alice.ok(
        "POST", "/v1/notebook/instance/create", {"notebook_id": nb["id"], **kw}
    )


async def ended(stack: Stack, instance_id: str, seconds: float = 15) -> dict:
    return await wait_ended(stack.alice, instance_id, seconds)


async def test_notebook_crud_and_list(stack: Stack, space: str) -> None:
    params = [{"name": "rounds", "type": "INT", "order": 5, "default": {"value": 2}}]
    nb = await notebook(stack, space, "crud", "print(rounds)", parameters=params)
    assert nb["id"] == f"{space}.crud" and nb["language"] == "python"
    assert nb["parameters"][0]["order"] == 5  # notebooks need not number consecutively
    assert (await stack.alice.ok("GET", "/v1/notebook", id=nb["id"]))["code"] == "print(rounds)"
    a = stack.alice
    assert await a.fail("POST", "/v1/notebook/create", {"space": space, "name": "crud"}) == 409
    assert (
        await a.fail(
            "POST", "/v1/notebook/create", {"space": space, "name": "js", "language": "javascript"}
        )
        == 400
    )
    assert (
        await a.fail(
            "POST",
            "/v1/notebook/create",
            {"space": space, "name": "bad", "parameters": [{"name": "not-ident", "type": "INT"}]},
        )
        == 400
    )
    await notebook(stack, space, "other", "")
    page = await a.ok("GET", "/v1/notebook/list", space=space, order_by="name", direction="asc")
    assert [i["name"] for i in page["items"]] == ["crud", "other"] and page["total_count"] == 2
    assert "code" not in page["items"][0]
    assert (await a.ok("GET", "/v1/notebook/list", space=space, name="oth"))["total_count"] == 1
    assert await stack.bob.fail("GET", "/v1/notebook", id=nb["id"]) == 404
    await a.ok("POST", "/v1/notebook/delete", {"id": nb["id"]})
    assert await a.fail("GET", "/v1/notebook", id=nb["id"]) == 404


async def test_instance_success_logs_cursor_and_metrics(stack: Stack, space: str) -> None:
    code = "import time\nfor i in range(rounds):\n    print('round', i)\n    time.sleep(0.3)\n"
    params = [{"name": "rounds", "type": "INT", "default": {"value": 1}}]
    nb = await notebook(stack, space, "rounds", code, parameters=params)
    inst = await start(stack, nb, arguments=[{"name": "rounds", "value": 3}], name="three")
    assert inst["status"] == "running" and inst["display_status"] in ("starting", "running")
    assert inst["launched"] == "manual" and inst["background"] is False
    assert inst["deadline"] == pytest.approx(inst["created_at"] + 150, abs=1)
    assert inst["notebook"] == {"id": nb["id"], "name": "rounds", "space": space}
    assert inst["user"]["id"] == stack.ids["alice"] and inst["account"]["id"] == stack.ids["alice"]
    seen: list[str] = []
    cursor = None
    for _ in range(60):
        params: dict[str, Any] = {"id": inst["id"]}
        if cursor is not None:
            params["timestamp"] = cursor
        data = await stack.alice.ok("GET", "/v1/notebook/instance/logs/history", **params)
        seen += [r["message"] for r in data["logs"] if r["type"] == "output"]
        cursor = data["timestamp"]
        doc = await stack.alice.ok("GET", "/v1/notebook/instance", id=inst["id"])
        if doc["status"] == "ended":
            data = await stack.alice.ok(
                "GET", "/v1/notebook/instance/logs/history", id=inst["id"], timestamp=cursor
            )
            seen += [r["message"] for r in data["logs"] if r["type"] == "output"]
            break
        await asyncio.sleep(0.15)
    assert seen == ["round 0", "round 1", "round 2"]  # each line exactly once
    assert (doc["exit_code"], doc["display_status"], doc["exit_message"]) == (
        0,
        "succeeded",
        "completed",
    )
    assert doc["oom_killed"] is False and doc["exited_at"] is not None
    container = await stack.alice.ok(
        "GET", "/v1/notebook/instance/metrics/container", id=inst["id"]
    )
    assert set(container["charts"]) == {"cpu", "memory", "net_rx", "net_tx"}
    assert container["charts"]["memory"]["unit"] == "bytes"
    assert container["charts"]["memory"]["series"][0]["points"]
    blockx = await stack.alice.ok("GET", "/v1/notebook/instance/metrics/blockx", id=inst["id"])
    assert set(blockx["charts"]) == {"block_lag", "tasks", "task_duration", "calls"}
    assert blockx["instance_id"] == inst["id"] and blockx["step"] >= 1
    assert await stack.bob.fail("GET", "/v1/notebook/instance", id=inst["id"]) == 404


async def test_arguments_are_checked_against_parameter_types(stack: Stack, space: str) -> None:
    a = stack.alice
    params = [
        {"name": "n", "type": "INT", "default": {"value": 1}},
        {"name": "who", "type": "ADDRESS", "default": {"value": None}},
        {"name": "extra", "type": "JSON", "default": {"value": None}},
    ]
    nb = await notebook(stack, space, "typed", "print(n, who, extra)\n", parameters=params)
    before = (await a.ok("GET", "/v1/notebook/instance/list"))["total_count"]
    for args, what in (
        ([{"name": "n", "value": "abc"}], "argument 'n' (INT) must be a 64-bit integer"),
        ([{"name": "n", "value": 1.5}], "argument 'n' (INT) must be a 64-bit integer"),
        ([{"name": "who", "value": "0x12"}], "argument 'who' (ADDRESS) must be a 0x-prefixed"),
    ):
        status, env = await a.post(
            "/v1/notebook/instance/create", {"notebook_id": nb["id"], "arguments": args}
        )
        assert (status, env["code"]) == (400, 40000) and env["message"].startswith(what), env
        status, env = await a.post(
            "/v1/notebook/schedule/create",
            {"notebook_id": nb["id"], "cron": "* * * * *", "arguments": args},
        )
        assert (status, env["code"]) == (400, 40000) and env["message"].startswith(what), env
    assert (await a.ok("GET", "/v1/notebook/instance/list"))["total_count"] == before
    assert (await a.ok("GET", "/v1/notebook/schedule/list", notebook_id=nb["id"]))["items"] == []
    good = [{"name": "n", "value": 2}, {"name": "extra", "value": {"any": ["json"]}}]
    doc = await ended(stack, (await start(stack, nb, arguments=good))["id"])
    assert doc["display_status"] == "succeeded"
    bad_default = [{"name": "n", "type": "INT", "default": {"value": "x"}}]
    status, env = await a.post(
        "/v1/notebook/create",
        {"space": space, "name": "typed2", "code": "", "parameters": bad_default},
    )
    assert (status, env["code"]) == (400, 40000)
    assert env["message"].startswith("parameters[0].default.value (INT) must be")


async def test_failure_cancel_keepalive_background(stack: Stack, space: str) -> None:
    a = stack.alice
    bad = await notebook(stack, space, "bad", "raise ValueError('broken notebook')\n")
    doc = await ended(stack, (await start(stack, bad))["id"])
    assert doc["display_status"] == "failed" and doc["exit_code"] == 1
    assert doc["exit_message"] == "ValueError: broken notebook"
    sleeper = await notebook(stack, space, "sleeper", SLEEPER)
    inst = await start(stack, sleeper)
    before = inst["deadline"]
    await asyncio.sleep(0.05)
    assert await a.ok("POST", "/v1/notebook/instance/keepalive", {"id": inst["id"]}) is None
    after = (await a.ok("GET", "/v1/notebook/instance", id=inst["id"]))["deadline"]
    assert after > before
    assert await a.ok("POST", "/v1/notebook/instance/set_background", {"id": inst["id"]}) is None
    bg = await a.ok("GET", "/v1/notebook/instance", id=inst["id"])
    assert bg["background"] is True and bg["deadline"] is None
    assert (
        await a.fail(
            "POST", "/v1/notebook/instance/set_background", {"id": inst["id"], "background": False}
        )
        == 400
    )
    await a.ok("POST", "/v1/notebook/instance/keepalive", {"id": inst["id"]})
    assert (await a.ok("GET", "/v1/notebook/instance", id=inst["id"]))["deadline"] is None
    assert await a.ok("POST", "/v1/notebook/instance/cancel", {"id": inst["id"]}) is None
    doc = await ended(stack, inst["id"])
    assert doc["display_status"] == "canceled" and doc["exit_code"] == 137
    assert doc["exit_message"] == "canceled"
    assert await a.fail("POST", "/v1/notebook/instance/cancel", {"id": "nope"}) == 404


async def test_quotas_specs_and_oom(stack: Stack, space: str) -> None:
    specs = await stack.alice.ok("GET", "/v1/notebook/instance/specs")
    assert {"max_cpu": 100, "max_memory": 256 * 1024 * 1024} in specs["allowed_quota_spec"]
    assert specs["sandbox"]["network_isolated"] is True
    assert specs["sandbox"]["processes_isolated"] is True
    nb = await notebook(stack, space, "hog", "x = bytearray(10 * 1024 ** 3)\n")
    assert (
        await stack.alice.fail(
            "POST", "/v1/notebook/instance/create", {"notebook_id": nb["id"], "max_cpu": 400}
        )
        == 400
    )
    inst = await start(stack, nb, max_cpu=100, max_memory=128 * 1024 * 1024)
    assert inst["max_memory"] == 128 * 1024 * 1024 and inst["max_cpu"] == 100
    doc = await ended(stack, inst["id"])
    assert doc["oom_killed"] is True and doc["display_status"] == "failed"
    assert "out of memory" in doc["exit_message"]


async def test_instance_list_filters(stack: Stack, space: str) -> None:
    nb = await notebook(stack, space, "lister", "print('hi')\n")
    ids = [(await start(stack, nb, name=f"zeta-{i}"))["id"] for i in range(3)]
    for i in ids:
        doc = await ended(stack, i)
        if doc["display_status"] != "succeeded":  # what the run printed says why
            logs = await stack.alice.ok("GET", "/v1/notebook/instance/logs/history", id=i)
            raise AssertionError((doc["exit_message"], doc["exit_code"], logs["logs"]))
    a = stack.alice
    res = await a.ok("GET", "/v1/notebook/instance/list", notebook_id=nb["id"])
    assert res["total_count"] == 3 and [i["id"] for i in res["instances"]] == ids[::-1]
    assert "code" not in res["instances"][0]
    res = await a.ok("GET", "/v1/notebook/instance/list", notebook_id=nb["id"], name="zeta-1")
    assert [i["id"] for i in res["instances"]] == [ids[1]]
    # keyword wins over name, and matches the launcher's personal account slug
    res = await a.ok(
        "GET", "/v1/notebook/instance/list", notebook_id=nb["id"], keyword="zeta-2", name="zeta-1"
    )
    assert [i["id"] for i in res["instances"]] == [ids[2]]
    res = await a.ok("GET", "/v1/notebook/instance/list", notebook_id=nb["id"], keyword="alice")
    assert res["total_count"] == 3
    res = await a.ok(
        "GET",
        "/v1/notebook/instance/list",
        notebook_id=nb["id"],
        display_status="succeeded",
        launched="manual",
        limit=2,
    )
    assert res["total_count"] == 3 and len(res["instances"]) == 2
    big = await a.ok("GET", "/v1/notebook/instance/list", limit=500)
    assert len(big["instances"]) <= 50
    assert await a.fail("GET", "/v1/notebook/instance/list", display_status="starting") == 400
    assert await a.fail("GET", "/v1/notebook/instance/list", limit=0) == 400
    other = await stack.bob.ok("GET", "/v1/notebook/instance/list")
    assert other["total_count"] == 0


async def test_schedules(stack: Stack, space: str) -> None:
    a = stack.alice
    nb = await notebook(stack, space, "cronned", SLEEPER)
    assert (
        await a.fail(
            "POST",
            "/v1/notebook/schedule/create",
            {"notebook_id": nb["id"], "cron": "every minute"},
        )
        == 400
    )
    assert (
        await a.fail(
            "POST",
            "/v1/notebook/schedule/create",
            {"notebook_id": nb["id"], "cron": "* * * * *", "mode": "queue"},
        )
        == 400
    )
    sched = await a.ok(
        "POST",
        "/v1/notebook/schedule/create",
        {"notebook_id": nb["id"], "cron": "*/5 * * * *", "name": "five"},
    )
    assert sched["content_type"] == "notebook" and sched["content_id"] == nb["id"]
    assert sched["mode"] == "skip" and sched["deleted_at"] is None
    got = await a.ok("GET", "/v1/notebook/schedule", id=sched["id"])
    assert got["next_run_at"] % 300 == 0
    listed = await a.ok("GET", "/v1/notebook/schedule/list", notebook_id=nb["id"])
    assert [s["id"] for s in listed["items"]] == [sched["id"]]
    scheduler = stack.svc.scheduler
    first = await scheduler.tick(got["next_run_at"] + 1)
    mine = [r for r in first if r["schedule_id"] == sched["id"]]
    assert [r["status"] for r in mine] == ["started"]
    inst = await a.ok("GET", "/v1/notebook/instance", id=mine[0]["instance_id"])
    assert inst["launched"] == "schedule" and inst["schedule"]["id"] == sched["id"]
    assert inst["background"] is True and inst["deadline"] is None
    second = await scheduler.tick(got["next_run_at"] + 301)
    assert [r["status"] for r in second if r["schedule_id"] == sched["id"]] == ["skipped"]
    runs = await a.ok("GET", "/v1/notebook/schedule/runs", id=sched["id"])
    assert runs["total_count"] == 2 and runs["items"][0]["status"] == "skipped"
    assert "still running" in runs["items"][0]["reason"]
    filtered = await a.ok(
        "GET", "/v1/notebook/instance/list", schedule_id=sched["id"], launched="schedule"
    )
    assert filtered["total_count"] == 1
    await a.ok("POST", "/v1/notebook/instance/cancel", {"id": inst["id"]})
    await a.ok("POST", "/v1/notebook/schedule/delete", {"id": sched["id"]})
    gone = await scheduler.tick(got["next_run_at"] + 3600)
    assert [r for r in gone if r["schedule_id"] == sched["id"]] == []
    assert (await a.ok("GET", "/v1/notebook/schedule/list"))["total_count"] == 0
    assert await stack.bob.fail("GET", "/v1/notebook/schedule", id=sched["id"]) == 404


async def test_sdk_table_access_and_blockx(stack: Stack, space: str) -> None:
    a = stack.alice
    t = await a.ok(
        "POST", "/v1/table/create", {"space": space, "name": "ticks", "table_type": "normal"}
    )
    await a.ok(
        "POST",
        "/v1/table/init",
        {"id": t["id"], "columns": [{"id": "id", "name": "id", "type": "STRING"}]},
    )
    code = (
        "import chainstate_sdk as cs, time\n"
        "for i in range(3):\n"
        "    with cs.task('tick'):\n"
        f"        cs.upsert('{t['id']}', {{'id': str(i)}})\n"
        "        cs.chain_call(1337, 'eth_getBlockByNumber', ['latest', False])\n"
        f"print(len(cs.list_rows('{t['id']}')))\n"
        "time.sleep(0.6)\n"
    )
    nb = await notebook(stack, space, "writer", code)
    inst = await start(stack, nb)
    doc = await ended(stack, inst["id"])
    assert doc["display_status"] == "succeeded", doc["exit_message"]
    logs = await a.ok("GET", "/v1/notebook/instance/logs/history", id=inst["id"])
    assert "3" in [r["message"] for r in logs["logs"]]
    for access in ("write", "read"):
        got = await a.ok("GET", "/v1/table/instance/list", id=t["id"], access=access)
        assert [i["id"] for i in got["instances"]] == [inst["id"]], access
        assert got["count"] == 1 and got["instances"][0]["last_accessed_at_ms"] > 0
        item = got["instances"][0]
        assert (item["display_status"], item["launched"], item["notebook_id"]) == (
            "succeeded",
            "manual",
            nb["id"],
        )
        direct = await stack.db.run(
            lambda c, x=access: table_instances(c, t["id"], x, 10, stack.ids["alice"])
        )
        assert direct == got
    # the Space's dep_count counts distinct readers (this Notebook) of its tables
    assert (await a.ok("GET", "/v1/space", id=space))["dep_count"] == 1
    readers = await stack.db.run(lambda c: table_reader_count(c, t["id"]))
    assert readers == 1
    assert (await a.ok("GET", "/v1/table", id=t["id"]))["deps"] == 1
    listed = await a.ok("GET", "/v1/table/list", space=space)
    assert {i["id"]: i["deps"] for i in listed["items"]}[t["id"]] == 1
    blockx = await a.ok("GET", "/v1/notebook/instance/metrics/blockx", id=inst["id"])
    calls = blockx["charts"]["calls"]["series"][0]["points"]
    assert sum(v for _, v in calls) > 0
    assert blockx["charts"]["task_duration"]["series"][0]["points"]
    assert blockx["charts"]["block_lag"]["series"][0]["points"]

"""Per-account quotas (HTTP 429 naming the setting) and retention of logs and records, on a
real server with real runs, on both backends."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from chainstate.config import ConfigError
from tests.compute.conftest import Client, Stack, running_stack, wait_ended
from tests.workspace.conftest import pg_schema
from workspace.compute.quotas import AccountQuotas
from workspace.compute.retention import DAY, Retention, RetentionSettings
from workspace.compute.scheduler import next_due
from workspace.compute.service import ComputeSettings
from workspace.compute.store import table_reader_count

ON_STACK = pytest.mark.asyncio(loop_scope="module")  # the module's server and its loop

SLEEPER = "import time\nwhile True:\n    time.sleep(0.05)\n"
QUOTAS = AccountQuotas(max_running_instances=1, max_function_runs=2, max_log_bytes=150_000)


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["sqlite", "postgresql"])
async def quota_stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, upstream: str
) -> AsyncIterator[Stack]:
    with contextlib.ExitStack() as schemas:
        database = "sqlite" if request.param == "sqlite" else schemas.enter_context(pg_schema())
        async with running_stack(
            tmp_path_factory.mktemp("quota"), upstream, database, account=QUOTAS
        ) as stack:
            yield stack


async def notebook(client: Client, code: str, **kw: Any) -> dict[str, Any]:
    space = f"q{uuid.uuid4().hex[:8]}"
    await client.ok("POST", "/v1/space/create", {"id": space})
    body = {"space": space, "name": "nb", "code": code, **kw}
    return await client.ok("POST", "/v1/notebook/create", body)


@ON_STACK
async def test_running_instances_per_account(quota_stack: Stack) -> None:
    a, b = quota_stack.alice, quota_stack.bob
    nb = await notebook(a, SLEEPER)
    first = await a.ok("POST", "/v1/notebook/instance/create", {"notebook_id": nb["id"]})
    try:
        status, env = await a.post("/v1/notebook/instance/create", {"notebook_id": nb["id"]})
        assert (status, env["code"], env["data"]) == (429, 42901, None)
        assert env["message"] == (
            "quota account_max_running_instances (1) reached: "
            "this account already has 1 instances running"
        )
        # a schedule of alice's due now is refused the same way, and recorded so
        body = {"notebook_id": nb["id"], "cron": "* * * * *"}
        sched = await a.ok("POST", "/v1/notebook/schedule/create", body)
        # one due time exactly: the server's own tick may have recorded it already
        first_due = next_due(sched["cron"], sched["created_at"])
        await quota_stack.svc.scheduler.tick(now=first_due + 1)
        runs = await a.ok("GET", "/v1/notebook/schedule/runs", id=sched["id"])
        assert [r["status"] for r in runs["items"]] == ["failed"]
        assert "account_max_running_instances" in runs["items"][0]["reason"]
        await a.ok("POST", "/v1/notebook/schedule/delete", {"id": sched["id"]})
        # another account is not held back by alice's quota
        other = await notebook(b, SLEEPER)
        inst = await b.ok("POST", "/v1/notebook/instance/create", {"notebook_id": other["id"]})
        await b.ok("POST", "/v1/notebook/instance/cancel", {"id": inst["id"]})
    finally:
        await a.ok("POST", "/v1/notebook/instance/cancel", {"id": first["id"]})
    second = await a.ok("POST", "/v1/notebook/instance/create", {"notebook_id": nb["id"]})
    await a.ok("POST", "/v1/notebook/instance/cancel", {"id": second["id"]})


@ON_STACK
async def test_function_runs_per_account(quota_stack: Stack) -> None:
    a, b = quota_stack.alice, quota_stack.bob
    slow = {"language": "python", "code": "import time\ndef main():\n    time.sleep(1.5)\n"}
    busy = [asyncio.create_task(a.post("/v1/function/run", slow)) for _ in range(2)]
    await asyncio.sleep(0.3)  # both are queued or running
    for extra in (slow, {"language": "sql", "code": "SELECT 1 AS one"}):
        status, env = await a.post("/v1/function/run", extra)
        assert (status, env["code"]) == (429, 42902), env
        assert env["message"].startswith("quota account_max_function_runs (2) reached")
    theirs = await b.ok("POST", "/v1/function/run", {"language": "sql", "code": "SELECT 1 AS n"})
    assert theirs["status"] == "succeeded"
    for status, env in await asyncio.gather(*busy):
        assert status == 200 and env["data"]["status"] == "succeeded", env
    again = await a.ok("POST", "/v1/function/run", {"language": "sql", "code": "SELECT 2 AS n"})
    assert again["return_value"] == [{"n": 2}]


async def logs_of(client: Client, instance_id: str) -> list[str]:
    logs = await client.ok("GET", "/v1/notebook/instance/logs/history", id=instance_id)
    return [r["message"] for r in logs["logs"]]


@ON_STACK
async def test_log_bytes_kept_per_account(quota_stack: Stack) -> None:
    """Each instance prints about 60 kB; with 150 kB kept per account, the oldest ended
    instances' logs are replaced by a notice as newer ones end."""
    b = quota_stack.bob
    nb = await notebook(b, "for i in range(600):\n    print('x' * 100)\n")
    ids = []
    for _ in range(4):
        inst = await b.ok("POST", "/v1/notebook/instance/create", {"notebook_id": nb["id"]})
        await wait_ended(b, inst["id"])
        ids.append(inst["id"])
    await quota_stack.svc.retention.enforce_account(quota_stack.ids["bob"])
    kept = [await logs_of(b, i) for i in ids]
    notice = ["log removed: account_max_log_bytes reached"]
    assert kept[0] == notice and kept[1] == notice
    assert len(kept[3]) > 600 and kept[3][-1] == "instance ended: succeeded: completed"


@ON_STACK
async def test_retention_of_logs_and_records(quota_stack: Stack) -> None:
    stack = quota_stack
    a = stack.alice
    space = f"r{uuid.uuid4().hex[:8]}"
    await a.ok("POST", "/v1/space/create", {"id": space})
    t = await a.ok(
        "POST", "/v1/table/create", {"space": space, "name": "t", "table_type": "normal"}
    )
    cols = [{"id": "id", "name": "id", "type": "STRING"}]
    await a.ok("POST", "/v1/table/init", {"id": t["id"], "columns": cols})
    nb = await notebook(a, f"import chainstate_sdk as cs\ncs.list_rows('{t['id']}')\nprint('hi')\n")
    inst = await a.ok("POST", "/v1/notebook/instance/create", {"notebook_id": nb["id"]})
    await wait_ended(a, inst["id"])
    assert await stack.db.read(table_reader_count, t["id"]) == 1
    svc = stack.svc

    def retention(days: float) -> Retention:
        settings = RetentionSettings(
            log_retention_seconds=7 * DAY, record_retention_seconds=30 * DAY
        )
        return Retention(
            stack.db, svc.manager.log_dir, settings, QUOTAS.max_log_bytes,
            clock=lambda: time.time() + days * DAY,
        )  # fmt: skip

    await retention(8).sweep()  # the log expired, the record is kept
    assert await logs_of(a, inst["id"]) == ["log removed: older than 7 days"]
    assert (await a.ok("GET", "/v1/notebook/instance", id=inst["id"]))["status"] == "ended"
    removed = await retention(31).sweep()  # the record, its log and its table access go
    assert removed["instances"] >= 1 and removed["table_access"] >= 1
    assert await a.fail("GET", "/v1/notebook/instance", id=inst["id"]) == 404
    log = svc.manager.log_dir / f"{inst['id']}.jsonl"
    assert not await asyncio.to_thread(log.exists)
    assert await stack.db.read(table_reader_count, t["id"]) == 0
    assert (await a.ok("GET", "/v1/space", id=space))["dep_count"] == 0


def test_quotas_retention_and_write_budgets_are_named_settings() -> None:
    values = {
        "account_max_running_instances": 2,
        "account_max_function_runs": 3,
        "account_max_log_bytes": 1000,
        "log_retention_seconds": 60,
        "record_retention_seconds": 120,
        "function_write_bytes": 4096,
        "instance_write_files": 5,
        "sql_max_value_bytes": 10,
    }
    s = ComputeSettings.from_mapping(values, Path("/nonexistent"), 1)
    assert s.account == AccountQuotas(2, 3, 1000)
    assert (s.retention.log_retention_seconds, s.retention.record_retention_seconds) == (60, 120)
    assert (s.function_limits.write_bytes, s.instance.write_files) == (4096, 5)
    assert s.sql_max_value_bytes == 10
    for bad in ({"account_nope": 1}, {"instance_uid_base": 5}, {"retention": 1}, {"port": 2}):
        with pytest.raises(ConfigError, match="unknown setting"):
            ComputeSettings.from_mapping(bad, Path("/nonexistent"), 1)
    with pytest.raises(ConfigError, match="must be a int"):
        ComputeSettings.from_mapping({"account_max_function_runs": "8"}, Path("/x"), 1)

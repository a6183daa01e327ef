"""Notebook instances: exits, logs cursor, cancel, keepalive expiry, background, OOM, restart;
schedules firing and skipping. Real SQLite store, real sandboxed processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from workspace.compute import instances
from workspace.compute.instances import (
    EXIT_KILLED,
    InstanceError,
    InstanceManager,
    InstanceSettings,
    LogFile,
)
from workspace.compute.runners import CodeRunner
from workspace.compute.sandbox import MiB, Sandbox
from workspace.compute.scheduler import Scheduler
from workspace.compute.store import MIGRATIONS, ComputeStore, list_schedule_runs
from workspace.db import schema
from workspace.db.sqlite import SqliteDatabase

T0 = 1_800_000_000.0  # a whole minute (divisible by 60)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ComputeStore]:
    db = SqliteDatabase(tmp_path / "ws.sqlite")
    db.migrate("workspace.db.schema", schema.MIGRATIONS)
    db.migrate("workspace.compute", MIGRATIONS)
    yield ComputeStore(db)
    await db.close()


SETTINGS = InstanceSettings(
    allowed_quotas=((100, 256 * MiB),),
    default_max_memory=256 * MiB,
    metrics_interval_seconds=0.2,
    reaper_interval_seconds=3600,  # tests call reap() themselves with the fake clock
    max_running=3,
)


def make_manager(
    sandbox: Sandbox, runner: CodeRunner, store: ComputeStore, tmp_path: Path, clock: Clock
) -> InstanceManager:
    return InstanceManager(sandbox, runner, store, SETTINGS, tmp_path / "logs", clock=clock)


@pytest.fixture
async def clock() -> Clock:
    return Clock()


@pytest.fixture
async def manager(
    sandbox: Sandbox, runner: CodeRunner, store: ComputeStore, tmp_path: Path, clock: Clock
) -> AsyncIterator[InstanceManager]:
    m = make_manager(sandbox, runner, store, tmp_path, clock)
    await m.start()
    yield m
    await m.close()


async def launch(m: InstanceManager, code: str, **kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "code": code,
        "notebook": {"id": "s1.nb", "space": "s1", "name": "nb"},
        "parameters": [],
        "arguments": [],
        "globals_": {},
        "account_id": "a" * 32,
        "user_id": "u1",
        "name": "job",
        "background": False,
        "max_cpu": None,
        "max_memory": None,
    }
    args.update(kw)
    return await m.launch(**args)


async def wait_ended(store: ComputeStore, instance_id: str, seconds: float = 10) -> dict[str, Any]:
    for _ in range(int(seconds * 20)):
        doc = await store.get_instance(instance_id)
        if doc and doc["status"] == "ended":
            return doc
        await asyncio.sleep(0.05)
    raise AssertionError(f"instance {instance_id} did not end")


async def test_success_logs_and_cursor(manager: InstanceManager, store: ComputeStore) -> None:
    code = "for i in range(3):\n    print('line', i, greeting)\n"
    doc = await launch(manager, code, globals_={"greeting": "hi"})
    assert doc["status"] == "running" and doc["display_status"] == "running"
    assert doc["deadline"] == T0 + 150
    end = await wait_ended(store, doc["id"])
    assert (end["exit_code"], end["display_status"], end["oom_killed"]) == (0, "succeeded", False)
    assert end["exit_message"] == "completed" and end["deadline"] is None
    logs, cursor = manager.logs(doc["id"], None)
    outputs = [r["message"] for r in logs if r["type"] == "output"]
    assert outputs == ["line 0 hi", "line 1 hi", "line 2 hi"]
    stamps = [r["timestamp"] for r in logs]
    assert stamps == sorted(set(stamps)) and cursor == stamps[-1]
    again, cursor2 = manager.logs(doc["id"], cursor)
    assert again == [] and cursor2 == cursor
    middle, _ = manager.logs(doc["id"], stamps[1])
    assert [r["timestamp"] for r in middle] == stamps[2:]


def parsable(path: Path) -> list[dict[str, Any]]:
    out = []
    for raw in path.read_bytes().splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(raw))
    return out


def reference_read(
    records: list[dict[str, Any]], cursor: int | None, limit: int
) -> list[dict[str, Any]]:
    """The cursor rule stated plainly: every parsable line after the cursor, in file order."""
    return [r for r in records if cursor is None or r["timestamp"] > cursor][:limit]


def test_log_cursor_reads_from_its_position(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rnd = random.Random(7)
    path = tmp_path / "big.jsonl"
    stamps = []
    with path.open("w") as fh:
        ts = 1_700_000_000_000_000
        for i in range(50_000):  # about 3 MB; line lengths vary from 1 to 3000 characters
            ts += rnd.randint(1, 5)
            stamps.append(ts)
            text = "x" * (3000 if i % 997 == 0 else rnd.randint(1, 40))
            fh.write(json.dumps({"timestamp": ts, "type": "output", "message": text}) + "\n")
            if i == 25_000:
                fh.write('{"timestamp": 17000000\n')  # a line cut by a crash
        fh.write('{"timestamp": 99999999999999999, "type": "out')  # still being written
    log = LogFile(path)
    records = parsable(path)
    cursors = [None, 0, stamps[0] - 1, stamps[0], stamps[-1], stamps[-1] + 10]
    cursors += [stamps[24_999], stamps[25_000], stamps[25_001] - 1]  # around the cut line
    cursors += [stamps[i] + d for i in rnd.sample(range(len(stamps)), 12) for d in (0, 1)]
    for cursor in cursors:
        for limit in (1, 1000):
            got, new = log.read_after(cursor, limit)
            want = reference_read(records, cursor, limit)
            assert got == want, cursor
            assert new == (want[-1]["timestamp"] if want else cursor or 0)
    # passing the cursor back pages through every line exactly once
    seen, cursor = [], None
    while True:
        page, cursor = log.read_after(cursor, 1000)
        if not page:
            break
        seen += [r["timestamp"] for r in page]
    assert seen == stamps
    # a page near the end parses a few dozen lines, not the 50 000 before it
    parsed = []

    def loads(raw: bytes) -> Any:
        parsed.append(raw)
        return json.loads(raw)

    monkeypatch.setattr(instances, "json", SimpleNamespace(loads=loads, dumps=json.dumps))
    page, _ = log.read_after(stamps[-11], 1000)
    assert len(page) == 10 and len(parsed) < 100


async def test_exception_fails_with_message(manager: InstanceManager, store: ComputeStore) -> None:
    doc = await launch(manager, "x = 1\nraise RuntimeError('nope')\n")
    end = await wait_ended(store, doc["id"])
    assert end["display_status"] == "failed" and end["exit_code"] == 1
    assert end["exit_message"] == "RuntimeError: nope"
    logs, _ = manager.logs(doc["id"], None)
    assert any("instance ended: failed" in r["message"] for r in logs)


async def test_cancel_running_instance(manager: InstanceManager, store: ComputeStore) -> None:
    doc = await launch(manager, "import time\nwhile True:\n    time.sleep(0.05)\n")
    assert manager.is_running(doc["id"])
    await manager.cancel(doc["id"])
    end = await store.get_instance(doc["id"])
    assert end is not None
    assert (end["status"], end["display_status"], end["exit_code"]) == (
        "ended",
        "canceled",
        EXIT_KILLED,
    )
    await manager.cancel(doc["id"])  # a finished instance: nothing happens
    with pytest.raises(InstanceError):
        await manager.cancel("missing")


async def test_keepalive_and_deadline(
    manager: InstanceManager, store: ComputeStore, clock: Clock
) -> None:
    code = "import time\nwhile True:\n    time.sleep(0.05)\n"
    fg = await launch(manager, code)
    bg = await launch(manager, code, background=True)
    assert bg["deadline"] is None
    clock.now += 100
    await manager.keepalive(fg["id"])
    await manager.keepalive(bg["id"])
    assert (await store.get_instance(fg["id"]))["deadline"] == clock.now + 150
    assert (await store.get_instance(bg["id"]))["deadline"] is None
    clock.now += 149
    assert await manager.reap() == 0
    clock.now += 2
    assert await manager.reap() == 1
    end = await wait_ended(store, fg["id"])
    assert end["display_status"] == "canceled" and "expired" in end["exit_message"]
    assert manager.is_running(bg["id"])
    await manager.keepalive(fg["id"])  # finished: unaffected
    assert (await store.get_instance(fg["id"]))["deadline"] is None
    await manager.cancel(bg["id"])


async def test_set_background_is_one_way(
    manager: InstanceManager, store: ComputeStore, clock: Clock
) -> None:
    doc = await launch(manager, "import time\ntime.sleep(30)\n")
    await manager.set_background(doc["id"], False)  # already foreground: no change
    await manager.set_background(doc["id"], True)
    now = await store.get_instance(doc["id"])
    assert now["background"] is True and now["deadline"] is None
    with pytest.raises(InstanceError, match="cannot move back"):
        await manager.set_background(doc["id"], False)
    clock.now += 1000
    assert await manager.reap() == 0
    await manager.cancel(doc["id"])


async def test_memory_limit_is_oom(manager: InstanceManager, store: ComputeStore) -> None:
    doc = await launch(manager, "blob = bytearray(10 * 1024 ** 3)\n")
    end = await wait_ended(store, doc["id"])
    assert end["oom_killed"] is True and end["display_status"] == "failed"
    assert "out of memory" in end["exit_message"]


async def test_quota_and_capacity_are_checked(manager: InstanceManager) -> None:
    with pytest.raises(InstanceError, match="not allowed"):
        await launch(manager, "pass", max_cpu=400)
    code = "import time\ntime.sleep(30)\n"
    docs = [await launch(manager, code) for _ in range(SETTINGS.max_running)]
    with pytest.raises(InstanceError) as err:
        await launch(manager, code)
    assert err.value.kind == "busy"
    for d in docs:
        await manager.cancel(d["id"])


async def test_container_metrics_are_sampled(manager: InstanceManager, store: ComputeStore) -> None:
    code = "import time\nt = time.time()\nwhile time.time() - t < 1.2:\n    pass\n"
    doc = await launch(manager, code)
    await wait_ended(store, doc["id"])
    points = manager.container_points(doc["id"])
    assert set(points) >= {"cpu", "memory", "net_rx", "net_tx"}
    # A busy loop shows up (an idle program samples ~0 %); not a share of a core, which a
    # loaded CI machine (load ~6 on 2 cores seen) may not give it in any 0.2 s interval.
    assert max(v for _, v in points["cpu"]) > 5
    assert all(v > 0 for _, v in points["memory"])


def test_a_sample_without_a_process_records_no_false_zero(
    manager: InstanceManager, tmp_path: Path
) -> None:
    """A sample taken while the program is gone (or not yet up) has no figures to give: no
    memory point of 0 bytes and no cpu point, which a chart would show as a real drop."""
    os_pid = os.getpid()
    sp = SimpleNamespace(processes=lambda: [], pid=os_pid, kill=lambda reason: None)
    live = instances._Live("x", "a", sp, None, 1 << 30, tmp_path / "log", 0.0)  # type: ignore[arg-type]
    manager.sample(live)
    manager.sample(live)
    assert "memory" not in live.points and "cpu" not in live.points
    me = psutil.Process(os_pid)
    sp.processes = lambda: [me]
    manager.sample(live)
    assert live.points["memory"][-1][1] > 0


async def test_restart_ends_running_instances_as_failed(
    sandbox: Sandbox,
    runner: CodeRunner,
    store: ComputeStore,
    tmp_path: Path,
    clock: Clock,
) -> None:
    first = make_manager(sandbox, runner, store, tmp_path, clock)
    await first.start()
    doc = await launch(first, "import time\ntime.sleep(60)\n")
    second = make_manager(sandbox, runner, store, tmp_path, clock)
    await second.start()  # what a restarted server does first
    end = await store.get_instance(doc["id"])
    assert end["status"] == "ended" and end["display_status"] == "failed"
    assert "server restarted" in end["exit_message"]
    await second.close()
    await first.close()


async def test_schedule_fires_and_skips_overlaps(
    manager: InstanceManager, store: ComputeStore, clock: Clock
) -> None:
    async def launch_scheduled(sched: dict[str, Any]) -> str:
        doc = await launch(
            manager, sched["code"], background=True, launched="schedule", schedule_id=sched["id"]
        )
        return doc["id"]

    scheduler = Scheduler(store, launch_scheduled, manager.is_running, clock=clock)
    sched = {
        "id": "sch1",
        "account_id": "a" * 32,
        "space": "s1",
        "cron": "* * * * *",
        "mode": "skip",
        "code": "import time\ntime.sleep(30)\n",
        "created_at": T0,
        "deleted_at": None,
    }
    await store.put_schedule(sched)
    assert await scheduler.tick(T0 + 30) == []
    first = await scheduler.tick(T0 + 61)
    assert [r["status"] for r in first] == ["started"]
    inst = await store.get_instance(first[0]["instance_id"])
    assert inst["launched"] == "schedule" and inst["schedule_id"] == "sch1"
    second = await scheduler.tick(T0 + 121)
    assert [r["status"] for r in second] == ["skipped"]
    assert "still running" in second[0]["reason"]
    await manager.cancel(first[0]["instance_id"])
    later = await scheduler.tick(T0 + 365)  # 180, 240, 300 missed; 360 fires
    assert [r["status"] for r in later] == ["skipped", "skipped", "skipped", "started"]
    _, total = await store.db.run(list_schedule_runs, "sch1", 0, 100)
    assert total == 6
    await manager.cancel(later[-1]["instance_id"])


async def test_max_cpu_is_enforced(manager: InstanceManager, store: ComputeStore) -> None:
    if manager.sandbox.isolation.cpu_cgroup is None:
        pytest.fail(f"no cpu cgroup here: {manager.sandbox.isolation.notes}")
    busy = "while True:\n    pass\n"
    doc = await launch(manager, busy, max_cpu=25)
    await asyncio.sleep(2.0)
    points = manager.container_points(doc["id"])["cpu"]
    await manager.cancel(doc["id"])
    steady = [v for _, v in points[1:]]
    assert steady and sum(steady) / len(steady) < 40  # a quarter of a CPU, not a whole one

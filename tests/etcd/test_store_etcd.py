"""EtcdStore against a real etcd: the ConfigStore contract, outages, restarts, compaction."""

from __future__ import annotations

import asyncio
import shutil
import signal
import time
import uuid
from collections.abc import AsyncIterator

import pytest

from chainstate.config import ConfigError
from proxy.store import StoreEvent, StoreUnavailable
from proxy.store_etcd import EtcdStore, parse_etcd_url, prefix_range_end
from tests.etcd.conftest import EtcdServer

FAST = {"timeout": 1.0, "probe_interval": 0.2, "retry_interval": 0.2}


def unique_prefix() -> str:
    return f"/t-{uuid.uuid4().hex[:8]}/"


async def wait_until(predicate, within: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


class Collector:
    """Consumes a store watch in the background and keeps every event."""

    def __init__(self, watch: AsyncIterator[StoreEvent]) -> None:
        self.events: list[StoreEvent] = []
        self._task = asyncio.create_task(self._run(watch))

    async def _run(self, watch: AsyncIterator[StoreEvent]) -> None:
        async for event in watch:
            self.events.append(event)

    async def wait_for(self, count: int, within: float = 10.0) -> list[StoreEvent]:
        await wait_until(lambda: len(self.events) >= count or self._task.done(), within)
        if self._task.done():
            self._task.result()  # surface a crash of the watch
        return self.events

    async def stop(self) -> None:
        self._task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self._task


@pytest.fixture
async def store(etcd: EtcdServer) -> AsyncIterator[EtcdStore]:
    s = EtcdStore(etcd.endpoint, unique_prefix(), **FAST)
    await s.start()
    yield s
    await s.close()


async def peer_of(store: EtcdStore) -> EtcdStore:
    """A second client on the same prefix, like another proxy process."""
    other = EtcdStore(store.endpoint, store.prefix, **FAST)
    await other.start()
    return other


# -- pure helpers ----------------------------------------------------------------------------


def test_prefix_range_end() -> None:
    assert prefix_range_end(b"/cfg/") == b"/cfg0"
    assert prefix_range_end(b"a\xff") == b"b"
    assert prefix_range_end(b"\xff\xff") == b"\0"


def test_parse_etcd_url() -> None:
    assert parse_etcd_url("etcd://10.0.0.5:2380/prod/proxy") == ("10.0.0.5:2380", "/prod/proxy/")
    assert parse_etcd_url("etcd://localhost") == ("localhost:2379", "/chainstate/")
    for bad in ("http://x:1/", "etcd://:1/", "etcd://u:p@h:1/", "etcd://h:99999/", "etcd://h:1//"):
        with pytest.raises(ConfigError):
            parse_etcd_url(bad)


def test_url_options() -> None:
    s = EtcdStore.from_url("etcd://h:1/p/?timeout=0.5&probe_interval=3&retry_interval=0.1")
    assert (s._timeout, s._probe_interval, s._retry_interval) == (0.5, 3.0, 0.1)
    assert s.prefix == "/p/" and s.endpoint == "h:1"
    for bad in ("?timeout=0", "?timeout=x", "?timeout=", "?timeout=inf", "?color=red"):
        with pytest.raises(ConfigError):
            EtcdStore.from_url("etcd://h:1/p/" + bad)
    with pytest.raises(ConfigError):
        EtcdStore("h:1", timeout=-1)


def test_bad_keys_are_refused_before_reaching_etcd() -> None:
    s = EtcdStore("127.0.0.1:1")
    with pytest.raises(ValueError):
        s._full_key("")


# -- the store contract ------------------------------------------------------------------------


async def test_put_snapshot_delete_revisions(store: EtcdStore) -> None:
    assert store.available
    r1 = await store.put("pools/1/nodes/a", b'{"key":"a"}')
    r2 = await store.put("pools/10/nodes/b", b'{"key":"b"}')
    r3 = await store.put("1/version", b'"blue"')
    assert r1 < r2 < r3
    data, rev = await store.snapshot()
    assert rev == r3
    assert data == {
        "pools/1/nodes/a": b'{"key":"a"}',
        "pools/10/nodes/b": b'{"key":"b"}',
        "1/version": b'"blue"',
    }
    # A sub-prefix ending in "/" never matches a longer sibling ("pools/1/" vs "pools/10/").
    sub, _ = await store.snapshot("pools/1/")
    assert sub == {"pools/1/nodes/a": b'{"key":"a"}'}

    r4 = await store.delete("pools/1/nodes/a")
    assert r4 == r3 + 1
    # Deleting nothing changes nothing: the answer is the newest revision under the prefix
    # (the live "1/version" key), never etcd's revision moved on by other prefixes, which a
    # caller waiting for its watch to catch up would wait for in vain.
    foreign = EtcdStore(store.endpoint, unique_prefix(), **FAST)
    await foreign.start()
    assert await foreign.put("elsewhere", b"x") > r4
    await foreign.close()
    assert await store.delete("pools/1/nodes/a") == r3
    r5 = await store.delete_prefix("pools/")
    assert r5 == r4 + 2
    data, rev = await store.snapshot()
    assert data == {"1/version": b'"blue"'} and rev == r5


async def test_replace_is_a_compare_and_set(store: EtcdStore) -> None:
    other = await peer_of(store)
    try:
        r1 = await store.replace("pools/1/routes/eth_call", None, b"[1]")  # create if absent
        assert r1 is not None
        assert await other.replace("pools/1/routes/eth_call", None, b"[9]") is None  # exists
        r2 = await other.replace("pools/1/routes/eth_call", b"[1]", b"[1,2]")
        assert r2 is not None and r2 > r1
        # A proxy that read "[1]" before the other's change loses the race, changes nothing.
        assert await store.replace("pools/1/routes/eth_call", b"[1]", b"[1,3]") is None
        assert (await store.snapshot())[0] == {"pools/1/routes/eth_call": b"[1,2]"}
        r3 = await store.replace("pools/1/routes/eth_call", b"[1,2]", None)  # delete
        assert r3 is not None and r3 > r2
        assert (await store.snapshot())[0] == {}
        assert await store.replace("pools/1/routes/eth_call", b"[1,2]", None) is None
        # Deleting what is already absent succeeds without a change: the answer is a revision
        # the watch has delivered, not etcd's (other prefixes move that one).
        rx = await other.put("x", b"1")
        foreign = EtcdStore(store.endpoint, unique_prefix(), **FAST)
        await foreign.start()
        assert await foreign.put("elsewhere", b"x") > rx
        await foreign.close()
        assert await store.replace("pools/1/routes/eth_call", None, None) == rx
    finally:
        await other.close()


async def test_prefixes_are_isolated(etcd: EtcdServer) -> None:
    base = unique_prefix()
    a = EtcdStore(etcd.endpoint, base, **FAST)
    b = EtcdStore(etcd.endpoint, base.rstrip("/") + "x/", **FAST)
    await a.start()
    await b.start()
    try:
        await a.put("k", b"a")
        await b.put("k", b"b")
        await b.delete_prefix("")
        assert (await a.snapshot())[0] == {"k": b"a"}
        assert (await b.snapshot())[0] == {}
    finally:
        await a.close()
        await b.close()


async def test_put_refuses_non_bytes(store: EtcdStore) -> None:
    with pytest.raises(TypeError):
        await store.put("k", "text")  # type: ignore[arg-type]
    assert (await store.snapshot())[0] == {}


async def test_watch_sees_other_process_changes_fast(store: EtcdStore) -> None:
    other = await peer_of(store)
    try:
        _, rev = await store.snapshot()
        events = Collector(store.watch("", rev + 1))
        await asyncio.sleep(0.1)
        t0 = time.monotonic()
        r1 = await other.put("pools/1/nodes/a", b"1")
        await events.wait_for(1)
        assert time.monotonic() - t0 < 1.0  # the "visible on all within a second" promise
        r2 = await other.delete("pools/1/nodes/a")
        assert await events.wait_for(2) == [
            StoreEvent("pools/1/nodes/a", b"1", r1),
            StoreEvent("pools/1/nodes/a", None, r2),
        ]
        await events.stop()
    finally:
        await other.close()


async def test_watch_replays_history_from_an_old_revision(store: EtcdStore) -> None:
    r1 = await store.put("a", b"1")
    r2 = await store.put("b", b"2")
    r3 = await store.delete("a")
    events = Collector(store.watch("", r1))
    assert await events.wait_for(3) == [
        StoreEvent("a", b"1", r1),
        StoreEvent("b", b"2", r2),
        StoreEvent("a", None, r3),
    ]
    await events.stop()


async def test_watch_of_a_sub_prefix_ignores_siblings(store: EtcdStore) -> None:
    _, rev = await store.snapshot()
    events = Collector(store.watch("pools/1/", rev + 1))
    await store.put("pools/10/nodes/x", b"no")
    r = await store.put("pools/1/nodes/x", b"yes")
    assert await events.wait_for(1) == [StoreEvent("pools/1/nodes/x", b"yes", r)]
    await asyncio.sleep(0.2)
    assert len(events.events) == 1
    await events.stop()


# -- outages -----------------------------------------------------------------------------------


async def test_etcd_killed_and_restarted_mid_watch_loses_nothing(etcd: EtcdServer) -> None:
    prefix = unique_prefix()
    # A slow re-watch makes sure writes land in the gap between restart and re-watch.
    watcher = EtcdStore(etcd.endpoint, prefix, timeout=1.0, probe_interval=0.2, retry_interval=2)
    writer = EtcdStore(etcd.endpoint, prefix, **FAST)
    await watcher.start()
    await writer.start()
    try:
        _, rev = await watcher.snapshot()
        events = Collector(watcher.watch("", rev + 1))
        r1 = await writer.put("before", b"1")
        await events.wait_for(1)

        etcd.kill()
        await wait_until(lambda: not watcher.available, within=5)
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailable, match="unavailable"):
            await writer.put("refused", b"x")
        assert time.monotonic() - t0 < 1.5  # refused promptly, not hanging
        with pytest.raises(StoreUnavailable):
            await watcher.snapshot()

        etcd.start()
        r2 = await retry_put(writer, "gap", b"2")  # written while the watch is still down
        r3 = await writer.delete("before")
        await wait_until(lambda: watcher.available, within=5)
        r4 = await writer.put("after", b"3")
        got = await events.wait_for(4)
        assert got == [
            StoreEvent("before", b"1", r1),
            StoreEvent("gap", b"2", r2),
            StoreEvent("before", None, r3),
            StoreEvent("after", b"3", r4),
        ]
        assert (await writer.snapshot())[0] == {"gap": b"2", "after": b"3"}
        await events.stop()
    finally:
        await watcher.close()
        await writer.close()


async def test_a_hung_etcd_times_out_and_recovers(etcd: EtcdServer) -> None:
    """etcd frozen (SIGSTOP): calls fail after `timeout` instead of hanging, `available`
    drops, and after SIGCONT the same watch goes on delivering."""
    s = EtcdStore(etcd.endpoint, unique_prefix(), timeout=0.5, probe_interval=0.2)
    await s.start()
    try:
        _, rev = await s.snapshot()
        events = Collector(s.watch("", rev + 1))
        r1 = await s.put("a", b"1")
        await events.wait_for(1)
        assert etcd.proc is not None
        etcd.proc.send_signal(signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            with pytest.raises(StoreUnavailable):
                await s.put("b", b"2")
            assert time.monotonic() - t0 < 2.0
            await wait_until(lambda: not s.available, within=3)
        finally:
            etcd.proc.send_signal(signal.SIGCONT)
        await wait_until(lambda: s.available, within=5)
        r3 = await s.put("c", b"3")
        got = await events.wait_for(2)
        # "b" may or may not have been applied by etcd after its timeout; either way the
        # watch reports exactly what etcd holds.
        assert got[0] == StoreEvent("a", b"1", r1) and got[-1] == StoreEvent("c", b"3", r3)
        assert {e.key for e in got} <= {"a", "b", "c"}
        data, _ = await s.snapshot()
        assert {k for k in data} == {e.key for e in got}
        await events.stop()
    finally:
        await s.close()


async def retry_put(store: EtcdStore, key: str, value: bytes, within: float = 10.0) -> int:
    """Put once etcd answers again (the client reconnects within about a second)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await store.put(key, value)
        except StoreUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def test_etcd_down_at_start(etcd_not_started: EtcdServer) -> None:
    s = EtcdStore(etcd_not_started.endpoint, unique_prefix(), **FAST)
    t0 = time.monotonic()
    await s.start()
    assert time.monotonic() - t0 < 2.0  # start() reports, it does not wait for etcd
    try:
        assert not s.available
        assert s.last_error  # the reason, for admin responses
        with pytest.raises(StoreUnavailable):
            await s.snapshot()
        with pytest.raises(StoreUnavailable):
            await s.put("k", b"v")
        changes: list[bool] = []
        s.add_listener(changes.append)
        events = Collector(s.watch("", 1))  # a watch may start while etcd is down
        await asyncio.sleep(0.5)
        assert events.events == []

        etcd_not_started.start()
        await wait_until(lambda: s.available, within=5)
        assert changes == [True]
        r = await s.put("k", b"v")
        assert await events.wait_for(1) == [StoreEvent("k", b"v", r)]
        await events.stop()
    finally:
        await s.close()


async def test_compaction_during_outage_is_resynced_by_diff(etcd: EtcdServer) -> None:
    prefix = unique_prefix()
    watcher = EtcdStore(etcd.endpoint, prefix, timeout=1.0, probe_interval=0.2, retry_interval=2)
    writer = EtcdStore(etcd.endpoint, prefix, **FAST)
    await watcher.start()
    await writer.start()
    try:
        await writer.put("keep", b"1")
        await writer.put("drop", b"1")
        _, rev = await watcher.snapshot()
        events = Collector(watcher.watch("", rev + 1))
        r = await writer.put("change", b"1")
        await events.wait_for(1)

        etcd.kill()
        etcd.start()
        await retry_put(writer, "change", b"2")
        await writer.put("change", b"3")
        await writer.delete("drop")
        final = await writer.put("new", b"1")
        assert writer._client is not None
        await writer._client.compact(final, physical=True)  # history of the gap is gone

        got = await events.wait_for(4)
        assert got[0] == StoreEvent("change", b"1", r)
        # The gap arrives as the net difference, stamped with the resync revision.
        assert {(e.key, e.value) for e in got[1:]} == {
            ("drop", None),
            ("change", b"3"),
            ("new", b"1"),
        }
        assert len(got) == 4
        r2 = await writer.put("later", b"x")
        assert (await events.wait_for(5))[4] == StoreEvent("later", b"x", r2)
        await events.stop()
    finally:
        await watcher.close()
        await writer.close()


async def test_watch_from_a_compacted_revision_replays_current_state(store: EtcdStore) -> None:
    r1 = await store.put("a", b"1")
    r2 = await store.put("b", b"2")
    assert store._client is not None
    await store._client.compact(r2, physical=True)
    events = Collector(store.watch("", r1))
    got = await events.wait_for(2)
    assert got == [StoreEvent("a", b"1", r2), StoreEvent("b", b"2", r2)]
    await events.stop()


async def test_etcd_rebuilt_with_lower_revisions_is_resynced(tmp_path, etcd_not_started) -> None:  # type: ignore[no-untyped-def]
    server: EtcdServer = etcd_not_started
    server.start()
    prefix = unique_prefix()
    watcher = EtcdStore(server.endpoint, prefix, **FAST)
    writer = EtcdStore(server.endpoint, prefix, **FAST)
    await watcher.start()
    await writer.start()
    try:
        for i in range(20):
            await writer.put(f"old{i % 2}", str(i).encode())
        _, rev = await watcher.snapshot()
        events = Collector(watcher.watch("", rev + 1))
        await asyncio.sleep(0.2)

        server.kill()
        shutil.rmtree(server.data_dir)  # disaster recovery: an empty etcd, revisions restart
        server.start()
        r = await retry_put(writer, "fresh", b"1")
        assert r < rev
        got = await events.wait_for(3)
        assert {(e.key, e.value) for e in got} == {("old0", None), ("old1", None), ("fresh", b"1")}
        await events.stop()
    finally:
        await watcher.close()
        await writer.close()


async def test_close_ends_watch(store: EtcdStore, etcd: EtcdServer) -> None:
    s = EtcdStore(etcd.endpoint, store.prefix, **FAST)
    await s.start()
    it = s.watch("", 1)
    task = asyncio.create_task(anext(it, None))
    await asyncio.sleep(0.2)
    await s.close()
    assert await asyncio.wait_for(task, 5) is None

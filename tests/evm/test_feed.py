"""The state feed: its answers, its HTTP handling, the feed process over a real LMDB store, and
EVM calls over that store giving the same results through the feed process and the in-loop
feed (the differential tests against anvil run on the in-loop feed; tests/evm/test_node_e2e
runs a real node, whose workers read through the feed process)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import pytest_asyncio
from Crypto.Hash import keccak

from nodes.state.evm.feed import FeedCore, Overlay, serve
from nodes.state.evm.feedproc import FeedProcess
from nodes.state.evm.methods import EvmMethods
from nodes.state.evm.settings import EvmSettings
from nodes.state.store import StateStore
from nodes.state.vendor import parse_vendor_block
from tests.conftest import raw_post
from tests.evm.conftest import Client
from tests.nodes.test_state_chain import SyntheticChain, make_addresses

module_loop = pytest.mark.asyncio(loop_scope="module")

# SUM: returns SLOAD(0) + … + SLOAD(5) (six cold SLOADs)
SUM_RUNTIME = "600054" + "".join(f"60{i:02x}5401" for i in range(1, 6)) + "60005260206000f3"
# BALANCE: returns SLOAD(keccak(CALLDATALOAD(4) ‖ 0)), an ERC20's balanceOf of `_balances`
# at position 0 (without the selector dispatch)
BALANCE_RUNTIME = "6004356000526000602052604060002054" + "60005260206000f3"
HEIGHTS = 12
TOKEN = make_addresses(1, "feed-token")[0]


def balance_slot(holder: str) -> int:
    """The token's `_balances` entry of `holder` (position 0)."""
    key = bytes(12) + bytes.fromhex(holder[2:]) + bytes(32)
    return int.from_bytes(keccak.new(digest_bits=256, data=key).digest(), "big")


def make_chain() -> tuple[SyntheticChain, str, list[str]]:
    """A contract whose six slots change block after block, funded accounts, and a token
    whose balances of them change too (`TOKEN`)."""
    people = make_addresses(3, "feed-test")
    contract = make_addresses(1, "feed-sum")[0]
    chain = SyntheticChain("feed")
    chain.add_block(
        {
            contract: {"code": bytes.fromhex(SUM_RUNTIME), "storage": {0: 1}},
            TOKEN: {
                "code": bytes.fromhex(BALANCE_RUNTIME),
                "storage": {balance_slot(p): 100 + i for i, p in enumerate(people)},
            },
            **{p: {"balance": 10**18 * (i + 1), "nonce": i} for i, p in enumerate(people)},
        }
    )
    for h in range(1, HEIGHTS):
        chain.add_block(
            {
                contract: {"storage": {h % 6: h * 1000 + 7}},
                people[h % 3]: {"balance": 10**18 + h},
                TOKEN: {"storage": {balance_slot(people[h % 3]): 1000 * h}},
            }
        )
    return chain, contract, people


def post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, body, {"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def rpc(url: str, method: str, params: list[Any]) -> Any:
    body = orjson.dumps({"jsonrpc": "2.0", "id": 7, "method": method, "params": params})
    return orjson.loads(post(url, body)[1])


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    chain, contract, people = make_chain()
    path = tmp_path_factory.mktemp("feed") / "lmdb"
    st = StateStore(path, kind="archive", map_size_mb=64)
    st.open()
    for raw in chain.blocks:
        st.apply(parse_vendor_block(raw))
    st.chain, st.contract, st.people = chain, contract, people  # type: ignore[attr-defined]
    yield st
    st.close()


# -- FeedCore ---------------------------------------------------------------------------


def test_core_answers_equal_the_store(store: Any) -> None:
    core = FeedCore(store, 1337)
    for h in (0, 5, HEIGHTS - 1):
        model = store.chain.state(h)
        items = [
            {"id": 1, "method": "eth_getBalance", "params": [store.people[0], hex(h)]},
            {"id": 2, "method": "eth_getTransactionCount", "params": [store.people[1], hex(h)]},
            {"id": 3, "method": "eth_getCode", "params": [store.contract, hex(h)]},
            {"id": 4, "method": "eth_getStorageAt", "params": [store.contract, "0x1", hex(h)]},
            {"id": 5, "method": "feed_accounts", "params": [store.people, hex(h)]},
        ]
        status, body = core.answer("/", orjson.dumps(items))
        assert status == 200
        got = [r["result"] for r in orjson.loads(body)]
        assert int(got[0], 16) == model[store.people[0]].balance
        assert int(got[1], 16) == model[store.people[1]].nonce
        assert got[2] == "0x" + SUM_RUNTIME
        assert int(got[3], 16) == model[store.contract].storage.get(1, 0)
        assert got[4] == [[hex(model[p].balance), hex(model[p].nonce), "0x"] for p in store.people]


def test_core_errors(store: Any) -> None:
    core = FeedCore(store, 1337)

    def one(method: str, params: list[Any]) -> dict[str, Any]:
        body = orjson.dumps({"id": 1, "method": method, "params": params})
        return orjson.loads(core.answer("/", body)[1])

    assert one("eth_getBalance", [store.people[0], hex(HEIGHTS)])["error"]["code"] == -39006
    assert one("feed_accounts", [store.people, hex(HEIGHTS + 5)])["error"]["code"] == -39006
    assert one("eth_getBalance", ["0x12", "0x1"])["error"]["code"] == -32602
    assert one("feed_accounts", ["0x12", "0x1"])["error"]["code"] == -32602
    assert one("eth_sendTransaction", [])["error"]["code"] == -32601
    assert orjson.loads(core.answer("/", b"{nope")[1])["error"]["code"] == -32700
    assert core.answer("/o/unknown", b"{}")[0] == 404
    assert core.answer("/elsewhere", b"{}")[0] == 404


def test_core_overlay_applies_to_single_reads_and_feed_accounts(store: Any) -> None:
    core = FeedCore(store, 1337)
    who = store.people[2]
    core.overlays["t"] = Overlay(
        accounts={who: {"balance": 5, "code": b"\x60\x00"}},
        storage={store.contract: {3: 99}},
        replaced={store.contract},
    )
    h = hex(HEIGHTS - 1)
    items = [
        {"id": 1, "method": "eth_getBalance", "params": [who, h]},
        {"id": 2, "method": "feed_accounts", "params": [[who], h]},
        {"id": 3, "method": "eth_getStorageAt", "params": [store.contract, "0x3", h]},
        {"id": 4, "method": "eth_getStorageAt", "params": [store.contract, "0x1", h]},
    ]
    got = [r["result"] for r in orjson.loads(core.answer("/o/t", orjson.dumps(items))[1])]
    nonce = hex(store.chain.state(HEIGHTS - 1)[who].nonce)
    assert got[0] == "0x5"
    assert got[1] == [["0x5", nonce, "0x6000"]]
    assert int(got[2], 16) == 99
    assert int(got[3], 16) == 0  # replaced storage: unnamed slots read zero


# -- HTTP -------------------------------------------------------------------------------


async def _exchange(url: str, raw: bytes, reads: int = 1) -> list[bytes]:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(raw)
    answers = []
    for _ in range(reads):
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        answers.append(head + await reader.readexactly(length))
    closed = await reader.read() == b"" if b"connection: close" in answers[-1].lower() else None
    writer.close()
    answers.append(b"closed" if closed else b"open")
    return answers


@module_loop
async def test_http_keep_alive_close_and_refusals(store: Any) -> None:
    server, url = await serve(FeedCore(store, 1337))
    try:
        body = orjson.dumps({"id": 1, "method": "eth_chainId", "params": []})
        two = await _exchange(url, raw_post(body) + raw_post(body), reads=2)
        assert all(b"200 OK" in a and b'"result":"0x539"' in a for a in two[:2])
        assert two[2] == b"open"  # keep-alive: both answered on one connection
        closing = await _exchange(url, raw_post(body, b"connection: close\r\n"))
        assert closing[1] == b"closed"
        got = await _exchange(url, b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        assert b"405" in got[0]
        big = b"x" * (1024 * 1024 + 1)
        assert b"413" in (await _exchange(url, raw_post(big)))[0]
        assert b"400" in (await _exchange(url, b"NOT HTTP AT ALL\r\n\r\n"))[0]
        upgrade = b"GET / HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n"
        assert b"405" in (await _exchange(url, upgrade))[0]  # no protocol switch either
    finally:
        server.close()


# -- the feed process -------------------------------------------------------------------


@pytest_asyncio.fixture(loop_scope="module")
async def process(store: Any) -> AsyncIterator[FeedProcess]:
    exits: list[int] = []
    freed = lambda: exits.append(store.free_stale_readers())  # noqa: E731
    feed = FeedProcess(store.path, 64, 1337, on_exit=freed, retry_after=0.0)
    feed.exits = exits  # type: ignore[attr-defined]
    await feed.start()
    try:
        yield feed
    finally:
        await feed.stop()


@module_loop
async def test_process_serves_the_store_and_sees_new_blocks(
    store: Any, process: FeedProcess
) -> None:
    url = process.url_if_running()
    assert url is not None
    for h in range(HEIGHTS):
        got = await asyncio.to_thread(rpc, url, "feed_accounts", [store.people, hex(h)])
        model = store.chain.state(h)
        assert got["result"] == [
            [hex(model[p].balance), hex(model[p].nonce), "0x"] for p in store.people
        ]
        params = [store.contract, "0x2", hex(h)]
        slot = await asyncio.to_thread(rpc, url, "eth_getStorageAt", params)
        assert int(slot["result"], 16) == model[store.contract].storage.get(2, 0)
    # a block the node commits after the process opened the store is readable at once
    chain = store.chain
    chain.add_block({store.people[0]: {"balance": 424242}})
    store.apply(parse_vendor_block(chain.blocks[-1]))
    got = await asyncio.to_thread(rpc, url, "eth_getBalance", [store.people[0], hex(chain.head)])
    assert got["result"] == hex(424242)


@module_loop
async def test_process_restarts_after_it_dies(process: FeedProcess) -> None:
    first = process.url_if_running()
    assert first is not None and process._proc is not None
    os.kill(process._proc.pid, signal.SIGKILL)
    # noticed when its sentinel turns readable (the forkserver reports the exit)
    deadline = time.monotonic() + 5
    while process.url_if_running() is not None:  # the node falls back to the in-loop feed
        assert time.monotonic() < deadline, "the dead feed process was not noticed"
        await asyncio.sleep(0.01)
    assert len(process.exits) == 1  # type: ignore[attr-defined]  # its reader slots freed
    assert process._starting is not None
    await process._starting
    second = process.url_if_running()
    assert second is not None and second != first
    got = await asyncio.to_thread(rpc, second, "eth_chainId", [])
    assert got["result"] == "0x539"


@module_loop
async def test_process_ends_when_stopped(store: Any) -> None:
    feed = FeedProcess(store.path, 64, 1337)
    await feed.start()
    proc = feed._proc
    assert proc is not None and proc.is_alive()
    await feed.stop()
    assert not proc.is_alive()
    assert feed.url_if_running() is None  # stopped for good: no restart


@module_loop
async def test_process_reports_a_store_it_cannot_open(tmp_path: Path) -> None:
    feed = FeedProcess(tmp_path / "missing", 64, 1337)
    await feed.start()  # logged, not raised: the node keeps the in-loop feed
    assert feed._proc is None
    # requests meanwhile use the in-loop feed and do not try again at once (no spawn storm)
    assert feed.url_if_running() is None and feed._starting is None
    await feed.stop()


# -- EVM calls through both feeds -------------------------------------------------------


@module_loop
async def test_calls_equal_through_the_feed_process_and_the_loop(store: Any) -> None:
    """Every height: the sum of six slots as the model says, and the same gas on both."""
    answers = {}
    for feed in ("process", "loop"):
        methods = EvmMethods(store, EvmSettings(workers=1, feed=feed, call_timeout=10.0))
        await methods.start()
        try:
            if feed == "process":
                assert methods.feed.state_url() != methods.feed.url
            client = Client(methods)
            got = []
            for h in range(HEIGHTS):
                req = {"from": store.people[h % 3], "to": store.contract}
                out = await client.call("eth_multiCall", [[req], hex(h)])
                got.append(out[0])
            answers[feed] = got
        finally:
            await methods.close()
    assert answers["process"] == answers["loop"]
    for h, r in enumerate(answers["process"]):
        slots = store.chain.state(h)[store.contract].storage
        assert r["success"] and int(r["returnData"], 16) == sum(slots.values())
        assert int(r["gasUsed"], 16) > 6 * 2100  # six cold SLOADs


def test_settings_feed_choice() -> None:
    from chainstate.config import ConfigError

    assert EvmSettings.from_config({"feed": "loop"}).feed == "loop"
    with pytest.raises(ConfigError):
        EvmSettings.from_config({"feed": "thread"})
    assert EvmSettings().feed == "process"


# -- warm EVMs ----------------------------------------------------------------------------


@module_loop
async def test_a_block_stays_warm_on_one_worker(store: Any) -> None:
    """Calls at one block go to the worker that has it warm, not round-robin: a block's
    state is read from the feed once, not once per worker."""
    methods = EvmMethods(store, EvmSettings(workers=2))
    await methods.start()
    try:
        client = Client(methods)
        for h in (3, 3, 7, 3, 7, 7, 3, 3, 3, 7, 7, 7):
            await client.call("eth_call", [{"to": store.contract}, hex(h)])
        workers = methods.executor.pool.workers()
        for h in (3, 7):
            holding = [w for w in workers if any(k[1] == h for k in w.warm)]
            assert len(holding) == 1, h
    finally:
        await methods.close()


def sum_job(store: Any, url: str, height: int) -> dict[str, Any]:
    """A worker job: one call of the SUM contract at `height`, reading through `url`."""
    from nodes.state.evm.codec import block_env

    return {
        "kind": "calls",
        "fork_url": url,
        "height": height,
        "block": block_env(store.header(height)),
        "chain_id": 1337,
        "spec_id": "Cancun",
        "calls": [
            {"from": store.people[0], "to": store.contract, "data": b"", "value": 0,
             "gas": 1_000_000, "max_fee": 0, "tip": None, "nonce": None,
             "chain_id": None, "access_list": []}
        ],
    }  # fmt: skip


@module_loop
async def test_warm_evms_are_dropped_past_the_memory_limit(
    store: Any, process: FeedProcess
) -> None:
    from nodes.state.evm.worker import Limits, Runner

    url = process.url_if_running()
    assert url is not None
    job = sum_job(store, url, 4)
    results = []
    for memory in (0, 1):  # no limit; a limit every process is above
        runner = Runner(Limits(100, 10**6, 10**6, 10**6, 1000, warm_memory_bytes=memory), 8)
        results.append(await asyncio.to_thread(runner.run, job))
        assert len(runner._warm) == (1 if memory == 0 else 0)
    assert results[0] == results[1]
    assert int(results[0]["results"][0]["output"], 16) == sum(
        store.chain.state(4)[store.contract].storage.values()
    )


MAPPED_MB = 64


def _touch_mapped(path: Path) -> Any:
    """A file of MAPPED_MB mapped read-only with every page read, as a worker's reads map
    the LMDB store's pages into it; the map is returned (the pages stay mapped while it is
    open)."""
    import mmap

    path.write_bytes(b"\x01" * (MAPPED_MB << 20))
    with path.open("rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    assert sum(mapped[i] for i in range(0, len(mapped), mmap.PAGESIZE)) > 0
    return mapped


def _resident() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="Linux /proc")
def test_own_memory_counts_the_heap_not_mapped_file_pages(tmp_path: Path) -> None:
    from nodes.state.evm.worker import own_bytes

    own, resident = own_bytes(), _resident()
    mapped = _touch_mapped(tmp_path / "mapped")
    try:
        assert _resident() - resident >= (MAPPED_MB - 8) << 20  # resident, but not own
        assert own_bytes() - own < 8 << 20
        heap = bytearray(b"\x01" * (MAPPED_MB << 20))
        assert own_bytes() - own >= (MAPPED_MB - 8) << 20
        del heap
    finally:
        mapped.close()


@module_loop
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="Linux /proc")
async def test_warm_evms_stay_when_only_mapped_store_pages_pass_the_limit(
    store: Any, process: FeedProcess, tmp_path: Path
) -> None:
    """The pages of a big store a worker has read make its resident memory pass the limit
    while its own memory stays under it: its warm EVMs (and kept answers) stay."""
    from nodes.state.evm.worker import Limits, Runner, own_bytes

    url = process.url_if_running()
    assert url is not None
    mapped = _touch_mapped(tmp_path / "mapped")
    try:
        limit = own_bytes() + (MAPPED_MB // 2 << 20)
        assert _resident() > limit
        runner = Runner(Limits(100, 10**6, 10**6, 10**6, 1000, warm_memory_bytes=limit), 8)
        await asyncio.to_thread(runner.run, sum_job(store, url, 4))
        assert len(runner._warm) == 1
    finally:
        mapped.close()


def test_bench_evm_settings_reach_the_state_node(tmp_path: Path) -> None:
    """`chainstate bench suite call --evm warm_blocks=4` (how the cold path is measured
    alone) gives the benchmarked state node those [evm] settings."""
    import argparse

    from bench.suite import evm_config_args, parse_setting
    from nodes.state.cli import section_from_args
    from nodes.state.settings import StateSettings

    settings = dict(parse_setting(t) for t in ("warm_blocks=4", "feed=loop", "call_timeout=2.5"))
    args = evm_config_args(tmp_path, settings)
    ns = argparse.Namespace(
        config=args[1], key="bench-state", source="http://127.0.0.1:1", kind="archive",
        window=None, host=None, port=None, chain_id=None,
    )  # fmt: skip
    section = StateSettings.from_section(section_from_args(ns))
    evm = EvmSettings.from_config(section.evm)
    assert (evm.warm_blocks, evm.feed, evm.call_timeout) == (4, "loop", 2.5)
    assert evm_config_args(tmp_path, {}) == []
    with pytest.raises(argparse.ArgumentTypeError):
        parse_setting("warm_blocks")


@module_loop
@pytest.mark.parametrize("direct", [True, False], ids=["store", "feed"])
async def test_preloaded_slots_give_the_results_and_gas_of_lazy_reads(
    store: Any, process: FeedProcess, direct: bool
) -> None:
    """A worker learns the slots a call reads; at a new height it gives the new EVM those
    slots before the call (read from the store directly, or in one feed request). Output
    and gas (six cold SLOADs) equal a worker that reads every slot lazily."""
    from nodes.state.evm.worker import Limits, Runner

    url = process.url_if_running()
    assert url is not None

    def job(height: int) -> dict[str, Any]:
        out = sum_job(store, url, height)
        if direct:
            out["store"] = [str(copy), 64]
        return out

    copy = store.path.parent / "worker-copy"  # one LMDB env per path per process: a copy
    if direct and not copy.exists():
        copy.mkdir()
        store._env.copy(str(copy))
    limits = Limits(100, 10**6, 10**6, 10**6, 1000)
    learner = Runner(limits, 64)
    for height in range(1, HEIGHTS):
        lazy = await asyncio.to_thread(Runner(limits, 64).run, job(height))
        preloaded = await asyncio.to_thread(learner.run, job(height))
        assert preloaded == lazy, height
        want = sum(store.chain.state(height)[store.contract].storage.values())
        assert int(preloaded["results"][0]["output"], 16) == want
    assert len(learner._predicted(job(1)["calls"])) == 6  # the six slots the call reads


@module_loop
@pytest.mark.parametrize("direct", [True, False], ids=["store", "feed"])
async def test_a_balance_read_for_one_holder_is_preloaded_for_another(
    store: Any, process: FeedProcess, direct: bool
) -> None:
    """After a worker ran one balanceOf (a mapping entry keyed by the calldata's first word),
    a balanceOf of another holder at another height gets that holder's entry given before
    the call; output and gas (a cold SLOAD) equal a worker that reads it lazily, at every
    height and for every holder."""
    from nodes.state.evm.worker import Limits, Runner

    url = process.url_if_running()
    assert url is not None
    copy = store.path.parent / "worker-copy"  # one LMDB env per path per process: a copy
    if direct and not copy.exists():
        copy.mkdir()
        store._env.copy(str(copy))

    def job(height: int, holder: str) -> dict[str, Any]:
        out = sum_job(store, url, height)
        data = bytes.fromhex("70a08231") + bytes(12) + bytes.fromhex(holder[2:])
        out["calls"][0] = {**out["calls"][0], "to": TOKEN, "data": data}
        if direct:
            out["store"] = [str(copy), 64]
        return out

    limits = Limits(100, 10**6, 10**6, 10**6, 1000)
    learner = Runner(limits, 64)
    first, other = store.people[0], store.people[1]
    learner.run(job(2, first))
    assert learner._predicted(job(5, other)["calls"]) == [(TOKEN, balance_slot(other))]
    for height in range(1, HEIGHTS):
        for holder in store.people:
            lazy = await asyncio.to_thread(Runner(limits, 64).run, job(height, holder))
            preloaded = await asyncio.to_thread(learner.run, job(height, holder))
            assert preloaded == lazy, (height, holder)
            want = store.chain.state(height)[TOKEN].storage[balance_slot(holder)]
            assert int(preloaded["results"][0]["output"], 16) == want


@module_loop
async def test_calls_at_many_heights_at_once_answer_each_its_own_state(store: Any) -> None:
    """Concurrent single calls at different heights are sent to a worker together (one job
    of several blocks); each still answers its own block's state."""
    methods = EvmMethods(store, EvmSettings(workers=1))
    await methods.start()
    try:
        client = Client(methods)
        heights = [h for _ in range(4) for h in range(1, HEIGHTS)]
        answers = await asyncio.gather(
            *(client.call("eth_call", [{"to": store.contract}, hex(h)]) for h in heights)
        )
        for h, answer in zip(heights, answers, strict=True):
            want = sum(store.chain.state(h)[store.contract].storage.values())
            assert int(answer, 16) == want, h
    finally:
        await methods.close()


@module_loop
async def test_a_killed_worker_frees_its_store_reader_slots(store: Any) -> None:
    """Workers read the store directly; one killed past its time limit (perhaps inside a
    read transaction) is followed by a check that frees dead readers' LMDB slots."""
    settings = EvmSettings(workers=1, call_timeout=0.5, gas_cap=2**62)
    methods = EvmMethods(store, settings)
    assert methods.executor.pool.on_replace == store.free_stale_readers
    freed: list[int] = []
    methods.executor.pool.on_replace = lambda: freed.append(store.free_stale_readers())
    await methods.start()
    try:
        client = Client(methods)
        loop = "0x" + "5b600056"  # JUMPDEST PUSH1 0 JUMP: runs until killed
        target = "0x" + "6f" * 20
        call = [{"to": target}, "latest", {target: {"code": loop}}, {"gasLimit": hex(2**62)}]
        answer = await client.raw("eth_call", call)
        assert answer["error"]["code"] == -39004
        assert "time limit" in answer["error"]["message"]
        assert len(freed) == 1
    finally:
        await methods.close()


@module_loop
async def test_the_same_call_twice_in_a_job_runs_once_with_the_same_answer(
    store: Any, process: FeedProcess
) -> None:
    """Calls of one job run on the block's state and are undone, so a call repeated in the
    job (clients polling one view at the head, coalesced) runs once; each position still
    gets the answer the call has alone, a failure included."""
    from nodes.state.evm.worker import Limits, Runner

    url = process.url_if_running()
    assert url is not None
    job = sum_job(store, url, 4)
    call = job["calls"][0]
    starved = {**call, "gas": 21_100}  # out of gas after the intrinsic cost
    limits = Limits(100, 10**6, 10**6, 10**6, 1000)
    alone = [
        (await asyncio.to_thread(Runner(limits, 8).run, {**job, "calls": [c]}))["results"][0]
        for c in (call, starved)
    ]
    runner = Runner(limits, 8)
    ran: list[int] = []
    isolated = runner._isolated
    runner._isolated = lambda evm, c, *key: ran.append(c["gas"]) or isolated(evm, c, *key)  # type: ignore[method-assign]
    calls = [call, dict(call), starved, dict(call), dict(starved)]
    answer = await asyncio.to_thread(runner.run, {**job, "calls": calls})
    expected = [alone[0], alone[0], alone[1], alone[0], alone[1]]
    assert answer["results"] == expected
    assert alone[1]["ok"] is False and alone[0]["ok"] is True
    assert ran == [call["gas"], starved["gas"]]

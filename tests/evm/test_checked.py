"""EVMs in memory (nodes/state/evm/checked.py): a worker reading the store directly runs a
block's first calls on an EVM holding only what it was given, and its answers equal those of
fork-mode EVMs reading every value lazily through the feed process, for calls that read
what no prediction gave them, call other code, read a block hash or revert."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from nodes.state.evm.checked import Checkable, journal_accounts, reads_block_hash
from nodes.state.evm.codec import block_env
from nodes.state.evm.feedproc import FeedProcess
from nodes.state.evm.worker import Limits, Runner
from nodes.state.store import StateStore
from nodes.state.vendor import parse_vendor_block
from tests.nodes.test_state_chain import SyntheticChain, make_addresses

module_loop = pytest.mark.asyncio(loop_scope="module")

RETURN_WORD = "60005260206000f3"  # MSTORE at 0, RETURN 32 bytes
POINTER = "6000545454" + RETURN_WORD  # SLOAD(SLOAD(SLOAD(0))): each read names the next
PEEK = "60003531" + RETURN_WORD  # BALANCE(the calldata's first word)
HASH = "6001430340" + RETURN_WORD  # BLOCKHASH(NUMBER - 1)
FAIL = "600154600052" + "60206000fd"  # REVERT with SLOAD(1)
HEIGHTS = 10
POINTER_AT, PEEK_AT, HASH_AT, FAIL_AT, PROXY_AT = make_addresses(5, "checked")


def proxy(target: str) -> str:
    """STATICCALL `target` with no calldata and return its first word."""
    return "602060006000600073" + target[2:] + "5afa50" + "60206000f3"


def make_chain() -> tuple[SyntheticChain, list[str]]:
    """Contracts whose slots change block after block (POINTER's chain of three reads goes
    elsewhere at each height), and accounts whose balances change."""
    people = make_addresses(3, "checked-people")
    chain = SyntheticChain("checked")
    chain.add_block(
        {
            POINTER_AT: {"code": bytes.fromhex(POINTER), "storage": {0: 1, 1: 2, 2: 3}},
            PEEK_AT: {"code": bytes.fromhex(PEEK)},
            HASH_AT: {"code": bytes.fromhex(HASH)},
            FAIL_AT: {"code": bytes.fromhex(FAIL), "storage": {1: 9}},
            PROXY_AT: {"code": bytes.fromhex(proxy(POINTER_AT))},
            **{p: {"balance": 10**18 * (i + 1)} for i, p in enumerate(people)},
        }
    )
    for h in range(1, HEIGHTS):
        first, second = 10 + h, 100 + h
        chain.add_block(
            {
                POINTER_AT: {"storage": {0: first, first: second, second: 7 * h}},
                FAIL_AT: {"storage": {1: h}},
                people[h % 3]: {"balance": 10**18 + h},
            }
        )
    return chain, people


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    chain, people = make_chain()
    root = tmp_path_factory.mktemp("checked")
    st = StateStore(root / "lmdb", kind="archive", map_size_mb=64)
    st.open()
    for raw in chain.blocks:
        st.apply(parse_vendor_block(raw))
    copy = root / "worker-copy"  # one LMDB env per path per process: the worker's reads a copy
    copy.mkdir()
    st._env.copy(str(copy))  # type: ignore[union-attr]
    st.chain, st.people, st.copy = chain, people, copy  # type: ignore[attr-defined]
    yield st
    st.close()


@pytest_asyncio.fixture(loop_scope="module")
async def url(store: Any) -> AsyncIterator[str]:
    feed = FeedProcess(store.path, 64, 1337, retry_after=0.0)
    await feed.start()
    try:
        found = feed.url_if_running()
        assert found is not None
        yield found
    finally:
        await feed.stop()


def call(to: str, data: bytes = b"") -> dict[str, Any]:
    return {"from": "0x" + "00" * 19 + "aa", "to": to, "data": data, "value": 0,
            "gas": 1_000_000, "max_fee": 0, "tip": None, "nonce": None, "chain_id": None,
            "access_list": []}  # fmt: skip


def job(store: Any, url: str, height: int, calls: list[dict[str, Any]], direct: bool) -> Any:
    out = {
        "kind": "calls", "fork_url": url, "height": height,
        "block": block_env(store.header(height)), "chain_id": 1337, "spec_id": "Cancun",
        "calls": calls,
    }  # fmt: skip
    if direct:
        out["store"] = [str(store.copy), 64]
    return out


def word(result: dict[str, Any]) -> int:
    assert result["ok"], result
    return int(result["output"], 16)


@module_loop
async def test_answers_on_evms_in_memory_equal_lazy_reads(store: Any, url: str) -> None:
    """Per height: POINTER's reads (each named by the one before, so a prediction learnt at
    another height misses) and BALANCE of an account no call named run on the EVM in
    memory; a reverting call, a call reading BLOCKHASH and one calling other code, sent
    after them to the same block, run on fork-mode EVMs. Every answer (output, gas, revert
    data) equals a worker reading everything lazily through the feed, and the model."""
    limits = Limits(100, 10**6, 10**6, 10**6, 1000)
    checked = Runner(limits, 64)
    people = store.people
    for height in range(1, HEIGHTS):
        lazy = Runner(limits, 64)  # no store: fork-mode EVMs reading through the feed
        model = store.chain.state(height)
        holder = people[(height + 1) % 3]
        plain = [call(POINTER_AT), call(PEEK_AT, bytes(12) + bytes.fromhex(holder[2:]))]
        for calls in (plain, [call(FAIL_AT)], [call(HASH_AT)], [call(PROXY_AT)]):
            got = await asyncio.to_thread(checked.run, job(store, url, height, calls, True))
            want = await asyncio.to_thread(lazy.run, job(store, url, height, calls, False))
            assert got == want, (height, calls[0]["to"])
            if calls is plain:
                key = next(reversed(checked._warm))
                assert checked._warm[key].checked  # (the block's first job: in memory)
                pointer = model[POINTER_AT].storage
                assert word(got["results"][0]) == pointer[pointer[pointer[0]]] == 7 * height
                assert word(got["results"][1]) == model[holder].balance
        assert not checked._warm[next(reversed(checked._warm))].checked
        hash_call = await asyncio.to_thread(
            checked.run, job(store, url, height, [call(HASH_AT)], True)
        )
        assert word(hash_call["results"][0]) == int(store.header(height - 1).hash, 16)
        failed = await asyncio.to_thread(
            checked.run, job(store, url, height, [call(FAIL_AT)], True)
        )
        assert not failed["results"][0]["ok"]
        assert int(failed["results"][0]["error"]["data"], 16) == height


def test_checkable_codes_run_only_themselves_and_read_no_block_hash() -> None:
    check = Checkable()
    assert check(bytes.fromhex(POINTER)) and check(bytes.fromhex(PEEK)) and check(b"")
    assert not check(bytes.fromhex(HASH))
    assert not check(bytes.fromhex(proxy(POINTER_AT)))
    assert not reads_block_hash(bytes.fromhex("6040" + RETURN_WORD))  # 0x40 as PUSH data
    assert check(bytes.fromhex("6040" + RETURN_WORD))


def test_journal_accounts_name_each_account_and_its_storage() -> None:
    """From pyrevm's journal text: every account a call loaded, with its slots' text."""
    from pyrevm import EVM, AccountInfo, BlockEnv, CfgEnv, Env

    block = BlockEnv(number=5, coinbase="0x" + "11" * 20, timestamp=1, prevrandao=b"\0" * 32)
    evm = EVM(env=Env(cfg=CfgEnv(chain_id=1), block=block), spec_id="Cancun")
    evm.insert_account_info(POINTER_AT, AccountInfo(0, 1, None, bytes.fromhex(POINTER)))
    checkpoint = evm.snapshot()
    evm.message_call("0x" + "00" * 19 + "aa", POINTER_AT, b"", 0, 100_000, 0, True)
    journal = evm.journal_str
    found = {address: journal[start:end] for address, start, end in journal_accounts(journal)}
    assert set(found) == {"0x" + "11" * 20, "0x" + "00" * 19 + "aa", POINTER_AT}
    assert found["0x" + "11" * 20] == ""
    assert found[POINTER_AT].startswith("0: ")  # SLOAD(0) read 0, then SLOAD(0) again
    evm.revert(checkpoint)


def test_journal_text_of_another_shape_is_refused() -> None:
    from nodes.state.evm.checked import JournalText

    with pytest.raises(JournalText):
        journal_accounts("JournaledState { state: {x, storage: {1: 2}, status: 0} }")

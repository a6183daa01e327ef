"""Units without a chain: settings, BSRB/1 codec, revert decoding, error classification."""

from __future__ import annotations

import os

import pytest
from Crypto.Hash import keccak
from pyrevm import AccountInfo

from chainstate.config import ConfigError
from nodes.state.evm import bsrb
from nodes.state.evm.basefee import CLEAN, SUSPECT, UNSURE, BasefeeCheck, code_may_read_basefee
from nodes.state.evm.codec import apply_block_overrides, parse_call, parse_state_override
from nodes.state.evm.settings import EvmSettings
from nodes.state.evm.worker import TraceSink, classify, decode_revert


def test_settings_defaults_and_overrides() -> None:
    s = EvmSettings.from_config({"gas_cap": 1000, "call_timeout": 2, "workers": 3})
    assert (s.gas_cap, s.call_timeout, s.worker_count) == (1000, 2, 3)
    assert EvmSettings().worker_count >= 1


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_default_workers_are_the_cores_the_node_may_use() -> None:
    """A node pinned to one core (taskset, a cpuset) starts one worker by default, not one
    per core of the machine; a `workers` setting is kept as it is."""
    cpus = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(cpus)})
        assert EvmSettings().worker_count == 1
        assert EvmSettings(workers=3).worker_count == 3
    finally:
        os.sched_setaffinity(0, cpus)
    assert EvmSettings().worker_count == len(cpus)


def test_a_node_with_fewer_workers_keeps_as_many_warm_blocks() -> None:
    """By default a worker keeps 256 warm blocks, and a node's workers at least 512 in all:
    one worker (a node given one core) keeps the 512 that two kept; `warm_blocks` given is
    each worker's, whatever their number."""
    assert EvmSettings(workers=1).worker_warm_blocks == 512
    assert EvmSettings(workers=2).worker_warm_blocks == 256
    assert EvmSettings(workers=8).worker_warm_blocks == 256
    assert EvmSettings(workers=1, warm_blocks=4).worker_warm_blocks == 4
    assert EvmSettings.from_config({"warm_blocks": 300}).worker_warm_blocks == 300


@pytest.mark.parametrize(
    "cfg",
    [
        {"gas_kap": 1},
        {"gas_cap": "1"},
        {"gas_cap": True},
        {"call_timeout": -1},
        {"coalesce_max": 0},
        {"spec_id": "cancun"},
    ],
)
def test_settings_rejects_bad_values(cfg: dict) -> None:
    with pytest.raises(ConfigError):
        EvmSettings.from_config(cfg)


def test_bsrb_round_trip() -> None:
    reads = [
        bsrb.Read(bsrb.BALANCE, "0x" + "11" * 20),
        bsrb.Read(bsrb.STORAGE, "0x" + "22" * 20, 2**255 + 7),
        bsrb.Read(bsrb.CODE, "0x" + "33" * 20),
        bsrb.Read(bsrb.NONCE, "0x" + "44" * 20),
    ]
    for height in (None, 0, 12345):
        req = bsrb.decode_request(bsrb.encode_request(height, reads), 10)
        assert (req.height, req.reads) == (height, reads)
    values = [(1, 10**30), (4, 5), (3, b"\x60\x00"), (2, 9)]
    data = bsrb.encode_response(7, "0x" + "ab" * 32, values)
    assert bsrb.decode_response(data) == (7, "0x" + "ab" * 32, values)


def test_bsrb_limit() -> None:
    payload = bsrb.encode_request(1, [bsrb.Read(bsrb.BALANCE, "0x" + "11" * 20)] * 3)
    with pytest.raises(bsrb.BsrbError, match="at most 2"):
        bsrb.decode_request(payload, 2)


def test_decode_revert() -> None:
    msg = b"nope"
    error = (
        bytes.fromhex("08c379a0")
        + (32).to_bytes(32, "big")
        + len(msg).to_bytes(32, "big")
        + msg.ljust(32, b"\0")
    )
    assert decode_revert(error) == "nope"
    assert decode_revert(bytes.fromhex("4e487b71") + (0x12).to_bytes(32, "big")) == (
        "panic: division or modulo by zero (0x12)"
    )
    assert decode_revert(b"\x01\x02") is None
    assert decode_revert(bytes.fromhex("08c379a0") + b"\xff" * 64) is None


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("Revert { gas_used: 100, output: 0x }", -39000),
        ("Halt { reason: OutOfGas(Basic), gas_used: 5 }", -39001),
        ("Halt { reason: OpcodeNotFound, gas_used: 5 }", -39004),
        ("Halt { reason: PrecompileError, gas_used: 5 }", -39004),
        (
            "Initial gas spend is 21572 but gas limit is 100. Error: CallGasCostMoreThanGasLimit",
            -39001,
        ),
        ("Transaction(LackOfFundForMaxFee { fee: 1, balance: 0 })", -39002),
        ("Transaction(NonceTooHigh { tx: 5, state: 1 })", -39003),
        (
            "Database(PyErr { value: RuntimeError('JsonRpcClientError(JsonRpcError(JsonRpcError "
            '{ code: -39005, message: "db down", data: None }))\') })',
            -39005,
        ),
        (
            "Database(PyErr { value: RuntimeError('JsonRpcClientError(JsonRpcError(JsonRpcError "
            '{ code: -39006, message: "block 5 is out of range", data: None }))\') })',
            -39006,
        ),
        ("Database(PyErr { value: RuntimeError('error sending request for url') })", -39005),
    ],
)
def test_classify(text: str, code: int) -> None:
    assert classify(RuntimeError(text)).error["code"] == code


def test_call_object_rules() -> None:
    call = parse_call({"to": "0x" + "ab" * 20, "gas": "0xffffffff", "input": "0x01"}, 1000)
    assert call["gas"] == 1000  # clamped to the cap
    assert call["from"] == "0x" + "00" * 20
    assert call["data"] == b"\x01"
    assert (call["max_fee"], call["tip"]) == (0, None)
    with pytest.raises(Exception, match="differ"):
        parse_call({"to": "0x" + "ab" * 20, "data": "0x01", "input": "0x02"}, 1000)
    with pytest.raises(Exception, match="greater than maxFeePerGas"):
        parse_call({"to": "0x" + "ab" * 20, "maxPriorityFeePerGas": "0x1"}, 1000)
    with pytest.raises(Exception, match="32-byte"):
        parse_call(
            {
                "to": "0x" + "ab" * 20,
                "accessList": [{"address": "0x" + "ab" * 20, "storageKeys": ["0x01"]}],
            },
            1000,
        )


@pytest.mark.parametrize(
    ("fields", "basefee", "price"),
    [
        ({}, 7, 0),
        ({"gasPrice": "0x5"}, 7, 5),  # legacy: below the base fee it still runs
        ({"maxFeePerGas": "0x1000"}, 7, 0x1000),  # no priority fee: the max fee
        ({"maxFeePerGas": "0x1000", "maxPriorityFeePerGas": "0x3"}, 7, 0xA),
        ({"maxFeePerGas": "0x9", "maxPriorityFeePerGas": "0x3"}, 7, 9),
        ({"gasPrice": "0x1", "maxFeePerGas": "0x1000", "maxPriorityFeePerGas": "0x3"}, 7, 0xA),
        ({"maxPriorityFeePerGas": "0x0"}, 7, 0),
    ],
)
def test_effective_price_as_anvil(fields: dict[str, str], basefee: int, price: int) -> None:
    from nodes.state.evm.codec import effective_price

    call = parse_call({"to": "0x" + "ab" * 20, **fields}, 1000)
    assert effective_price(call, basefee) == price


def test_overrides_parse() -> None:
    a = "0x" + "ab" * 20
    ov = parse_state_override({a: {"balance": "0x10", "state": {"0x1": "0x2"}}})
    assert ov is not None
    assert ov.accounts[a] == {"balance": 16}
    assert ov.storage[a] == {1: 2}
    assert a in ov.replaced
    env = {"number": 1, "timestamp": 2, "gas_limit": 3, "coinbase": a}
    out = apply_block_overrides(env, {"number": "0x5", "feeRecipient": "0x" + "cd" * 20})
    assert out["number"] == 5 and out["coinbase"] == "0x" + "cd" * 20
    assert env["number"] == 1


def test_trace_sink_limits() -> None:
    sink = TraceSink(max_steps=2, max_bytes=10_000)
    step = '{"pc":0,"op":96,"gas":"0x10","gasCost":"0x3","stack":[],"depth":2,"opName":"PUSH1"}\n'
    sink.write(step)
    sink.write(step)
    assert [s["depth"] for s in sink.struct_logs()] == [1, 1]
    with pytest.raises(Exception, match="limit"):
        sink.write(step)
        sink.write(step)
    assert sink.overflow


def test_touched_accounts_are_coinbase_callers_and_callees_once_and_bounded() -> None:
    from nodes.state.evm.worker import PRELOAD_ACCOUNTS, touched_accounts

    coinbase, a, b = "0x" + "0C" * 20, "0x" + "aa" * 20, "0x" + "bb" * 20
    calls = [{"from": a, "to": b}, {"from": b, "to": None}, {"from": "0x" + "AA" * 20, "to": a}]
    job = {"block": {"coinbase": coinbase}, "calls": calls}
    assert touched_accounts(job) == [coinbase.lower(), a, b]
    many = [{"from": f"0x{i:040x}", "to": None} for i in range(200)]
    assert len(touched_accounts({"block": {"coinbase": coinbase}, "calls": many})) == (
        PRELOAD_ACCOUNTS
    )


def _info(code: bytes) -> AccountInfo:
    return AccountInfo(0, 0, keccak.new(digest_bits=256, data=code).digest(), code)


def test_basefee_verdicts() -> None:
    """BASEFEE/CREATE/CREATE2 as instructions make a code suspect, not as PUSH data; a
    suspect code only in the database cache (not in the call's journal) is unsure."""
    reads = bytes.fromhex("4860005260206000f3")  # BASEFEE, MSTORE, RETURN
    in_push = bytes.fromhex("6048" + "7f" + "f5" * 32 + "00")  # PUSH1 0x48, PUSH32 f5…
    assert code_may_read_basefee(reads)
    assert not code_may_read_basefee(in_push)
    assert code_may_read_basefee(bytes.fromhex("600060006000f0"))  # CREATE
    check = BasefeeCheck()
    clean, suspect = {"0x01": _info(in_push)}, {"0x02": _info(reads)}
    assert check.verdict(clean, clean, None) == CLEAN
    assert check.verdict({**clean, **suspect}, suspect, None) == SUSPECT
    assert check.verdict({**clean, **suspect}, clean, None) == UNSURE
    assert check.verdict({}, {}, reads) == SUSPECT  # a creation whose init code reads it
    assert check.verdict(clean, clean, in_push) == CLEAN


def test_a_code_that_runs_no_other_code_is_judged_alone() -> None:
    """A callee without CALL- or CREATE-family instructions decides the verdict by itself;
    one that could run other code (or 0xEF code) is left to the run (None)."""
    check = BasefeeCheck()
    assert check.alone(bytes.fromhex("4860005260206000f3")) == SUSPECT  # BASEFEE, RETURN
    assert check.alone(bytes.fromhex("6048" + "7f" + "f1" * 32 + "00")) == CLEAN  # as data
    assert check.alone(b"") == CLEAN  # an account without code (or a precompile)
    for op in ("f0", "f1", "f2", "f4", "f5", "fa"):  # CREATE, CALL, …, CREATE2, STATICCALL
        assert check.alone(bytes.fromhex("6000600060006000600060005a" + op + "00")) is None
    assert check.alone(bytes.fromhex("ef0100" + "11" * 20)) is None  # a delegation
    assert check.alone(bytes.fromhex("4860005260206000f3")) == SUSPECT  # (kept verdict)


async def test_an_overrun_job_answers_its_own_culprit_and_queues_the_others() -> None:
    """A combined job stopped at its time limit: the call it was running, having run the
    whole limit, is answered -39004 with data.reason `time_limit` (final: never run again);
    the calls that only shared its time wait again at the head of the queue, in order. A
    call cut short (the others ate its time) waits again first, with the limit to itself."""
    import asyncio

    from nodes.state.evm.executor import Executor
    from nodes.state.evm.pool import Overrun

    executor = Executor(EvmSettings(workers=1))
    loop = asyncio.get_running_loop()
    block = {"hash": "0x" + "11" * 32, "gas_limit": 30_000_000}

    def items(n: int) -> list:
        job = executor.job("calls", "inproc://feed", 5, block, [{}])
        return [(job, loop.create_future()) for _ in range(n)]

    def queued() -> list:
        return [future for waiting in executor._pending.values() for _, future in waiting]

    try:
        first = items(3)
        executor._after_failure(first, Overrun(1.0, running=1, ran=0.95))
        culprit = first[1][1].exception()
        assert culprit.code == -39004 and culprit.data == {"reason": "time_limit", "seconds": 1.0}
        assert queued() == [first[0][1], first[2][1]]
        assert executor._pending_count == 2
        cut = items(2)
        executor._after_failure(cut, Overrun(1.0, running=1, ran=0.3))
        assert queued() == [cut[1][1], cut[0][1], first[0][1], first[2][1]]
        assert not any(future.done() for future in queued())
    finally:
        for task in list(executor._tasks):
            task.cancel()
        await executor.close()


def test_the_journal_names_each_slot_a_call_read_or_wrote() -> None:
    """`storage_read` and `writes_of` find every slot in pyrevm's journal text, per account,
    with the value it holds after the calls (accounts with analysed code and without)."""
    from pyrevm import EVM, BlockEnv, CfgEnv, Env

    from nodes.state.evm.worker import storage_read, writes_of

    # SSTORE(calldata word + 1, SLOAD(calldata word))
    copy = bytes.fromhex("600035805490600101550000")
    block = BlockEnv(number=5, coinbase="0x" + "11" * 20, timestamp=1, prevrandao=b"\0" * 32)
    evm = EVM(env=Env(cfg=CfgEnv(chain_id=1), block=block), spec_id="Cancun")
    one, two, caller = "0x" + "22" * 20, "0x" + "33" * 20, "0x" + "44" * 20
    for address, slot, value in ((one, 7, 99), (two, 3, 5)):
        evm.insert_account_info(address, _info(copy))
        evm.insert_account_storage(address, slot, value)
    checkpoint = evm.snapshot()
    evm.message_call(caller, one, (7).to_bytes(32, "big"), 0, 100_000, 0, False)
    evm.message_call(caller, two, (3).to_bytes(32, "big"), 0, 100_000, 0, False)
    assert sorted(storage_read(evm.journal_str)) == [(one, 7), (one, 8), (two, 3), (two, 4)]
    assert writes_of(evm)["slots"] == {one: {7: 99, 8: 99}, two: {3: 5, 4: 5}}
    evm.revert(checkpoint)
    assert storage_read(evm.journal_str) == []

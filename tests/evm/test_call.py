"""eth_call and its errors, differential against anvil at historical blocks of the workload."""

from __future__ import annotations

import asyncio
import time

import pytest

from chainstate.jsonrpc import JsonRpcError
from nodes.state.evm import bsrb
from tests.evm.conftest import A0, A1, A2, Chain, Client, rpc, rpc_raw

pytestmark = pytest.mark.asyncio(loop_scope="module")


def balance_of(holder: str) -> str:
    return "0x70a08231" + holder[2:].rjust(64, "0")


def transfer(to: str, amount: int) -> str:
    return "0xa9059cbb" + to[2:].rjust(64, "0") + f"{amount:064x}"


async def test_erc20_balance_equals_anvil_at_every_block(evm: Client, chain: Chain) -> None:
    holders = [*chain.holders, A0, A2]
    for height in range(chain.erc20_block, chain.head + 1):
        for holder in holders:
            req = {"to": chain.erc20, "data": balance_of(holder)}
            ours = await evm.call("eth_call", [req, hex(height)])
            assert ours == rpc(chain.url, "eth_call", [req, hex(height)]), (height, holder)


async def test_nested_call_equals_anvil(evm: Client, chain: Chain) -> None:
    for height in (hex(chain.head - 1), "latest"):
        for data in (balance_of(A1), transfer(A1, 10**30)):
            req = {"from": A0, "to": chain.forwarder, "data": data}
            assert await evm.call("eth_call", [req, height]) == rpc(
                chain.url, "eth_call", [req, height]
            )


async def test_contract_creation_equals_anvil(evm: Client, chain: Chain) -> None:
    """A call without `to` runs the init code and answers the deployed code (geth's rule)."""
    from tests.evm.conftest import COUNTER_RUNTIME, init_code

    req = {"from": A0, "data": init_code(COUNTER_RUNTIME)}
    ours = await evm.call("eth_call", [req, "latest"])
    assert ours == rpc(chain.url, "eth_call", [req, "latest"]) == "0x" + COUNTER_RUNTIME
    reverting = {"from": A0, "data": "0x60006000fd"}
    with pytest.raises(JsonRpcError) as exc:
        await evm.call("eth_call", [reverting, "latest"])
    assert exc.value.code == -39000


async def test_latest_and_by_hash(evm: Client, chain: Chain) -> None:
    req = {"to": chain.erc20, "data": balance_of(A2)}
    expected = rpc(chain.url, "eth_call", [req, "latest"])
    assert await evm.call("eth_call", [req, "latest"]) == expected
    assert await evm.call("eth_call", [req]) == expected
    block = rpc(chain.url, "eth_getBlockByNumber", [hex(chain.head - 1), False])
    by_hash = await evm.call("eth_call", [req, {"blockHash": block["hash"]}])
    assert by_hash == rpc(chain.url, "eth_call", [req, hex(chain.head - 1)])
    assert by_hash != expected  # A2 received tokens in the last block


async def test_block_env_opcodes(evm: Client, chain: Chain) -> None:
    """NUMBER, TIMESTAMP, BASEFEE, COINBASE, GASLIMIT, CHAINID, PREVRANDAO, BLOCKHASH equal
    anvil's (BASEFEE through py-evm: nodes/state/evm/basefee.py; test_blockenv.py has the
    rest)."""
    height = hex(chain.head - 2)
    req = {"to": chain.env, "data": "0x"}
    ours = await evm.call("eth_call", [req, height])
    assert ours == rpc(chain.url, "eth_call", [req, height])
    assert len(ours) == 2 + 8 * 64


async def test_revert_reason_and_data_equal_anvil(evm: Client, chain: Chain) -> None:
    req = {"from": A1, "to": chain.erc20, "data": transfer(A0, 10**30)}
    with pytest.raises(JsonRpcError) as exc:
        await evm.call("eth_call", [req, "latest"])
    theirs = rpc_raw(chain.url, "eth_call", [req, "latest"])["error"]
    assert exc.value.code == -39000
    assert exc.value.data == theirs["data"]
    assert exc.value.message == theirs["message"]
    assert "ERC20: transfer amount exceeds balance" in exc.value.message


async def test_panic_is_decoded(evm: Client, chain: Chain) -> None:
    with pytest.raises(JsonRpcError) as exc:
        await evm.call("eth_call", [{"to": chain.panic}, "latest"])
    assert exc.value.code == -39000
    assert exc.value.data == "0x4e487b71" + "11".rjust(64, "0")
    assert "arithmetic underflow or overflow (0x11)" in exc.value.message


async def test_out_of_gas_is_39001(evm: Client, chain: Chain) -> None:
    with pytest.raises(JsonRpcError) as exc:
        await evm.call("eth_call", [{"to": chain.loop}, "latest"])
    assert exc.value.code == -39001
    with pytest.raises(JsonRpcError) as exc:
        await evm.call("eth_call", [{"to": chain.erc20, "gas": "0x5000"}, "latest"])
    assert exc.value.code == -39001
    assert "intrinsic gas" in exc.value.message


async def test_balance_exhausted(evm: Client, chain: Chain) -> None:
    req = {"from": A1, "to": A2, "value": hex(10**30)}
    with pytest.raises(JsonRpcError) as exc:
        await evm.call("eth_call", [req, "latest"])
    assert exc.value.code == -39002
    assert "code" in rpc_raw(chain.url, "eth_call", [req, "latest"])["error"]
    priced = {"from": A1, "to": chain.erc20, "data": balance_of(A1), "gasPrice": hex(10**18)}
    with pytest.raises(JsonRpcError) as exc:
        await evm.call("eth_call", [priced, "latest"])
    assert exc.value.code == -39002


async def test_gas_price_given_is_charged_check_only(evm: Client, chain: Chain) -> None:
    req = {"from": A0, "to": chain.erc20, "data": balance_of(A0), "gasPrice": "0x1"}
    ours = await evm.call("eth_call", [req, "latest"])
    assert ours == rpc(chain.url, "eth_call", [req, "latest"])


async def test_from_a_contract_is_a_clear_error(evm: Client, chain: Chain) -> None:
    """geth and anvil skip EIP-3607 in eth_call; pyrevm cannot: a clear -39004."""
    answer = await evm.raw("eth_call", [{"from": chain.erc20, "to": A0}, "latest"])
    assert answer["error"]["code"] == -39004
    assert "EIP-3607" in answer["error"]["message"]


async def test_return_size_limit(evm: Client, chain: Chain) -> None:
    with pytest.raises(JsonRpcError) as exc:
        await evm.call("eth_call", [{"to": chain.bigret}, "latest"])
    assert exc.value.code == -39004
    assert "exceeds" in exc.value.message


async def test_state_override_equals_anvil(evm: Client, chain: Chain) -> None:
    slot = (
        "0x"
        + (__import__("nodes.devnet.workload", fromlist=["mapping_slot"]).mapping_slot(A1, 0)[2:])
    )
    overrides = {
        chain.erc20: {"stateDiff": {slot: "0x" + f"{12345:064x}"}},
        A1: {"balance": "0xde0b6b3a7640000"},
    }
    req = {"to": chain.erc20, "data": balance_of(A1)}
    ours = await evm.call("eth_call", [req, "latest", overrides])
    assert ours == rpc(chain.url, "eth_call", [req, "latest", overrides])
    assert int(ours, 16) == 12345
    code_ov = {chain.loop: {"code": "0x" + "602a60005260206000f3"}}  # return 42
    ours = await evm.call("eth_call", [{"to": chain.loop}, "latest", code_ov])
    assert int(ours, 16) == 42
    assert ours == rpc(chain.url, "eth_call", [{"to": chain.loop}, "latest", code_ov])
    # the override did not leak into later calls (the warm state is as of the block)
    plain = await evm.call("eth_call", [req, "latest"])
    assert plain == rpc(chain.url, "eth_call", [req, "latest"])


async def test_full_storage_override_equals_anvil(evm: Client, chain: Chain) -> None:
    """`state` replaces the whole storage: every other holder reads zero."""
    from nodes.devnet.workload import mapping_slot

    overrides = {chain.erc20: {"state": {mapping_slot(A1, 0): "0x" + f"{5:064x}"}}}
    for holder, want in [(A1, 5), (A0, 0)]:
        req = {"to": chain.erc20, "data": balance_of(holder)}
        ours = await evm.call("eth_call", [req, "latest", overrides])
        assert ours == rpc(chain.url, "eth_call", [req, "latest", overrides])
        assert int(ours, 16) == want


async def test_block_overrides(evm: Client, chain: Chain) -> None:
    ov = {"number": "0x3e8", "time": "0x1234", "gasLimit": "0x2faf080"}
    out = bytes.fromhex((await evm.call("eth_call", [{"to": chain.env}, "latest", None, ov]))[2:])
    assert int.from_bytes(out[0:32], "big") == 1000
    assert int.from_bytes(out[32:64], "big") == 0x1234
    assert int.from_bytes(out[128:160], "big") == 50_000_000


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ([{"to": "0x12"}, "latest"], -32602),
        ([{"to": None, "data": "0xzz"}, "latest"], -32602),
        ([{"to": "0x" + "00" * 20, "data": "0xabc"}, "latest"], -32602),
        ([{"to": "0x" + "00" * 20, "value": "0x01"}, "latest"], -32602),
        ([{"to": "0x" + "00" * 20, "bogus": 1}, "latest"], -32602),
        (["not an object", "latest"], -32602),
        ([{"to": "0x" + "00" * 20}, "0xffffffffff"], -39006),
        ([{"to": "0x" + "00" * 20}, "yesterday"], -39007),
        ([{"to": "0x" + "00" * 20}, {"blockHash": "0x" + "ab" * 32}], -39006),
        ([{"to": "0x" + "00" * 20}, "latest", {"0x12": {}}], -32602),
        (
            [
                {"to": "0x" + "00" * 20},
                "latest",
                {"0x" + "11" * 20: {"state": {}, "stateDiff": {}}},
            ],
            -32602,
        ),
        ([{"to": "0x" + "00" * 20}, "latest", {"0x" + "11" * 20: {"stateDiff": []}}], -32602),
        ([{"to": "0x" + "00" * 20}, "latest", None, {"number": 5}], -32602),
        ([{"to": "0x" + "00" * 20}, "latest", None, None, 1], -32602),
    ],
)
async def test_bad_input(evm: Client, params: list, code: int) -> None:
    answer = await evm.raw("eth_call", params)
    assert answer["error"]["code"] == code, answer


async def test_long_calldata_is_decoded_by_the_worker(evm: Client, chain: Chain) -> None:
    """Calldata past LAZY_DATA_CHARS goes to the worker as hex (off the event loop): the
    answer equals anvil's, as `data` or `input`; text that is not hex is -32602 naming the
    field, for that call alone when calls run together, and for an estimate too."""
    from nodes.state.evm.methods import LAZY_DATA_CHARS

    padding = "00" * (LAZY_DATA_CHARS // 2 + 10)
    req = {"to": chain.erc20, "data": balance_of(A0) + padding}
    expected = rpc(chain.url, "eth_call", [req, "latest"])
    assert await evm.call("eth_call", [req, "latest"]) == expected
    as_input = {"to": chain.erc20, "input": req["data"]}
    assert await evm.call("eth_call", [as_input, "latest"]) == expected
    bad = {"to": chain.erc20, "input": req["data"][:-2] + "zz"}
    answers = await asyncio.gather(
        *(evm.raw("eth_call", [r, "latest"]) for r in (req, bad, req, {**bad, "to": None}))
    )
    assert [a.get("result") for a in answers] == [expected, None, expected, None], answers
    for answer in answers[1::2]:
        assert answer["error"]["code"] == -32602, answer
        assert "request.input" in answer["error"]["message"]
    estimate = await evm.raw("estimateGas", [bad])
    assert estimate["error"]["code"] == -32602, estimate
    not_ascii = await evm.raw("eth_call", [{**req, "data": req["data"] + "é"}, "latest"])
    assert not_ascii["error"]["code"] == -32602, not_ascii


async def test_slow_calls_do_not_stall_the_node(chain: Chain) -> None:
    """Two calls that would run for minutes occupy both workers: the event loop keeps
    answering (batch reads), queued calls answer once the limit frees a worker, and the
    slow calls end with -39004 at their time limit."""
    from nodes.state.evm.methods import EvmMethods
    from nodes.state.evm.settings import EvmSettings
    from tests.evm.conftest import AnvilReader, Client

    settings = EvmSettings(workers=2, call_timeout=1.0, gas_cap=2**62, chain_id=1337)
    methods = EvmMethods(AnvilReader(chain.url), settings)
    await methods.start()
    try:
        client = Client(methods)
        ov = {"gasLimit": hex(2**62)}
        loops = [
            asyncio.create_task(client.raw("eth_call", [{"to": chain.loop}, "latest", None, ov]))
            for _ in range(2)
        ]
        await asyncio.sleep(0.2)
        started = time.monotonic()
        payload = "0x" + bsrb.encode_request(None, [bsrb.Read(bsrb.BALANCE, A0)]).hex()
        read = await client.raw("blockx_stateReadBatch", [payload])
        assert "result" in read and time.monotonic() - started < 0.5
        req = {"to": chain.erc20, "data": balance_of(A0)}
        queued = await client.raw("eth_call", [req, "latest"])
        assert queued["result"] == rpc(chain.url, "eth_call", [req, "latest"])
        answers = await asyncio.gather(*loops)
        assert [a["error"]["code"] for a in answers] == [-39004, -39004]
        assert time.monotonic() - started < 10
    finally:
        await methods.close()


async def test_time_limit_kills_only_that_call(chain: Chain) -> None:
    from nodes.state.evm.methods import EvmMethods
    from nodes.state.evm.settings import EvmSettings
    from tests.evm.conftest import AnvilReader, Client

    settings = EvmSettings(workers=1, call_timeout=1.0, gas_cap=2**62, chain_id=1337)
    methods = EvmMethods(AnvilReader(chain.url), settings)
    await methods.start()
    try:
        client = Client(methods)
        ov = {"gasLimit": hex(2**62)}
        answer = await client.raw("eth_call", [{"to": chain.loop}, "latest", None, ov])
        assert answer["error"]["code"] == -39004
        assert "time limit" in answer["error"]["message"]
        # the replaced worker answers the next call
        methods.settings  # noqa: B018
        ok = await client.raw("eth_call", [{"to": chain.erc20, "data": balance_of(A0)}])
        assert ok.get("result", "").startswith("0x"), ok
    finally:
        await methods.close()


async def test_a_call_stopped_by_its_own_cost_is_not_run_again(chain: Chain) -> None:
    """Calls at one block run together; the one that runs the whole time limit is answered
    -39004 saying so (`data.reason`: time_limit, which the proxy does not retry) and is
    not run again; the others, stopped with it, run again and answer."""
    from nodes.state.evm.methods import EvmMethods
    from nodes.state.evm.settings import EvmSettings
    from tests.evm.conftest import AnvilReader, Client

    settings = EvmSettings(workers=1, call_timeout=1.0, gas_cap=2**62, chain_id=1337)
    methods = EvmMethods(AnvilReader(chain.url), settings)
    await methods.start()
    pool = methods.executor.pool
    runs: list[int] = []  # loop calls in each job a worker was given
    run_on = pool.run_on

    async def counted(worker, job, limit):  # type: ignore[no-untyped-def]
        jobs = job["jobs"] if job["kind"] == "groups" else [job]
        runs.append(sum(c["to"] == chain.loop for one in jobs for c in one["calls"]))
        return await run_on(worker, job, limit)

    pool.run_on = counted  # type: ignore[method-assign]
    try:
        client = Client(methods)
        ov = {"gasLimit": hex(2**62)}
        fast = {"to": chain.erc20, "data": balance_of(A0)}
        blocker = asyncio.create_task(client.raw("eth_call", [fast, "latest", None, ov]))
        batch = [
            asyncio.create_task(client.raw("eth_call", [req, "latest", None, ov]))
            for req in [{"to": chain.loop}, fast, fast]
        ]
        answers = await asyncio.gather(blocker, *batch)
        assert [a.get("error", {}).get("code") for a in answers] == [None, -39004, None, None]
        assert answers[1]["error"]["data"] == {"reason": "time_limit", "seconds": 1.0}
        assert sum(runs) == 1, runs  # the loop ran once: in the job that stopped
    finally:
        await methods.close()


async def test_state_read_failure_is_39005(chain: Chain) -> None:
    from nodes.state.evm.methods import EvmMethods
    from nodes.state.evm.settings import EvmSettings
    from tests.evm.conftest import AnvilReader, Client

    class FailingStorage(AnvilReader):
        def storage(self, address: str, slot: int, height: int) -> int:
            raise JsonRpcError(-39005, "storage unreadable")

    methods = EvmMethods(FailingStorage(chain.url), EvmSettings(workers=1, chain_id=1337))
    try:
        client = Client(methods)
        answer = await client.raw("eth_call", [{"to": chain.erc20, "data": balance_of(A0)}])
        assert answer["error"]["code"] == -39005, answer
        # a call that reads no storage still works on the same node
        ok = await client.raw("eth_call", [{"to": chain.env}])
        assert ok["result"].startswith("0x")
    finally:
        await methods.close()


async def test_coalesced_calls_survive_a_culprit_and_callers_leaving(chain: Chain) -> None:
    """Calls at one block are run together; one overrunning call fails alone, the others
    answer. A caller that goes away leaves its worker running (no respawn)."""
    from nodes.state.evm.methods import EvmMethods
    from nodes.state.evm.settings import EvmSettings
    from tests.evm.conftest import AnvilReader, Client

    settings = EvmSettings(workers=1, call_timeout=1.0, gas_cap=2**62, chain_id=1337)
    methods = EvmMethods(AnvilReader(chain.url), settings)
    await methods.start()
    try:
        client = Client(methods)
        ov = {"gasLimit": hex(2**62)}
        fast = {"to": chain.erc20, "data": balance_of(A0)}
        blocker = asyncio.create_task(client.raw("eth_call", [fast, "latest", None, ov]))
        batch = [
            asyncio.create_task(client.raw("eth_call", [req, "latest", None, ov]))
            for req in [fast, {"to": chain.loop}, fast, fast]
        ]
        answers = await asyncio.gather(blocker, *batch)
        codes = [a.get("error", {}).get("code") for a in answers]
        assert codes == [None, None, -39004, None, None], answers
        assert answers[1]["result"] == rpc(chain.url, "eth_call", [fast, "latest"])

        pids = {w.proc.pid for w in methods.executor.pool._all}
        slow = asyncio.create_task(client.raw("eth_call", [{"to": chain.loop, "gas": "0x1c9c380"}]))
        await asyncio.sleep(0.05)
        slow.cancel()
        ok = await client.raw("eth_call", [fast])
        assert ok["result"] == rpc(chain.url, "eth_call", [fast, "latest"])
        assert {w.proc.pid for w in methods.executor.pool._all} == pids
    finally:
        await methods.close()


async def test_multicall_response_size_limit(chain: Chain) -> None:
    from nodes.state.evm.methods import EvmMethods
    from nodes.state.evm.settings import EvmSettings
    from tests.evm.conftest import AnvilReader, Client

    settings = EvmSettings(workers=1, max_response_bytes=64, chain_id=1337)
    methods = EvmMethods(AnvilReader(chain.url), settings)
    try:
        calls = [{"to": chain.erc20, "data": balance_of(A0)}] * 4
        results = await Client(methods).call("eth_multiCall", [calls, "latest"])
        assert [r["success"] for r in results] == [True, True, True, False]
        assert "response exceeds 64 bytes" in results[3]["error"]["message"]
    finally:
        await methods.close()


async def test_closed_methods_refuse_instead_of_restarting(chain: Chain) -> None:
    from nodes.state.evm.methods import EvmMethods
    from nodes.state.evm.settings import EvmSettings
    from tests.evm.conftest import AnvilReader, Client

    methods = EvmMethods(AnvilReader(chain.url), EvmSettings(workers=1, chain_id=1337))
    await methods.close()
    answer = await Client(methods).raw("eth_call", [{"to": chain.erc20}])
    assert answer["error"]["code"] == -32005
    assert not methods.executor.pool.started

"""Multi-calls, simulations, gas estimates, traces and BSRB/1 batch reads, against anvil."""

from __future__ import annotations

from typing import Any

import pytest

from chainstate.jsonrpc import JsonRpcError
from nodes.devnet.workload import mapping_slot
from nodes.state.evm import bsrb
from tests.evm.conftest import (
    A0,
    A1,
    A2,
    COUNTER_RUNTIME,
    Chain,
    Client,
    init_code,
    rpc,
    rpc_raw,
    send,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")


def balance_of(holder: str) -> str:
    return "0x70a08231" + holder[2:].rjust(64, "0")


def transfer(to: str, amount: int) -> str:
    return "0xa9059cbb" + to[2:].rjust(64, "0") + f"{amount:064x}"


def hundred_calls(chain: Chain) -> list[dict[str, Any]]:
    holders = [*chain.holders, A0, A1, A2]
    return [{"to": chain.erc20, "data": balance_of(holders[i % len(holders)])} for i in range(100)]


@pytest.mark.parametrize("options", [{}, {"useParallel": True}, {"disableCache": True}])
async def test_contract_multicall_100_equals_anvil(
    evm: Client, chain: Chain, options: dict[str, Any]
) -> None:
    calls = hundred_calls(chain)
    height = hex(chain.head - 1)
    params = {"requests": calls, "blockCtx": {"block_id": height, "type": "Equals"}, **options}
    results = await evm.call("contractMultiCall", params)
    assert len(results) == 100
    for call, r in zip(calls, results, strict=True):
        assert r["success"] is True
        assert r["returnData"] == rpc(chain.url, "eth_call", [call, height])
    # every call starts cold, as a transaction does: the gas used by a repeated call equals
    # anvil's estimate (balanceOf has no refunds, so estimate == gas used)
    for call, r in list(zip(calls, results, strict=True))[:12]:
        assert r["gasUsed"] == rpc(chain.url, "eth_estimateGas", [call, height])


async def test_eth_multicall_mixed_results(evm: Client, chain: Chain) -> None:
    calls = [
        {"to": chain.erc20, "data": balance_of(A0)},
        {"from": A1, "to": chain.erc20, "data": transfer(A0, 10**30)},
        {"to": chain.loop, "gas": "0x30000"},
    ]
    results = await evm.call("eth_multiCall", [calls, "latest"])
    assert [r["success"] for r in results] == [True, False, False]
    assert results[0]["returnData"] == rpc(chain.url, "eth_call", [calls[0], "latest"])
    assert results[1]["error"]["code"] == -39000
    assert (
        results[1]["returnData"]
        == rpc_raw(chain.url, "eth_call", [calls[1], "latest"])["error"]["data"]
    )
    assert results[2]["error"]["code"] == -39001


async def test_fast_fail_answers_the_first_failure(evm: Client, chain: Chain) -> None:
    calls = [
        {"to": chain.erc20, "data": balance_of(A0)},
        {"from": A1, "to": chain.erc20, "data": transfer(A0, 10**30)},
        {"to": chain.erc20, "data": balance_of(A1)},
    ]
    for method, params in [
        ("eth_multiCall", [calls, "latest", True]),
        ("contractMultiCall", {"requests": calls, "fastFail": True, "useParallel": True}),
    ]:
        with pytest.raises(JsonRpcError) as exc:
            await evm.call(method, params)
        assert exc.value.code == -39000
        assert exc.value.message.startswith("requests[1]: execution reverted")
        assert exc.value.data["index"] == 1


async def test_multicall_overrides(evm: Client, chain: Chain) -> None:
    slot = mapping_slot(A1, 0)
    state = {chain.erc20: {"stateDiff": {slot: hex(777)}}}
    params = {
        "requests": [{"to": chain.erc20, "data": balance_of(A1)}, {"to": chain.env}],
        "stateOverride": state,
        "blockOverrides": {"number": hex(chain.head), "time": "0x99"},
    }
    first, env = await evm.call("contractMultiCall", params)
    assert int(first["returnData"], 16) == 777
    assert int(env["returnData"][2 + 64 : 2 + 128], 16) == 0x99


@pytest.mark.parametrize(
    ("method", "params", "code"),
    [
        ("contractMultiCall", {"requests": []}, -32602),
        ("contractMultiCall", {"requests": "x"}, -32602),
        ("contractMultiCall", {"requests": [{"to": "0x1"}]}, -32602),
        ("contractMultiCall", {"requests": [{"to": "0x" + "1" * 40}], "fastFail": "yes"}, -32602),
        ("contractMultiCall", {"requests": [{"to": "0x" + "1" * 40}], "blockCtx": 5}, -39007),
        (
            "contractMultiCall",
            {"requests": [{"to": "0x" + "1" * 40}], "blockCtx": {"block_id": "0x999999"}},
            -39006,
        ),
        ("eth_multiCall", [[{"to": "0x" + "1" * 40}] * 1001, "latest"], -32602),
        ("simulateTransactions", [[{"to": "0x" + "1" * 40, "gas": "0xzz"}]], -32602),
        ("estimateGas", [{"to": "0x" + "1" * 40}, {"type": "Sometimes"}], -39007),
        ("pre_traceCall", [{"to": "0x" + "1" * 40}, "nope"], -39007),
        ("pre_traceMany", [{"to": "0x" + "1" * 40}], -32602),
    ],
)
async def test_bad_batch_input(evm: Client, method: str, params: Any, code: int) -> None:
    answer = await evm.raw(method, params)
    assert answer["error"]["code"] == code, answer


async def test_simulate_equals_executing_on_anvil(evm: Client, chain: Chain) -> None:
    txs = [
        {"from": A0, "to": chain.erc20, "data": transfer(A1, 7 * 10**18)},
        {"from": A1, "to": chain.erc20, "data": transfer(A2, 5 * 10**18)},
        {"from": A1, "to": chain.erc20, "data": transfer(A2, 10**30)},
        {"from": A2, "to": chain.counter},
        {"from": A0, "to": chain.counter},
    ]
    ours = await evm.call("simulateTransactions", [txs, {"block_id": "latest"}])
    snapshot = rpc(chain.url, "evm_snapshot", [])
    try:
        receipts = [send(chain.url, {**tx, "gas": "0x100000"}) for tx in txs]
    finally:
        rpc(chain.url, "evm_revert", [snapshot])
    assert [r["status"] for r in ours] == [r["status"] for r in receipts]
    assert [r["gasUsed"] for r in ours] == [r["gasUsed"] for r in receipts]
    for mine, receipt in zip(ours, receipts, strict=True):
        theirs = [
            {"address": x["address"], "topics": x["topics"], "data": x["data"]}
            for x in receipt["logs"]
        ]
        assert mine["logs"] == theirs
    assert ours[2]["error"]["code"] == -39000
    assert "exceeds balance" in ours[2]["error"]["message"]
    # the counter's second increment saw the first
    assert int(ours[4]["returnData"], 16) == int(ours[3]["returnData"], 16) + 1


async def test_simulate_charges_fees_with_a_gas_price(evm: Client, chain: Chain) -> None:
    """With a gas price, later transactions see the sender's balance after value and fees,
    as on anvil; without one nothing is charged (eth_call semantics)."""
    price = 3 * 10**9
    pay = {"from": A2, "to": A1, "value": hex(10**18), "gasPrice": hex(price)}
    read = {"from": A0, "to": chain.balances, "data": "0x" + A2[2:].rjust(64, "0")}
    ours = await evm.call("simulateTransactions", [[pay, read]])
    assert [r["status"] for r in ours] == ["0x1", "0x1"]
    snapshot = rpc(chain.url, "evm_snapshot", [])
    try:
        receipt = send(chain.url, {**pay, "gas": "0x5208"})
        after = rpc(chain.url, "eth_getBalance", [A2, "latest"])
    finally:
        rpc(chain.url, "evm_revert", [snapshot])
    assert ours[0]["gasUsed"] == receipt["gasUsed"]
    assert int(ours[1]["returnData"], 16) == int(after, 16)
    before = int(rpc(chain.url, "eth_getBalance", [A2, "latest"]), 16)
    free = await evm.call("simulateTransactions", [[{**pay, "gasPrice": None}, read]])
    assert int(free[1]["returnData"], 16) == before - 10**18


async def test_simulate_nonce_check(evm: Client, chain: Chain) -> None:
    nonce = int(rpc(chain.url, "eth_getTransactionCount", [A2, "latest"]), 16)
    txs = [
        {"from": A2, "to": chain.counter, "nonce": hex(nonce)},
        {"from": A2, "to": chain.counter, "nonce": hex(nonce)},
        {"from": A2, "to": chain.counter, "nonce": hex(nonce + 1)},
    ]
    out = await evm.call("simulateTransactions", [txs])
    assert [r["status"] for r in out] == ["0x1", "0x0", "0x1"]
    assert out[1]["error"]["code"] == -39003


async def test_estimate_gas_equals_anvil(evm: Client, chain: Chain) -> None:
    for req in [
        {"from": A0, "to": chain.erc20, "data": transfer(A1, 10**18)},
        {"from": A0, "to": chain.erc20, "data": transfer(A2, 1)},
        {"from": A0, "to": chain.counter},
        {"from": A0, "to": A1, "value": "0x1"},
    ]:
        ours = await evm.call("estimateGas", [req])
        assert ours == rpc(chain.url, "eth_estimateGas", [req, "latest"]), req
    old = {"block_id": hex(chain.erc20_block + 1)}
    req = {"from": A0, "to": chain.erc20, "data": transfer(A1, 10**18)}
    ours = await evm.call("estimateGas", [req, old])
    assert ours == rpc(chain.url, "eth_estimateGas", [req, old["block_id"]])


async def test_estimate_gas_with_a_gas_price_is_capped_by_the_balance(
    evm: Client, chain: Chain
) -> None:
    from nodes.devnet.workload import fresh_address

    holder = fresh_address(1)  # received 0.5 ETH in the workload
    balance = int(rpc(chain.url, "eth_getBalance", [holder, "latest"]), 16)
    price = balance // 30_000  # affords about 30,000 gas
    req = {"from": holder, "to": chain.erc20, "data": balance_of(A0), "gasPrice": hex(price)}
    ours = await evm.call("estimateGas", [req])
    assert ours == rpc(chain.url, "eth_estimateGas", [req, "latest"])
    too_costly = {"from": holder, "to": chain.counter, "gasPrice": hex(price)}  # ~44k gas
    with pytest.raises(JsonRpcError) as exc:
        await evm.call("estimateGas", [too_costly])
    assert exc.value.code == -39001
    assert "gas required exceeds allowance (30000)" in exc.value.message
    assert "error" in rpc_raw(chain.url, "eth_estimateGas", [too_costly, "latest"])
    broke = {"from": "0x" + "5e" * 20, "to": chain.erc20, "gasPrice": "0x1", "value": "0x1"}
    with pytest.raises(JsonRpcError) as exc:
        await evm.call("estimateGas", [broke])
    assert exc.value.code == -39002


async def test_estimate_gas_of_a_deployment_equals_anvil(evm: Client, chain: Chain) -> None:
    import json

    from nodes.devnet.anvil import ensure_openzeppelin
    from nodes.devnet.workload import abi_encode_erc20_constructor

    artifact = json.loads((ensure_openzeppelin() / "ERC20PresetFixedSupply.json").read_text())
    args = abi_encode_erc20_constructor("Gold", "GLD", 10**24, A1)
    req = {"from": A0, "data": artifact["bytecode"] + args.hex()}
    assert await evm.call("estimateGas", [req]) == rpc(
        chain.url, "eth_estimateGas", [req, "latest"]
    )


async def test_simulate_deploy_then_use(evm: Client, chain: Chain) -> None:
    from nodes.devnet.workload import create_address
    from tests.evm.conftest import COUNTER_RUNTIME, init_code

    nonce = int(rpc(chain.url, "eth_getTransactionCount", [A2, "latest"]), 16)
    created = create_address(A2, nonce)
    txs = [
        {"from": A2, "data": init_code(COUNTER_RUNTIME)},
        {"from": A1, "to": created},
        {"from": A1, "to": created},
    ]
    ours = await evm.call("simulateTransactions", [txs])
    snapshot = rpc(chain.url, "evm_snapshot", [])
    try:
        receipts = [send(chain.url, {**tx, "gas": "0x100000"}) for tx in txs]
    finally:
        rpc(chain.url, "evm_revert", [snapshot])
    assert receipts[0]["contractAddress"] == created
    assert [r["status"] for r in ours] == [r["status"] for r in receipts] == ["0x1"] * 3
    assert [r["gasUsed"] for r in ours] == [r["gasUsed"] for r in receipts]
    assert [int(r["returnData"], 16) for r in ours[1:]] == [1, 2]
    # the deployed code is served to later transactions exactly (no analysis padding)
    size_of = {"from": A1, "to": chain.codesize, "data": "0x" + created[2:].rjust(64, "0")}
    sized = await evm.call("simulateTransactions", [[txs[0], size_of]])
    assert int(sized[1]["returnData"], 16) == len(COUNTER_RUNTIME) // 2


async def test_estimate_gas_errors(evm: Client, chain: Chain) -> None:
    with pytest.raises(JsonRpcError) as exc:
        req = {"from": A1, "to": chain.erc20, "data": transfer(A0, 10**30)}
        await evm.call("estimateGas", [req])
    assert exc.value.code == -39000
    assert "exceeds balance" in exc.value.message
    with pytest.raises(JsonRpcError) as exc:
        await evm.call("estimateGas", [{"to": chain.loop}])
    assert exc.value.code == -39001
    assert "gas required exceeds allowance" in exc.value.message


def _steps(trace: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(s["pc"], s["op"], s["gas"], s["gasCost"], s["depth"]) for s in trace["structLogs"]]


async def test_trace_equals_anvil_struct_logs(evm: Client, chain: Chain) -> None:
    height = hex(chain.head - 1)
    for req in [
        {"from": A0, "to": chain.erc20, "data": balance_of(A1)},
        {"from": A0, "to": chain.erc20, "data": transfer(A1, 3)},
        {"from": A0, "to": chain.counter},
        {"from": A1, "to": chain.erc20, "data": transfer(A0, 10**30)},
        {"from": A0, "to": chain.forwarder, "data": balance_of(A1)},  # a nested CALL
        {"from": A0, "to": chain.forwarder, "data": transfer(A1, 10**30)},  # inner revert
        {"from": A0, "data": init_code(COUNTER_RUNTIME)},  # a creation
    ]:
        ours = await evm.call("pre_traceCall", [req, height])
        theirs = rpc(chain.url, "debug_traceCall", [req, height, {}])
        assert _steps(ours) == _steps(theirs), req
        assert ours["gas"] == theirs["gas"]
        assert ours["failed"] == theirs["failed"]
        assert [s["stack"] for s in ours["structLogs"]] == [
            s["stack"] for s in theirs["structLogs"]
        ]


async def test_trace_many_and_step_limit(evm: Client, chain: Chain) -> None:
    reqs = [{"to": chain.erc20, "data": balance_of(A0)}, {"to": chain.counter}]
    traces = await evm.call("pre_traceMany", [reqs, "latest"])
    assert len(traces) == 2
    assert all(t["structLogs"] and not t["failed"] for t in traces)
    with pytest.raises(JsonRpcError) as exc:
        await evm.call("pre_traceCall", [{"to": chain.loop, "gas": "0x1000000"}])
    assert exc.value.code == -39004
    assert "trace exceeds" in exc.value.message


async def test_state_read_batch(evm: Client, chain: Chain) -> None:
    height = chain.head - 1
    slot = int(mapping_slot(A1, 0), 16)
    reads = [
        bsrb.Read(bsrb.BALANCE, A0),
        bsrb.Read(bsrb.NONCE, A0),
        bsrb.Read(bsrb.CODE, chain.counter),
        bsrb.Read(bsrb.STORAGE, chain.erc20, slot),
    ]
    payload = "0x" + bsrb.encode_request(height, reads).hex()
    answer = await evm.call("blockx_stateReadBatch", [payload])
    got_height, got_hash, values = bsrb.decode_response(bytes.fromhex(answer[2:]))
    block = rpc(chain.url, "eth_getBlockByNumber", [hex(height), False])
    assert (got_height, got_hash) == (height, block["hash"])
    h = hex(height)
    assert values == [
        (1, int(rpc(chain.url, "eth_getBalance", [A0, h]), 16)),
        (2, int(rpc(chain.url, "eth_getTransactionCount", [A0, h]), 16)),
        (3, bytes.fromhex(rpc(chain.url, "eth_getCode", [chain.counter, h])[2:])),
        (4, int(rpc(chain.url, "eth_getStorageAt", [chain.erc20, hex(slot), h]), 16)),
    ]
    latest = "0x" + bsrb.encode_request(None, reads[:1]).hex()
    got_height, _, _ = bsrb.decode_response(
        bytes.fromhex((await evm.call("blockx_stateReadBatch", [latest]))[2:])
    )
    assert got_height == chain.head


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        ("zz", -32602),
        ("0x", -32602),
        ("0x" + b"XSRB".hex() + "01" + "00" * 8 + "00000001", -32602),
        ("0x" + b"BSRB".hex() + "02" + "00" * 8 + "00000001" + "01" + "00" * 20, -32602),
        ("0x" + b"BSRB".hex() + "01" + "00" * 8 + "00000000", -32602),
        ("0x" + b"BSRB".hex() + "01" + "00" * 8 + "00000001" + "09" + "00" * 20, -32602),
        ("0x" + b"BSRB".hex() + "01" + "00" * 8 + "00000001" + "04" + "00" * 20, -32602),
        ("0x" + b"BSRB".hex() + "01" + "00" * 8 + "00000001" + "01" + "00" * 21, -32602),
        ("0x" + b"BSRB".hex() + "01" + "00" * 8 + "00000002" + "01" + "00" * 20, -32602),
        ("0x" + b"BSRB".hex() + "01" + "0000ffffffffffff" + "00000001" + "01" + "00" * 20, -39006),
        ("0x" + b"BSRB".hex() + "01" + "00" * 8 + "00ffffff" + "01" + "00" * 20, -32005),
    ],
)
async def test_state_read_batch_rejects_malformed(evm: Client, payload: str, code: int) -> None:
    answer = await evm.raw("blockx_stateReadBatch", [payload])
    assert answer["error"]["code"] == code, answer

"""End to end, as a user: anvil running the devnet workload, a write node following it, an
archive state node (separate processes, `chainstate write-node` / `state-node`) and the
routing proxy in front. Through the proxy: an ERC20 call at latest and at an old block equal
to anvil's, a revert with its reason, a gas estimate, a trace and a 100-call multi-call."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from bench.services import running
from bench.suite import StateSuite, SuiteOptions, proxy_available
from tests.evm.conftest import A0, A1, rpc, rpc_raw

pytestmark = pytest.mark.skipif(not proxy_available(), reason="the proxy is not in this tree")


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, Any]]:
    with running() as services:
        suite = StateSuite()
        targets = suite.start(services, SuiteOptions(pin=False))
        record = json.loads((services.workdir / "workload.json").read_text())
        yield {**targets, "record": record, "head": suite.head}


def balance_of(holder: str) -> str:
    return "0x70a08231" + holder[2:].rjust(64, "0")


def test_erc20_at_latest_and_old_block_equals_anvil(stack: dict[str, Any]) -> None:
    erc20 = stack["record"]["erc20"]
    holders = [*stack["record"]["erc20_holders"], A0]
    old = hex(stack["record"]["last_block"])  # before the 200 empty blocks: state window
    for holder in holders:
        req = {"to": erc20, "data": balance_of(holder)}
        for block in ("latest", old):
            expected = rpc(stack["anvil"], "eth_call", [req, block])
            assert rpc(stack["proxy"], "eth_call", [req, block]) == expected
            assert rpc(stack["state-node"], "eth_call", [req, block]) == expected


def test_revert_reason_through_the_proxy(stack: dict[str, Any]) -> None:
    erc20 = stack["record"]["erc20"]
    data = "0xa9059cbb" + A0[2:].rjust(64, "0") + f"{10**30:064x}"
    req = {"from": A1, "to": erc20, "data": data}
    err = rpc_raw(stack["proxy"], "eth_call", [req, "latest"])["error"]
    theirs = rpc_raw(stack["anvil"], "eth_call", [req, "latest"])["error"]
    assert err["code"] == theirs["code"] == 3  # geth's revert code at the proxy's face
    assert err["message"] == theirs["message"]
    assert err["data"] == theirs["data"]


def test_estimate_and_trace_through_the_proxy(stack: dict[str, Any]) -> None:
    erc20 = stack["record"]["erc20"]
    data = "0xa9059cbb" + A1[2:].rjust(64, "0") + f"{10**18:064x}"
    req = {"from": A0, "to": erc20, "data": data}
    assert rpc(stack["proxy"], "estimateGas", [req]) == rpc(
        stack["anvil"], "eth_estimateGas", [req, "latest"]
    )
    ours = rpc(stack["proxy"], "pre_traceCall", [req, "latest"])
    theirs = rpc(stack["anvil"], "debug_traceCall", [req, "latest", {}])
    key = lambda t: [(s["pc"], s["op"], s["gas"], s["gasCost"], s["depth"]) for s in t]  # noqa: E731
    assert key(ours["structLogs"]) == key(theirs["structLogs"])


def test_contract_multicall_100_through_the_proxy(stack: dict[str, Any]) -> None:
    erc20 = stack["record"]["erc20"]
    holders = [*stack["record"]["erc20_holders"], A0, A1]
    calls = [{"to": erc20, "data": balance_of(holders[i % len(holders)])} for i in range(100)]
    results = rpc(stack["proxy"], "contractMultiCall", {"requests": calls, "useParallel": True})
    assert len(results) == 100
    for call, r in zip(calls, results, strict=True):
        assert r["success"]
        assert r["returnData"] == rpc(stack["anvil"], "eth_call", [call, "latest"])


def test_old_block_results_and_gas_equal_anvil(stack: dict[str, Any]) -> None:
    """The node's workers read old blocks through the feed process, with the accounts each
    call touches preloaded: return data and gas stay anvil's, every call cold."""
    erc20 = stack["record"]["erc20"]
    holders = [*stack["record"]["erc20_holders"], A0]
    first = stack["record"]["first_block"]
    for block in {hex(first + 8), hex(stack["record"]["last_block"])}:
        calls = [{"from": A1, "to": erc20, "data": balance_of(h)} for h in holders]
        ctx = {"block_id": block, "type": "Equals"}
        params = {"requests": calls, "blockCtx": ctx, "disableCache": True}
        results = rpc(stack["state-node"], "contractMultiCall", params)
        for call, r in zip(calls, results, strict=True):
            assert r["returnData"] == rpc(stack["anvil"], "eth_call", [call, block])
            assert r["gasUsed"] == rpc(stack["anvil"], "eth_estimateGas", [call, block])


def test_a_batch_of_eth_calls_answers_each_item(stack: dict[str, Any]) -> None:
    """A batch mixing eth_calls (latest, old blocks, a revert, bad params, a block out of
    range, a notification) with another method: each answer in place, results equal to
    anvil's, errors with our codes and anvil's revert message."""
    import urllib.request

    erc20 = stack["record"]["erc20"]
    old = hex(stack["record"]["last_block"])
    holders = [*stack["record"]["erc20_holders"], A0]
    calls = [({"to": erc20, "data": balance_of(h)}, b) for h in holders for b in ("latest", old)]
    batch: list[dict[str, Any]] = [
        {"jsonrpc": "2.0", "id": i, "method": "eth_call", "params": [req, block]}
        for i, (req, block) in enumerate(calls)
    ]
    transfer = "0xa9059cbb" + A0[2:].rjust(64, "0") + f"{10**30:064x}"
    revert = {"from": A1, "to": erc20, "data": transfer}
    batch += [
        {"jsonrpc": "2.0", "id": "revert", "method": "eth_call", "params": [revert, "latest"]},
        {"jsonrpc": "2.0", "id": "bad", "method": "eth_call", "params": [{"to": "0x12"}]},
        {"jsonrpc": "2.0", "id": "far", "method": "eth_call", "params": [calls[0][0], "0xffffff"]},
        {"jsonrpc": "2.0", "method": "eth_call", "params": [calls[0][0], "latest"]},
        {"jsonrpc": "2.0", "id": "head", "method": "eth_blockNumber", "params": []},
    ]
    body = json.dumps(batch).encode()
    req = urllib.request.Request(stack["state-node"], body, {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        answers = {a["id"]: a for a in json.loads(resp.read())}
    assert len(answers) == len(batch) - 1  # the notification gets none
    for i, (req_, block) in enumerate(calls):
        assert answers[i]["result"] == rpc(stack["anvil"], "eth_call", [req_, block]), i
    theirs = rpc_raw(stack["anvil"], "eth_call", [revert, "latest"])["error"]
    assert answers["revert"]["error"]["code"] == -39000
    assert answers["revert"]["error"]["message"] == theirs["message"]
    assert answers["bad"]["error"]["code"] == -32602
    assert answers["far"]["error"]["code"] == -39006
    assert int(answers["head"]["result"], 16) >= stack["head"]


def test_traces_of_workload_blocks_equal_anvil(stack: dict[str, Any]) -> None:
    """The state node re-executes stored blocks (bodies and receipts from its LMDB store,
    state read by its workers from the store): callTracer and prestateTracer of every
    workload transaction, and trace_block, equal to anvil's (the top gasUsed is the
    transaction's own, where anvil writes the cumulative one)."""
    record = stack["record"]
    traced = 0
    for height in range(record["first_block"], record["last_block"] + 1):
        block = rpc(stack["anvil"], "eth_getBlockByNumber", [hex(height), False])
        for tx_hash in block["transactions"]:
            receipt = rpc(stack["anvil"], "eth_getTransactionReceipt", [tx_hash])
            for options in ({"tracer": "callTracer"}, {"tracer": "prestateTracer"}):
                ours = rpc(stack["state-node"], "debug_traceTransaction", [tx_hash, options])
                theirs = rpc(stack["anvil"], "debug_traceTransaction", [tx_hash, options])
                if options["tracer"] == "callTracer":
                    theirs["gasUsed"] = receipt["gasUsed"]
                assert ours == theirs, (height, tx_hash, options)
            traced += 1
        if block["transactions"]:
            params = [hex(height)]
            assert rpc(stack["state-node"], "trace_block", params) == rpc(
                stack["anvil"], "trace_block", params
            )
    assert traced

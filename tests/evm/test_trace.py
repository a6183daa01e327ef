"""Traces by re-execution, differential against anvil on the same chain (tracechain.py):
debug_traceTransaction / debug_traceBlockByNumber / debug_traceBlockByHash / debug_traceCall
with callTracer, prestateTracer (diffMode) and the struct logger, trace_block,
trace_transaction, trace_filter and trace_replayBlockTransactions; bad inputs, a receipt the
re-execution does not reproduce, and the step limit.

anvil answers a mined transaction's callTracer `gasUsed` with its *cumulative* gas used and
its struct logs empty; the node answers the transaction's own gas used (as geth) and the
struct logs (compared with anvil's debug_traceCall of the same call at the parent block).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from nodes.state.evm.methods import EvmMethods
from nodes.state.evm.settings import EvmSettings
from tests.evm.conftest import A1, AnvilReader, Client, rpc
from tests.evm.tracechain import TraceChain, build_trace_chain

pytestmark = pytest.mark.asyncio(loop_scope="module")

MAX_STEPS = 5000
TEN_ZEROS_INIT = "0x600a600c600039600a6000f3" + "00" * 10  # deploys 10 zero bytes
TRACERS = [
    {"tracer": "callTracer"},
    {"tracer": "callTracer", "tracerConfig": {"withLog": True}},
    {"tracer": "callTracer", "tracerConfig": {"onlyTopCall": True}},
    {"tracer": "prestateTracer"},
    {"tracer": "prestateTracer", "tracerConfig": {"diffMode": True}},
    {"tracer": "prestateTracer", "tracerConfig": {"diffMode": True, "disableCode": True}},
]
STRUCT_OPTIONS = [
    {},
    {"enableMemory": True, "enableReturnData": True},
    {"disableStack": True, "disableStorage": True},
]


@pytest.fixture(scope="module")
def tchain(anvil_url: str) -> TraceChain:
    return build_trace_chain(anvil_url)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def node(tchain: TraceChain) -> AsyncIterator[Client]:
    settings = EvmSettings(workers=1, trace_timeout=30.0, max_trace_steps=MAX_STEPS)
    methods = EvmMethods(AnvilReader(tchain.url), settings)
    await methods.start()
    try:
        yield Client(methods)
    finally:
        await methods.close()


def own_gas(theirs: dict[str, Any], tx_hash: str, url: str) -> dict[str, Any]:
    """anvil's call frame with the transaction's own gas used at the top (anvil writes the
    block's cumulative gas used there)."""
    receipt = rpc(url, "eth_getTransactionReceipt", [tx_hash])
    return {**theirs, "gasUsed": receipt["gasUsed"]}


async def test_mined_transactions_equal_anvil(node: Client, tchain: TraceChain) -> None:
    """Every transaction of the chain, with each tracer: transfers of the three types, a
    deployment, logs, nested calls, reverts, out of gas, DELEGATECALL, CREATE2, a precompile,
    SELFDESTRUCTs, and the later transactions of a block of four."""
    for name, tx_hash in tchain.txs.items():
        for options in TRACERS:
            ours = await node.call("debug_traceTransaction", [tx_hash, options])
            theirs = rpc(tchain.url, "debug_traceTransaction", [tx_hash, options])
            if options["tracer"] == "callTracer":
                theirs = own_gas(theirs, tx_hash, tchain.url)
            assert ours == theirs, (name, options)


async def test_parity_traces_equal_anvil(node: Client, tchain: TraceChain) -> None:
    for name, tx_hash in tchain.txs.items():
        ours = await node.call("trace_transaction", [tx_hash])
        assert ours == rpc(tchain.url, "trace_transaction", [tx_hash]), name
    for height in sorted(set(tchain.blocks.values())):
        ours = await node.call("trace_block", [hex(height)])
        assert ours == rpc(tchain.url, "trace_block", [hex(height)]), height


async def test_replay_block_transactions_equal_anvil(node: Client, tchain: TraceChain) -> None:
    """trace_replayBlockTransactions with `stateDiff` of every block (created accounts,
    storage, balances, nonces, a contract created and destroyed in one transaction), and
    with `trace` of the block of four. (anvil leaves out here the `suicide` trace of a
    SELFDESTRUCT of an old contract that its trace_block shows; the node shows it in both.)"""
    for height in sorted(set(tchain.blocks.values())):
        params = [hex(height), ["stateDiff"]]
        ours = await node.call("trace_replayBlockTransactions", params)
        assert ours == rpc(tchain.url, "trace_replayBlockTransactions", params), height
    for types in (["trace"], ["trace", "stateDiff"]):
        params = [hex(tchain.multi_block), types]
        assert await node.call("trace_replayBlockTransactions", params) == rpc(
            tchain.url, "trace_replayBlockTransactions", params
        )


@pytest.mark.parametrize(
    "flt",
    [
        {},
        {"count": 3, "after": 2},
        {"toAddress": ["counter"]},
        {"fromAddress": [A1]},
        {"fromAddress": [A1], "toAddress": ["counter"], "mode": "intersection"},
        {"fromAddress": [A1], "toAddress": ["counter"]},
    ],
)
async def test_trace_filter_equals_anvil(
    node: Client, tchain: TraceChain, flt: dict[str, Any]
) -> None:
    flt = {
        k: [tchain.contracts.get(a, a) for a in v] if isinstance(v, list) else v
        for k, v in flt.items()
    }
    full = {"fromBlock": "0x1", "toBlock": hex(tchain.head), **flt}
    ours = await node.call("trace_filter", [full])
    assert ours == rpc(tchain.url, "trace_filter", [full])
    assert ours


async def test_blocks_equal_anvil(node: Client, tchain: TraceChain) -> None:
    """debug_traceBlockByNumber/ByHash of a block of four transactions: per transaction
    `{"txHash", "result"}` as anvil's, the top gasUsed the transaction's own."""
    height = tchain.multi_block
    block_hash = rpc(tchain.url, "eth_getBlockByNumber", [hex(height), False])["hash"]
    for options in TRACERS:
        theirs = rpc(tchain.url, "debug_traceBlockByNumber", [hex(height), options])
        if options["tracer"] == "callTracer":
            theirs = [
                {**t, "result": own_gas(t["result"], t["txHash"], tchain.url)} for t in theirs
            ]
        assert len(theirs) == 4
        assert await node.call("debug_traceBlockByNumber", [hex(height), options]) == theirs
        assert await node.call("debug_traceBlockByHash", [block_hash, options]) == theirs
    assert await node.call("debug_traceBlockByNumber", ["0x0", {}]) == []


def _call_objects(tchain: TraceChain) -> dict[str, dict[str, Any]]:
    c = tchain.contracts
    return {
        "store": {"from": A1, "to": c["counter"]},
        "nested": {"from": A1, "to": c["forward_counter"]},
        "nested revert": {"from": A1, "to": c["forward_panic"]},
        "revert": {"from": A1, "to": c["reason"]},
        "delegate": {"from": A1, "to": c["proxy"]},
        "create2": {"from": A1, "to": c["factory"], "data": TEN_ZEROS_INIT},
        "precompile": {"from": A1, "to": c["sha"]},
        "selfdestruct": {"from": A1, "to": c["destructor"], "value": "0x7"},
        "creation": {"from": A1, "data": "0x60006000fd"},
        "priced": {"from": A1, "to": c["counter"], "maxFeePerGas": "0x77359400",
                   "maxPriorityFeePerGas": "0x2"},
        "no sender": {"to": c["counter"]},
    }  # fmt: skip


@pytest.mark.parametrize("options", [*TRACERS, *STRUCT_OPTIONS])
async def test_trace_call_equals_anvil(
    node: Client, tchain: TraceChain, options: dict[str, Any]
) -> None:
    """debug_traceCall of call objects at an older block (anvil's debug_traceCall builds
    struct logs too: memory, return data and storage compared as well)."""
    height = hex(tchain.head - 1)
    for name, request in _call_objects(tchain).items():
        params = [request, height, options]
        ours = await node.call("debug_traceCall", params)
        assert ours == rpc(tchain.url, "debug_traceCall", params), name


async def test_trace_call_with_overrides(node: Client, tchain: TraceChain) -> None:
    """stateOverrides (code at a fresh address) and blockOverrides, as anvil applies them."""
    target = "0x" + "ce" * 20
    options = {
        "tracer": "callTracer",
        "stateOverrides": {target: {"code": "0x4860005260206000f3"}},  # returns BASEFEE
        "blockOverrides": {"baseFee": "0x7"},
    }
    params = [{"from": A1, "to": target}, hex(tchain.head), options]
    ours = await node.call("debug_traceCall", params)
    assert ours == rpc(tchain.url, "debug_traceCall", params)
    assert int(ours["output"], 16) == 7


async def test_struct_logs_of_mined_transactions(node: Client, tchain: TraceChain) -> None:
    """anvil answers empty struct logs for a mined transaction; the node's equal anvil's
    debug_traceCall of the same call on the parent block (each transaction here is the
    first of its block), and debug_traceBlock agrees with debug_traceTransaction."""
    for name in ("store_log", "nested_revert", "revert", "delegate"):
        tx = rpc(tchain.url, "eth_getTransactionByHash", [tchain.txs[name]])
        request = {k: tx[k] for k in ("from", "to", "gas", "value", "input")}
        request.update(
            maxFeePerGas=tx["maxFeePerGas"], maxPriorityFeePerGas=tx["maxPriorityFeePerGas"]
        )
        parent = hex(int(tx["blockNumber"], 16) - 1)
        for options in STRUCT_OPTIONS:
            ours = await node.call("debug_traceTransaction", [tx["hash"], options])
            theirs = rpc(tchain.url, "debug_traceCall", [request, parent, options])
            assert ours == theirs, (name, options)
            assert ours["structLogs"]
    block = await node.call("debug_traceBlockByNumber", [hex(tchain.multi_block), {}])
    for item in block:
        assert item["result"] == await node.call("debug_traceTransaction", [item["txHash"], {}])


@pytest.mark.parametrize(
    ("method", "params", "code"),
    [
        ("debug_traceTransaction", ["0x" + "12" * 32, {}], -39006),  # not found
        ("debug_traceTransaction", ["0x12", {}], -32602),  # bad hash
        ("debug_traceTransaction", ["TX", {"tracer": "4byteTracer"}], -32602),
        ("debug_traceTransaction", ["TX", {"tracer": "function() {}"}], -32602),
        (
            "debug_traceTransaction",
            ["TX", {"tracer": "callTracer", "tracerConfig": {"x": 1}}],
            -32602,
        ),
        ("debug_traceTransaction", ["TX", {"disableStack": "yes"}], -32602),
        ("debug_traceTransaction", ["TX", {"bogus": True}], -32602),
        ("debug_traceBlockByNumber", [hex(10**6), {}], -39006),  # out of range
        ("debug_traceBlockByNumber", ["0xzz", {}], -39007),
        ("debug_traceBlockByHash", ["0x" + "34" * 32, {}], -39006),
        ("debug_traceCall", [{"to": "0x12"}, "latest", {}], -32602),
        ("debug_traceCall", [{"to": A1}, "latest", {"tracer": "flatCallTracer"}], -32602),
        ("debug_traceCall", [{"to": A1}, hex(10**6), {}], -39006),
        ("trace_block", [hex(10**6)], -39006),
        ("trace_transaction", ["0x" + "12" * 32], -39006),
        ("trace_filter", [{"fromBlock": "0x5", "toBlock": "0x1"}], -32602),
        ("trace_filter", [{"fromBlock": "0x1", "bogus": 1}], -32602),
        ("trace_filter", [{"fromAddress": ["0x12"]}], -32602),
        ("trace_replayBlockTransactions", ["0x1", ["vmTrace"]], -32602),
        ("trace_replayBlockTransactions", ["0x1", ["bogus"]], -32602),
        ("trace_replayBlockTransactions", ["0x1", "trace"], -32602),
        ("eth_simulateV1", [{"blockStateCalls": []}, "latest"], -32601),
    ],
)
async def test_bad_inputs(
    node: Client, tchain: TraceChain, method: str, params: list[Any], code: int
) -> None:
    params = [tchain.txs["legacy"] if p == "TX" else p for p in params]
    answer = await node.raw(method, params)
    assert answer["error"]["code"] == code, answer


async def test_trace_filter_range_limit(tchain: TraceChain) -> None:
    methods = EvmMethods(AnvilReader(tchain.url), EvmSettings(workers=1, max_trace_filter_blocks=2))
    answer = await Client(methods).raw("trace_filter", [{"fromBlock": "0x1", "toBlock": "0x5"}])
    assert answer["error"]["code"] == -32602
    assert "too large" in answer["error"]["message"]
    await methods.close()


async def test_step_limit(node: Client, tchain: TraceChain) -> None:
    """The out-of-gas loop takes more struct-log steps than the limit: a clear -39004, and
    the same transaction still traces with callTracer (no steps kept)."""
    tx_hash = tchain.txs["out_of_gas"]
    answer = await node.raw("debug_traceTransaction", [tx_hash, {}])
    assert answer["error"]["code"] == -39004
    assert f"{MAX_STEPS} steps" in answer["error"]["message"]
    limited = await node.call("debug_traceTransaction", [tx_hash, {"limit": 10}])
    assert len(limited["structLogs"]) == 10
    assert (await node.call("debug_traceTransaction", [tx_hash, TRACERS[0]]))[
        "error"
    ] == "out of gas"


class _AlteredReceipts(AnvilReader):
    """anvil's chain with one stored receipt altered: its gas used off by one."""

    def __init__(self, url: str, tx_hash: str) -> None:
        super().__init__(url)
        self.tx_hash = tx_hash

    def block_body(self, height: int) -> dict[str, Any] | None:
        body = super().block_body(height)
        for receipt in (body or {}).get("receipts", []):
            if receipt["transactionHash"] == self.tx_hash:
                receipt["gasUsed"] = hex(int(receipt["gasUsed"], 16) + 1)
        return body


async def test_a_receipt_not_reproduced_is_an_error(tchain: TraceChain) -> None:
    """When re-execution does not reproduce a stored receipt, the answer is an error naming
    it, never a wrong trace (also for a later transaction of the block)."""
    first = tchain.txs["multi_0"]
    methods = EvmMethods(_AlteredReceipts(tchain.url, first), EvmSettings(workers=1))
    client = Client(methods)
    try:
        for tx_hash in (first, tchain.txs["multi_2"]):
            answer = await client.raw("debug_traceTransaction", [tx_hash, TRACERS[0]])
            assert answer["error"]["code"] == -39004
            assert "does not reproduce its receipt" in answer["error"]["message"]
            assert first in answer["error"]["message"]
        answer = await client.raw("trace_block", [hex(tchain.multi_block)])
        assert answer["error"]["code"] == -39004
    finally:
        await methods.close()


def _listed(answer: dict[str, Any]) -> list[tuple[str, tuple[str, ...]]]:
    """An access list in a fixed order (geth and anvil keep it in maps)."""
    return sorted((x["address"], tuple(x["storageKeys"])) for x in answer["accessList"])


async def test_create_access_list_equals_anvil(node: Client, tchain: TraceChain) -> None:
    """The accounts and slots a call touches (sender, recipient and precompiles listed only
    with slots), a list given in the request kept, and the gas used with the list."""
    c = tchain.contracts
    given = [{"address": A1, "storageKeys": ["0x" + "00" * 31 + "05"]}]
    requests = [
        *(request for name, request in _call_objects(tchain).items() if "revert" not in name),
        {"from": A1, "to": c["forward_counter"], "accessList": given},
        {"from": A1, "to": A1},
    ]
    height = hex(tchain.head)
    for request in requests:
        if request.get("data") == "0x60006000fd":
            continue  # a creation that reverts: see below
        ours = await node.call("eth_createAccessList", [request, height])
        theirs = rpc(tchain.url, "eth_createAccessList", [request, height])
        assert _listed(ours) == _listed(theirs), request
        assert ours["gasUsed"] == theirs["gasUsed"], request
        assert "error" not in ours


async def test_create_access_list_of_a_failing_call(node: Client, tchain: TraceChain) -> None:
    """A call that reverts or runs out of gas with the list: the list, the gas and `error`
    as a result, as geth and the execution-apis spec answer (anvil answers a JSON-RPC
    error); a sender that cannot pay is an error."""
    c = tchain.contracts
    reverted = await node.call("eth_createAccessList", [{"from": A1, "to": c["reason"]}])
    assert reverted["error"] == "execution reverted"
    assert int(reverted["gasUsed"], 16) > 21000
    out_of_gas = await node.call(
        "eth_createAccessList", [{"from": A1, "to": c["loop"], "gas": "0x10000"}]
    )
    assert (out_of_gas["error"], out_of_gas["gasUsed"]) == ("out of gas", "0x10000")
    poor = {"from": "0x" + "11" * 20, "to": c["counter"], "gasPrice": "0x1"}
    assert (await node.raw("eth_createAccessList", [poor]))["error"]["code"] == -39002
    assert (await node.raw("eth_createAccessList", [{"to": "0x12"}]))["error"]["code"] == -32602


async def test_struct_log_size_limit(tchain: TraceChain) -> None:
    """Memory and stack are copied into every step: the answer's size is bounded too."""
    settings = EvmSettings(workers=1, max_trace_bytes=2000)
    methods = EvmMethods(AnvilReader(tchain.url), settings)
    try:
        options = {"enableMemory": True}
        answer = await Client(methods).raw(
            "debug_traceTransaction", [tchain.txs["nested_log"], options]
        )
        assert answer["error"]["code"] == -39004
        assert "2000 bytes" in answer["error"]["message"]
    finally:
        await methods.close()

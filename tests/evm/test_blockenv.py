"""Every opcode that reads the block or the transaction environment, differential against
anvil: NUMBER, TIMESTAMP, COINBASE, GASLIMIT, BASEFEE, PREVRANDAO, CHAINID and BLOBBASEFEE,
at latest and at older heights, with and without blockOverrides; the issue's BASEFEE
reproduction (code given by a state override); GASPRICE, ORIGIN, CALLER, CALLVALUE, GAS and
the sender's balance for legacy, 2930 and 1559 call objects, with the fee checks and
estimateGas. BASEFEE is the one pyrevm 0.3.7 cannot give (it runs calls with a base fee of
0): such calls are answered by py-evm (nodes/state/evm/basefee.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.evm.conftest import A1, A2, Chain, Client, deploy, rpc, rpc_raw, send

pytestmark = pytest.mark.asyncio(loop_scope="module")

OPS = {
    "NUMBER": "43",
    "TIMESTAMP": "42",
    "COINBASE": "41",
    "GASLIMIT": "45",
    "BASEFEE": "48",
    "PREVRANDAO": "44",
    "CHAINID": "46",
    "BLOBBASEFEE": "4a",
}
# returns the eight values above as eight words
BLOCKENV_RUNTIME = (
    "".join(f"{op}60{i * 32:02x}52" for i, op in enumerate(OPS.values())) + "6101006000f3"
)
BASEFEE_CODE = "0x4860005260206000f3"  # the issue's reproduction: returns BASEFEE
OVERRIDES = {
    "number": "0x1234",
    "time": "0x65000000",
    "gasLimit": "0x1c9c380",
    "coinbase": A1,
    "random": "0x" + "ab" * 32,
    "baseFee": "0x3b9aca07",
}


@pytest.fixture(scope="module")
def blockenv(chain: Chain) -> str:
    return deploy(chain.url, BLOCKENV_RUNTIME)


def words(hex_data: str) -> dict[str, int]:
    raw = bytes.fromhex(hex_data[2:])
    return {name: int.from_bytes(raw[32 * i : 32 * i + 32], "big") for i, name in enumerate(OPS)}


def heights(chain: Chain) -> list[str]:
    head = int(rpc(chain.url, "eth_blockNumber", []), 16)
    return ["latest", hex(head - 2), hex(chain.erc20_block)]


@pytest.mark.parametrize("overrides", [None, OVERRIDES], ids=["header", "blockOverrides"])
async def test_block_env_opcodes_equal_anvil(
    evm: Client, chain: Chain, overrides: dict[str, Any] | None
) -> None:
    """The code sits at a fresh address through a state override, so it exists at every
    height asked (old ones included)."""
    target = "0x" + "5c" * 20
    for height in heights(chain):
        params: list[Any] = [
            {"to": target, "data": "0x"},
            height,
            {target: {"code": "0x" + BLOCKENV_RUNTIME}},
        ]
        if overrides is not None:
            params.append(overrides)
        theirs = words(rpc(chain.url, "eth_call", params))
        ours = words(await evm.call("eth_call", params))
        assert ours == theirs, height
        assert theirs["BASEFEE"] != 0, (height, theirs)  # what pyrevm alone answers wrong


async def test_basefee_reproduction_answers_the_blocks_base_fee(evm: Client, chain: Chain) -> None:
    """The issue's reproduction: code returning BASEFEE given by a state override."""
    target = "0x" + "5a" * 20
    for height in heights(chain):
        params = [{"to": target, "data": "0x"}, height, {target: {"code": BASEFEE_CODE}}]
        theirs = rpc(chain.url, "eth_call", params)
        assert await evm.call("eth_call", params) == theirs, height
        block = rpc(chain.url, "eth_getBlockByNumber", [height, False])
        assert int(theirs, 16) == int(block["baseFeePerGas"], 16)


async def test_a_call_reading_basefee_through_another_contract(
    evm: Client, chain: Chain, blockenv: str
) -> None:
    """BASEFEE read by a contract the called one calls (not the called code itself), and a
    contract creation whose init code reads it: both still equal anvil."""
    forwarder = "0x" + "5b" * 20
    # CALL(gas, blockenv, 0, 0, 0, 0, 256); RETURN(0, 256)
    code = "0x" + "6101006000600060006000" + "73" + blockenv[2:] + "5af1" + "506101006000f3"
    params = [{"to": forwarder, "data": "0x"}, "latest", {forwarder: {"code": code}}]
    assert await evm.call("eth_call", params) == rpc(chain.url, "eth_call", params)
    # init code: MSTORE(0, BASEFEE); RETURN(0, 32) → the "deployed code" is the base fee
    create = [{"data": "0x" + "4860005260206000f3"}, "latest"]
    assert await evm.call("eth_call", create) == rpc(chain.url, "eth_call", create)


def call_then(target: str, end: str) -> str:
    """Code that CALLs `target` (no calldata) and ends with its return data: `end` is
    "f3" (RETURN) or "fd" (REVERT)."""
    call = "6000600060006000600073" + target[2:] + "5af1" + "50"  # CALL(gas, target, 0…0); POP
    copy = "3d600060003e"  # RETURNDATACOPY(0, 0, RETURNDATASIZE)
    return call + copy + "3d6000" + end  # RETURN/REVERT(0, RETURNDATASIZE)


def reverted_data(url: str, params: list[Any]) -> str:
    answer = rpc_raw(url, "eth_call", params)
    assert "error" in answer, answer
    return answer["error"]["data"]


async def our_reverted_data(evm: Client, params: list[Any]) -> str:
    answer = await evm.raw("eth_call", params)
    assert "error" in answer, answer
    assert answer["error"]["code"] == -39000, answer
    return answer["error"]["data"]


async def test_basefee_read_in_a_frame_that_reverts(evm: Client, chain: Chain) -> None:
    """BASEFEE read only inside frames that revert: revm's journal forgets the accounts a
    reverted frame loaded, so the check must not rely on it. The value reaches the answer
    through the revert data (the whole call reverts) or through return data (an inner
    frame reverts, the outer one returns what it got)."""
    env, reverter, outer = "0x" + "5c" * 20, "0x" + "5d" * 20, "0x" + "5e" * 20
    inline = "0x" + "5f" * 20
    state = {
        env: {"code": "0x" + BLOCKENV_RUNTIME},
        reverter: {"code": "0x" + call_then(env, "fd")},  # calls env, reverts with its answer
        outer: {"code": "0x" + call_then(reverter, "f3")},  # returns what reverter reverted
        inline: {"code": "0x486000526020" + "6000fd"},  # REVERT(BASEFEE) in the top frame
    }
    for height in heights(chain):
        for target in (reverter, inline):
            params = [{"to": target, "data": "0x"}, height, state]
            theirs = reverted_data(chain.url, params)
            assert await our_reverted_data(evm, params) == theirs, (height, target)
            basefee = words(theirs)["BASEFEE"] if target == reverter else int(theirs, 16)
            assert basefee != 0
        params = [{"to": outer, "data": "0x"}, height, state]
        theirs = rpc(chain.url, "eth_call", params)
        assert await evm.call("eth_call", params) == theirs, height
        assert words(theirs)["BASEFEE"] != 0


async def test_basefee_in_a_reverting_frame_on_warm_state(
    evm: Client, chain: Chain, blockenv: str
) -> None:
    """The same without overrides: contracts on chain, calls on a warm EVM of the block (the
    second call at a block is answered from the verdict kept for it)."""
    reverter = deploy(chain.url, call_then(blockenv, "fd"))
    outer = deploy(chain.url, call_then(reverter, "f3"))
    for _ in range(2):
        params = [{"to": reverter, "data": "0x"}, "latest"]
        assert await our_reverted_data(evm, params) == reverted_data(chain.url, params)
        params = [{"to": outer, "data": "0x"}, "latest"]
        assert await evm.call("eth_call", params) == rpc(chain.url, "eth_call", params)


async def test_basefee_read_by_the_called_code_alone_on_warm_state(
    evm: Client, chain: Chain, blockenv: str
) -> None:
    """Callees that call no other code, on warm EVMs of two blocks: one reading BASEFEE
    answers the block's base fee every time, one holding 0x48 only as PUSH data, called at
    the same blocks, is answered by revm; both equal anvil."""
    pushed = deploy(chain.url, "6048600052" + "60206000f3")  # MSTORE(0, 0x48); RETURN
    old = rpc(chain.url, "eth_blockNumber", [])
    send(chain.url, {"from": A1, "to": A2, "value": "0x1"})  # (latest is another block)
    for height in (old, "latest"):
        for _ in range(2):
            params = [{"to": blockenv, "data": "0x"}, height]
            theirs = rpc(chain.url, "eth_call", params)
            assert await evm.call("eth_call", params) == theirs, height
            assert words(theirs)["BASEFEE"] != 0
            params = [{"to": pushed, "data": "0x"}, height]
            theirs = rpc(chain.url, "eth_call", params)
            assert await evm.call("eth_call", params) == theirs, height
            assert int(theirs, 16) == 0x48


# Gas and output depend on BASEFEE: SSTORE(0, 1) only when it is not 0, then LOG0 and
# RETURN of BASEFEE. pyrevm alone would skip the store, log and return 0.
BASEFEE_BRANCH = "4815600a5760016000555b48600052" + "60206000a0" + "60206000f3"


async def test_estimate_gas_of_a_call_reading_basefee_equals_anvil(
    evm: Client, chain: Chain
) -> None:
    target = deploy(chain.url, BASEFEE_BRANCH)
    req = {"from": A1, "to": target}
    ours = await evm.call("estimateGas", [req])
    assert ours == rpc(chain.url, "eth_estimateGas", [req, "latest"])
    assert int(ours, 16) > 40_000  # the store ran
    create = {"from": A1, "data": BASEFEE_CODE}  # init code reading BASEFEE (EIP-3860 words)
    assert await evm.call("estimateGas", [create]) == rpc(
        chain.url, "eth_estimateGas", [create, "latest"]
    )


async def test_gasprice_and_basefee_with_a_gas_price_equal_anvil(evm: Client, chain: Chain) -> None:
    """A call with a gas price reading GASPRICE and BASEFEE (run on py-evm): both as anvil's."""
    target = "0x" + "59" * 20
    code = "0x" + "3a600052" + "48602052" + "60406000f3"  # returns GASPRICE, BASEFEE
    block = rpc(chain.url, "eth_getBlockByNumber", ["latest", False])
    price = hex(2 * int(block["baseFeePerGas"], 16) + 7)
    params = [{"from": A1, "to": target, "gasPrice": price}, "latest", {target: {"code": code}}]
    theirs = rpc(chain.url, "eth_call", params)
    assert await evm.call("eth_call", params) == theirs
    assert int(theirs[2:66], 16) == int(price, 16)


async def test_simulate_transactions_reading_basefee_equal_anvil(evm: Client, chain: Chain) -> None:
    """Gas used, logs and return data as executing the transactions on anvil (whose blocks
    carry their own base fee: the values read are compared with the simulated block's), and
    the second transaction sees the first one's write (its store costs less)."""
    target = deploy(chain.url, BASEFEE_BRANCH)
    txs = [{"from": A1, "to": target}, {"from": A2, "to": target}]
    ours = await evm.call("simulateTransactions", [txs, {"block_id": "latest"}])
    base_fee = rpc(chain.url, "eth_getBlockByNumber", ["latest", False])["baseFeePerGas"]
    snapshot = rpc(chain.url, "evm_snapshot", [])
    try:
        receipts = [send(chain.url, {**tx, "gas": "0x100000"}) for tx in txs]
    finally:
        rpc(chain.url, "evm_revert", [snapshot])
    assert [r["status"] for r in ours] == [r["status"] for r in receipts] == ["0x1", "0x1"]
    assert [r["gasUsed"] for r in ours] == [r["gasUsed"] for r in receipts]
    assert ours[0]["gasUsed"] != ours[1]["gasUsed"]
    for mine, receipt in zip(ours, receipts, strict=True):
        assert int(mine["returnData"], 16) == int(base_fee, 16)
        assert [(x["address"], x["topics"]) for x in mine["logs"]] == [
            (x["address"], x["topics"]) for x in receipt["logs"]
        ]
        assert [int(x["data"], 16) for x in mine["logs"]] == [int(base_fee, 16)]


def steps(trace: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [
        (s["pc"], s["op"], s["gas"], s["gasCost"], s["depth"], s["stack"])
        for s in trace["structLogs"]
    ]


async def test_traces_of_calls_reading_basefee_equal_anvil(
    evm: Client, chain: Chain, blockenv: str
) -> None:
    """pre_traceCall/pre_traceMany of calls reading BASEFEE (pyrevm would trace a run with a
    base fee of 0): the steps (pc, op, gas, cost, depth, stack), gas and failure equal
    anvil's debug_traceCall, through a CALL, a frame that reverts and a creation."""
    branch = deploy(chain.url, BASEFEE_BRANCH)
    reverter = deploy(chain.url, call_then(blockenv, "fd"))
    outer = deploy(chain.url, call_then(reverter, "f3"))
    reqs = [
        {"from": A1, "to": branch},
        {"from": A1, "to": blockenv},
        {"from": A1, "to": reverter},
        {"from": A1, "to": outer},
        {"from": A1, "data": "0x" + BASEFEE_CODE[2:]},  # a creation whose init code reads it
    ]
    height = rpc(chain.url, "eth_blockNumber", [])
    many = await evm.call("pre_traceMany", [reqs, height])
    for req, traced in zip(reqs, many, strict=True):
        ours = await evm.call("pre_traceCall", [req, height])
        theirs = rpc(chain.url, "debug_traceCall", [req, height, {}])
        assert steps(ours) == steps(theirs) == steps(traced), req
        assert (ours["gas"], ours["failed"]) == (theirs["gas"], theirs["failed"]), req
        assert any(s["op"] == "BASEFEE" for s in ours["structLogs"])


async def test_basefee_read_only_for_one_caller_on_warm_state(evm: Client, chain: Chain) -> None:
    """The same callee and calldata read BASEFEE for one caller and not for another: the
    verdict kept on a warm EVM is per whole call, so the second caller still gets it."""
    reader = deploy(chain.url, BASEFEE_CODE[2:])
    # if CALLER == A2: return what `reader` returns (BASEFEE), else stop
    target = deploy(chain.url, "3373" + A2[2:] + "14601b5700" + "5b" + call_then(reader, "f3"))
    for sender in (A1, A2):
        params = [{"from": sender, "to": target, "data": "0x"}, "latest"]
        assert await evm.call("eth_call", params) == rpc(chain.url, "eth_call", params), sender
    assert int(rpc(chain.url, "eth_call", [{"from": A2, "to": target}, "latest"]), 16) != 0


async def test_simulated_creation_reading_basefee_then_a_call_to_it(
    evm: Client, chain: Chain
) -> None:
    """A creation whose init code stores BASEFEE (run on py-evm) deploys code returning the
    stored value, which the next simulated transaction calls: the deployed code and the slot
    come from py-evm's writes."""
    runtime = "60005460005260206000f3"  # returns SLOAD(0)
    # SSTORE(0, BASEFEE), then CODECOPY the runtime (at 0x10) and RETURN it
    create = {"from": A2, "data": "0x48600055" + "61000b8060106000396000f3" + runtime}
    snapshot = rpc(chain.url, "evm_snapshot", [])
    try:
        receipt = send(chain.url, {**create, "gas": "0x100000"})
    finally:
        rpc(chain.url, "evm_revert", [snapshot])
    created = receipt["contractAddress"]
    txs = [create, {"from": A1, "to": created}]
    ours = await evm.call("simulateTransactions", [txs, {"block_id": "latest"}])
    base_fee = rpc(chain.url, "eth_getBlockByNumber", ["latest", False])["baseFeePerGas"]
    assert [r["status"] for r in ours] == ["0x1", "0x1"]
    assert ours[0]["gasUsed"] == receipt["gasUsed"]
    assert ours[0]["returnData"] == "0x" + runtime
    assert int(ours[1]["returnData"], 16) == int(base_fee, 16)


# -- the transaction environment ---------------------------------------------------------

# returns GASPRICE, ORIGIN, CALLER, CALLVALUE, GAS, BALANCE(ORIGIN), SELFBALANCE and one more
# word: GASPRICE again (revm path) or BASEFEE (py-evm path)
TXENV_OPS = ["3a", "32", "33", "34", "5a", "3231", "47"]
TXENV = {
    "revm": "0x" + "".join(f"{op}60{i * 32:02x}52" for i, op in enumerate([*TXENV_OPS, "3a"])),
    "py-evm": "0x" + "".join(f"{op}60{i * 32:02x}52" for i, op in enumerate([*TXENV_OPS, "48"])),
}
TXENV_TARGET = "0x" + "e7" * 20
POOR = "0x" + "11" * 20  # a sender funded by a state override
FEES = [
    {},
    {"gasPrice": "0x1000"},
    {"gasPrice": "0x1"},  # below the base fee: it runs, as in anvil
    {"maxFeePerGas": "0x1000"},
    {"maxFeePerGas": "0x1000", "maxPriorityFeePerGas": "0x3"},  # the issue's case
    {"maxFeePerGas": "0x5", "maxPriorityFeePerGas": "0x3"},
    {"maxFeePerGas": "0x3b9aca07", "maxPriorityFeePerGas": "0x3"},
    {"maxPriorityFeePerGas": "0x0"},
    {"gasPrice": "0x7", "maxFeePerGas": "0x1000", "maxPriorityFeePerGas": "0x3"},
    {"gasPrice": "0x1000", "gas": "0x10000", "value": "0x5"},
    {"gasPrice": "0x1000", "accessList": [{"address": TXENV_TARGET, "storageKeys": []}]},
    {"type": "0x1", "gasPrice": "0x1000", "accessList": [
        {"address": A2, "storageKeys": ["0x" + "00" * 31 + "01"]}]},
    {"gasPrice": "0xffffffffffffffffffffffff"},  # more than the sender has
    {"chainId": "0x539"},
]  # fmt: skip


def _txenv_params(fees: dict[str, Any], engine: str, block_ov: Any, height: str) -> list[Any]:
    """An eth_call of the env code at `height`: not `latest`, since anvil answers calls at
    its head with the base fee of a block that evm_revert removed (tests above revert)."""
    request = {"from": A1, "to": TXENV_TARGET, **fees}
    code = TXENV[engine] + "6101006000f3"
    params: list[Any] = [request, height, {TXENV_TARGET: {"code": code}}]
    return params if block_ov is None else [*params, block_ov]


def _same_answer(ours: dict[str, Any], theirs: dict[str, Any]) -> bool:
    """Equal results, or both an error (the node keeps its -39xxx codes)."""
    if "error" in theirs:
        return "error" in ours
    return ours.get("result") == theirs["result"]


@pytest.mark.parametrize("engine", ["revm", "py-evm"])
@pytest.mark.parametrize("block_ov", [None, {"baseFee": "0x7"}, {"baseFee": "0x0"}])
async def test_transaction_env_equals_anvil(
    evm: Client, chain: Chain, engine: str, block_ov: Any
) -> None:
    """GASPRICE (the effective price), ORIGIN, CALLER, CALLVALUE, GAS (access lists
    applied), the sender's balance after the up-front charge, and the fee checks, for
    legacy, 2930 and 1559 call objects, on both engines, as anvil's eth_call."""
    height = hex(int(rpc(chain.url, "eth_blockNumber", []), 16) - 1)
    for fees in FEES:
        params = _txenv_params(fees, engine, block_ov, height)
        theirs = rpc_raw(chain.url, "eth_call", params)
        ours = await evm.raw("eth_call", params)
        assert _same_answer(ours, theirs), (fees, ours, theirs)


async def test_issue_gasprice_is_the_effective_price(evm: Client, chain: Chain) -> None:
    """maxFeePerGas 0x1000 and a priority fee of 3 at a base fee of 7: GASPRICE reads 0xa."""
    fees = {"maxFeePerGas": "0x1000", "maxPriorityFeePerGas": "0x3"}
    params = _txenv_params(fees, "revm", {"baseFee": "0x7"}, hex(chain.erc20_block))
    ours = await evm.call("eth_call", params)
    assert ours == rpc(chain.url, "eth_call", params)
    assert int(ours[2:66], 16) == 0xA


@pytest.mark.parametrize("engine", ["revm", "py-evm"])
async def test_balance_covering_the_fee_once_equals_anvil(
    evm: Client, chain: Chain, engine: str
) -> None:
    """The sender holds gas × max fee + value exactly (anvil's check), or one wei less:
    the call runs with the fee taken from its balance (on py-evm, since revm would check the
    balance again), or is refused."""
    gas, max_fee = 100_000, 2**40
    for extra in (5, 4):
        fees = {"gas": hex(gas), "maxFeePerGas": hex(max_fee), "maxPriorityFeePerGas": "0x3"}
        params = _txenv_params({**fees, "value": "0x5"}, engine, {"baseFee": "0x7"}, "0x1")
        params[0]["from"] = POOR
        params[2][POOR] = {"balance": hex(gas * max_fee + extra)}
        theirs = rpc_raw(chain.url, "eth_call", params)
        ours = await evm.raw("eth_call", params)
        assert _same_answer(ours, theirs), (extra, ours, theirs)
        assert ("error" in theirs) == (extra == 4)


@pytest.mark.parametrize("fees", [{}, {"gasPrice": "0x1000"}, {"maxFeePerGas": "0x1000"}])
async def test_priced_creation_reading_its_env_equals_anvil(
    evm: Client, chain: Chain, fees: dict[str, str]
) -> None:
    """A creation whose init code returns GASPRICE, ORIGIN, CALLER, CALLVALUE, GAS and the
    sender's balance (pyrevm's deploy, given the price)."""
    request = {"from": A1, "data": TXENV["revm"] + "6101006000f3", **fees}
    height = hex(chain.erc20_block)
    ours = await evm.call("eth_call", [request, height])
    assert ours == rpc(chain.url, "eth_call", [request, height])


async def test_fee_and_chain_errors(evm: Client, chain: Chain) -> None:
    """A priority fee above the max fee, and a chainId of another chain: -32602 (anvil
    refuses both too)."""
    for fees in ({"maxFeePerGas": "0x1000", "maxPriorityFeePerGas": "0x2000"},
                 {"maxPriorityFeePerGas": "0x3"}, {"chainId": "0x1"}):  # fmt: skip
        params = _txenv_params(fees, "revm", None, "0x1")
        assert "error" in rpc_raw(chain.url, "eth_call", params)
        for method in ("eth_call", "estimateGas"):
            answer = await evm.raw(method, params[:1] if method == "estimateGas" else params)
            assert answer["error"]["code"] == -32602, (method, fees)


async def test_estimate_gas_equals_anvils_eth_estimate_gas(evm: Client, chain: Chain) -> None:
    """The vendor estimateGas as anvil's eth_estimateGas: a plain transfer is 21000 without
    running; with a price (legacy or 1559) the gas is capped by what the sender can pay;
    a sender without funds for the value is refused."""
    cases = [
        {"from": A1, "to": "0x" + "22" * 20},
        {"from": A1, "to": "0x" + "22" * 20, "data": "0x00"},
        {"from": A1, "to": chain.counter},
        {"from": A1, "to": chain.counter, "maxFeePerGas": "0x3b9aca07"},
        {"from": A1, "to": chain.counter, "gasPrice": "0x3b9aca07", "value": "0x10"},
        {"from": A1, "to": chain.counter, "accessList": [{"address": chain.counter,
                                                          "storageKeys": ["0x" + "00" * 32]}]},
    ]  # fmt: skip
    for request in cases:
        ours = await evm.call("estimateGas", [request])
        assert ours == rpc(chain.url, "eth_estimateGas", [request, "latest"]), request
    poor = {"from": POOR, "to": chain.counter, "gasPrice": "0x1"}
    assert "error" in rpc_raw(chain.url, "eth_estimateGas", [poor, "latest"])
    answer = await evm.raw("estimateGas", [poor])
    assert answer["error"]["code"] == -39001
    assert "allowance" in answer["error"]["message"]
    broke = {"from": POOR, "to": chain.counter, "value": "0x1"}
    assert (await evm.raw("estimateGas", [broke]))["error"]["code"] == -39002

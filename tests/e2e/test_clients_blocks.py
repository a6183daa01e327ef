"""Real client libraries read blocks through `chainstate up` as indexers and dapps do, and get
what anvil (the devnet's execution client) gives them for the same block:

- a block with its transactions (web3.py `get_block(n, True)`, ethers v6 `getBlock(n, true)`,
  viem `getBlock({includeTransactions: true})`) and with their hashes;
- the block's receipts (web3.py `get_block_receipts`, viem `getBlockReceipts`, ethers
  `send("eth_getBlockReceipts")`);
- `debug_traceTransaction` with the callTracer (web3.py `geth.debug.trace_transaction`);
- waiting for a block that does not exist yet by polling `getBlock(n)`: "no such block"
  (`null`) until it exists, then the block (web3.py `BlockNotFound`, ethers `null`, viem
  `BlockNotFoundError`; any other error fails the wait).

The block read holds three transactions of three types, one of them an ERC20 transfer (logs,
a trace with a call), mined together while the test holds anvil's interval mining. The JS
libraries are installed with npm into the project's tool folder (.tools) on first use.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from web3 import Web3
from web3.exceptions import BlockNotFound

from nodes.devnet.anvil import TOOL_DIR, ensure_npm_package, ensure_openzeppelin
from nodes.devnet.workload import abi_encode_erc20_constructor, erc20_transfer_data, fresh_address
from tests.e2e.stack import DEV, Stack, write_config

ETHERS_VERSION = "6.17.0"
VIEM_VERSION = "2.57.20"
READER = Path(__file__).parent / "js" / "read_blocks.cjs"
DEV_KEY = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80"
GWEI = 10**9

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    config, ports = write_config(tmp_path_factory.mktemp("clients-blocks"))
    running = Stack(config, ports)
    running.start()
    yield running
    assert running.stop() == 0, "".join(running.output[-50:])


@pytest.fixture(scope="module")
def w3(stack: Stack) -> Web3:
    return Web3(Web3.HTTPProvider(stack.url("8663") + "/1337", request_kwargs={"timeout": 30}))


@pytest.fixture(scope="module")
def anvil(stack: Stack) -> Web3:
    return Web3(Web3.HTTPProvider(stack.url("8545")))


def signed(w3: Web3, tx: dict[str, Any]) -> bytes:
    return w3.eth.send_raw_transaction(Account.sign_transaction(tx, DEV_KEY).raw_transaction)


@pytest.fixture(scope="module")
def block(w3: Web3, anvil: Web3) -> tuple[int, str]:
    """A block holding a legacy transfer, an EIP-1559 transfer and an ERC20 transfer (sent
    through the proxy, mined together), readable through the proxy; and the ERC20 transfer's
    hash."""
    artifact = json.loads((ensure_openzeppelin() / "ERC20PresetFixedSupply.json").read_text())
    code = artifact["bytecode"] + abi_encode_erc20_constructor("Blocks", "BLK", 10**24, DEV).hex()
    me = Web3.to_checksum_address(DEV)
    nonce = w3.eth.get_transaction_count(me, "pending")
    deploy = {
        "data": code,
        "gas": 2_000_000,
        "gasPrice": 10 * GWEI,
        "nonce": nonce,
        "chainId": 1337,
    }
    token = w3.eth.wait_for_transaction_receipt(signed(w3, deploy), timeout=60)["contractAddress"]
    anvil.provider.make_request("evm_setIntervalMining", [0])  # the next three share a block
    try:
        common = {"chainId": 1337, "gas": 100_000}
        fees = {"maxFeePerGas": 10 * GWEI, "maxPriorityFeePerGas": GWEI}
        to = Web3.to_checksum_address(fresh_address(31))
        signed(w3, {**common, "nonce": nonce + 1, "to": to, "value": 1, "gasPrice": 10 * GWEI})
        signed(w3, {**common, "nonce": nonce + 2, "to": to, "value": 2, **fees, "type": 2})
        data = erc20_transfer_data(fresh_address(32), 5)
        call = signed(w3, {**common, "nonce": nonce + 3, "to": token, "data": data, **fees})
        anvil.provider.make_request("evm_mine", [])
    finally:
        anvil.provider.make_request("evm_setIntervalMining", [1])
    receipt = w3.eth.wait_for_transaction_receipt(call, timeout=60, poll_latency=0.1)
    number = receipt["blockNumber"]
    assert len(anvil.eth.get_block(number)["transactions"]) == 3
    return number, "0x" + bytes(call).hex()


def without_total_difficulty(value: Any) -> Any:
    """anvil's blocks carry `totalDifficulty`, which left the spec with the merge: the proxy
    may leave it out (the listed difference `total-difficulty` of
    docs/proxy.md, "Conformance with a full node"), so it is not compared."""
    if isinstance(value, dict):
        return {k: without_total_difficulty(v) for k, v in value.items() if k != "totalDifficulty"}
    if isinstance(value, list):
        return [without_total_difficulty(v) for v in value]
    return value


def plain(value: Any) -> Any:
    return json.loads(Web3.to_json(value))


def gas_before(anvil: Web3, tx: str) -> int:
    """The gas the transactions before `tx` in its block used."""
    receipt = anvil.eth.get_transaction_receipt(tx)
    return receipt["cumulativeGasUsed"] - receipt["gasUsed"]


def own_gas(trace: dict[str, Any], before: int) -> dict[str, Any]:
    """anvil's callTracer counts the gas of the transactions before this one in its block
    into `gasUsed` (the listed difference `anvil-cumulative-gas` of
    docs/proxy.md, "Conformance with a full node"): take it off."""
    used = trace["gasUsed"]
    fixed = used - before if isinstance(used, int) else hex(int(used, 16) - before)
    return {**trace, "gasUsed": fixed}


def test_web3py_block_with_transactions_equals_anvil(
    w3: Web3, anvil: Web3, block: tuple[int, str]
) -> None:
    number, _ = block
    got = without_total_difficulty(plain(w3.eth.get_block(number, full_transactions=True)))
    assert len(got["transactions"]) == 3
    assert {tx["type"] for tx in got["transactions"]} == {0, 2}
    want = plain(anvil.eth.get_block(number, full_transactions=True))
    assert got == without_total_difficulty(want)
    hashes = without_total_difficulty(plain(w3.eth.get_block(got["hash"])))
    assert hashes == without_total_difficulty(plain(anvil.eth.get_block(number)))
    assert hashes["transactions"] == [tx["hash"] for tx in got["transactions"]]


def test_web3py_block_receipts_equal_anvil(w3: Web3, anvil: Web3, block: tuple[int, str]) -> None:
    number, call = block
    receipts = plain(w3.eth.get_block_receipts(number))
    assert receipts == plain(anvil.eth.get_block_receipts(number))
    assert [r["status"] for r in receipts] == [1, 1, 1]
    assert receipts[2]["transactionHash"] == call and len(receipts[2]["logs"]) == 1


def test_web3py_debug_trace_transaction_equals_anvil(
    w3: Web3, anvil: Web3, block: tuple[int, str]
) -> None:
    _, call = block
    config = {"tracer": "callTracer"}
    trace = plain(w3.geth.debug.trace_transaction(call, config))
    want = plain(anvil.geth.debug.trace_transaction(call, config))
    assert trace == own_gas(want, gas_before(anvil, call))
    assert trace["type"] == "CALL" and trace["input"].startswith("0xa9059cbb")


def test_web3py_waits_for_a_future_block(w3: Web3, anvil: Web3) -> None:
    future = w3.eth.block_number + 2
    polls, deadline = 0, time.monotonic() + 30
    while True:
        polls += 1
        try:
            got = w3.eth.get_block(future)
            break
        except BlockNotFound:  # the node answered null: not there yet
            assert time.monotonic() < deadline, f"block {future} never arrived"
            time.sleep(0.1)
    assert polls > 1, "the block existed at once: nothing was waited for"
    assert got["hash"] == anvil.eth.get_block(future)["hash"]


@pytest.fixture(scope="module")
def node_modules() -> Path:
    ensure_npm_package("ethers", ETHERS_VERSION)
    ensure_npm_package("viem", VIEM_VERSION)
    return TOOL_DIR / "node_modules"


def read_blocks(node_modules: Path, lib: str, url: str, block: int, tx: str, future: str) -> Any:
    env = {**os.environ, "CHAINSTATE_NODE_MODULES": str(node_modules)}
    done = subprocess.run(
        ["node", str(READER), lib, url, str(block), tx, future],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    answer = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else {}
    assert done.returncode == 0 and "error" not in answer, answer.get("error") or done.stderr
    return answer


@pytest.mark.parametrize("lib", ["ethers", "viem"])
def test_js_client_reads_blocks_like_anvil(
    lib: str, stack: Stack, w3: Web3, anvil: Web3, block: tuple[int, str], node_modules: Path
) -> None:
    number, call = block
    ours = read_blocks(node_modules, lib, stack.url("8663") + "/1337", number, call, "next")
    future = ours["waited"]["number"]
    theirs = read_blocks(node_modules, lib, stack.url("8545"), number, call, str(future))
    theirs["trace"] = own_gas(theirs["trace"], gas_before(anvil, call))
    for part in ("block", "hashes", "receipts", "trace"):
        assert without_total_difficulty(ours[part]) == without_total_difficulty(theirs[part]), part
    transactions = ours["block"]["prefetchedTransactions" if lib == "ethers" else "transactions"]
    assert len(transactions) == 3
    assert len(ours["receipts"]) == 3
    assert ours["waited"]["polls"] > 1, "the block existed at once: nothing was waited for"
    assert ours["waited"]["hash"] == theirs["waited"]["hash"]


def test_a_pending_transaction_filter_reports_a_sent_transaction(w3: Web3, anvil: Web3) -> None:
    """web3.py's `eth.filter("pending")` through the proxy: the filter lives in the Leader's
    execution client, so a transaction sent while it is installed is among its changes (held
    in the mempool while anvil's interval mining is off); uninstalled, it is gone."""
    pending = w3.eth.filter("pending")
    me = Web3.to_checksum_address(DEV)
    anvil.provider.make_request("evm_setIntervalMining", [0])
    try:
        nonce = w3.eth.get_transaction_count(me, "pending")
        to = Web3.to_checksum_address(fresh_address(33))
        sent = signed(
            w3, {"chainId": 1337, "gas": 21_000, "gasPrice": 10 * GWEI, "nonce": nonce, "to": to}
        )
        seen: list[bytes] = []
        deadline = time.monotonic() + 20
        while sent not in seen and time.monotonic() < deadline:
            seen += w3.eth.get_filter_changes(pending.filter_id)
            time.sleep(0.1)
        assert sent in seen
        assert w3.eth.get_filter_changes(pending.filter_id) == []  # each change once
    finally:
        anvil.provider.make_request("evm_setIntervalMining", [1])
    assert w3.eth.uninstall_filter(pending.filter_id) is True
    answer = w3.provider.make_request("eth_getFilterChanges", [pending.filter_id])
    assert answer["error"]["code"] == -32000 and "filter not found" in answer["error"]["message"]

"""A real Ethereum client (web3.py) against `chainstate up`, as an application uses it.

Everything goes through the proxy's `POST /1337`, and every answer is compared with what
anvil (the devnet's execution client, the reference) says for the same block: connecting,
signing and sending (two sends back to back need the pending nonce), waiting for receipts,
balances at the new and at an old block, an ERC20 from OpenZeppelin's artifacts, a revert
with its reason, and gas estimates.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from eth_abi import decode
from eth_account import Account
from web3 import Web3
from web3.contract import Contract
from web3.exceptions import ContractLogicError
from web3.middleware import SignAndSendRawMiddlewareBuilder

from nodes.devnet.anvil import ensure_openzeppelin
from tests.e2e.stack import DEV, Stack, post, write_config

# Account 0 of the test mnemonic "test test test test test test test test test test test
# junk" (anvil's and hardhat's first dev account): DEV.
DEV_KEY = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80"
ME = Account.from_key(DEV_KEY).address  # checksummed, as web3.py wants it
REVERT_REASON = "ERC20: transfer amount exceeds balance"

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    config, ports = write_config(tmp_path_factory.mktemp("clients"))
    running = Stack(config, ports)
    running.start()
    yield running
    assert running.stop() == 0, "".join(running.output)


@pytest.fixture(scope="module")
def w3(stack: Stack) -> Web3:
    """web3.py on the proxy, signing locally with the first dev account's key."""
    web3 = Web3(Web3.HTTPProvider(stack.url("8663") + "/1337", request_kwargs={"timeout": 30}))
    web3.middleware_onion.inject(SignAndSendRawMiddlewareBuilder.build(DEV_KEY), layer=0)
    return web3


@pytest.fixture(scope="module")
def anvil(stack: Stack) -> Web3:
    """The reference: web3.py on the execution client itself."""
    return Web3(Web3.HTTPProvider(stack.url("8545")))


@pytest.fixture(scope="module")
def erc20_artifact() -> dict[str, Any]:
    return json.loads((ensure_openzeppelin() / "ERC20PresetFixedSupply.json").read_text())


def wait(w3: Web3, tx_hash: bytes) -> Any:
    return w3.eth.wait_for_transaction_receipt(tx_hash, timeout=60, poll_latency=0.1)


def sign_and_send(w3: Web3, tx: dict[str, Any]) -> bytes:
    """Sign with the dev key here and send the raw bytes, as a wallet does."""
    return w3.eth.send_raw_transaction(Account.sign_transaction(tx, DEV_KEY).raw_transaction)


def test_connects_like_any_node(w3: Web3, anvil: Web3, stack: Stack) -> None:
    assert ME.lower() == DEV
    assert w3.is_connected(show_traceback=True)
    assert w3.client_version.startswith("chainstate-state-node/state-1/v")
    assert w3.eth.chain_id == 1337
    assert w3.net.version == "1337"
    assert w3.net.listening is True
    assert 0 <= w3.eth.block_number <= anvil.eth.block_number
    assert w3.eth.accounts[0] == ME
    assert w3.eth.gas_price > 0 and w3.eth.max_priority_fee > 0
    # Passed to anvil as it is; anvil's own answer moves with its head (its last base fee was
    # 875000000 and then 765625000 for the same block in one CI run): ours must be one of
    # the answers anvil gave just before and just after.
    before = anvil.eth.fee_history(1, 0, [50])
    history = w3.eth.fee_history(1, 0, [50])
    after = anvil.eth.fee_history(1, 0, [50])
    assert history in (before, after) and len(history["baseFeePerGas"]) == 2
    # The state node itself follows the spec: no eth_estimateGas there, and it says so.
    state = stack.url("8665")
    assert Web3(Web3.HTTPProvider(state)).is_connected()
    estimate = {"jsonrpc": "2.0", "id": 1, "method": "eth_estimateGas", "params": [{"to": DEV}]}
    error = post(state, estimate)["error"]
    assert error["code"] == -32601 and "estimateGas" in error["message"]


def test_back_to_back_sends_new_and_old_balance(w3: Web3, anvil: Web3) -> None:
    to = Account.create().address
    base_fee = w3.eth.get_block("latest")["baseFeePerGas"]
    fees = {"maxPriorityFeePerGas": w3.eth.max_priority_fee}
    fees["maxFeePerGas"] = 2 * base_fee + fees["maxPriorityFeePerGas"]
    first_nonce = w3.eth.get_transaction_count(ME, "pending")
    hashes = []
    for value in (1000, 2000):  # the second send is built before the first is mined
        nonce = w3.eth.get_transaction_count(ME, "pending")
        tx = {"to": to, "value": value, "nonce": nonce, "gas": 21000, "chainId": 1337, **fees}
        hashes.append(sign_and_send(w3, tx))
    # And once more with everything filled in by web3.py (nonce, gas estimate, fees).
    hashes.append(w3.eth.send_transaction({"from": ME, "to": to, "value": 4000}))
    receipts = [wait(w3, h) for h in hashes]
    assert [r["status"] for r in receipts] == [1, 1, 1]
    nonces = [w3.eth.get_transaction(h)["nonce"] for h in hashes]
    assert nonces == [first_nonce, first_nonce + 1, first_nonce + 2]
    assert receipts[0] == anvil.eth.get_transaction_receipt(hashes[0])
    first, last = receipts[0]["blockNumber"], receipts[-1]["blockNumber"]
    # Once a receipt is out, its block can be read through the proxy, at once.
    assert w3.eth.get_balance(to, last) == 7000 == anvil.eth.get_balance(to, last)
    assert w3.eth.get_balance(to) == 7000
    assert w3.eth.get_balance(to, first - 1) == 0 == anvil.eth.get_balance(to, first - 1)
    assert w3.eth.get_balance(to, first) == anvil.eth.get_balance(to, first)
    assert w3.eth.get_balance(ME, first - 1) == anvil.eth.get_balance(ME, first - 1)
    assert w3.eth.get_transaction_count(ME, last) == first_nonce + 3
    assert w3.eth.get_block(last)["hash"] == anvil.eth.get_block(last)["hash"]


@pytest.fixture(scope="module")
def erc20(w3: Web3, erc20_artifact: dict[str, Any]) -> tuple[Contract, int]:
    """An ERC20 deployed through the proxy (signed here) and the block it was deployed in."""
    factory = w3.eth.contract(abi=erc20_artifact["abi"], bytecode=erc20_artifact["bytecode"])
    tx = factory.constructor("Token", "TOK", 10**24, ME).build_transaction(
        {"from": ME, "nonce": w3.eth.get_transaction_count(ME, "pending")}
    )
    receipt = wait(w3, sign_and_send(w3, tx))
    assert receipt["status"] == 1
    address = receipt["contractAddress"]
    return w3.eth.contract(address=address, abi=erc20_artifact["abi"]), receipt["blockNumber"]


def test_erc20_balance_of_at_latest_and_old_blocks_equals_anvil(
    w3: Web3, anvil: Web3, erc20: tuple[Contract, int]
) -> None:
    token, deployed = erc20
    reference = anvil.eth.contract(address=token.address, abi=token.abi)
    holder = Account.create().address
    receipt = wait(w3, token.functions.transfer(holder, 5 * 10**18).transact({"from": ME}))
    moved = receipt["blockNumber"]
    assert token.functions.balanceOf(holder).call() == 5 * 10**18
    for block in (deployed, moved - 1, moved, "latest"):
        for who in (holder, ME):
            got = token.functions.balanceOf(who).call(block_identifier=block)
            assert got == reference.functions.balanceOf(who).call(block_identifier=block), block
    assert token.functions.balanceOf(holder).call(block_identifier=moved - 1) == 0
    assert token.functions.totalSupply().call(block_identifier=deployed) == 10**24
    assert token.functions.symbol().call() == "TOK"


def test_revert_surfaces_its_reason(w3: Web3, anvil: Web3, erc20: tuple[Contract, int]) -> None:
    token, _ = erc20
    reference = anvil.eth.contract(address=token.address, abi=token.abi)
    broke = Account.create().address
    overdraw = token.functions.transfer(ME, 10**30)
    with pytest.raises(ContractLogicError) as got:
        overdraw.call({"from": broke})
    with pytest.raises(ContractLogicError) as want:
        reference.functions.transfer(ME, 10**30).call({"from": broke})
    assert got.value.data == want.value.data
    assert got.value.message.startswith("execution reverted")
    data = got.value.data
    assert isinstance(data, str) and data.startswith("0x08c379a0")  # Error(string)
    assert decode(["string"], bytes.fromhex(data[10:])) == (REVERT_REASON,)
    # A gas estimate of the same call reverts with the reason in the message.
    with pytest.raises(ContractLogicError, match=REVERT_REASON):
        overdraw.estimate_gas({"from": broke})


def test_estimate_gas_equals_anvil(w3: Web3, anvil: Web3, erc20: tuple[Contract, int]) -> None:
    token, _ = erc20
    reference = anvil.eth.contract(address=token.address, abi=token.abi)
    to = Account.create().address
    got = token.functions.transfer(to, 1).estimate_gas({"from": ME})
    assert got == reference.functions.transfer(to, 1).estimate_gas({"from": ME})
    assert 21000 < got < 100_000
    plain = {"from": ME, "to": to, "value": 1}
    assert w3.eth.estimate_gas(plain) == 21000 == anvil.eth.estimate_gas(plain)

"""The workload driver leaves the chain in the state its record describes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nodes.devnet.rpc import EthClient
from nodes.devnet.workload import (
    ERC20_SUPPLY,
    WorkloadRecord,
    create_address,
    mapping_slot,
    run_workload,
    slot_hex,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def record(anvil_url: str) -> WorkloadRecord:
    import asyncio

    return asyncio.run(run_workload(anvil_url))


@pytest.fixture
async def eth(anvil_url: str):
    client = EthClient(anvil_url)
    yield client
    await client.close()


def test_create_address_matches_known_vector() -> None:
    # The first contract deployed by the first dev account on any fresh anvil.
    sender = "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266"
    assert create_address(sender, 0) == "0x5fbdb2315678afecb367f032d93f642f64180aa3"


async def test_erc20_balances(record: WorkloadRecord, eth: EthClient) -> None:
    token = record.erc20
    holders = record.erc20_holders
    expected = [ERC20_SUPPLY - 6001, 0, 1995, 3000, 1006]
    for holder, want in zip(holders, expected, strict=True):
        slot = mapping_slot(holder, 0)
        assert slot in record.slots[token]
        got = await eth.call("eth_getStorageAt", [token, slot, hex(record.last_block)])
        assert int(got, 16) == want, holder
        data = "0x70a08231" + holder[2:].rjust(64, "0")  # balanceOf: slot 0 is `_balances`
        assert int(await eth.call("eth_call", [{"to": token, "data": data}, "latest"]), 16) == want


async def test_storage_contract_slots(record: WorkloadRecord, eth: EthClient) -> None:
    storage = record.contracts["storage"]
    want = {0: 0, 1: 111, 2: 0, 3: 33, 0x10: 0, 2**255: 5}
    for slot, value in want.items():
        got = await eth.call("eth_getStorageAt", [storage, slot_hex(slot), "latest"])
        assert int(got, 16) == value, hex(slot)
        assert slot_hex(slot) in record.slots[storage]


async def test_selfdestruct_cancun_semantics(record: WorkloadRecord, eth: EthClient) -> None:
    victim, ephemeral = record.selfdestructed
    # An old contract keeps its code and storage; only the balance leaves.
    assert await eth.call("eth_getCode", [victim, "latest"]) == "0x33ff"
    assert await eth.call("eth_getBalance", [victim, "latest"]) == "0x0"
    assert int(await eth.call("eth_getStorageAt", [victim, "0x0", "latest"]), 16) == 7
    # Created and destroyed in one transaction: nothing remains.
    assert await eth.call("eth_getCode", [ephemeral, "latest"]) == "0x"
    assert await eth.call("eth_getBalance", [ephemeral, "latest"]) == "0x0"
    assert await eth.call("eth_getTransactionCount", [ephemeral, "latest"]) == "0x0"


async def test_reorgs_orphan_their_blocks(record: WorkloadRecord, eth: EthClient) -> None:
    assert [r["kind"] for r in record.reorgs] == ["evm_revert", "anvil_reorg"]
    for reorg in record.reorgs:
        for offset, orphan in enumerate(reorg["orphaned"]):
            canonical = await eth.call(
                "eth_getBlockByNumber", [hex(reorg["height"] + offset), False]
            )
            assert canonical["hash"] != orphan
            assert await eth.call("eth_getBlockByHash", [orphan, False]) is None
    # The orphaned transfer's recipient holds nothing on the canonical chain.
    assert (
        await eth.call("eth_getBalance", ["0xc0ffee0000000000000000000000000000000004", "latest"])
        == "0x0"
    )
    assert (
        int(
            await eth.call(
                "eth_getBalance", ["0xc0ffee0000000000000000000000000000000005", "latest"]
            ),
            16,
        )
        == 2 * 10**18
    )


async def test_every_recorded_transaction_is_canonical(
    record: WorkloadRecord, eth: EthClient
) -> None:
    for tx in record.transactions:
        receipt = await eth.call("eth_getTransactionReceipt", [tx])
        assert receipt is not None and receipt["status"] == "0x1"
        assert record.first_block <= int(receipt["blockNumber"], 16) <= record.last_block


def test_cli_workload_prints_the_record(anvil_url: str, record: WorkloadRecord) -> None:
    cmd = [sys.executable, "-m", "stack.cli", "devnet", "workload", "--url", anvil_url]
    out = subprocess.run(
        [*cmd, "--json", "--no-reorg"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["chain_id"] == 1337 and doc["first_block"] == record.last_block + 1
    assert doc["reorgs"] == []


def test_cli_workload_unreachable_url_is_a_clear_error() -> None:
    from tests.conftest import free_port

    url = f"http://127.0.0.1:{free_port()}"
    cmd = [sys.executable, "-m", "stack.cli", "devnet", "workload", "--url", url]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert url in out.stderr


async def test_workload_is_deterministic(record: WorkloadRecord, eth: EthClient) -> None:
    """A fresh automine anvil gets the same blocks' state: same contracts, heights, values."""
    from nodes.devnet.anvil import GENESIS, AnvilProcess
    from tests.conftest import free_port

    async with AnvilProcess(port=free_port(), genesis=GENESIS) as other:
        again = await run_workload(other.url)
        mine, theirs = record.to_json(), again.to_json()
        for volatile in ("reorgs", "transactions"):  # hashes include block timestamps
            mine.pop(volatile), theirs.pop(volatile)
        assert mine == theirs
        other_eth = EthClient(other.url)
        try:
            for height in (record.first_block, record.last_block):
                for addr in sorted(record.accounts):
                    params = [addr, hex(height)]
                    assert await eth.call("eth_getBalance", params) == await other_eth.call(
                        "eth_getBalance", params
                    )
                for addr, slot in record.storage_targets():
                    params = [addr, slot, hex(height)]
                    assert await eth.call("eth_getStorageAt", params) == await other_eth.call(
                        "eth_getStorageAt", params
                    )
        finally:
            await other_eth.close()

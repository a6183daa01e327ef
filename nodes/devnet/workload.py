"""A deterministic workload for the devnet, driven over JSON-RPC.

It exercises what the write node must turn into state diffs: ETH transfers (also to fresh
accounts), contract deployments, an OpenZeppelin ERC20 with transfers (a holder drained to a
zero slot), a storage contract whose slots are written, overwritten and zeroed, a block where
a slot is changed and restored, SELFDESTRUCT under Cancun rules (an old contract that only
sends its balance away, and a contract created and destroyed in one transaction), and chain
reorganisations (`evm_snapshot`/`evm_revert` and `anvil_reorg`).

It uses anvil's unlocked dev accounts (`eth_sendTransaction`). On a fresh automine anvil
every run makes the same blocks with the same state at every height (block hashes differ
with the timestamps). `run()` returns a `WorkloadRecord` of everything it touched, so a
differential test can compare every touched account and slot at every block.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from Crypto.Hash import keccak

from chainstate.jsonrpc import METHOD_NOT_FOUND, JsonRpcError
from nodes.devnet.anvil import ensure_openzeppelin
from nodes.devnet.rpc import EthClient

ETHER = 10**18
ERC20_SUPPLY = 1_000_000 * ETHER
ERC20_BALANCES_SLOT = 0  # OpenZeppelin 4.9 ERC20: `_balances` is the first state variable
DEFAULT_RECEIPT_TIMEOUT = 30.0  # seconds to wait for a transaction to be mined

# Hand-assembled EVM code (there is no compiler on the devnet).
# Storage: calldata = slot (32 bytes) ++ value (32 bytes) → SSTORE(slot, value).
STORAGE_RUNTIME = bytes.fromhex("6020356000355500")
# Self-destructing: any call sends the whole balance to the caller (SELFDESTRUCT(CALLER)).
SELFDESTRUCT_RUNTIME = bytes.fromhex("33ff")
# Init code that writes slot 0 = 1, then SELFDESTRUCT(CALLER): created and destroyed at once.
CREATE_AND_DESTROY_INIT = bytes.fromhex("600160005533ff")


class WorkloadError(RuntimeError):
    """A workload step did not have the effect it needs (failed transaction, timeout)."""


def keccak256(data: bytes) -> bytes:
    return keccak.new(digest_bits=256, data=data).digest()


def word(value: int) -> bytes:
    return value.to_bytes(32, "big")


def address_word(address: str) -> bytes:
    return bytes.fromhex(address[2:]).rjust(32, b"\0")


def slot_hex(slot: int | bytes) -> str:
    """The canonical 32-byte storage slot encoding."""
    raw = word(slot) if isinstance(slot, int) else slot.rjust(32, b"\0")
    return "0x" + raw.hex()


def mapping_slot(key: str, base_slot: int) -> str:
    """Storage slot of `mapping(address => …)` at `base_slot` for `key`."""
    return slot_hex(keccak256(address_word(key) + word(base_slot)))


def init_code(runtime: bytes, constructor: bytes = b"") -> bytes:
    """Init code that runs `constructor`, then returns `runtime` as the contract's code."""
    size = len(runtime)
    if size > 0xFF:
        raise ValueError("runtime too long for the one-byte PUSH1 copier")
    offset = len(constructor) + 12
    copier = bytes([0x60, size, 0x60, offset, 0x60, 0x00, 0x39, 0x60, size, 0x60, 0x00, 0xF3])
    return constructor + copier + runtime


def sstore_code(slot: int, value: int) -> bytes:
    """PUSH1 value, PUSH1 slot, SSTORE (both below 256)."""
    return bytes([0x60, value, 0x60, slot, 0x55])


def abi_encode_erc20_constructor(name: str, symbol: str, supply: int, owner: str) -> bytes:
    """ABI encoding of `(string, string, uint256, address)`."""

    def tail(text: str) -> bytes:
        raw = text.encode()
        return word(len(raw)) + raw.ljust((len(raw) + 31) // 32 * 32, b"\0")

    name_tail, symbol_tail = tail(name), tail(symbol)
    head = word(0x80) + word(0x80 + len(name_tail)) + word(supply) + address_word(owner)
    return head + name_tail + symbol_tail


def erc20_transfer_data(to: str, amount: int) -> str:
    return "0x" + (bytes.fromhex("a9059cbb") + address_word(to) + word(amount)).hex()


def storage_call_data(slot: int, value: int) -> str:
    return "0x" + (word(slot) + word(value)).hex()


def fresh_address(n: int) -> str:
    """Deterministic never-used addresses (no key; they only receive)."""
    return "0x" + f"c0ffee{n:034x}"


@dataclass
class WorkloadRecord:
    """What the workload touched; heights are of the final canonical chain."""

    chain_id: int = 0
    first_block: int = 0
    last_block: int = 0
    accounts: set[str] = field(default_factory=set)
    slots: dict[str, set[str]] = field(default_factory=dict)
    contracts: dict[str, str] = field(default_factory=dict)
    erc20: str = ""
    erc20_holders: list[str] = field(default_factory=list)
    selfdestructed: list[str] = field(default_factory=list)
    reorgs: list[dict[str, Any]] = field(default_factory=list)
    transactions: list[str] = field(default_factory=list)

    def touch(self, *addresses: str | None) -> None:
        for addr in addresses:
            if addr:
                self.accounts.add(addr.lower())

    def touch_slot(self, address: str, slot: str) -> None:
        self.touch(address)
        self.slots.setdefault(address.lower(), set()).add(slot)

    def storage_targets(self) -> list[tuple[str, str]]:
        """Every (address, slot) pair written, sorted."""
        return sorted((a, s) for a, slots in self.slots.items() for s in slots)

    def to_json(self) -> dict[str, Any]:
        return {
            "chain_id": self.chain_id,
            "first_block": self.first_block,
            "last_block": self.last_block,
            "accounts": sorted(self.accounts),
            "slots": {a: sorted(s) for a, s in sorted(self.slots.items())},
            "contracts": self.contracts,
            "erc20": self.erc20,
            "erc20_holders": self.erc20_holders,
            "selfdestructed": self.selfdestructed,
            "reorgs": self.reorgs,
            "transactions": self.transactions,
        }


class Workload:
    """Runs the scenario against one execution client with unlocked dev accounts."""

    def __init__(
        self,
        client: EthClient,
        *,
        artifacts: Path | None = None,
        reorg: bool = True,
        receipt_timeout: float = DEFAULT_RECEIPT_TIMEOUT,
    ) -> None:
        self.client = client
        self.artifacts = artifacts
        self.reorg = reorg
        self.receipt_timeout = receipt_timeout
        self.record = WorkloadRecord()
        self.accounts: list[str] = []

    async def run(self) -> WorkloadRecord:
        """Run every step; returns the record of what was touched."""
        rec = self.record
        rec.chain_id = int(await self.client.call("eth_chainId"), 16)
        self.accounts = [a.lower() for a in await self.client.call("eth_accounts")]
        if len(self.accounts) < 10:
            raise WorkloadError("the workload needs 10 unlocked dev accounts (eth_accounts)")
        rec.first_block = int(await self.client.call("eth_blockNumber"), 16) + 1
        await self.eth_transfers()
        await self.storage_contract()
        await self.erc20()
        await self.selfdestructs()
        await self.changed_and_restored_block()
        if self.reorg:
            await self.snapshot_revert()
            await self.anvil_reorg()
        rec.last_block = int(await self.client.call("eth_blockNumber"), 16)
        await self.touch_miners()
        return rec

    # -- steps -----------------------------------------------------------------

    async def eth_transfers(self) -> None:
        a = self.accounts
        await self.send({"from": a[0], "to": a[1], "value": hex(1 * ETHER)})
        await self.send({"from": a[1], "to": fresh_address(1), "value": hex(ETHER // 2)})
        await self.send({"from": a[2], "to": a[0], "value": hex(3 * ETHER)})
        await self.send({"from": a[3], "to": fresh_address(2), "value": hex(12345)})

    async def storage_contract(self) -> None:
        a0 = self.accounts[0]
        code = init_code(STORAGE_RUNTIME, sstore_code(0, 0x2A))
        addr = await self.deploy(a0, code, "storage")
        self.record.touch_slot(addr, slot_hex(0))
        for slot, value in [(1, 11), (2, 22), (3, 33), (1, 111), (2, 0), (0, 0), (2**255, 5)]:
            await self.send({"from": a0, "to": addr, "data": storage_call_data(slot, value)})
            self.record.touch_slot(addr, slot_hex(slot))

    async def erc20(self) -> None:
        a = self.accounts
        artifact = (self.artifacts or ensure_openzeppelin()) / "ERC20PresetFixedSupply.json"
        bytecode = bytes.fromhex(json.loads(artifact.read_text())["bytecode"][2:])
        args = abi_encode_erc20_constructor("Chainstate Devnet Token", "CDT", ERC20_SUPPLY, a[0])
        token = await self.deploy(a[0], bytecode + args, "erc20")
        self.record.erc20 = token
        holders = [a[0], a[1], a[2], a[3], a[4]]
        self.record.erc20_holders = holders
        self.record.touch(*holders)
        for slot in (2, 3, 4):  # _totalSupply, _name, _symbol: written by the constructor
            self.record.touch_slot(token, slot_hex(slot))
        for holder in holders:
            self.record.touch_slot(token, mapping_slot(holder, ERC20_BALANCES_SLOT))
        for to, amount in [(a[1], 1000), (a[2], 2000), (a[3], 3000), (a[1], 1)]:
            await self.send({"from": a[0], "to": token, "data": erc20_transfer_data(to, amount)})
        # a[1] sends everything it holds: its balance slot becomes zero.
        await self.send({"from": a[1], "to": token, "data": erc20_transfer_data(a[4], 1001)})
        await self.send({"from": a[2], "to": token, "data": erc20_transfer_data(a[4], 5)})

    async def selfdestructs(self) -> None:
        a5 = self.accounts[5]
        # Deployed earlier, destroyed later: under Cancun only the balance moves.
        code = init_code(SELFDESTRUCT_RUNTIME, sstore_code(0, 7))
        victim = await self.deploy(a5, code, "selfdestruct", value=ETHER)
        self.record.touch_slot(victim, slot_hex(0))
        await self.send({"from": a5, "to": victim, "data": "0x"})
        self.record.selfdestructed.append(victim)
        # Created and destroyed in one transaction: the account never exists after it.
        nonce = int(await self.client.call("eth_getTransactionCount", [a5, "latest"]), 16)
        ephemeral = create_address(a5, nonce)
        tx = {"from": a5, "data": "0x" + CREATE_AND_DESTROY_INIT.hex(), "value": hex(ETHER // 4)}
        await self.send(tx)
        self.record.contracts["ephemeral"] = ephemeral
        self.record.touch_slot(ephemeral, slot_hex(0))
        self.record.selfdestructed.append(ephemeral)

    async def changed_and_restored_block(self) -> None:
        """One block in which a slot is set and reset, with an unrelated transfer."""
        a0, a6 = self.accounts[0], self.accounts[6]
        storage = self.record.contracts["storage"]
        automine = await self._automine()
        if automine:
            await self.client.call("evm_setAutomine", [False])
        try:
            nonce = int(await self.client.call("eth_getTransactionCount", [a0, "pending"]), 16)
            txs = [
                self._store_tx(a0, storage, 0x10, 5, nonce),
                self._store_tx(a0, storage, 0x10, 0, nonce + 1),
                {"from": a6, "to": fresh_address(3), "value": hex(777)},
            ]
            hashes = [await self.client.call("eth_sendTransaction", [tx]) for tx in txs]
            if automine:
                await self.client.call("evm_mine")
        finally:
            if automine:
                await self.client.call("evm_setAutomine", [True])
        for h in hashes:
            await self.wait_receipt(h)
        self.record.touch(a0, a6, fresh_address(3))
        self.record.touch_slot(storage, slot_hex(0x10))

    async def snapshot_revert(self) -> None:
        """A block is replaced by another at the same height (a one-block reorg)."""
        a7 = self.accounts[7]
        snap = await self.client.call("evm_snapshot")
        receipt = await self.send({"from": a7, "to": fresh_address(4), "value": hex(ETHER)})
        height = int(receipt["blockNumber"], 16)
        await self.client.call("evm_revert", [snap])
        self.record.transactions.remove(receipt["transactionHash"])
        await self.send({"from": a7, "to": fresh_address(5), "value": hex(2 * ETHER)})
        self.record.touch(fresh_address(4))
        orphan = {"kind": "evm_revert", "height": height, "depth": 1}
        self.record.reorgs.append(orphan | {"orphaned": [receipt["blockHash"]]})

    async def anvil_reorg(self) -> None:
        """Two blocks replaced by two new ones, the first holding a different transfer."""
        a8, a9 = self.accounts[8], self.accounts[9]
        r1 = await self.send({"from": a9, "to": a8, "value": hex(ETHER)})
        r2 = await self.send({"from": a9, "to": fresh_address(6), "value": hex(ETHER)})
        replacement = {"from": a8, "to": fresh_address(7), "value": hex(3 * ETHER)}
        try:
            await self.client.call("anvil_reorg", [2, [[replacement, 0]]])
        except JsonRpcError as exc:
            if exc.code == METHOD_NOT_FOUND:
                return  # not anvil: the snapshot/revert reorg is enough
            raise
        for r in (r1, r2):
            self.record.transactions.remove(r["transactionHash"])
        self.record.touch(a8, fresh_address(6), fresh_address(7))
        self.record.reorgs.append(
            {
                "kind": "anvil_reorg",
                "height": int(r1["blockNumber"], 16),
                "depth": 2,
                "orphaned": [r1["blockHash"], r2["blockHash"]],
            }
        )

    # -- helpers ---------------------------------------------------------------

    @staticmethod
    def _store_tx(sender: str, to: str, slot: int, value: int, nonce: int) -> dict[str, Any]:
        """A storage write with explicit gas: an estimate made before the block's earlier
        transactions ran would be too low for a later reset of the same slot."""
        data = storage_call_data(slot, value)
        return {"from": sender, "to": to, "data": data, "nonce": hex(nonce), "gas": hex(100_000)}

    async def touch_miners(self) -> None:
        """Fee recipients change balance in every block with transactions."""
        heights = range(self.record.first_block, self.record.last_block + 1)
        calls = [("eth_getBlockByNumber", [hex(h), False]) for h in heights]
        for block in await self.client.batch(calls):
            if block:
                self.record.touch(block["miner"])

    async def _automine(self) -> bool:
        try:
            return bool(await self.client.call("anvil_getAutomine"))
        except JsonRpcError:
            return False

    async def deploy(self, sender: str, code: bytes, name: str, value: int = 0) -> str:
        tx: dict[str, Any] = {"from": sender, "data": "0x" + code.hex()}
        if value:
            tx["value"] = hex(value)
        receipt = await self.send(tx)
        address = receipt.get("contractAddress")
        if not address:
            raise WorkloadError(f"deploying {name} created no contract")
        address = address.lower()
        self.record.contracts[name] = address
        self.record.touch(address)
        return address

    async def send(self, tx: dict[str, Any]) -> dict[str, Any]:
        """Send from an unlocked account and wait for a successful receipt."""
        tx_hash = await self.client.call("eth_sendTransaction", [tx])
        receipt = await self.wait_receipt(tx_hash)
        self.record.touch(tx.get("from"), tx.get("to"))
        return receipt

    async def wait_receipt(self, tx_hash: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.receipt_timeout
        while True:
            receipt = await self.client.call("eth_getTransactionReceipt", [tx_hash])
            if receipt is not None:
                break
            if time.monotonic() > deadline:
                raise WorkloadError(f"transaction {tx_hash} not mined in {self.receipt_timeout}s")
            await asyncio.sleep(0.05)
        if receipt.get("status") != "0x1":
            raise WorkloadError(f"transaction {tx_hash} failed: {receipt}")
        self.record.transactions.append(tx_hash)
        return receipt


def create_address(sender: str, nonce: int) -> str:
    """Address of a contract created by `sender` at `nonce` (RLP of [sender, nonce])."""
    sender_raw = bytes.fromhex(sender[2:])
    if nonce == 0:
        nonce_rlp = b"\x80"
    elif nonce < 0x80:
        nonce_rlp = bytes([nonce])
    else:
        raw = nonce.to_bytes((nonce.bit_length() + 7) // 8, "big")
        nonce_rlp = bytes([0x80 + len(raw)]) + raw
    payload = b"\x94" + sender_raw + nonce_rlp
    return "0x" + keccak256(bytes([0xC0 + len(payload)]) + payload)[12:].hex()


async def run_workload(url: str, *, reorg: bool = True) -> WorkloadRecord:
    """Run the workload against the execution client at `url`."""
    client = EthClient(url, timeout=60.0)
    try:
        return await Workload(client, reorg=reorg).run()
    finally:
        await client.close()

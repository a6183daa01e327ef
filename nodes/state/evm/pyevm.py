"""Run one call on py-evm at a block, with the block's base fee (see basefee.py for when).

Imported by a worker the first time a call needs it (py-evm takes ~1.5 s to import).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from eth.constants import BLANK_ROOT_HASH, CREATE_CONTRACT_ADDRESS
from eth.db.atomic import AtomicDB
from eth.exceptions import OutOfGas, Revert
from eth.vm.execution_context import ExecutionContext
from eth.vm.forks.cancun.state import CancunState
from eth.vm.forks.cancun.transactions import CancunTransactionBuilder
from eth.vm.spoof import SpoofTransaction

DYNAMIC_FEE_TX = 2  # EIP-1559 transaction type
MAX_ROUNDS = 8  # py-evm runs of one call while it keeps reading state not filled in

# what a source answers: (balance, nonce, code) per address, value per (address, slot)
Source = Callable[
    [list[str], list[tuple[str, int]]], tuple[list[tuple[int, int, bytes]], list[int]]
]


def _addr(address: str) -> bytes:
    return bytes.fromhex(address[2:])


def _hex(address: bytes) -> str:
    return "0x" + address.hex()


class _Recording(CancunState):
    """py-evm's Cancun state that notes reads of accounts and slots not filled in."""

    recording = False  # set once the block's state is filled in
    filled_accounts: set[bytes]
    filled_slots: set[tuple[bytes, int]]
    missed_accounts: set[bytes]
    missed_slots: set[tuple[bytes, int]]
    call_gas_price = 0

    def _account(self, address: bytes) -> None:
        if self.recording and address not in self.filled_accounts:
            self.missed_accounts.add(address)

    def get_balance(self, address: Any) -> int:
        self._account(address)
        return super().get_balance(address)

    def get_nonce(self, address: Any) -> int:
        self._account(address)
        return super().get_nonce(address)

    def get_code(self, address: Any) -> bytes:
        self._account(address)
        return super().get_code(address)

    def get_code_hash(self, address: Any) -> Any:
        self._account(address)
        return super().get_code_hash(address)

    def account_exists(self, address: Any) -> bool:
        self._account(address)
        return super().account_exists(address)

    def account_is_empty(self, address: Any) -> bool:
        self._account(address)
        return super().account_is_empty(address)

    def has_code_or_nonce(self, address: Any) -> bool:
        self._account(address)
        return super().has_code_or_nonce(address)

    def get_storage(self, address: Any, slot: int, from_journal: bool = True) -> int:
        if self.recording and (address, slot) not in self.filled_slots:
            self._account(address)
            self.missed_slots.add((address, slot))
        return super().get_storage(address, slot, from_journal)

    def get_gas_price(self, transaction: Any) -> int:
        return self.call_gas_price  # GASPRICE reads the call's price (0 without one)


class _Hashes:
    """BLOCKHASH's view of the previous 256 block hashes, read only when asked."""

    def __init__(self, height: int, hash_of: Callable[[int], bytes]) -> None:
        self.height = height
        self.hash_of = hash_of

    def __iter__(self) -> Iterator[bytes]:
        for h in range(self.height - 1, max(-1, self.height - 257), -1):
            yield self.hash_of(h)


def intrinsic_gas(data: bytes, create: bool) -> int:
    """revm's initial gas of a Cancun transaction without an access list."""
    zeros = data.count(0)
    gas = 21_000 + 4 * zeros + 16 * (len(data) - zeros)
    if create:
        gas += 32_000 + 2 * ((len(data) + 31) // 32)
    return gas


def run_on_pyevm(
    job: dict[str, Any],
    call: dict[str, Any],
    source: Source,
    seed_slots: list[tuple[str, int]],
    hash_of: Callable[[int], bytes],
) -> dict[str, Any]:
    """The call on py-evm at the job's block: `{"ok", "output", "gas_used", "logs"}` or,
    failed, `{"ok": False, "kind", "output", "gas_used"}` (kind: revert, out_of_gas, halt
    with `reason`, too_many_reads)."""
    block = job["block"]
    accounts: dict[bytes, tuple[int, int, bytes]] = {}
    slots: dict[tuple[bytes, int], int] = {}
    want_accounts = {_addr(block["coinbase"]), _addr(call["from"])}
    if call["to"] is not None:
        want_accounts.add(_addr(call["to"]))
    want_slots = {(_addr(a), s) for a, s in seed_slots}
    for _ in range(MAX_ROUNDS):
        want_accounts |= {a for a, _ in want_slots}
        new_accounts = [a for a in want_accounts if a not in accounts]
        new_slots = [k for k in want_slots if k not in slots]
        if new_accounts or new_slots:
            infos, values = source(
                [_hex(a) for a in new_accounts], [(_hex(a), s) for a, s in new_slots]
            )
            accounts.update(zip(new_accounts, infos, strict=True))
            slots.update(zip(new_slots, values, strict=True))
        state = _state(job, call, accounts, slots, hash_of)
        result = _execute(state, job, call)
        if not state.missed_accounts and not state.missed_slots:
            return result
        want_accounts |= state.missed_accounts
        want_slots |= state.missed_slots
    return {"ok": False, "kind": "too_many_reads", "output": b"", "gas_used": 0}


def _state(
    job: dict[str, Any],
    call: dict[str, Any],
    accounts: dict[bytes, tuple[int, int, bytes]],
    slots: dict[tuple[bytes, int], int],
    hash_of: Callable[[int], bytes],
) -> _Recording:
    block = job["block"]
    context = ExecutionContext(
        coinbase=_addr(block["coinbase"]),
        timestamp=block["timestamp"],
        block_number=block["number"],
        difficulty=block.get("difficulty", 0),
        mix_hash=bytes.fromhex(block["prevrandao"][2:]),
        gas_limit=block["gas_limit"],
        prev_hashes=_Hashes(block["number"], hash_of),
        chain_id=job["chain_id"],
        base_fee_per_gas=block["basefee"],
        excess_blob_gas=block.get("excess_blob_gas") or 0,
    )
    state = _Recording(AtomicDB(), context, BLANK_ROOT_HASH)
    for address, (balance, nonce, code) in accounts.items():
        if balance or nonce or code:  # an empty account does not exist
            state.set_balance(address, balance)
            state.set_nonce(address, nonce)
            state.set_code(address, code)
    for (address, slot), value in slots.items():
        if value:
            state.set_storage(address, slot, value)
    state.persist()  # the block's state: committed, so storage "original values" are it
    state.filled_accounts = set(accounts)
    state.filled_slots = set(slots)
    state.missed_accounts, state.missed_slots = set(), set()
    state.call_gas_price = call["gas_price"] or 0
    state.recording = True
    return state


def _execute(state: _Recording, job: dict[str, Any], call: dict[str, Any]) -> dict[str, Any]:
    create = call["to"] is None
    price = call["gas_price"] or 0
    unsigned = CancunTransactionBuilder.new_unsigned_dynamic_fee_transaction(
        chain_id=job["chain_id"],
        nonce=state.get_nonce(_addr(call["from"])),
        max_priority_fee_per_gas=0,
        max_fee_per_gas=price,
        gas=call["gas"],
        to=CREATE_CONTRACT_ADDRESS if create else _addr(call["to"]),
        value=call["value"],
        data=call["data"],
        access_list=[],
    )
    tx = SpoofTransaction(
        unsigned,
        sender=_addr(call["from"]),
        intrinsic_gas=intrinsic_gas(call["data"], create),
        type_id=DYNAMIC_FEE_TX,
    )
    if tx.intrinsic_gas > call["gas"]:
        return {"ok": False, "kind": "intrinsic", "output": b"", "gas_used": 0}
    executor = state.get_transaction_executor()
    message = executor.build_evm_message(tx)
    computation = executor.build_computation(message, tx)
    spent = call["gas"] - computation.get_gas_remaining()
    used = spent - min(computation.get_gas_refund(), spent // 5)
    if computation.is_error:
        error = computation.error
        if isinstance(error, Revert):
            return {"ok": False, "kind": "revert", "output": computation.output, "gas_used": used}
        kind = "out_of_gas" if isinstance(error, OutOfGas) else "halt"
        reason = type(error).__name__
        return {"ok": False, "kind": kind, "reason": reason, "output": b"", "gas_used": spent}
    logs = [
        {
            "address": _hex(address),
            "topics": ["0x" + t.to_bytes(32, "big").hex() for t in topics],
            "data": "0x" + data.hex(),
        }
        for address, topics, data in computation.get_log_entries()
    ]
    output = computation.output
    if create:  # eth_call of a creation answers the deployed code
        output = state.get_code(message.storage_address)
    return {"ok": True, "output": output, "gas_used": used, "logs": logs}

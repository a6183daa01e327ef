"""Run one call on py-evm at a block, with the block's base fee (see basefee.py for when).

Imported by each worker before it reports ready (py-evm takes ~0.6 s of CPU to import).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from eth.constants import BLANK_ROOT_HASH, CREATE_CONTRACT_ADDRESS
from eth.db.atomic import AtomicDB
from eth.exceptions import OutOfGas, Revert
from eth.vm.execution_context import ExecutionContext
from eth.vm.forks.cancun.computation import CancunComputation
from eth.vm.forks.cancun.state import CancunState
from eth.vm.forks.cancun.transactions import CancunTransactionBuilder
from eth.vm.spoof import SpoofTransaction

from nodes.state.evm.codec import effective_price

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


class TraceLimit(Exception):
    """A traced call took more steps than it may."""


class _Tracer:
    """geth's struct-log steps of one run (the revm path's shape: pc, op, gas before the
    step, its cost, depth from 1, stack bottom first, the frame's refund counter)."""

    def __init__(self, max_steps: int) -> None:
        self.max_steps = max_steps
        self.steps: list[dict[str, Any]] = []
        self.open: list[dict[str, Any]] = []  # steps running (a CALL's runs its frame)
        # per frame (its computation, kept alive so that no id is reused): the pc after its
        # last step, which tells the STOP past the end of the code from a STOP in it
        self.next_pc: dict[Any, int] = {}


# py-evm mnemonics that revm (and so anvil, and the revm path of traces) names otherwise
GETH_NAMES = {"SHA3": "KECCAK256", "PREVRANDAO": "DIFFICULTY"}


def _traced(opcode: int, fn: Any) -> Callable[..., None]:
    """The opcode, recording a struct-log step when its computation's state has a tracer."""
    inner = getattr(fn, "__wrapped__", fn)
    name = getattr(fn, "mnemonic", None) or getattr(inner, "mnemonic", f"0x{opcode:02x}")
    name = GETH_NAMES.get(name, name)

    def step(computation: Any) -> None:
        tracer = computation.state.tracer
        if tracer is None:
            return fn(computation=computation)
        code = computation.code
        pc = code.program_counter - 1
        frame = computation
        if opcode == 0 and tracer.next_pc.get(frame, 0) == code.program_counter:
            pc = code.program_counter  # the STOP past the end of the code: nothing was read
            if pc == 0:
                return fn(computation=computation)  # empty code: revm runs no frame
        if len(tracer.steps) >= tracer.max_steps:
            raise TraceLimit(f"more than {tracer.max_steps} steps")
        gas = computation.get_gas_remaining()
        entry = {
            "pc": pc,
            "op": name,
            "gas": gas,
            "gasCost": None,
            "depth": computation.msg.depth + 1,
            "stack": [
                hex(v if v.__class__ is int else int.from_bytes(v, "big"))
                for v in computation._stack.values
            ],
            "refund": computation._gas_meter.gas_refunded,
        }
        tracer.steps.append(entry)
        tracer.open.append(entry)
        try:
            fn(computation=computation)
        finally:
            tracer.open.pop()
            if entry["gasCost"] is None:
                entry["gasCost"] = gas - computation.get_gas_remaining()
            tracer.next_pc[frame] = code.program_counter

    return step


class _TracedComputation(CancunComputation):
    """Cancun's computation whose opcodes record struct-log steps; a CALL or CREATE step
    costs what it took before its frame runs (with the gas it gives), as geth reports."""

    opcodes: ClassVar[dict[int, Any]] = {
        op: _traced(op, fn) for op, fn in CancunComputation.opcodes.items()
    }

    def apply_child_computation(self, child_msg: Any) -> Any:
        tracer = self.state.tracer
        if tracer is not None and tracer.open:
            entry = tracer.open[-1]
            entry["gasCost"] = entry["gas"] - self.get_gas_remaining()
        return super().apply_child_computation(child_msg)


class _Recording(CancunState):
    """py-evm's Cancun state that notes reads of accounts and slots not filled in."""

    recording = False  # set once the block's state is filled in
    tracer: _Tracer | None = None  # with one, `computation_class` is _TracedComputation
    filled_accounts: set[bytes]
    filled_slots: set[tuple[bytes, int]]
    missed_accounts: set[bytes]
    missed_slots: set[tuple[bytes, int]]
    written_accounts: set[bytes]
    written_slots: set[tuple[bytes, int]]

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

    # writes, for simulated transactions (the next one reads them)
    def _wrote(self, address: bytes) -> None:
        if self.recording:
            self.written_accounts.add(address)

    def set_balance(self, address: Any, balance: int) -> None:
        self._wrote(address)
        super().set_balance(address, balance)

    def set_nonce(self, address: Any, nonce: int) -> None:
        self._wrote(address)
        super().set_nonce(address, nonce)

    def increment_nonce(self, address: Any) -> None:
        self._wrote(address)
        super().increment_nonce(address)

    def set_code(self, address: Any, code: bytes) -> None:
        self._wrote(address)
        super().set_code(address, code)

    def delete_account(self, address: Any) -> None:
        self._wrote(address)
        super().delete_account(address)

    def set_storage(self, address: Any, slot: int, value: int) -> None:
        if self.recording:
            self.written_slots.add((address, slot))
        super().set_storage(address, slot, value)

    def writes(self) -> dict[str, Any]:
        """What the call wrote, in the shape of the revm path's `writes_of`: accounts as
        (balance, nonce, code) and slots' present values."""
        self.recording = False
        accounts = {
            _hex(a): (self.get_balance(a), self.get_nonce(a), self.get_code(a))
            for a in self.written_accounts | {a for a, _ in self.written_slots}
        }
        slots: dict[str, dict[int, int]] = {}
        for address, slot in self.written_slots:
            slots.setdefault(_hex(address), {})[slot] = self.get_storage(address, slot)
        return {"accounts": accounts, "slots": slots}


class PreviousHashes:
    """BLOCKHASH's view of the previous 256 block hashes, read only when asked."""

    def __init__(self, height: int, hash_of: Callable[[int], bytes]) -> None:
        self.height = height
        self.hash_of = hash_of

    def __iter__(self) -> Iterator[bytes]:
        for h in range(self.height - 1, max(-1, self.height - 257), -1):
            yield self.hash_of(h)


def intrinsic_gas(
    data: bytes, create: bool, access_list: list[tuple[str, list[int]]] | None = None
) -> int:
    """revm's initial gas of a Cancun transaction (a creation's includes EIP-3860's init
    code words, which py-evm charges when the creation starts)."""
    zeros = data.count(0)
    gas = 21_000 + 4 * zeros + 16 * (len(data) - zeros)
    for _address, slots in access_list or ():
        gas += 2400 + 1900 * len(slots)
    if create:
        gas += 32_000 + initcode_gas(data)
    return gas


def initcode_gas(data: bytes) -> int:
    """EIP-3860: 2 gas per 32-byte word of init code."""
    return 2 * ((len(data) + 31) // 32)


def run_on_pyevm(
    job: dict[str, Any],
    call: dict[str, Any],
    source: Source,
    seed_slots: list[tuple[str, int]],
    hash_of: Callable[[int], bytes],
    trace_steps: int | None = None,
) -> dict[str, Any]:
    """The call on py-evm at the job's block: `{"ok", "output", "gas_used", "logs", "writes"}` or,
    failed, `{"ok": False, "kind", "output", "gas_used"}` (kind: revert, out_of_gas, halt
    with `reason`, too_many_reads); with `trace_steps`, also its `struct_logs` (TraceLimit
    past that many steps)."""
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
        if trace_steps is not None:  # the traced computation only then: it costs a call a step
            state.tracer = _Tracer(trace_steps)
            state.computation_class = _TracedComputation
        result = _execute(state, job, call)
        if not state.missed_accounts and not state.missed_slots:
            if state.tracer is not None:
                result["struct_logs"] = state.tracer.steps
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
        prev_hashes=PreviousHashes(block["number"], hash_of),
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
    state.written_accounts, state.written_slots = set(), set()
    state.recording = True
    return state


def _execute(state: _Recording, job: dict[str, Any], call: dict[str, Any]) -> dict[str, Any]:
    """The call as a transaction of the block: the sender pays gas × effective price up
    front (its balance shows it while the call runs) and gets it back afterwards, since
    a call is not charged (a simulated transaction is charged by the node)."""
    create = call["to"] is None
    price = effective_price(call, job["block"]["basefee"])
    access = call.get("access_list") or []
    intrinsic = intrinsic_gas(call["data"], create, access)
    unsigned = CancunTransactionBuilder.new_unsigned_dynamic_fee_transaction(
        chain_id=job["chain_id"],
        nonce=state.get_nonce(_addr(call["from"])),
        max_priority_fee_per_gas=price,  # GASPRICE reads min(price + base fee, price)
        max_fee_per_gas=price,
        gas=call["gas"],
        to=CREATE_CONTRACT_ADDRESS if create else _addr(call["to"]),
        value=call["value"],
        data=call["data"],
        access_list=[(_addr(a), tuple(slots)) for a, slots in access],
    )
    tx = SpoofTransaction(
        unsigned,
        sender=_addr(call["from"]),
        # py-evm charges the init code words itself when the creation starts
        intrinsic_gas=intrinsic - (initcode_gas(call["data"]) if create else 0),
        type_id=DYNAMIC_FEE_TX,
    )
    if intrinsic > call["gas"]:
        return {"ok": False, "kind": "intrinsic", "output": b"", "gas_used": 0}
    executor = state.get_transaction_executor()
    message = executor.build_evm_message(tx)
    computation = executor.build_computation(message, tx)
    if price:
        state.delta_balance(_addr(call["from"]), call["gas"] * price)
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
    return {"ok": True, "output": output, "gas_used": used, "logs": logs, "writes": state.writes()}

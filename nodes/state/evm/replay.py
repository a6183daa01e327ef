"""Transactions re-executed as their block ran them, on py-evm, for the tracers.

A mined transaction is traced by running its block's transactions before it on the state of
the parent block, with the block's environment; a call object (debug_traceCall) runs as a
transaction on the state of its block. py-evm (already used for calls that read BASEFEE,
pyevm.py) runs whole transactions: nonce, up-front gas charge, refund, the coinbase's tip,
the base fee burnt, EIP-161 clean-up; pyrevm 0.3.7 cannot (its `message_call` charges
nothing), and its only tracer writes EIP-3155 lines at ~650 steps/s.

State is read lazily: the first time py-evm touches an account or a slot it is read from
`source` (the block's state, from the store or the state feed) and written *under* py-evm's
journal, as committed state, so warm/cold access and storage "original values" are those
of the block. Every access of a transaction is recorded with its value before that
transaction (`Access`), which is what the prestate tracer answers.

Imported by a worker only when a trace is asked (py-evm takes ~1.5 s to import).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import rlp
from eth.constants import BLANK_ROOT_HASH, CREATE_CONTRACT_ADDRESS, EMPTY_SHA3
from eth.db.account import AccountDB
from eth.db.atomic import AtomicDB
from eth.db.storage import CLEAR_COUNT_KEY_NAME
from eth.rlp.accounts import Account
from eth.vm.execution_context import ExecutionContext
from eth.vm.forks.cancun.computation import CancunComputation
from eth.vm.forks.cancun.state import CancunState
from eth.vm.forks.cancun.transactions import CancunTransactionBuilder
from eth.vm.spoof import SpoofTransaction
from eth_hash.auto import keccak
from eth_utils import int_to_big_endian, to_int

from nodes.state.evm.pyevm import PreviousHashes, Source, initcode_gas, intrinsic_gas

BLOB_TX_TYPE = 3
SELFDESTRUCT = 0xFF
CALL_OPS = {0xF1: "CALL", 0xF2: "CALLCODE", 0xF4: "DELEGATECALL", 0xFA: "STATICCALL"}
CREATE_OPS = {0xF0: "CREATE", 0xF5: "CREATE2"}


def _addr(address: str) -> bytes:
    return bytes.fromhex(address[2:])


class ReplayError(Exception):
    """The re-execution cannot be trusted (a transaction invalid on the replayed state, or
    a result that differs from the stored receipt)."""


class StepLimit(Exception):
    """A tracer recorded more steps than it may."""


# -- lazily read state -----------------------------------------------------------------


@dataclass
class Access:
    """What one transaction touched, with the values before it: accounts as py-evm's
    Account (balance, nonce, code hash) and slots as ints."""

    accounts: dict[bytes, Any] = field(default_factory=dict)
    slots: dict[tuple[bytes, int], int] = field(default_factory=dict)


class LazyAccounts(AccountDB):
    """py-evm's account database filled from `source` on first touch, under the journal.

    `source(addresses, slots)` answers `([(balance, nonce, code)], [value])` at the
    block's parent height. An account is written into the account trie under the journal
    (`_trie_cache`), its code into the code store under the journal (`_batchdb`), a slot
    into the account's storage lookup, under its journal and its locked changes: committed
    state for py-evm. A slot of storage wiped in this run (a creation, a selfdestruct) is
    never read from the source: the wipe made it empty.
    """

    source: Source
    recorder: Access | None = None

    def __init__(self, db: Any, state_root: bytes = BLANK_ROOT_HASH) -> None:
        super().__init__(db, state_root)
        self._loaded: set[bytes] = set()
        self._loaded_slots: set[tuple[bytes, int]] = set()

    def _load(self, address: bytes) -> None:
        self._loaded.add(address)
        (info,), _ = self.source(["0x" + address.hex()], [])
        balance, nonce, code = info
        if not (balance or nonce or code):
            return  # an empty account does not exist
        code_hash = keccak(code) if code else EMPTY_SHA3
        if code:
            self._batchdb[code_hash] = code
        account = Account(nonce=nonce, balance=balance, code_hash=code_hash)
        self._trie_cache[address] = rlp.encode(account, sedes=Account)

    def _touch(self, address: bytes) -> None:
        if address not in self._loaded:
            self._load(address)
        rec = self.recorder
        if rec is not None and address not in rec.accounts:
            rec.accounts[address] = None  # a read below comes back here
            rec.accounts[address] = AccountDB._get_account(self, address)

    def _get_encoded_account(self, address: bytes, from_journal: bool = True) -> bytes:
        self._touch(address)
        return super()._get_encoded_account(address, from_journal)

    def _get_account(self, address: bytes, from_journal: bool = True) -> Any:
        self._touch(address)
        return super()._get_account(address, from_journal)

    def _load_slot(self, address: bytes, slot: int) -> None:
        key = (address, slot)
        if key in self._loaded_slots:
            return
        store = self._get_address_store(address)
        if to_int(store._clear_count[CLEAR_COUNT_KEY_NAME]):
            return  # wiped in this run: empty, whatever the block held (read again if undone)
        self._loaded_slots.add(key)
        _, (value,) = self.source([], [("0x" + address.hex(), slot)])
        if value:
            store._storage_lookup[int_to_big_endian(slot)] = rlp.encode(value)

    def get_storage(self, address: bytes, slot: int, from_journal: bool = True) -> int:
        self._touch(address)
        self._load_slot(address, slot)
        rec = self.recorder
        if rec is not None and (address, slot) not in rec.slots:
            rec.slots[(address, slot)] = super().get_storage(address, slot, from_journal=False)
        return super().get_storage(address, slot, from_journal)

    def set_storage(self, address: bytes, slot: int, value: int) -> None:
        self._touch(address)
        self._load_slot(address, slot)
        super().set_storage(address, slot, value)

    def code_of(self, code_hash: bytes) -> bytes:
        return b"" if code_hash == EMPTY_SHA3 else self._journaldb[code_hash]

    def quietly(self) -> Any:
        """The current account of an address, not recorded as an access."""
        return _Quiet(self)


class _Quiet:
    """Reads of a LazyAccounts that are not accesses of the transaction (the tracers'
    own reads of post-transaction values)."""

    def __init__(self, db: LazyAccounts) -> None:
        self.db = db

    def __enter__(self) -> LazyAccounts:
        self.saved, self.db.recorder = self.db.recorder, None
        return self.db

    def __exit__(self, *exc: object) -> None:
        self.db.recorder = self.saved


# -- frames ----------------------------------------------------------------------------


def _child_kind(parent: Any) -> str:
    """The opcode that starts a child frame: the one before the parent's program counter."""
    pc = parent.code.program_counter - 1
    op = parent.msg.code[pc] if 0 <= pc < len(parent.msg.code) else 0
    return CALL_OPS.get(op) or CREATE_OPS.get(op) or "CALL"


def _selfdestruct_recorded(fn: Any) -> Callable[..., None]:
    """SELFDESTRUCT, noting (beneficiary, balance sent) on the frame for the tracers."""

    def step(computation: Any) -> None:
        beneficiary = computation._stack.values[-1]
        if beneficiary.__class__ is not int:
            beneficiary = int.from_bytes(beneficiary, "big")
        target = (beneficiary & (2**160 - 1)).to_bytes(20, "big")
        balance = computation.state.get_balance(computation.msg.storage_address)
        computation.selfdestructed = (target, balance)  # before: the opcode ends in Halt
        fn(computation=computation)

    step.mnemonic = "SELFDESTRUCT"  # type: ignore[attr-defined]
    return step


class FrameComputation(CancunComputation):
    """Cancun's computation noting what the tracers need that py-evm does not keep: the
    opcode that started each child frame, how many of its own logs came before each child
    (a log's `position`), and a SELFDESTRUCT's beneficiary and value. With a `stepper` on
    the state (the struct logger), every opcode is reported to it."""

    opcodes: ClassVar[dict[int, Any]] = {
        **CancunComputation.opcodes,
        SELFDESTRUCT: _selfdestruct_recorded(CancunComputation.opcodes[SELFDESTRUCT]),
    }
    kind = "CALL"
    log_mark = 0
    selfdestructed: tuple[bytes, int] | None = None

    def apply_child_computation(self, child_msg: Any) -> Any:
        kind = _child_kind(self)
        mark = len(self._log_entries)
        stepper = self.state.stepper
        if stepper is not None:
            stepper.child_starts(self)
        child = self.generate_child_computation(child_msg)
        child.kind = kind
        child.log_mark = mark
        self.add_child_computation(child)
        return child


class ReplayState(CancunState):
    """Cancun's state over LazyAccounts, running FrameComputation."""

    account_db_class = LazyAccounts
    computation_class = FrameComputation
    stepper: Any = None  # the struct logger, when one is asked

    def get_tip(self, transaction: Any) -> int:
        """The coinbase's share of a unit of gas, never below 0: a call object may offer
        less than the base fee (revm's saturating subtraction; a mined transaction
        cannot)."""
        return max(0, super().get_tip(transaction))

    def set_system_contracts(self) -> None:
        """Nothing: the block's state is read as it is (py-evm would read the beacon roots
        contract here, before the state has its source)."""

    @property
    def accounts(self) -> LazyAccounts:
        return self._account_db  # type: ignore[return-value]


def new_state(
    block: dict[str, Any], chain_id: int, source: Source, hash_of: Callable[[int], bytes]
) -> ReplayState:
    """An empty py-evm state reading the block's parent state lazily from `source`."""
    context = ExecutionContext(
        coinbase=_addr(block["coinbase"]),
        timestamp=block["timestamp"],
        block_number=block["number"],
        difficulty=block.get("difficulty", 0),
        mix_hash=bytes.fromhex(block["prevrandao"][2:]),
        gas_limit=block["gas_limit"],
        prev_hashes=PreviousHashes(block["number"], hash_of),
        chain_id=chain_id,
        base_fee_per_gas=block["basefee"],
        excess_blob_gas=block.get("excess_blob_gas") or 0,
    )
    state = ReplayState(AtomicDB(), context, BLANK_ROOT_HASH)
    state.accounts.source = source
    return state


# -- transactions ----------------------------------------------------------------------


@dataclass
class Tx:
    """What running a transaction needs, decoded (from a stored transaction object or a
    call object). `price` is the legacy gas price (None for EIP-1559 fees)."""

    sender: str
    to: str | None
    nonce: int
    gas: int
    value: int
    data: bytes
    max_fee: int
    tip: int
    access_list: list[tuple[str, list[int]]]
    type: int = 2
    blob_hashes: list[bytes] = field(default_factory=list)
    max_fee_per_blob_gas: int = 0
    hash: str | None = None


def _q(obj: dict[str, Any], name: str, default: int = 0) -> int:
    value = obj.get(name)
    return default if value is None else int(value, 16)


def tx_of_object(obj: dict[str, Any]) -> Tx:
    """A Tx from a JSON-RPC transaction object (eth_getTransactionByHash's shape)."""
    kind = _q(obj, "type")
    if kind in (0, 1):
        max_fee = tip = _q(obj, "gasPrice")
    else:
        max_fee, tip = _q(obj, "maxFeePerGas"), _q(obj, "maxPriorityFeePerGas")
    access = [
        (item["address"].lower(), [int(k, 16) for k in item.get("storageKeys") or []])
        for item in obj.get("accessList") or []
    ]
    return Tx(
        sender=obj["from"].lower(),
        to=None if obj.get("to") is None else obj["to"].lower(),
        nonce=_q(obj, "nonce"),
        gas=_q(obj, "gas"),
        value=_q(obj, "value"),
        data=bytes.fromhex((obj.get("input") or obj.get("data") or "0x")[2:]),
        max_fee=max_fee,
        tip=tip,
        access_list=access,
        type=kind,
        blob_hashes=[bytes.fromhex(h[2:]) for h in obj.get("blobVersionedHashes") or []],
        max_fee_per_blob_gas=_q(obj, "maxFeePerBlobGas"),
        hash=obj.get("hash"),
    )


def _spoofed(tx: Tx, chain_id: int) -> Any:
    """py-evm's transaction for `tx`, with the sender given (no signature recovery): an
    EIP-1559 one whose max fee and priority fee make py-evm charge what the transaction's
    own type charges (a legacy price P is max fee P, tip P: min(P, base + P) = P)."""
    create = tx.to is None
    access = [(_addr(a), tuple(slots)) for a, slots in tx.access_list]
    unsigned = CancunTransactionBuilder.new_unsigned_dynamic_fee_transaction(
        chain_id=chain_id,
        nonce=tx.nonce,
        max_priority_fee_per_gas=tx.tip,
        max_fee_per_gas=tx.max_fee,
        gas=tx.gas,
        to=CREATE_CONTRACT_ADDRESS if create else _addr(tx.to),  # type: ignore[arg-type]
        value=tx.value,
        data=tx.data,
        access_list=access,
    )
    intrinsic = intrinsic_gas(tx.data, create, tx.access_list)
    overrides: dict[str, Any] = {
        "sender": _addr(tx.sender),
        # py-evm charges the init code words itself when the creation starts
        "intrinsic_gas": intrinsic - (initcode_gas(tx.data) if create else 0),
        "type_id": BLOB_TX_TYPE if tx.type == BLOB_TX_TYPE else 2,
    }
    if tx.type == BLOB_TX_TYPE:
        overrides["blob_versioned_hashes"] = tuple(tx.blob_hashes)
        overrides["max_fee_per_blob_gas"] = tx.max_fee_per_blob_gas
    return SpoofTransaction(unsigned, **overrides)


@dataclass
class Ran:
    """One transaction run: its root computation, what it touched (values before it), its
    receipt's values, and the data the tracers read."""

    tx: Tx
    computation: Any
    access: Access
    gas_used: int
    status: int
    logs: list[dict[str, Any]]
    created: list[bytes]
    deleted: set[bytes]
    initcode_gas: int  # charged in py-evm's root frame, in revm's intrinsic gas


def run_tx(state: ReplayState, tx: Tx, chain_id: int, validate: bool) -> Ran:
    """Run one transaction on `state` as a block does (the state keeps its writes).
    `validate`: check nonce, funds and fees first (a mined transaction); a call object
    skips that, as eth_call does."""
    spoofed = _spoofed(tx, chain_id)
    state.lock_changes()  # the last transaction's writes become its "original values"
    access = Access()
    state.accounts.recorder = access
    try:
        if validate:
            _validate(state, tx, spoofed)
        executor = state.get_transaction_executor()
        message = executor.build_evm_message(spoofed)
        computation = executor.build_computation(message, spoofed)
        deleted = set(computation.get_accounts_for_deletion())
        computation = executor.finalize_computation(spoofed, computation)
        state.clear_transient_storage()
    finally:
        state.accounts.recorder = None
    spent = tx.gas - computation.get_gas_remaining()
    used = spent - min(computation.get_gas_refund(), spent // 5)
    logs = [
        {
            "address": "0x" + address.hex(),
            "topics": ["0x" + t.to_bytes(32, "big").hex() for t in topics],
            "data": "0x" + data.hex(),
        }
        for address, topics, data in computation.get_log_entries()
    ]
    created = [c.msg.storage_address for c in walk(computation) if c.msg.is_create]
    return Ran(
        tx=tx,
        computation=computation,
        access=access,
        gas_used=used,
        status=0 if computation.is_error else 1,
        logs=logs,
        created=[a for a, c in zip(created, _creates(computation), strict=True) if c],
        deleted=deleted,
        initcode_gas=initcode_gas(tx.data) if tx.to is None else 0,
    )


def _validate(state: ReplayState, tx: Tx, spoofed: Any) -> None:
    """A mined transaction's validity on the replayed state (nonce, funds, fees, gas);
    not py-evm's own check, which reads the signature."""
    sender = _addr(tx.sender)
    nonce = state.get_nonce(sender)
    problem = None
    if nonce != tx.nonce:
        problem = f"nonce {tx.nonce}, the account's is {nonce}"
    elif tx.tip > tx.max_fee or tx.max_fee < state.execution_context.base_fee_per_gas:
        problem = "fees below the base fee or priority fee above the max fee"
    elif tx.gas > state.gas_limit or spoofed.intrinsic_gas > tx.gas:
        problem = "gas outside the block gas limit or below the intrinsic gas"
    else:
        blob = len(tx.blob_hashes) * 2**17 * tx.max_fee_per_blob_gas
        if state.get_balance(sender) < tx.gas * tx.max_fee + tx.value + blob:
            problem = "insufficient funds for gas * price + value"
    if problem is not None:
        raise ReplayError(f"transaction {tx.hash} is invalid on the replayed state: {problem}")


def walk(computation: Any) -> Iterator[Any]:
    """Every frame of a transaction, depth first, parents before children."""
    yield computation
    for child in computation.children:
        yield from walk(child)


def _creates(computation: Any) -> list[bool]:
    """For each creating frame (in `walk` order): did it create its account (it and every
    frame above it succeeded)?"""
    out: list[bool] = []

    def visit(c: Any, ok: bool) -> None:
        ok = ok and not c.is_error
        if c.msg.is_create:
            out.append(ok)
        for child in c.children:
            visit(child, ok)

    visit(computation, True)
    return out


def check_receipt(ran: Ran, receipt: dict[str, Any]) -> None:
    """The re-execution must reproduce the stored receipt (gas used, status, logs);
    otherwise its trace would be wrong, and ReplayError says where it differs."""
    where = f"re-executing transaction {ran.tx.hash} does not reproduce its receipt"
    want_gas = int(receipt["gasUsed"], 16)
    if ran.gas_used != want_gas:
        raise ReplayError(f"{where}: gasUsed {ran.gas_used}, stored {want_gas}")
    want_status = int(receipt.get("status") or "0x1", 16)
    if ran.status != want_status:
        raise ReplayError(f"{where}: status {ran.status}, stored {want_status}")
    stored = [
        (x["address"].lower(), [t.lower() for t in x["topics"]], x["data"].lower())
        for x in receipt.get("logs") or []
    ]
    mine = [(x["address"], x["topics"], x["data"]) for x in ran.logs]
    if mine != stored:
        raise ReplayError(f"{where}: {len(mine)} logs differ from the {len(stored)} stored")

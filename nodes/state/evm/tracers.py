"""The answers of the tracers, built from transactions re-executed on py-evm (replay.py).

Shapes are those anvil 1.7.1 answers (revm-inspectors' builders, which follow geth): the
struct logger, `callTracer`, `prestateTracer` (with `diffMode`) and the Parity-style traces
of `trace_block`/`trace_transaction`. Each frame's gas is counted as revm counts it: a
creation's init code words belong to the intrinsic gas, which py-evm charges in the frame.

Imported by a worker only when a trace is asked (it imports py-evm).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from eth import exceptions as evm_errors

from nodes.state.evm.pyevm import GETH_NAMES
from nodes.state.evm.replay import (
    FrameComputation,
    Ran,
    ReplayState,
    StepLimit,
)
from nodes.state.evm.revert import PANIC_REASONS, error_string, panic_code

SLOAD, SSTORE = 0x54, 0x55
INVALID = 0xFE


def _hex(data: bytes) -> str:
    return "0x" + bytes(data).hex()


def _address(raw: bytes) -> str:
    return "0x" + raw.hex()


def word(value: int) -> str:
    return "0x" + value.to_bytes(32, "big").hex()


# -- errors ----------------------------------------------------------------------------


def error_of(computation: Any, parity: bool = False) -> str | None:
    """A failed frame's error as revm-inspectors words it (geth's wording for the geth
    tracers, Parity's for trace_*); None when the frame succeeded."""
    if not computation.is_error:
        return None
    err = computation.error
    names = _ERRORS.get(type(err))
    if isinstance(err, evm_errors.OutOfGas) and "memory" in str(err).lower():
        names = ("out of gas: out of memory", "Out of gas")
    if isinstance(err, evm_errors.InvalidInstruction):
        op = _failing_opcode(computation)
        names = ("invalid opcode: INVALID", "Bad instruction") if op == INVALID else names
    if names is None:
        names = (
            ("precompiled failed", "Built-in failed")
            if _is_precompile(computation)
            else (
                type(err).__name__,
                type(err).__name__,
            )
        )
    return names[1] if parity else names[0]


_ERRORS: dict[type, tuple[str, str]] = {
    evm_errors.Revert: ("execution reverted", "Reverted"),
    evm_errors.OutOfGas: ("out of gas", "Out of gas"),
    evm_errors.InvalidInstruction: ("invalid opcode", "Bad instruction"),
    evm_errors.InvalidJumpDestination: ("invalid jump destination", "Bad jump destination"),
    evm_errors.InsufficientStack: ("StackUnderflow", "StackUnderflow"),
    evm_errors.FullStack: ("Out of stack", "Out of stack"),
    evm_errors.StackDepthLimit: ("CallTooDeep", "CallTooDeep"),
    evm_errors.InsufficientFunds: (
        "insufficient balance for transfer",
        "Insufficient balance for transfer",
    ),
    evm_errors.WriteProtection: ("StateChangeDuringStaticCall", "StateChangeDuringStaticCall"),
    evm_errors.OutOfBoundsRead: ("OutOfOffset", "OutOfOffset"),
    evm_errors.ContractCreationCollision: ("CreateCollision", "CreateCollision"),
    evm_errors.ReservedBytesInCode: (
        "CreateContractStartingWithEF",
        "CreateContractStartingWithEF",
    ),
}


def _failing_opcode(computation: Any) -> int:
    pc = computation.code.program_counter - 1
    code = computation.msg.code
    return code[pc] if 0 <= pc < len(code) else 0


def _is_precompile(computation: Any) -> bool:
    return computation.msg.code_address in computation.precompiles


def revert_reason(output: bytes) -> str | None:
    """geth's UnpackRevert: the Error(string) message or the panic's words; None for other
    data or an empty message."""
    output = bytes(output)
    reason = error_string(output)
    if reason is not None:
        return reason if reason.strip("\0") else None
    code = panic_code(output)
    if code is None:
        return None
    return PANIC_REASONS.get(code, f"unknown panic code: {code:#x}")


# -- frames: who called whom -----------------------------------------------------------


def _ends(c: Any) -> tuple[str, str]:
    """(from, to) of a frame as revm-inspectors records them: a DELEGATECALL or CALLCODE
    runs in the caller's account, from it, to the code's address."""
    msg = c.msg
    if c.kind in ("DELEGATECALL", "CALLCODE"):
        return _address(msg.storage_address), _address(msg.code_address)
    return _address(msg.sender), _address(msg.storage_address)


def _input(c: Any) -> bytes:
    return bytes(c.msg.code) if c.msg.is_create else bytes(c.msg.data)


def _frame_gas(c: Any, ran: Ran, root: bool) -> tuple[int, int]:
    """(gas given, gas spent) of a frame as revm counts: the root frame of a creation
    without the init code words (revm's intrinsic gas)."""
    limit, used = c.msg.gas, c.get_gas_used()
    if root and ran.initcode_gas:
        limit -= ran.initcode_gas
        used -= ran.initcode_gas
    return limit, used


def call_frames(ran: Ran, gas_used: int, with_log: bool, only_top: bool) -> dict[str, Any]:
    """callTracer's tree: `gasUsed` of the top frame is `gas_used` (the transaction's)."""
    root = ran.computation
    if root.msg.is_create:
        root.kind = "CREATE"
    frame = _call_frame(root, ran, True, with_log)
    frame["gasUsed"] = hex(gas_used)
    if only_top:
        frame.pop("calls", None)
        selfdestruct = _selfdestruct_frame(root)
        if selfdestruct is not None:
            frame["calls"] = [selfdestruct]
    return frame


def _call_frame(c: Any, ran: Ran, root: bool, with_log: bool) -> dict[str, Any]:
    source, target = _ends(c)
    limit, used = _frame_gas(c, ran, root)
    output = bytes(c.output)
    frame: dict[str, Any] = {
        "from": source,
        "gas": hex(limit),
        "gasUsed": hex(used),
        "to": target,
        "input": _hex(_input(c)),
        "value": hex(c.msg.value),
        "type": c.kind,
    }
    if c.kind == "STATICCALL":
        del frame["value"]
    if output:
        frame["output"] = _hex(output)
    if c.is_error:
        if c.msg.is_create:
            del frame["to"]
        if not isinstance(c.error, evm_errors.Revert):
            frame["gasUsed"] = hex(limit)
            frame.pop("output", None)
        reason = revert_reason(output)
        if reason is not None:
            frame["revertReason"] = reason
        frame["error"] = error_of(c)
    if with_log and c.is_success and c._log_entries:
        frame["logs"] = [_log_frame(c, i, entry) for i, entry in enumerate(c._log_entries)]
    calls = []
    selfdestruct = _selfdestruct_frame(c)
    if selfdestruct is not None:
        calls.append(selfdestruct)
    calls += [_call_frame(child, ran, False, with_log and c.is_success) for child in c.children]
    if calls:
        frame["calls"] = calls
    return frame


def _log_frame(c: Any, i: int, entry: tuple[Any, ...]) -> dict[str, Any]:
    counter, address, topics, data = entry
    position = sum(1 for child in c.children if child.log_mark <= i)
    return {
        "address": _address(address),
        "topics": [word(t) for t in topics],
        "data": _hex(data),
        "position": hex(position),
        "index": hex(counter),
    }


def _selfdestruct_frame(c: Any) -> dict[str, Any] | None:
    if c.selfdestructed is None or c.is_error:
        return None
    target, balance = c.selfdestructed
    return {
        "from": _address(c.msg.storage_address),
        "gas": "0x0",
        "gasUsed": "0x0",
        "to": _address(target),
        "input": "0x",
        "value": hex(balance),
        "type": "SELFDESTRUCT",
    }


# -- Parity-style traces ---------------------------------------------------------------


def parity_traces(ran: Ran) -> list[dict[str, Any]]:
    """trace_transaction's traces of one transaction (without the block and transaction
    fields), parents before children, each with its `traceAddress`."""
    root = ran.computation
    if root.msg.is_create:
        root.kind = "CREATE"
    out: list[dict[str, Any]] = []
    _parity(root, ran, [], out)
    return out


def _parity(c: Any, ran: Ran, address: list[int], out: list[dict[str, Any]]) -> None:
    source, target = _ends(c)
    limit, used = _frame_gas(c, ran, not address)
    children = list(c.children)
    destruct = c.selfdestructed is not None and not c.is_error
    trace: dict[str, Any] = {"subtraces": len(children) + (1 if destruct else 0)}
    if c.msg.is_create:
        trace["type"] = "create"
        trace["action"] = {
            "from": source,
            "gas": hex(limit),
            "init": _hex(_input(c)),
            "value": hex(c.msg.value),
            "creationMethod": c.kind.lower(),
        }
        result = {"address": target, "code": _hex(c.output), "gasUsed": hex(used)}
    else:
        trace["type"] = "call"
        trace["action"] = {
            "from": source,
            "callType": c.kind.lower(),
            "gas": hex(limit),
            "input": _hex(_input(c)),
            "to": target,
            "value": hex(c.msg.value),
        }
        result = {"gasUsed": hex(used), "output": _hex(c.output)}
    if c.is_error:
        trace["error"] = error_of(c, parity=True)
    if not c.is_error or isinstance(c.error, evm_errors.Revert):
        trace["result"] = result
    else:
        trace["result"] = None
    trace["traceAddress"] = address
    out.append(trace)
    for i, child in enumerate(children):
        _parity(child, ran, [*address, i], out)
    if destruct:
        target_addr, balance = c.selfdestructed
        out.append(
            {
                "action": {
                    "address": _address(c.msg.storage_address),
                    "balance": hex(balance),
                    "refundAddress": _address(target_addr),
                },
                "result": None,
                "subtraces": 0,
                "traceAddress": [*address, len(children)],
                "type": "suicide",
            }
        )


# -- prestate --------------------------------------------------------------------------


def prestate(ran: Ran, state: ReplayState, diff: bool, code: bool, storage: bool) -> Any:
    """prestateTracer's answer: every account the transaction touched with its values
    before it (and the slots it read or wrote); in `diff` mode `{"pre", "post"}` of what
    changed only, as revm-inspectors builds it."""
    db = state.accounts
    accounts = ran.access.accounts
    slots: dict[bytes, dict[int, int]] = {}
    for (address, slot), value in ran.access.slots.items():
        slots.setdefault(address, {})[slot] = value
    if not diff:
        out = {}
        for address, acc in accounts.items():
            entry = _account_state(
                acc.nonce, acc.balance, db.code_of(acc.code_hash) if code else b""
            )
            if storage and slots.get(address):
                entry["storage"] = {word(k): word(v) for k, v in slots[address].items()}
            out[_address(address)] = entry
        return out
    pre_out: dict[str, Any] = {}
    post_out: dict[str, Any] = {}
    created = set(ran.created)
    with db.quietly() as quiet:
        for address, acc in accounts.items():
            now = quiet._get_account(address)
            pre_code = db.code_of(acc.code_hash) if code else b""
            post_code = (
                (pre_code if now.code_hash == acc.code_hash else db.code_of(now.code_hash))
                if code
                else b""
            )
            pre = _account_state(acc.nonce, acc.balance, pre_code)
            post = _account_state(now.nonce, now.balance, post_code)
            if storage:
                for slot, before in slots.get(address, {}).items():
                    after = quiet.get_storage(address, slot)
                    if after != before:
                        pre.setdefault("storage", {})[word(slot)] = word(before)
                        post.setdefault("storage", {})[word(slot)] = word(after)
            key = _address(address)
            destroyed = address in ran.deleted
            if not destroyed and pre == post:
                continue  # unchanged: in neither
            was_empty = acc.balance == 0 and acc.nonce == 0 and not pre_code
            if not (address in created and was_empty):
                pre_out[key] = pre
            if not destroyed:
                post_out[key] = {k: v for k, v in post.items() if k == "storage" or pre.get(k) != v}
    for entry in (*pre_out.values(), *post_out.values()):
        kept = {k: v for k, v in entry.get("storage", {}).items() if int(v, 16)}
        if kept:
            entry["storage"] = kept
        else:
            entry.pop("storage", None)
    return {"pre": pre_out, "post": post_out}


def state_diff(ran: Ran, state: ReplayState) -> dict[str, Any]:
    """trace_replayBlockTransactions' Parity `stateDiff` of one transaction, as
    revm-inspectors' populate_state_diff builds it: per account touched and changed, its
    balance, nonce, code and changed slots as `"="`, `{"+": new}` (created from nothing) or
    `{"*": {"from", "to"}}`."""
    db = state.accounts
    slots: dict[bytes, dict[int, int]] = {}
    for (address, slot), value in ran.access.slots.items():
        slots.setdefault(address, {})[slot] = value
    created = set(ran.created)
    out: dict[str, Any] = {}
    with db.quietly() as quiet:
        for address, acc in ran.access.accounts.items():
            is_created, destroyed = address in created, address in ran.deleted
            if is_created and destroyed:
                continue
            now = quiet._get_account(address)
            changed = {}
            for slot, before in slots.get(address, {}).items():
                after = quiet.get_storage(address, slot)
                if after != before:
                    changed[slot] = (before, after)
            entry: dict[str, Any] = {"balance": "=", "code": "=", "nonce": "=", "storage": {}}
            if is_created and acc.balance == 0:
                entry["balance"] = {"+": hex(now.balance)}
                entry["nonce"] = {"+": hex(now.nonce)}
                entry["code"] = {"+": _hex(db.code_of(now.code_hash))}
                entry["storage"] = {word(k): {"+": word(v[1])} for k, v in changed.items()}
            else:
                if is_created:
                    before_code, after_code = db.code_of(acc.code_hash), db.code_of(now.code_hash)
                    entry["code"] = {"*": {"from": _hex(before_code), "to": _hex(after_code)}}
                entry["storage"] = {
                    word(k): {"*": {"from": word(b), "to": word(a)}}
                    for k, (b, a) in changed.items()
                }
                same = (acc.balance, acc.nonce, acc.code_hash) == (
                    now.balance,
                    now.nonce,
                    now.code_hash,
                )
                if not changed and same and not destroyed:
                    continue
                if acc.balance != now.balance:
                    entry["balance"] = {"*": {"from": hex(acc.balance), "to": hex(now.balance)}}
                if acc.nonce != now.nonce:
                    entry["nonce"] = {"*": {"from": hex(acc.nonce), "to": hex(now.nonce)}}
            out[_address(address)] = entry
    return out


def _account_state(nonce: int, balance: int, code: bytes) -> dict[str, Any]:
    """alloy's AccountState: balance always, nonce when not 0, code when not empty."""
    out: dict[str, Any] = {"balance": hex(balance)}
    if code:
        out["code"] = _hex(code)
    if nonce:
        out["nonce"] = nonce
    return out


# -- the struct logger -----------------------------------------------------------------


class StructLogger:
    """geth's struct logs, as revm-inspectors writes them: each step with the gas before it
    and its cost (a CALL or CREATE costs what it took before its frame runs, the gas it
    gives included), depth from 1, the stack bottom first, the frame's refund counter, and
    when asked the memory (32-byte words), the return data, and at SLOAD/SSTORE the slots
    of the executing account read or written so far in the transaction."""

    def __init__(
        self,
        max_steps: int,
        stack: bool,
        storage: bool,
        memory: bool,
        return_data: bool,
        limit: int = 0,
        max_bytes: int = 0,
    ) -> None:
        self.max_steps = max_steps  # of the whole job: past it the trace fails
        self.max_bytes = max_bytes  # the steps' JSON, roughly, of the whole job (0: no bound)
        self.size = 0
        self.limit = limit  # geth's `limit` per transaction: past it steps are not recorded
        self.stack, self.storage, self.memory, self.return_data = (
            stack,
            storage,
            memory,
            return_data,
        )
        self.total = 0
        self.steps: list[dict[str, Any]] = []
        # steps still running, with their frame (a CALL runs its child frame)
        self.open: list[tuple[Any, dict[str, Any]]] = []
        self.next_pc: dict[Any, int] = {}  # per frame: the pc after its last step
        self.slots: dict[bytes, dict[str, str]] = {}  # per account: slots seen, for `storage`

    def reset(self) -> None:
        """A new transaction: its steps and storage view start empty."""
        self.steps, self.open, self.next_pc, self.slots = [], [], {}, {}

    def child_starts(self, parent: Any) -> None:
        if self.open and self.open[-1][0] is parent:
            entry = self.open[-1][1]
            entry["gasCost"] = entry["gas"] - parent.get_gas_remaining()

    def before(self, computation: Any, opcode: int, name: str) -> dict[str, Any] | None:
        code = computation.code
        pc = code.program_counter - 1
        if opcode == 0 and self.next_pc.get(computation, 0) == code.program_counter:
            pc = code.program_counter  # the STOP past the end of the code: nothing was read
            if pc == 0:
                return None  # empty code: revm runs no frame
        if self.limit and len(self.steps) >= self.limit:
            return None
        self.total += 1
        if self.total > self.max_steps:
            raise StepLimit(f"more than {self.max_steps} steps")
        entry: dict[str, Any] = {
            "pc": pc,
            "op": name,
            "gas": computation.get_gas_remaining(),
            "gasCost": None,
            "depth": computation.msg.depth + 1,
        }
        values = computation._stack.values
        if self.stack:
            entry["stack"] = [
                hex(v if v.__class__ is int else int.from_bytes(v, "big")) for v in values
            ]
        if self.memory:
            mem = bytes(computation._memory._bytes)
            entry["memory"] = [_hex(mem[i : i + 32]) for i in range(0, len(mem), 32)]
        if self.return_data:
            entry["returnData"] = _hex(computation.return_data)
        entry["refund"] = computation._gas_meter.gas_refunded
        if self.storage and opcode in (SLOAD, SSTORE) and values:
            self._storage(computation, opcode, values, entry)
        if self.max_bytes:
            self._count(entry)
        self.steps.append(entry)
        self.open.append((computation, entry))
        return entry

    def _count(self, entry: dict[str, Any]) -> None:
        """Bound the answer's size: memory and stack are copied into every step."""
        self.size += 120 + 70 * (len(entry.get("stack", ())) + len(entry.get("memory", ())))
        self.size += len(entry.get("returnData", "")) + 140 * len(entry.get("storage", ()))
        if self.size > self.max_bytes:
            raise StepLimit(f"more than {self.max_bytes} bytes")

    def _storage(
        self, computation: Any, opcode: int, values: list[Any], entry: dict[str, Any]
    ) -> None:
        """The slot an SLOAD or SSTORE is about to touch, noted on the entry; `after` adds
        it to the account's slots seen when revm's journal would show a change (a cold
        slot, or a store of another value) and the step did not fail, as revm-inspectors
        records storage. The entry shows the slots seen after the step."""
        top = values[-1]
        slot = top if top.__class__ is int else int.from_bytes(top, "big")
        address = computation.msg.storage_address
        state = computation.state
        current = state.get_storage(address, slot)
        cold = not state.is_storage_warm(address, slot)
        value = current
        if opcode == SSTORE:
            if len(values) < 2:
                return
            raw = values[-2]
            value = raw if raw.__class__ is int else int.from_bytes(raw, "big")
        if cold or value != current:
            entry["_slot"] = (address, slot, value)
        entry["storage"] = self.slots.setdefault(address, {})

    def after(self, computation: Any, entry: dict[str, Any], failure: BaseException | None) -> None:
        """The step's cost once it ran; a step that failed carries revm's error (as
        revm-inspectors prints it) and, out of gas, costs all the gas the frame had."""
        self.open.pop()
        self.next_pc[computation] = computation.code.program_counter
        if "storage" in entry:
            change = entry.pop("_slot", None)
            seen = entry["storage"]
            if change is not None and failure is None:
                _address, slot, value = change
                seen[word(slot)] = word(value)
            entry["storage"] = dict(seen)
        if entry["gasCost"] is None:
            entry["gasCost"] = entry["gas"] - computation.get_gas_remaining()
        if failure is not None and isinstance(failure, evm_errors.VMError):
            result = _step_error(failure, computation)
            if result is not None:
                entry["error"] = f"Some({result})"
                if result in ("OutOfGas", "MemoryOOG"):
                    entry["gasCost"] = entry["gas"]

    def result(self, ran: Ran, gas_used: int) -> dict[str, Any]:
        """revm-inspectors' frame: `returnValue` is 0x-prefixed (geth writes it without)."""
        c = ran.computation
        output = (
            bytes(c.output) if not c.is_error or isinstance(c.error, evm_errors.Revert) else b""
        )
        return {
            "failed": c.is_error,
            "gas": gas_used,
            "returnValue": _hex(output),
            "structLogs": self.steps,
        }


def _stepped(opcode: int, fn: Any) -> Callable[..., None]:
    inner = getattr(fn, "__wrapped__", fn)
    name = getattr(fn, "mnemonic", None) or getattr(inner, "mnemonic", f"0x{opcode:02x}")
    name = GETH_NAMES.get(name, name)

    def step(computation: Any) -> None:
        logger = computation.state.stepper
        if logger is None:  # a transaction run before the traced one
            return fn(computation=computation)
        entry = logger.before(computation, opcode, name)
        if entry is None:
            return fn(computation=computation)
        try:
            fn(computation=computation)
        except BaseException as exc:
            logger.after(computation, entry, exc)
            raise
        logger.after(computation, entry, None)

    return step


def _step_error(err: BaseException, computation: Any) -> str | None:
    """revm's InstructionResult for an opcode that failed (None for a revert or a halt
    that is not an error)."""
    if isinstance(err, evm_errors.Revert | evm_errors.Halt):
        return None
    if isinstance(err, evm_errors.OutOfGas):
        return "MemoryOOG" if "memory" in str(err).lower() else "OutOfGas"
    if isinstance(err, evm_errors.InvalidInstruction):
        return "InvalidFEOpcode" if _failing_opcode(computation) == INVALID else "OpcodeNotFound"
    return _STEP_ERRORS.get(type(err), type(err).__name__)


_STEP_ERRORS: dict[type, str] = {
    evm_errors.InvalidJumpDestination: "InvalidJump",
    evm_errors.InsufficientStack: "StackUnderflow",
    evm_errors.FullStack: "StackOverflow",
    evm_errors.WriteProtection: "StateChangeDuringStaticCall",
    evm_errors.OutOfBoundsRead: "OutOfOffset",
}


class SteppedComputation(FrameComputation):
    """FrameComputation whose every opcode is reported to the struct logger."""

    opcodes: ClassVar[dict[int, Any]] = {
        op: _stepped(op, fn) for op, fn in FrameComputation.opcodes.items()
    }


# -- eth_createAccessList ----------------------------------------------------------------

PRECOMPILES = frozenset(i.to_bytes(20, "big") for i in range(1, 11))  # Cancun's 0x01..0x0a
EXT_OPS = frozenset({0x3B, 0x3C, 0x3F, 0x31, 0xFF})  # EXTCODESIZE/COPY/HASH, BALANCE, SELFDESTRUCT
CALLS = frozenset({0xF1, 0xF2, 0xF4, 0xFA})  # CALL, CALLCODE, DELEGATECALL, STATICCALL


class AccessListCollector:
    """geth's access-list tracer: the slots every SLOAD/SSTORE touches (of any account),
    and the accounts BALANCE, EXTCODE*, SELFDESTRUCT and the CALLs touch, except the
    sender, the recipient (or the created account) and the precompiles; it starts from the
    list the call gave."""

    def __init__(self, excluded: set[bytes], start: list[tuple[str, list[int]]]) -> None:
        self.excluded = excluded | PRECOMPILES
        self.touched: dict[bytes, set[int]] = {}
        for address, slots in start:
            raw = bytes.fromhex(address[2:])
            if raw not in self.excluded or slots:
                self.touched.setdefault(raw, set()).update(slots)

    def child_starts(self, parent: Any) -> None:
        pass

    def before(self, computation: Any, opcode: int, name: str) -> None:
        values = computation._stack.values
        if opcode in (SLOAD, SSTORE) and values:
            slot = _int(values[-1])
            self.touched.setdefault(computation.msg.storage_address, set()).add(slot)
        elif opcode in EXT_OPS and values:
            self._account(_int(values[-1]))
        elif opcode in CALLS and len(values) >= 2:
            self._account(_int(values[-2]))
        return None

    def _account(self, word: int) -> None:
        address = (word & (2**160 - 1)).to_bytes(20, "big")
        if address not in self.excluded:
            self.touched.setdefault(address, set())

    def access_list(self) -> list[tuple[str, list[int]]]:
        """The list, accounts and slots sorted (geth and anvil keep them in maps)."""
        return [(_address(a), sorted(slots)) for a, slots in sorted(self.touched.items())]


def _int(value: Any) -> int:
    return value if value.__class__ is int else int.from_bytes(value, "big")

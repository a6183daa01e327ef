"""Calls that may read BASEFEE, run again on py-evm with the block's base fee.

pyrevm 0.3.7 rebuilds the block env of every `message_call`/`deploy` with a base fee of 0
(docs/evm.md); no API of it sets one (checked in its source), no other revm binding installs
here (pyrevm-trace is a source package needing crates.io), so a call that executes BASEFEE
would answer 0 where anvil answers the block's base fee. Such calls are found and run on
py-evm (the Ethereum Foundation's EVM, pure Python, slow but exact); every other call stays
on revm.

Finding them (`BasefeeCheck.verdict`): every account whose code revm ran is in its database
cache (`db_accounts`): fork mode keeps there what it read, also for frames that reverted,
whose accounts revm's journal forgets (a call into B reading BASEFEE, then a revert carrying
the value). The journal adds the accounts the call created. If none of those codes holds
BASEFEE (0x48) as an instruction, nor CREATE/CREATE2 (whose init code comes from memory and
could), and the call is not a creation whose init code holds one, revm's answer is exact.
A warm EVM's cache also holds what earlier calls at its block read: a suspect code there
that this call's journal does not show is ambiguous (loaded by this call in a frame that
reverted, or by another call), and the worker settles it by running the call once on a
fresh EVM, whose cache holds only what this call loads. Verdicts are kept per code hash,
and per warm EVM, block env and whole call (`worker.Warm.verdicts`, by `worker.call_key`),
so a warm call pays a dictionary look-up.

Most calls need none of that (`BasefeeCheck.alone`): a callee whose code holds no CALL-,
CREATE-family instruction runs no code but its own (a frame is entered only through them),
so that code alone decides. A warm EVM knows the code of each account it was given, and a
call into one of those is judged without listing the database cache, whose size grows with
every account called at the block (on a store of 10 k tokens, listing it per new call cost
more than the call).

Running them (`nodes/state/evm/pyevm.py`, imported only when a call needs it: py-evm takes
1.5 s to import): py-evm's Cancun state in memory, filled with the accounts and
slots revm's run read (the block's values); every read py-evm makes of something not filled
in is recorded, and the call runs again with those added until it reads nothing new (a
different base fee can take a different branch). Gas is counted as revm's message calls
count it (intrinsic gas included, refund capped at a fifth), so results compare with the
revm path.
"""

from __future__ import annotations

from typing import Any

BASEFEE, CREATE, CREATE2 = 0x48, 0xF0, 0xF5
# Instructions that run other code: CREATE, CALL, CALLCODE, DELEGATECALL, CREATE2, STATICCALL.
RUNS_OTHERS = frozenset({0xF0, 0xF1, 0xF2, 0xF4, 0xF5, 0xFA})
CODE_VERDICTS = 65_536  # code hashes whose verdict is kept
ALONE_BYTES = 16 * 1024 * 1024  # bytes of code whose `alone` verdict is kept (keyed by code)


def code_may_read_basefee(code: bytes) -> bool:
    """Does the code hold BASEFEE, CREATE or CREATE2 as an instruction (PUSH data skipped)?"""
    i, n = 0, len(code)
    while i < n:
        op = code[i]
        if op in (BASEFEE, CREATE, CREATE2):
            return True
        i += op - 0x5E if 0x60 <= op <= 0x7F else 1  # PUSH1..PUSH32 carry 1..32 bytes
    return False


def runs_only_itself(code: bytes) -> bool:
    """Does a call into this code run no other code: no CALL- or CREATE-family instruction
    (PUSH data skipped), and no 0xEF code (EOF, EIP-7702 delegations run other code)?"""
    if code[:1] == b"\xef":
        return False
    i, n = 0, len(code)
    while i < n:
        op = code[i]
        if op in RUNS_OTHERS:
            return False
        i += op - 0x5E if 0x60 <= op <= 0x7F else 1
    return True


CLEAN, SUSPECT, UNSURE = "clean", "suspect", "unsure"


class BasefeeCheck:
    """Verdicts per code hash, and `alone` verdicts per code (both bounded)."""

    def __init__(self) -> None:
        self._codes: dict[bytes, bool] = {}
        self._alone: dict[bytes, str | None] = {}
        self._alone_bytes = 0

    def alone(self, code: bytes) -> str | None:
        """The verdict on any call into `code` that is undone before the next (a warm EVM's:
        the callee's code stays as given): SUSPECT or CLEAN when the code runs no other code
        (`runs_only_itself`), else None (the run must be looked at: `verdict`)."""
        verdict = self._alone.get(code, UNSURE)
        if verdict == UNSURE:
            verdict = None
            if runs_only_itself(code):
                verdict = SUSPECT if code_may_read_basefee(code) else CLEAN
            if self._alone_bytes + len(code) > ALONE_BYTES:
                self._alone.clear()
                self._alone_bytes = 0
            self._alone[code] = verdict
            self._alone_bytes += len(code)
        return verdict

    def _suspect_code(self, info: Any) -> bool:
        code_hash = bytes(info.code_hash)
        verdict = self._codes.get(code_hash)
        if verdict is None:
            verdict = code_may_read_basefee(bytes(info.code or b""))
            if len(self._codes) >= CODE_VERDICTS:
                self._codes.clear()
            self._codes[code_hash] = verdict
        return verdict

    def verdict(
        self, db_accounts: dict[str, Any], journal: dict[str, Any], initcode: bytes | None
    ) -> str:
        """After revm ran a call: SUSPECT when it may have executed BASEFEE (a suspect code in
        its journal, or its own init code), UNSURE when a suspect code is only in the
        database cache (pyrevm `db_accounts`: this call may have run it in a frame that
        reverted, or an earlier call at the block loaded it), else CLEAN. `initcode` is the
        call's own init code (a creation)."""
        if initcode is not None and code_may_read_basefee(initcode):
            return SUSPECT
        if any(self._suspect_code(info) for info in journal.values()):
            return SUSPECT
        if any(self._suspect_code(info) for info in db_accounts.values()):
            return UNSURE
        return CLEAN

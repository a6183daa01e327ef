"""Calls that may read BASEFEE, run again on py-evm with the block's base fee.

pyrevm 0.3.7 rebuilds the block env of every `message_call`/`deploy` with a base fee of 0
(docs/evm.md); no API of it sets one (checked in its source), no other revm binding installs
here (pyrevm-trace is a source package needing crates.io), so a call that executes BASEFEE
would answer 0 where anvil answers the block's base fee. Such calls are found and run on
py-evm (the Ethereum Foundation's EVM, pure Python, slow but exact); every other call stays
on revm.

Finding them (`may_read_basefee`): after revm ran a call, every account whose code it
loaded is in its journal; if none of those codes holds BASEFEE (0x48) as an instruction,
nor CREATE/CREATE2 (whose init code comes from memory and could), and the call is not a
creation whose init code holds one, revm's answer is exact. Verdicts are kept per code
hash, and per warm EVM and call, so a warm call pays a dictionary look-up.

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
CODE_VERDICTS = 65_536  # code hashes whose verdict is kept


def code_may_read_basefee(code: bytes) -> bool:
    """Does the code hold BASEFEE, CREATE or CREATE2 as an instruction (PUSH data skipped)?"""
    i, n = 0, len(code)
    while i < n:
        op = code[i]
        if op in (BASEFEE, CREATE, CREATE2):
            return True
        i += op - 0x5E if 0x60 <= op <= 0x7F else 1  # PUSH1..PUSH32 carry 1..32 bytes
    return False


class BasefeeCheck:
    """Verdicts per code hash (bounded)."""

    def __init__(self) -> None:
        self._codes: dict[bytes, bool] = {}

    def may_read_basefee(self, journal_accounts: dict[str, Any], initcode: bytes | None) -> bool:
        """True when a call whose journal holds these accounts (pyrevm `journal_state`)
        may have executed BASEFEE; `initcode` is the call's own init code (a creation)."""
        if initcode is not None and code_may_read_basefee(initcode):
            return True
        for info in journal_accounts.values():
            code_hash = bytes(info.code_hash)
            verdict = self._codes.get(code_hash)
            if verdict is None:
                verdict = code_may_read_basefee(bytes(info.code or b""))
                if len(self._codes) >= CODE_VERDICTS:
                    self._codes.clear()
                self._codes[code_hash] = verdict
            if verdict:
                return True
        return False

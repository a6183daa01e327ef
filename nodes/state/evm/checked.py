"""EVMs in memory for blocks with no warm EVM, every call checked against what it was given.

A fork-mode EVM (pyrevm reading lazily from the state URL) costs ~15 µs of CPU to build:
pyrevm makes an HTTP client per EVM. An EVM in memory costs ~2.6 µs. At a random old height
of a long chain a call seldom finds a warm EVM for its block, and that build was a large
part of its cost. An EVM in memory answers anything it was not given as empty (zero
balance, no code, zero slots), so its answer counts only when the call read nothing else.
The call's journal lists every account it loaded and every slot it read, unless a frame of
the call reverted (a revert forgets what its frame loaded) or it read a block hash (read
from the database, not journaled; in memory a made-up hash). So only calls whose callee runs
no other code (one frame: `basefee.runs_only_itself`) and holds no BLOCKHASH instruction run
on one (`Checkable`); a call that read something it was not given runs again with that given
(`worker.Runner._checked`), and one that fails or keeps reading more runs on a fork-mode EVM.
"""

from __future__ import annotations

from nodes.state.evm.basefee import runs_only_itself

BLOCKHASH = 0x40
CHECK_ROUNDS = 4  # runs of one call on an EVM in memory, each given what the last missed
CHECKED_CALLS = 64  # calls an EVM in memory serves; then its block gets a fork-mode EVM
CHECKABLE_CODES = 16_384  # codes whose verdict a worker keeps
_STORAGE = ", storage: {"
_ACCOUNT = ": Account { info: "
_STATUS = "}, status"


class JournalText(Exception):
    """pyrevm's journal text is not shaped as expected (its version is pinned)."""


def reads_block_hash(code: bytes) -> bool:
    """Does the code hold BLOCKHASH as an instruction (PUSH data skipped)?"""
    i, n = 0, len(code)
    while i < n:
        op = code[i]
        if op == BLOCKHASH:
            return True
        i += op - 0x5E if 0x60 <= op <= 0x7F else 1  # PUSH1..PUSH32 carry 1..32 bytes
    return False


class Checkable:
    """Verdicts per code (bounded): can a call into it be checked by its journal?"""

    def __init__(self, limit: int = CHECKABLE_CODES) -> None:
        self.limit = limit
        self._codes: dict[bytes, bool] = {}

    def __call__(self, code: bytes) -> bool:
        verdict = self._codes.get(code)
        if verdict is None:
            verdict = runs_only_itself(code) and not reads_block_hash(code)
            if len(self._codes) >= self.limit:
                self._codes.clear()
            self._codes[code] = verdict
        return verdict


def journal_accounts(journal: str) -> list[tuple[str, int, int]]:
    """(address, start, end) of each account in pyrevm's journal text, `start:end` its
    storage map's text (empty when it holds none); found with `str.find`, as one regex over
    the whole text (matching lazily across each account's code) cost several times more."""
    out = []
    at = journal.find(_STORAGE)
    while at != -1:
        start = at + len(_STORAGE)
        head = journal.rfind(_ACCOUNT, 0, at)
        end = start if journal.startswith("}", start) else journal.find(_STATUS, start)
        if head < 42 or end == -1 or not journal.startswith("0x", head - 42):
            raise JournalText(f"unexpected journal text near {journal[max(0, at - 80) : at]!r}")
        out.append((journal[head - 42 : head], start, end))
        at = journal.find(_STORAGE, end)
    return out

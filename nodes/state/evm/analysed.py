"""Contract code given to an EVM with its jump destinations already analysed.

revm analyses a contract's code (the bitmap of valid JUMPDESTs, the code padded for the
interpreter) whenever a frame runs code that its database holds raw, and pyrevm 0.3.7's
`AccountInfo` only builds raw code: so every call into a preloaded contract analysed its
code again, ~15k instructions of a 2.6 KB ERC20's ~82k `balanceOf` (snapshot, call and
revert on a warm EVM). revm keeps code it created analysed, so a worker deploys each
distinct code once on a scratch EVM in memory and hands out that account's info (analysed
code, the keccak hash of the original code) with the balance of the account it stands for:
a warm EVM's cache then holds the code as revm would have analysed it, and calls at its
block never analyse it again. Analysed code behaves exactly as raw code (CODESIZE,
CODECOPY, EXTCODE* see the original bytes; tested).

Only for accounts of nonce 1 (every contract created since EIP-161 that has not created
another): a created account's nonce is 1 and pyrevm has no way to set it. Others, and code
the scratch cannot deploy (over its size limit, or starting with 0xEF), are given raw.
"""

from __future__ import annotations

from Crypto.Hash import keccak
from pyrevm import EVM, AccountInfo, CfgEnv, Env

MAX_CODE = 0xFFFFFF  # bytes of code the scratch deploys (its init code's PUSH3 length)
CODES = 1024  # distinct codes a scratch EVM holds before it is built anew
DEPLOYER = "0x" + "00" * 19 + "de"  # the scratch's only sender (nothing else is on it)
_MISSING = ""  # `_at`'s answer for a code not deployed yet (an address is never empty)
HASHED_BYTES = 16 * 1024 * 1024  # bytes of raw code whose hash is kept (keyed by code)


def init_code(code: bytes) -> bytes:
    """Init code that returns `code`: PUSH3 len, DUP1, PUSH1 13, PUSH1 0, CODECOPY,
    PUSH1 0, RETURN, then the code."""
    return b"\x62" + len(code).to_bytes(3, "big") + bytes.fromhex("80600d6000396000f3") + code


class AnalysedCode:
    """A worker's scratch EVM holding each contract code it was asked for, analysed."""

    def __init__(self, limit: int = CODES) -> None:
        self.limit = limit
        self._evm: EVM | None = None
        self._at: dict[bytes, str | None] = {}  # code → its account on the scratch (None: raw)
        self._hashes: dict[bytes, bytes] = {}  # raw code → its keccak hash
        self._hashed_bytes = 0

    def info(self, balance: int, nonce: int, code: bytes) -> AccountInfo | None:
        """An account of this balance, nonce and code with its code analysed, or None when
        it must be given raw (see the module's docstring)."""
        if nonce != 1 or not code:
            return None
        address = self._at.get(code, _MISSING)
        if address == _MISSING:
            address = self._deploy(code)
        if address is None:
            return None
        evm = self._evm
        assert evm is not None
        evm.set_balance(address, balance)
        return evm.basic(address)

    def code_hash(self, code: bytes) -> bytes:
        """The keccak hash of code given raw, kept per code: the same contract is given to
        EVM after EVM (at each block it is called at), and hashing it cost ~4 µs a time."""
        found = self._hashes.get(code)
        if found is None:
            found = keccak.new(digest_bits=256, data=code).digest()
            if self._hashed_bytes + len(code) > HASHED_BYTES:
                self._hashes.clear()
                self._hashed_bytes = 0
            self._hashes[code] = found
            self._hashed_bytes += len(code)
        return found

    def _deploy(self, code: bytes) -> str | None:
        if len(self._at) >= self.limit or self._evm is None:
            self._at.clear()  # (the scratch's journal keeps every deployment: start anew)
            cfg = CfgEnv(limit_contract_code_size=MAX_CODE)
            self._evm = EVM(env=Env(cfg=cfg), spec_id="Cancun")
        address: str | None = None
        if len(code) <= MAX_CODE and code[0] != 0xEF:
            try:
                address = self._evm.deploy(DEPLOYER, init_code(code), gas=2**62)
            except RuntimeError:  # refused by the scratch: given raw
                address = None
        self._at[code] = address
        return address

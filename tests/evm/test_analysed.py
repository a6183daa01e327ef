"""Contract code given to an EVM analysed (nodes/state/evm/analysed.py) runs exactly as the
same code given raw: same output, same gas, and the code seen by CODESIZE, CODECOPY and
EXTCODE* is the original code, not revm's padded copy."""

from __future__ import annotations

from Crypto.Hash import keccak
from pyrevm import EVM, AccountInfo

from nodes.state.evm.analysed import AnalysedCode

TARGET = "0x" + "aa" * 20
PROBE = "0x" + "bb" * 20
CALLER = "0x" + "cc" * 20
# JUMP over data to a JUMPDEST; return keccak(CODECOPY of its code and 40 bytes past it) and
# CODESIZE; it ends in a PUSH2 cut short, which revm's analysis pads.
TARGET_CODE = bytes.fromhex(  # (fromhex skips the spaces)
    "600756 6000 0000 5b 38602801 80 6000 6000 39 6000 20 600052 38602052 6040 6000 f3 61aa"
)
# EXTCODESIZE and EXTCODEHASH of the target, and keccak of EXTCODECOPY of 100 bytes of it
PROBE_CODE = bytes.fromhex(
    "73" + "aa" * 20 + " 80 3b 600052 80 3f 602052"
    " 6064 6000 6040 83 3c 50 6064 6040 20 604052 6060 6000 f3"
)


def _keccak(data: bytes) -> bytes:
    return keccak.new(digest_bits=256, data=data).digest()


def _raw(balance: int, nonce: int, code: bytes) -> AccountInfo:
    return AccountInfo(balance, nonce, _keccak(code), code)


def _run(target: AccountInfo) -> list[tuple[bytes, int]]:
    evm = EVM(spec_id="Cancun")
    evm.insert_account_info(TARGET, target)
    evm.insert_account_info(PROBE, _raw(0, 1, PROBE_CODE))
    out = []
    for to in (TARGET, PROBE):
        checkpoint = evm.snapshot()
        output = bytes(evm.message_call(CALLER, to, b"", None, 1_000_000, None))
        out.append((output, evm.result.gas_used))
        evm.revert(checkpoint)
    return out


def test_analysed_code_answers_and_costs_as_raw_code() -> None:
    analysed = AnalysedCode()
    info = analysed.info(123, 1, TARGET_CODE)
    assert info is not None
    assert (info.balance, info.nonce, bytes(info.code_hash)) == (123, 1, _keccak(TARGET_CODE))
    got = _run(info)
    assert got == _run(_raw(123, 1, TARGET_CODE))
    (own, _), (probe, _) = got
    size = len(TARGET_CODE)
    assert own == _keccak(TARGET_CODE + bytes(40)) + size.to_bytes(32, "big")
    copied = _keccak(TARGET_CODE + bytes(100 - size))
    assert probe == size.to_bytes(32, "big") + _keccak(TARGET_CODE) + copied


def test_each_code_is_deployed_once_and_the_balance_is_each_accounts() -> None:
    analysed = AnalysedCode(limit=2)
    first = analysed.info(5, 1, TARGET_CODE)
    second = analysed.info(7, 1, TARGET_CODE)
    assert first is not None and second is not None
    assert (first.balance, second.balance) == (5, 7)  # (each a copy, not the scratch's)
    assert len(analysed._at) == 1
    analysed.info(0, 1, PROBE_CODE)
    again = analysed.info(9, 1, b"\x00")  # past the limit: a new scratch, the same answers
    assert again is not None and len(analysed._at) == 1
    assert _run(analysed.info(1, 1, TARGET_CODE)) == _run(_raw(1, 1, TARGET_CODE))  # type: ignore[arg-type]


def test_accounts_it_cannot_stand_for_are_given_raw() -> None:
    """A nonce other than 1 (a created account's), no code, and code the scratch refuses
    to deploy (EIP-3541's 0xEF start) go raw."""
    analysed = AnalysedCode()
    assert analysed.info(1, 0, TARGET_CODE) is None
    assert analysed.info(1, 2, TARGET_CODE) is None
    assert analysed.info(1, 1, b"") is None
    assert analysed.info(1, 1, b"\xef\x00") is None
    assert analysed._at[b"\xef\x00"] is None  # (refused once, not tried again)

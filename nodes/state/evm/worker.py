"""The process side of the executor: runs jobs on pyrevm and answers plain dicts.

A worker process owns a small LRU of warm EVMs, one per (state URL, block): pyrevm's fork
mode fetches accounts and slots lazily from the state URL and keeps them, so repeated calls at
one block run in memory. Every call runs between `snapshot()` and `revert()`, which keeps
the journal from growing and leaves the warm state as of the block. Jobs marked `fresh`
(state overrides and simulations, whose state URL is an overlay of the feed), traces (an
aborted trace may leave the journal inconsistent) and `disable_cache` get a fresh EVM.

Errors are returned as `{"code", "message", "data"}` dicts (JSON-RPC codes of the spec); the
main process turns them into JsonRpcError. Nothing here imports the event loop.
"""

from __future__ import annotations

import binascii
import contextlib
import ctypes
import hashlib
import http.client
import io
import os
import pickle
import re
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
from Crypto.Hash import keccak
from pyrevm import EVM, AccountInfo, BlockEnv, CfgEnv, Env, TxEnv

from chainstate.jsonrpc import (
    BALANCE_EXHAUSTED,
    BLOCK_NOT_FOUND,
    DATABASE_FAILED,
    EVM_FAILED,
    EVM_REVERT,
    GAS_EXHAUSTED,
    INVALID_PARAMS,
    NONCE_ERROR,
)
from nodes.state.evm.analysed import AnalysedCode
from nodes.state.evm.basefee import SUSPECT, UNSURE, BasefeeCheck
from nodes.state.evm.checked import (
    CHECK_ROUNDS,
    CHECKED_CALLS,
    Checkable,
    JournalText,
    journal_accounts,
)
from nodes.state.evm.codec import effective_price
from nodes.state.evm.revert import PANIC_REASONS, error_string, panic_code
from nodes.state.evm.wire import WorkerEnvs, pack_answer, unpack
from nodes.state.store import (
    F_BALANCE,
    F_CODE,
    F_NONCE,
    F_STORAGE,
    Snapshot,
    StateStore,
    seek_span,
)

# Accounts preloaded into a new EVM: one feed request reads them all at once, which on the
# in-loop feed (overlays) holds the node's event loop for ~10 µs per account; the rest of a
# large multi-call's accounts are read lazily by pyrevm as before.
PRELOAD_ACCOUNTS = 64
# Storage slots preloaded into a new EVM: those the same (callee, calldata) read before, in
# this worker (an ERC20 balanceOf reads the same slot at every height, a view the same 64).
PRELOAD_SLOTS = 1024
LEARNED_CALLS = 4096  # (callee, calldata) whose slots a worker remembers
LEARN_DATA = 260  # calldata bytes that key a learned call (selector and 8 words)
# Mapping slots (`mapping_shapes`): the calldata words tried as a key and the slot numbers
# tried as the mapping's position, when a call's reads are first learned for its code and
# selector (2 × 16 × 2 keccaks, once).
MAPPING_WORDS = 2
MAPPING_POSITIONS = 16
CODE_KEYS = 65_536  # accounts whose code key (`Runner._code_of`) a worker keeps
SPAN_BYTES = 32 * 1024 * 1024  # account field values a worker keeps (`StoreReads`), bytes
SPAN_OVERHEAD = 200  # bytes a kept value costs beside its own
MEMORY_CHECK_S = 0.25  # seconds between two looks at the worker's own memory
ANSWER_BYTES = 1024  # return data up to which a warm EVM keeps a call's answer
NO_WARM = frozenset(
    {"trace", "replay", "trace_call", "access_list"}
)  # jobs that never run on a warm EVM
TRACE_JOBS = frozenset({"replay", "trace_call", "access_list"})  # run on py-evm by tracing.py
# tracing.TraceFailed kinds and the code each answers
TRACE_ERRORS = {"gas": GAS_EXHAUSTED, "funds": BALANCE_EXHAUSTED}
TRANSFER_GAS = 21_000  # a plain transfer's gas: what estimateGas answers without running it
_REVERT = re.compile(r"^Revert \{ gas_used: (\d+), output: 0x([0-9a-fA-F]*) \}")
_HALT = re.compile(r"^Halt \{ reason: (\w+)(?:\((\w+)\))?, gas_used: (\d+) \}")
READY = "ready"  # a worker's first message: imports done, jobs welcome
_DB_ERROR = re.compile(r'JsonRpcError \{ code: (-?\d+), message: "((?:[^"\\]|\\.)*)"')


class CallFailed(Exception):
    """A call ended without success; `error` is the JSON-RPC error dict, `gas_used` if known."""

    def __init__(self, error: dict[str, Any], gas_used: int = 0) -> None:
        super().__init__(error["message"])
        self.error = error
        self.gas_used = gas_used


class Unusable(Exception):
    """pyrevm's journal is broken after a panic; the EVM must be dropped."""


class Exact(Exception):
    """revm cannot run this call as a transaction would (see `Runner._charge`); py-evm can."""


class TraceTooLong(Exception):
    """Raised by the trace sink once the configured step or byte limit is passed."""


def error(code: int, message: str, data: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        out["data"] = data
    return out


def decode_revert(output: bytes) -> str | None:
    """The `Error(string)` or `Panic(uint256)` message of revert data, when it is one."""
    reason = error_string(output)
    if reason is not None:
        return reason
    code = panic_code(output)
    if code is None:
        return None
    return f"panic: {PANIC_REASONS.get(code, 'unknown panic code')} (0x{code:x})"


def revert_error(output: bytes) -> dict[str, Any]:
    """geth's shape: message `execution reverted[: reason]`, data the revert bytes in hex."""
    reason = decode_revert(output)
    message = "execution reverted" + (f": {reason}" if reason is not None else "")
    return error(EVM_REVERT, message, "0x" + output.hex())


def classify(exc: BaseException) -> CallFailed:
    """Map a pyrevm exception text to the spec's error codes."""
    text = str(exc)
    m = _REVERT.match(text)
    if m:
        return CallFailed(revert_error(bytes.fromhex(m.group(2))), int(m.group(1)))
    m = _HALT.match(text)
    if m:
        reason, detail, gas_used = m.group(1), m.group(2), int(m.group(3))
        if reason == "OutOfGas":
            return CallFailed(error(GAS_EXHAUSTED, f"out of gas ({detail or 'Basic'})"), gas_used)
        if reason == "OutOfFunds":
            return CallFailed(error(BALANCE_EXHAUSTED, "insufficient balance"), gas_used)
        if reason == "NonceOverflow":
            return CallFailed(error(NONCE_ERROR, "nonce overflow"), gas_used)
        return CallFailed(error(EVM_FAILED, f"execution halted: {reason}"), gas_used)
    if "CallGasCostMoreThanGasLimit" in text or ("GasLimit" in text and "Initial gas" in text):
        return CallFailed(error(GAS_EXHAUSTED, "intrinsic gas too high"))
    if "LackOfFundForMaxFee" in text or "InsufficientFunds" in text:
        return CallFailed(error(BALANCE_EXHAUSTED, "insufficient funds for gas * price + value"))
    if "Nonce" in text and "Transaction(" in text:
        return CallFailed(error(NONCE_ERROR, f"nonce error: {text[:200]}"))
    if "RejectCallerWithCode" in text:
        msg = "`from` is a contract: pyrevm 0.3.7 applies EIP-3607 to calls (geth does not)"
        return CallFailed(error(EVM_FAILED, msg))
    if "Transaction(" in text:
        return CallFailed(error(EVM_FAILED, f"invalid transaction: {text[:200]}"))
    m = _DB_ERROR.search(text)
    if m:  # the state feed answered an error: keep its code when it is -39006
        code = BLOCK_NOT_FOUND if m.group(1) == str(BLOCK_NOT_FOUND) else DATABASE_FAILED
        return CallFailed(error(code, f"state read failed: {m.group(2)}"))
    if any(k in text for k in ("Database", "error sending request", "Connection", "rpc", "RPC")):
        return CallFailed(error(DATABASE_FAILED, f"state read failed: {text[:200]}"))
    return CallFailed(error(EVM_FAILED, f"EVM failed: {text[:200]}"))


@dataclass(frozen=True, slots=True)
class Limits:
    max_trace_steps: int
    max_trace_bytes: int
    max_return_bytes: int
    max_response_bytes: int  # return data of all calls of one job together
    warm_max_calls: int  # calls a warm EVM serves before it is dropped (bounds its cache)
    warm_memory_bytes: int = 0  # own memory above which every warm EVM is dropped (0: never)
    warm_answers: int = 0  # answers of calls kept per warm EVM (`Warm.answers`)


def _block_env(block: dict[str, Any]) -> BlockEnv:
    return BlockEnv(
        number=block["number"],
        coinbase=block["coinbase"],
        timestamp=block["timestamp"],
        difficulty=block.get("difficulty", 0),
        prevrandao=bytes.fromhex(block["prevrandao"][2:]),
        basefee=block["basefee"],
        gas_limit=block["gas_limit"],
        excess_blob_gas=block.get("excess_blob_gas") or 0,
    )


def new_evm(job: dict[str, Any], tracing: bool = False, fork: bool = True) -> EVM:
    """A fork-mode EVM reading state as of the job's block from the job's state URL, or
    with `fork` False one in memory holding nothing but what it is given (checked.py).

    The constructor's `gas_limit` is what GASLIMIT reads after pyrevm rebuilds the block env,
    so it is the block's gas limit.
    """
    block = job["block"]
    env = Env(cfg=CfgEnv(chain_id=job["chain_id"]), block=_block_env(block))
    source = {"fork_url": job["fork_url"], "fork_block": hex(job["height"])} if fork else {}
    return EVM(
        env=env, gas_limit=block["gas_limit"], tracing=tracing, spec_id=job["spec_id"], **source
    )


class FeedClient:
    """Keep-alive HTTP connections from a worker to the state feed, for `feed_preload`."""

    def __init__(self) -> None:
        self._conns: dict[tuple[str, int], http.client.HTTPConnection] = {}

    def preload(
        self, url: str, addresses: list[str], slots: list[tuple[str, int]], height: int
    ) -> tuple[list[tuple[int, int, bytes]], list[int]]:
        """(balance, nonce, code) of each address and the value of each (address, slot), as
        the feed at `url` serves them at `height`; a failed read raises CallFailed with the
        code pyrevm's own read would get."""
        parts = urlsplit(url)
        key = (parts.hostname or "127.0.0.1", parts.port or 80)
        request = {"jsonrpc": "2.0", "id": 1, "method": "feed_preload"}
        wanted = [[address, hex(slot)] for address, slot in slots]
        body = orjson.dumps({**request, "params": [addresses, wanted, hex(height)]})
        status, data = self._post(key, parts.path or "/", body)
        if status != 200:
            raise CallFailed(error(DATABASE_FAILED, f"state read failed: HTTP {status}"))
        answer = orjson.loads(data)
        if "error" in answer:
            code = answer["error"].get("code")
            code = BLOCK_NOT_FOUND if code == BLOCK_NOT_FOUND else DATABASE_FAILED
            raise CallFailed(error(code, f"state read failed: {answer['error'].get('message')}"))
        result = answer["result"]
        infos = [(int(b, 16), int(n, 16), bytes.fromhex(c[2:])) for b, n, c in result["accounts"]]
        return infos, [int(v, 16) for v in result["slots"]]

    def block_hash(self, url: str, height: int) -> bytes:
        """A block's hash as the feed serves it (zero for a block the node does not hold)."""
        parts = urlsplit(url)
        key = (parts.hostname or "127.0.0.1", parts.port or 80)
        request = {"jsonrpc": "2.0", "id": 1, "method": "eth_getBlockByNumber"}
        body = orjson.dumps({**request, "params": [hex(height), False]})
        status, data = self._post(key, parts.path or "/", body)
        answer = orjson.loads(data) if status == 200 else {}
        block = answer.get("result") or {}
        return bytes.fromhex(block.get("hash", "0x" + "00" * 32)[2:])

    def _post(self, key: tuple[str, int], path: str, body: bytes) -> tuple[int, bytes]:
        headers = {"content-type": "application/json"}
        for attempt in (1, 2):  # a kept-alive connection the feed closed is retried once
            conn = self._conns.pop(key, None) or http.client.HTTPConnection(*key, timeout=60)
            try:
                conn.request("POST", path, body, headers)
                resp = conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                if attempt == 2:
                    raise CallFailed(error(DATABASE_FAILED, f"state read failed: {exc}")) from None
                continue
            if not resp.will_close:
                self._conns[key] = conn
            return resp.status, data
        raise AssertionError("unreachable")


class StoreReads:
    """The node's LMDB store opened read-only in the worker (LMDB serves many reader
    processes): what a new EVM is given is read here directly, with no socket and no other
    process involved. Only for a block's plain state (jobs that name the store).

    Account fields are kept with the heights each value holds for (`seek_span`): the
    caller, the coinbase and a called contract are read again for each block an EVM is
    built for, and their values seldom change. A kept value is the store's only while the
    chain it was read from stands: the header of the head it was read at is kept too and
    compared at each read (a reorg below or at that head changes it), and a value read
    with no later version holds only up to that head."""

    def __init__(self, path: str, map_size_mb: int) -> None:
        self.store = StateStore(Path(path), map_size_mb=map_size_mb)
        self.store.open_readonly()
        self._spans: dict[bytes, tuple[int, int, bytes | None]] = {}  # field → (from, to, value)
        self._span_bytes = 0
        self._head: tuple[int, bytes | None] = (-1, None)  # (height, header) spans hold to

    def block_hash(self, height: int) -> bytes:
        """A block's hash (zero for a block the store does not hold)."""
        found = self.store.hash_at(height)
        return bytes.fromhex((found or "0x" + "00" * 32)[2:])

    def preload(
        self, addresses: list[str], slots: list[tuple[str, int]], height: int
    ) -> tuple[list[tuple[int, int, bytes]], list[int]]:
        snap = self.store.snapshot()
        try:
            bounds = snap.bounds
            if bounds is None or not bounds[0] <= height <= bounds[1]:
                msg = f"state read failed: block {height} is outside this node's range"
                raise CallFailed(error(BLOCK_NOT_FOUND, msg))
            if addresses:
                self._still(snap, bounds[1])
            field = self._field
            infos = []
            for address in addresses:
                a = bytes.fromhex(address[2:])
                balance = int.from_bytes(field(snap, a + F_BALANCE, height) or b"", "big")
                nonce = int.from_bytes(field(snap, a + F_NONCE, height) or b"", "big")
                infos.append((balance, nonce, field(snap, a + F_CODE, height) or b""))
            values = []
            for address, slot in slots:
                prefix = bytes.fromhex(address[2:]) + F_STORAGE + slot.to_bytes(32, "big")
                values.append(int.from_bytes(snap.value(prefix, height) or b"", "big"))
            return infos, values
        finally:
            snap.close()

    def _still(self, snap: Snapshot, head: int) -> None:
        """Keep the spans while the head they hold to is still the store's block at its
        height; else drop them. Either way they hold to the store's head from here on."""
        held, header = self._head
        stored = self.store.stored_header
        if held >= 0:
            if stored(snap.txn, held) != header:
                self._spans.clear()
                self._span_bytes = 0
            elif held == head:
                return
        self._head = (head, stored(snap.txn, head))

    def _field(self, snap: Snapshot, key: bytes, height: int) -> bytes | None:
        span = self._spans.get(key)
        if span is not None and span[0] <= height < span[1]:
            return span[2]
        value, since, until = seek_span(snap.accounts, key, height)
        if until is None:
            until = self._head[0] + 1
        if self._span_bytes > SPAN_BYTES:
            self._spans.clear()
            self._span_bytes = 0
        self._spans[key] = (since, until, value)
        self._span_bytes += SPAN_OVERHEAD + len(value or b"")
        return value


def touched_accounts(job: dict[str, Any]) -> list[str]:
    """Accounts every call of the job loads whatever its code does: coinbase (loaded before
    execution since Shanghai), each caller and each callee; at most PRELOAD_ACCOUNTS."""
    seen = dict.fromkeys([job["block"]["coinbase"].lower()])
    for call in job["calls"]:
        seen[call["from"].lower()] = None
        if call["to"] is not None:
            seen[call["to"].lower()] = None
    return list(seen)[:PRELOAD_ACCOUNTS]


def insert_preloaded(
    evm: EVM,
    addresses: list[str],
    infos: list[tuple[int, int, bytes]],
    slots: list[tuple[str, int]],
    values: list[int],
    analysed: AnalysedCode | None = None,
) -> None:
    """Put accounts and storage slots into a new EVM's database cache, where fork mode
    would keep them after reading them, so they stay cold to the EVM.

    pyrevm's `insert_account_info` on an account not yet in the journal writes to the
    CacheDB under the journal, with the AccountInfo revm's EthersDB builds (raw code, keccak
    code hash). `insert_account_storage` on such an account writes the slot to the CacheDB
    too, but then loads the account into the journal (warm); inside a snapshot that is
    reverted right away, only the CacheDB write remains. So results and gas are exactly
    those of lazy reads (tested against anvil); only the reads are saved. With `analysed`,
    a contract's code goes in analysed where it can (analysed.py), as revm runs it.
    """
    for address, (balance, nonce, code) in zip(addresses, infos, strict=True):
        info = analysed.info(balance, nonce, code) if analysed is not None else None
        if info is None:
            # no hash for empty code: pyrevm then uses KECCAK_EMPTY, as EthersDB does
            code_hash = None
            if code:
                code_hash = (
                    analysed.code_hash(code)
                    if analysed is not None
                    else keccak.new(digest_bits=256, data=code).digest()
                )
            info = AccountInfo(balance, nonce, code_hash, code)
        evm.insert_account_info(address, info)
    for (address, slot), value in zip(slots, values, strict=True):
        checkpoint = evm.snapshot()
        evm.insert_account_storage(address, slot, value)
        evm.revert(checkpoint)


def with_bytes(job: dict[str, Any]) -> dict[str, Any] | None:
    """The job's long calldata decoded, in place: the node hands it over as the ASCII bytes
    of its hex (`hex`), to decode off its event loop (`EvmMethods._lazy`). A call whose hex
    is not hex gets -32602 (as the node answers it) under `invalid`, which `calls` answers
    for it alone (the other calls of a job run); for a job of another kind (one call), the
    error is returned."""
    for one in job["jobs"] if job["kind"] == "groups" else (job,):
        for call in one.get("calls") or ():
            lazy = call.pop("hex", None)
            if lazy is None:
                continue
            field, raw = lazy
            try:
                call["data"] = binascii.a2b_hex(memoryview(raw)[2:])
            except (binascii.Error, ValueError):
                msg = f"invalid {field}: expected 0x-prefixed hex bytes"
                call["invalid"] = error(INVALID_PARAMS, msg)
                if one["kind"] != "calls":
                    return call["invalid"]  # type: ignore[no-any-return]
    return None


def detached(job: dict[str, Any]) -> tuple[dict[str, Any], list[bytes]]:
    """`job` without the hex of its long calldata (`hex`), and those bytes in order: they
    go to the worker as raw messages after it (`pool._Worker.roundtrip`), not pickled (a
    copy made while the sending thread holds the GIL the event loop waits for). A copy of
    the job where it has any (the caller's may run again); `attached` puts them back."""
    ones = job["jobs"] if job["kind"] == "groups" else (job,)
    for one in ones:  # (loops, not any(): most jobs have none, looked at per group)
        for call in one.get("calls") or ():
            if "hex" in call:
                break
        else:
            continue
        break
    else:
        return job, []
    blobs: list[bytes] = []

    def strip(one: dict[str, Any]) -> dict[str, Any]:
        calls = one.get("calls") or ()
        if not any("hex" in call for call in calls):
            return one
        out = []
        for call in calls:
            if "hex" in call:
                field, raw = call["hex"]
                blobs.append(raw)
                call = {**call, "hex": (field, None)}
            out.append(call)
        return {**one, "calls": out}

    if job["kind"] == "groups":
        return {**job, "jobs": [strip(one) for one in job["jobs"]]}, blobs
    return strip(job), blobs


def attached(job: dict[str, Any], conn: Any) -> None:
    """The bytes `detached` took out of a job, read from the pipe back into it, in order."""
    for one in job["jobs"] if job["kind"] == "groups" else (job,):
        for call in one.get("calls") or ():
            lazy = call.get("hex")
            if lazy is not None and lazy[1] is None:
                call["hex"] = (lazy[0], conn.recv_bytes())


LearnKey = tuple[str | None, bytes]
# A mapping read as calldata shapes it: (calldata word, the mapping's position, key first):
# slot keccak(word ‖ position) as Solidity lays a mapping out, or keccak(position ‖ word)
# as Vyper does.
Shape = tuple[int, int, bool]


def _keccak(data: bytes) -> int:
    return int.from_bytes(keccak.new(digest_bits=256, data=data).digest(), "big")


def _mapping_slot(data: bytes, shape: Shape) -> int | None:
    """The slot `shape` names for this calldata (None when it is too short)."""
    word_at, position, key_first = shape
    word = data[4 + 32 * word_at : 36 + 32 * word_at]
    if len(word) != 32:
        return None
    where = position.to_bytes(32, "big")
    return _keccak(word + where if key_first else where + word)


def mapping_shapes(data: bytes, slots: list[int]) -> list[Shape]:
    """Which of `slots` (what a call read of its callee's storage) are entries of a mapping
    at a small position keyed by one of the first calldata words (an ERC20's `balanceOf`
    reads keccak(holder ‖ position of `_balances`))."""
    if not slots:
        return []
    read = set(slots)
    out = []
    for word_at in range(min(MAPPING_WORDS, (len(data) - 4) // 32)):
        for position in range(MAPPING_POSITIONS):
            for key_first in (True, False):
                shape = (word_at, position, key_first)
                if _mapping_slot(data, shape) in read:
                    out.append(shape)
    return out


def learn_key(call: dict[str, Any]) -> LearnKey:
    """What a call's slots are remembered under: callee and the start of the calldata."""
    data = call["data"]
    if data.__class__ is not bytes or len(data) > LEARN_DATA:  # (short bytes: themselves)
        data = bytes(data[:LEARN_DATA])
    return (call["to"], data)


CallKey = tuple[Any, ...]


def call_key(call: dict[str, Any]) -> CallKey:
    """What `Runner._isolated` reads of a call, as a key: equal keys run the same on one
    EVM with one block env, so they get the same answer and the same BASEFEE verdict (any
    field can change the path and so the code run). Calldata longer than LEARN_DATA bytes
    goes by its digest (keys are kept with their warm EVM)."""
    data = call["data"]
    if data.__class__ is not bytes:
        data = bytes(data)
    if len(data) > LEARN_DATA:
        data = ("blake2b", hashlib.blake2b(data).digest())
    access = call["access_list"]
    if access:
        access = tuple((a, tuple(slots)) for a, slots in access)
    return (
        call["from"],
        call["to"],
        data,
        call["value"],
        call["gas"],
        call["max_fee"],
        call["tip"],
        access or None,
    )


def storage_read(journal: str) -> list[tuple[str, int]]:
    """(address, slot) of every storage slot in the journal (what a call read or wrote)."""
    out = []
    for address, start, end in journal_accounts(journal):
        if start != end:
            for m in _SLOT.finditer(journal, start, end):
                out.append((address, int(m.group(1))))
    return out


_SLOT = re.compile(r"(\d+): (?:Evm)?StorageSlot \{ \w+: \d+, present_value: (\d+)")


def writes_of(evm: EVM) -> dict[str, Any]:
    """The accounts and present slot values in the journal (what a call wrote or read).

    pyrevm 0.3.7 exposes journal accounts (`journal_state`) but storage only in the debug
    text of the journal (`journal_str`), whose shape is pinned with the pyrevm version.
    """
    journal = evm.journal_str
    lengths = code_lengths(journal)
    accounts = {}
    for address, info in evm.journal_state.items():
        key = address.lower()
        code = bytes(info.code or b"")
        if key in lengths:
            code = code[: lengths[key]]
        accounts[key] = (info.balance, info.nonce, code)
    slots: dict[str, dict[int, int]] = {}
    for address, start, end in journal_accounts(journal):
        for m in _SLOT.finditer(journal, start, end):
            slots.setdefault(address, {})[int(m.group(1))] = int(m.group(2))
    return {"accounts": accounts, "slots": slots}


_ANALYSED = re.compile(
    r"0x([0-9a-f]{40}): Account \{ info: AccountInfo \{ balance: \d+, nonce: \d+, "
    r"code_hash: 0x[0-9a-f]{64}, code: Some\(Bytecode \{ bytecode: 0x[0-9a-f]*, "
    r"state: Analysed \{ len: (\d+)"
)


def code_lengths(journal: str) -> dict[str, int]:
    """Original code lengths of journal accounts whose code revm analysed (and padded with
    zeros for jump analysis); read from the journal's debug text (pinned pyrevm version)."""
    return {"0x" + a: int(n) for a, n in _ANALYSED.findall(journal)}


def deployed_code(evm: EVM, address: str) -> bytes:
    """The code a creation deployed, without revm's analysis padding."""
    code = bytes(evm.get_code(address) or b"")
    length = code_lengths(evm.journal_str).get(address.lower())
    return code if length is None else code[:length]


def _log(entry: Any) -> dict[str, Any]:
    _topics, data = entry.data
    return {
        "address": entry.address.lower(),
        "topics": [t.lower() for t in entry.topics],
        "data": "0x" + data.hex(),
    }


WarmKey = tuple[str, int, str, int]


def warm_key(job: dict[str, Any]) -> WarmKey | None:
    """The warm EVM a job may run on, or None when it needs a fresh one: overlays (`fresh`),
    traces (an aborted trace may leave the journal inconsistent) and `disable_cache`.

    One EVM is exactly one block's state: state URL, height and hash. GASLIMIT reads the
    constructor's gas limit, so a gasLimit override needs its own EVM too.
    """
    if job.get("fresh") or job["kind"] in NO_WARM or job.get("disable_cache"):
        return None
    return (job["fork_url"], job["height"], job["block"]["hash"], job["block"]["gas_limit"])


def own_bytes() -> int:
    """This process's own resident memory: resident pages less the file-backed and shared
    ones (Linux /proc; 0 where unknown). The LMDB store a worker reads is mapped into it,
    and the pages its reads touch count as resident; on a store of a few GB they alone pass
    any limit, though the kernel drops them at will and dropping warm EVMs frees none."""
    try:
        with open("/proc/self/statm", "rb") as f:
            fields = f.read().split()
        return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _trim_heap() -> None:
    """Give freed heap memory back to the system (glibc; a no-op elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class Warm:
    """One EVM at one block's state (`warm_key`, or a fresh one) and what the worker keeps
    with it, in one place (a group at a warm block looks it up once): the calls it ran, what
    it was given (`Runner._preload`: the learn keys of calls, slots, and accounts with the
    BASEFEE verdict of a call into each, `BasefeeCheck.alone`), the block env dict it runs
    with, and for that env the BASEFEE verdicts and kept answers of calls (`call_key`).
    `checked`: an EVM in memory (checked.py), whose given accounts are all it holds, and
    `unchecked` those of them a call into which it cannot vouch for."""

    __slots__ = (
        "accounts",
        "answers",
        "checked",
        "env",
        "evm",
        "given",
        "slots",
        "unchecked",
        "uses",
        "verdicts",
    )

    def __init__(self, evm: EVM, env: dict[str, Any], checked: bool = False) -> None:
        self.evm = evm
        self.checked = checked
        self.unchecked: set[str] = set()
        self.uses = 0
        self.given: set[LearnKey] = set()
        self.accounts: dict[str, str | None] = {}
        self.slots: set[tuple[str, int]] = set()
        self.env = env  # (`new_evm` builds the EVM with it)
        self.verdicts: dict[CallKey, bool] = {}
        self.answers: dict[CallKey, dict[str, Any]] = {}

    def run_with(self, block: dict[str, Any]) -> None:
        """Run the next calls with the block env `block`: set on the EVM unless it has it
        (the node sends a block's env once: the same dict for every job at it). Verdicts
        and answers are those of one env: another (blockOverrides) starts them anew."""
        env = self.env
        if env is block:
            return
        if env != block:
            self.evm.set_block_env(_block_env(block))
            self.verdicts = {}
            self.answers = {}
        self.env = block


class Runner:
    """Runs jobs inside one worker process; keeps the warm EVMs between jobs."""

    def __init__(self, limits: Limits, warm_blocks: int, progress: Any = None) -> None:
        self.limits = limits
        self.warm_blocks = max(1, warm_blocks)
        # Shared with the parent (pool.py): calls of the job started, and when the last one
        # did (time.monotonic, one clock for every process): which call a job that overran
        # its time limit was running, and for how long.
        self.progress = progress
        self._warm: OrderedDict[WarmKey, Warm] = OrderedDict()
        self.feed = FeedClient()
        self._stores: dict[str, StoreReads | None] = {}
        self._learned: OrderedDict[LearnKey, list[tuple[str, int]]] = OrderedDict()
        # Callee code (by its length and hash) and selector → the mapping entries its calls
        # read (`mapping_shapes`); an account's code key, from what was preloaded.
        self._shapes: OrderedDict[tuple[tuple[int, int], bytes], list[Shape]] = OrderedDict()
        self._code_of: dict[str, tuple[int, int]] = {}
        self._basefee = BasefeeCheck()
        self._analysed = AnalysedCode()  # contract codes given to EVMs analysed
        self._checkable = Checkable()  # codes a call into which an EVM in memory can check
        self._job: dict[str, Any] = {}  # the job being run
        self._key: WarmKey | None = None  # its warm key
        self._now: Warm | None = None  # the EVM it runs on and what is kept with it
        self._memory_checked = -MEMORY_CHECK_S  # when `_bound_memory` last read /proc

    def warm_for(self, job: dict[str, Any], key: WarmKey | None) -> Warm:
        """A warm EVM for the job's block (`key`: its `warm_key`), or a fresh one when the
        job must not share (`key` None).

        A warm EVM is rebuilt after `warm_max_calls` calls, which bounds what its cache of
        fetched accounts and slots can grow to. An EVM is given, before it runs a call it
        has not run yet, the accounts that call touches and the slots it read before
        (`_preload`), whether the EVM is new or warm from other calls at its block.
        """
        calls = job["calls"]
        if key is None:
            fresh = Warm(new_evm(job), job["block"])
            self._preload(fresh.evm, job, calls)
            return fresh
        warms = self._warm
        warm = warms.get(key)
        if (
            warm is None
            or warm.uses + len(calls) > self.limits.warm_max_calls
            or (warm.checked and (warm.uses >= CHECKED_CALLS or not self._may_check(job)))
        ):
            checked = warm is None and self._may_check(job)
            warm = warms[key] = Warm(new_evm(job, fork=not checked), job["block"], checked)
        warms.move_to_end(key)
        warm.uses += len(calls)
        self._give_calls(job, warm)
        if warm.checked and not self._vouched(calls, warm):
            warm = warms[key] = Warm(new_evm(job), job["block"])
            warm.uses = len(calls)
            self._give_calls(job, warm)
        while len(warms) > self.warm_blocks:
            warms.popitem(last=False)
        return warm

    def _give_calls(self, job: dict[str, Any], warm: Warm) -> None:
        """Preload a warm EVM for the job's calls it has not been given yet."""
        given = warm.given
        new = None
        for call in job["calls"]:  # (a loop, not a comprehension: no function made per group)
            if learn_key(call) not in given:
                if new is None:
                    new = []
                new.append(call)
        if new is not None:
            self._preload(warm.evm, job, new, warm)
            given.update(learn_key(c) for c in new)

    def _may_check(self, job: dict[str, Any]) -> bool:
        """May the job's block get an EVM in memory (checked.py): plain calls (no creation,
        no simulated transactions) at a block whose state the worker reads from the store."""
        if job["kind"] != "calls" or job.get("collect_writes"):
            return False
        for call in job["calls"]:
            if call["to"] is None:
                return False
        return self._store_reads(job.get("store")) is not None

    @staticmethod
    def _vouched(calls: list[dict[str, Any]], warm: Warm) -> bool:
        """Was each callee given to the EVM in memory, with a code it can vouch for?"""
        for call in calls:
            to = call["to"]
            if to not in warm.accounts or to in warm.unchecked:
                return False
        return True

    def _discard(self, evm: EVM) -> None:
        """Stop keeping an EVM warm (its journal can no longer be trusted)."""
        for key in [k for k, warm in self._warm.items() if warm.evm is evm]:
            del self._warm[key]

    def _preload(
        self,
        evm: EVM,
        job: dict[str, Any],
        calls: list[dict[str, Any]],
        warm: Warm | None = None,
    ) -> None:
        """Give an EVM the accounts the calls touch and the slots they are predicted to read
        (`_predicted`), read in one go (from the store directly, else one feed request).
        `warm`: the warm EVM `evm` is, whose accounts and slots given before (its cache
        holds them as of its block, calls are reverted) are not read again; what this gives
        is added to them. A callee whose code this worker has not read yet is read first,
        then the mapping entries its code's calls read (`mapping_shapes`) in a second go."""
        addresses = touched_accounts({**job, "calls": calls})
        code_of = self._code_of
        new_code = any(c["to"] is not None and c["to"] not in code_of for c in calls)
        slots = self._predicted(calls)
        given = self._give(evm, job, addresses, slots, warm)
        if new_code:
            more = [pair for pair in self._predicted(calls) if pair not in given]
            if more:
                self._give(evm, job, [], more, warm, given)

    def _give(
        self,
        evm: EVM,
        job: dict[str, Any],
        addresses: list[str],
        slots: list[tuple[str, int]],
        warm: Warm | None,
        given: set[Any] | frozenset[Any] = frozenset(),
    ) -> set[Any]:
        """Read and give accounts and slots (with the accounts of those slots, unless in
        `given`, or the warm EVM has them); what it gave, accounts and slots, as a set."""
        known = set(addresses) | given
        for address, _slot in slots:  # an account must be cached before its slots
            if address not in known:
                known.add(address)
                addresses.append(address)
        if warm is not None:
            addresses = [a for a in addresses if a not in warm.accounts]
            slots = [pair for pair in slots if pair not in warm.slots]
            if not addresses and not slots:
                return known
        reads = self._store_reads(job.get("store"))
        if reads is not None:
            infos, values = reads.preload(addresses, slots, job["height"])
        else:
            infos, values = self.feed.preload(job["fork_url"], addresses, slots, job["height"])
        insert_preloaded(evm, addresses, infos, slots, values, self._analysed)
        code_of = self._code_of
        if len(code_of) + len(addresses) > CODE_KEYS:
            code_of.clear()
        # Each account's code key, and for a warm EVM the BASEFEE verdict of a call into it.
        given_to = None if warm is None else warm.accounts
        alone = self._basefee.alone
        for address, info in zip(addresses, infos, strict=True):
            code = info[2]
            code_of[address] = (len(code), hash(code))
            if given_to is not None:
                given_to[address] = alone(code)
                if warm.checked and not self._checkable(code):  # type: ignore[union-attr]
                    warm.unchecked.add(address)  # type: ignore[union-attr]
        if warm is not None:
            warm.slots.update(slots)
        known.update(slots)
        return known

    def _store_reads(self, store: list[Any] | None) -> StoreReads | None:
        """The store a job names, opened once; None (read through the feed) when the job
        names none or it cannot be opened here."""
        if store is None:
            return None
        path = store[0]
        if path not in self._stores:
            try:
                self._stores[path] = StoreReads(path, store[1])
            except Exception as exc:  # e.g. not readable from here: the feed still is
                self._stores[path] = None
                print(f"evm worker: reading through the feed, not {path}: {exc}", file=sys.stderr)
        return self._stores[path]

    def _predicted(self, calls: list[dict[str, Any]]) -> list[tuple[str, int]]:
        """The slots the calls read the last time they ran here, or for a call not run here
        the mapping entries calls of its code and selector read (at most PRELOAD_SLOTS): a
        prediction; whatever it misses is read lazily as before."""
        out: dict[tuple[str, int], None] = {}
        for call in calls:
            to = call["to"]
            if to is None:
                continue
            learned = self._learned.get(learn_key(call))
            if learned is not None:
                for pair in learned:
                    out[pair] = None
                    if len(out) >= PRELOAD_SLOTS:
                        return list(out)
            elif (code := self._code_of.get(to)) is not None:
                data = bytes(call["data"][: 4 + 32 * MAPPING_WORDS])
                for shape in self._shapes.get((code, data[:4]), ()):
                    slot = _mapping_slot(data, shape)
                    if slot is not None:
                        out[(to, slot)] = None
                if len(out) >= PRELOAD_SLOTS:
                    return list(out)[:PRELOAD_SLOTS]
        return list(out)

    def _learn(
        self, call: dict[str, Any], evm: EVM, read: list[tuple[str, int]] | None = None
    ) -> None:
        """Remember the slots a call read (from the journal, before it is reverted, unless
        given as `read`), and the first time a code and selector is seen, which of them are
        mapping entries keyed by calldata (`mapping_shapes`), for calls with other arguments."""
        read = (storage_read(evm.journal_str) if read is None else read)[:PRELOAD_SLOTS]
        self._learned[learn_key(call)] = read
        while len(self._learned) > LEARNED_CALLS:
            self._learned.popitem(last=False)
        to, data = call["to"], call["data"]
        code = self._code_of.get(to)
        if code is None or len(data) < 36:
            return
        key = (code, bytes(data[:4]))
        if key not in self._shapes:
            head = bytes(data[: 4 + 32 * MAPPING_WORDS])
            self._shapes[key] = mapping_shapes(head, [slot for a, slot in read if a == to])
            while len(self._shapes) > LEARNED_CALLS:
                self._shapes.popitem(last=False)

    def run(self, job: dict[str, Any]) -> dict[str, Any]:
        """The answer to a job; to a `groups` job (calls at several blocks, sent together
        to save round trips) `{"answers": [answer of each]}`."""
        if self.progress is not None:
            self.progress[0] = 0
        try:
            invalid = with_bytes(job)
            if invalid is not None:
                return {"error": invalid}
            if job["kind"] == "groups":
                return {"answers": [self._run(one) for one in job["jobs"]]}
            return self._run(job)
        finally:
            self._bound_memory()

    def _bound_memory(self) -> None:
        """Drop every warm EVM when the process's own memory (`own_bytes`) has grown past
        `warm_memory_bytes`: what warm EVMs cache is only bounded per EVM by calls
        (`warm_max_calls`), not by size.
        Looked at most every MEMORY_CHECK_S (reading /proc costs as much as a warm call)."""
        limit = self.limits.warm_memory_bytes
        if not limit or not self._warm:
            return
        now = time.monotonic()
        if now < self._memory_checked + MEMORY_CHECK_S:
            return
        self._memory_checked = now
        if own_bytes() > limit:
            self._warm.clear()
            _trim_heap()

    def _run(self, job: dict[str, Any]) -> dict[str, Any]:
        kind = job["kind"]
        self._job = job
        try:
            if kind in TRACE_JOBS:
                return self._traces(job)
            key = self._key = warm_key(job)
            warm = self._now = self.warm_for(job, key)
            if warm.env is not job["block"]:  # (most groups: the env it has)
                warm.run_with(job["block"])
            evm = warm.evm
            if kind == "calls":
                return {"results": self.calls(evm, job)}
            if kind == "estimate":
                return {"result": self.estimate(evm, job)}
            if kind == "trace":
                return {"results": [self.trace(evm, job, c) for c in job["calls"]]}
            return {"error": error(INVALID_PARAMS, f"unknown job kind {kind!r}")}
        except CallFailed as exc:
            return {"error": exc.error}
        except (Unusable, JournalText):
            self._warm.clear()
            return {"error": error(EVM_FAILED, "EVM failed; the execution state was reset")}
        except Exception as exc:  # fork-mode connection failures land here
            self._warm.clear()
            return {"error": classify(exc).error}

    # -- one call ---------------------------------------------------------------------

    def _call(self, evm: EVM, call: dict[str, Any]) -> dict[str, Any]:
        """Run one call as a transaction would run (or a creation when `to` is None);
        returns output, gas used and logs, or raises CallFailed. A creation's output is the
        deployed code, as geth's eth_call answers.

        With a price, the sender must afford gas × max fee + value and pays gas × effective
        price up front (`_charge`), which its balance shows while the call runs, as in
        anvil and geth; nothing is charged in the end (the call is undone, or a simulated
        transaction is charged by the node). The access list is applied (warm accounts and
        slots, its intrinsic gas)."""
        price = charged = 0  # (no max fee: price 0, whatever the base fee and tip)
        if call["max_fee"]:
            price = effective_price(call, self._job["block"]["basefee"])
            charged = self._charge(evm, call, price)
        if call["access_list"]:
            evm.set_tx_env(TxEnv(access_list=call["access_list"]))
        try:
            if call["to"] is None:
                address = evm.deploy(
                    call["from"], call["data"], call["value"], call["gas"], price or None
                )
                output = deployed_code(evm, address)
            else:
                output = evm.message_call(
                    call["from"],
                    call["to"],
                    call["data"],
                    call["value"] or None,  # (None: zero, without converting an int)
                    call["gas"],
                    price or None,
                )
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt | SystemExit | TraceTooLong):
                raise
            failed = classify(exc)
            if type(exc).__name__ == "PanicException":
                raise Unusable(str(exc)) from None
            raise failed from None
        finally:
            if charged:  # not journaled by pyrevm: given back by hand
                evm.set_balance(call["from"], evm.get_balance(call["from"]) + charged)
            if call["access_list"]:
                evm.set_tx_env(TxEnv())
            evm.reset_transient_storage()
        result = evm.result
        if len(output) > self.limits.max_return_bytes:
            msg = f"return data of {len(output)} bytes exceeds {self.limits.max_return_bytes}"
            raise CallFailed(error(EVM_FAILED, msg), result.gas_used)
        logs = result.logs
        return {
            "ok": True,
            "output": "0x" + (output.hex() if output.__class__ is bytes else bytes(output).hex()),
            "gas_used": result.gas_used,
            "logs": [_log(x) for x in logs] if logs else [],
        }

    @staticmethod
    def _charge(evm: EVM, call: dict[str, Any], price: int) -> int:
        """The fee checks and the up-front charge of a priced call; the amount taken from
        the sender (to give back after the call), 0 for a creation (pyrevm's `deploy` runs
        a whole transaction and charges it itself).

        The sender must hold gas × max fee + value (anvil's check). A message call is then
        run with gas × price taken from the sender's balance; revm checks the balance
        against gas × price + value once more, so when the balance covers the fee only
        once, revm cannot run it that way and `Exact` sends the call to py-evm."""
        balance = evm.get_balance(call["from"])
        if balance < call["gas"] * call["max_fee"] + call["value"]:
            raise CallFailed(error(BALANCE_EXHAUSTED, "insufficient funds for gas * price + value"))
        cost = call["gas"] * price
        if call["to"] is None or not cost:
            return 0
        if balance - cost < cost + call["value"]:
            raise Exact("the balance covers the fee once")
        evm.set_balance(call["from"], balance - cost)
        return cost

    def _isolated(
        self, evm: EVM, call: dict[str, Any], key: CallKey | None = None
    ) -> dict[str, Any]:
        """One call run on `evm` and undone (`key`: its `call_key`, when the caller has
        it); on py-evm when it may read BASEFEE."""
        if self._key is not None and self._now.checked:  # type: ignore[union-attr]
            return self._checked(evm, call, key)
        checkpoint = evm.snapshot()
        try:
            result = self._call(evm, call)
        except Exact:
            self._revert(evm, checkpoint)
            return self._on_pyevm(call, [])
        except CallFailed as exc:  # executed (gas used) or refused before running
            seeds = self._basefee_seeds(evm, call, key) if exc.gas_used else None
            self._revert(evm, checkpoint)
            if evm.journal_depth:  # a failed state read leaves a call frame open in revm
                self._discard(evm)
            if seeds is not None:
                return self._on_pyevm(call, seeds)
            raise
        seeds = self._basefee_seeds(evm, call, key)
        if call["to"] is not None and learn_key(call) not in self._learned:  # (new to it)
            self._learn(call, evm)
        self._revert(evm, checkpoint)
        if seeds is not None:
            return self._on_pyevm(call, seeds)
        return result

    def _checked(self, evm: EVM, call: dict[str, Any], key: CallKey | None) -> dict[str, Any]:
        """`_isolated` on an EVM in memory (checked.py): the call's journal must show nothing
        read that the EVM was not given; what it shows is given and the call runs again, at
        most CHECK_ROUNDS times. A call that ran and failed (what a reverted frame read is
        not journaled), or keeps reading more, runs on a fork-mode EVM (`_unchecked`)."""
        warm = self._now
        assert warm is not None
        for _ in range(CHECK_ROUNDS):
            checkpoint = evm.snapshot()
            try:
                result = self._call(evm, call)
            except Exact:
                self._revert(evm, checkpoint)
                return self._on_pyevm(call, [])
            except CallFailed as exc:
                self._revert(evm, checkpoint)
                if exc.gas_used:
                    return self._unchecked(call, key)
                raise  # refused before running, on the caller's account as given
            journal = evm.journal_str
            accounts, slots, read = [], [], []
            for address, start, end in journal_accounts(journal):
                if address not in warm.accounts:
                    accounts.append(address)
                if start != end:
                    for m in _SLOT.finditer(journal, start, end):
                        pair = (address, int(m.group(1)))
                        read.append(pair)
                        if pair not in warm.slots:
                            slots.append(pair)
            if not accounts and not slots:
                seeds = self._basefee_seeds(evm, call, key)
                if learn_key(call) not in self._learned:
                    self._learn(call, evm, read)
                self._revert(evm, checkpoint)
                return result if seeds is None else self._on_pyevm(call, seeds)
            self._revert(evm, checkpoint)
            self._give(evm, self._job, accounts, slots, warm)
        return self._unchecked(call, key)

    def _unchecked(self, call: dict[str, Any], key: CallKey | None) -> dict[str, Any]:
        """A call an EVM in memory cannot vouch for, run on a fork-mode EVM of its own."""
        job, saved = self._job, (self._key, self._now)
        fresh = Warm(new_evm(job), job["block"])
        self._preload(fresh.evm, job, [call])
        self._key, self._now = None, fresh
        try:
            return self._isolated(fresh.evm, call, key)
        finally:
            self._key, self._now = saved

    def _collected(self, evm: EVM, call: dict[str, Any]) -> dict[str, Any]:
        """A simulated transaction on its own fresh EVM, with what it wrote (`writes`), for
        the next one to read; on py-evm when it may read BASEFEE."""
        try:
            result = self._call(evm, call)
        except Exact:
            return self._on_pyevm(call, [], collect=True)
        except CallFailed as exc:
            seeds = self._basefee_seeds(evm, call) if exc.gas_used else None
            if seeds is not None:
                return self._on_pyevm(call, seeds, collect=True)
            raise
        seeds = self._basefee_seeds(evm, call)
        if seeds is not None:
            return self._on_pyevm(call, seeds, collect=True)
        self._undo_creation_fee(evm, call, result["gas_used"])
        return {**result, "writes": writes_of(evm)}

    def _undo_creation_fee(self, evm: EVM, call: dict[str, Any], gas_used: int) -> None:
        """pyrevm's `deploy` charged the sender gas used × price and paid it all to the
        coinbase (its base fee is 0); a simulated transaction is charged by the node
        instead (`EvmMethods._settle`), so that is undone here."""
        fee = gas_used * effective_price(call, self._job["block"]["basefee"])
        if call["to"] is not None or not fee:
            return
        coinbase = self._job["block"]["coinbase"]
        evm.set_balance(call["from"], evm.get_balance(call["from"]) + fee)
        evm.set_balance(coinbase, evm.get_balance(coinbase) - fee)

    def _basefee_seeds(
        self, evm: EVM, call: dict[str, Any], key: CallKey | None = None
    ) -> list[tuple[str, int]] | None:
        """When revm's answer may be wrong because the call may read BASEFEE (pyrevm makes
        it 0) and the block's base fee is not 0: the slots revm read (to start py-evm with);
        else None. Verdicts are kept per warm EVM, block env and call (`key`: its
        `call_key`, when the caller has it)."""
        job = self._job
        if not job["block"]["basefee"]:
            return None
        if self._key is None:  # a fresh EVM of one call holds only what that call loaded
            suspect = self._may_read_basefee(evm, call, fresh=len(job["calls"]) == 1)
        else:
            warm = self._now
            assert warm is not None
            # A callee given to this EVM whose code runs no other: its code decides.
            alone = warm.accounts.get(call["to"]) if call["to"] is not None else None
            if alone is not None:
                suspect = alone == SUSPECT
            else:
                if key is None:
                    key = call_key(call)
                suspect = warm.verdicts.get(key)
                if suspect is None:
                    suspect = warm.verdicts[key] = self._may_read_basefee(evm, call)
        return storage_read(evm.journal_str) if suspect else None

    def _may_read_basefee(self, evm: EVM, call: dict[str, Any], fresh: bool = False) -> bool:
        """basefee.py's verdict on a call revm just ran on `evm`; an unsure one (a suspect
        code in the EVM's cache, not in the call's journal) is settled by running the call
        on a fresh EVM, whose cache holds only what the call loads (`fresh`: this is it)."""
        initcode = bytes(call["data"]) if call["to"] is None else None
        verdict = self._basefee.verdict(evm.db_accounts, evm.journal_state, initcode)
        if verdict != UNSURE:
            return verdict == SUSPECT
        if fresh:
            return True
        alone = new_evm(self._job)
        self._preload(alone, self._job, [call])
        alone.set_block_env(_block_env(self._job["block"]))
        with contextlib.suppress(CallFailed, Unusable):  # what it loaded is what counts
            self._call(alone, call)
        return self._may_read_basefee(alone, call, fresh=True)

    def _on_pyevm(
        self, call: dict[str, Any], seeds: list[tuple[str, int]], collect: bool = False
    ) -> dict[str, Any]:
        """The call run on py-evm with the block's base fee (nodes/state/evm/pyevm.py);
        `collect`: with what it wrote (a simulated transaction)."""
        return self._pyevm_answer(self._run_pyevm(call, seeds), collect)

    def _run_pyevm(
        self, call: dict[str, Any], seeds: list[tuple[str, int]], trace_steps: int | None = None
    ) -> dict[str, Any]:
        """pyevm.run_on_pyevm's raw result, reading the job's block (from the store or the
        feed); with `trace_steps`, with its struct logs (at most that many)."""
        job = self._job
        source, hash_of = self._sources(job)
        from nodes.state.evm import pyevm  # (imported before the worker said READY)

        try:
            return pyevm.run_on_pyevm(job, call, source, seeds, hash_of, trace_steps)
        except pyevm.TraceLimit:
            limit = f"{self.limits.max_trace_steps} steps"
            raise CallFailed(error(EVM_FAILED, f"trace exceeds {limit}")) from None

    def _sources(self, job: dict[str, Any]) -> tuple[Any, Any]:
        """(state source, block hash source) of py-evm at the job's height: the store read
        directly, else the feed."""
        height = job["height"]
        reads = self._store_reads(job.get("store"))
        if reads is not None:
            source = lambda a, s: reads.preload(a, s, height)  # noqa: E731
            return source, reads.block_hash
        url = job["fork_url"]
        source = lambda a, s: self.feed.preload(url, a, s, height)  # noqa: E731
        return source, lambda h: self.feed.block_hash(url, h)

    def _traces(self, job: dict[str, Any]) -> dict[str, Any]:
        """A trace job (tracing.py) on py-evm: `{"results": [...]}` or `{"error"}`."""
        from nodes.state.evm import tracing  # (imported before the worker said READY)

        source, hash_of = self._sources(job)
        try:
            limits = self.limits
            results = tracing.run_job(
                job, source, hash_of, limits.max_trace_steps, limits.max_trace_bytes
            )
            return {"results": results}
        except tracing.TraceFailed as exc:
            code = TRACE_ERRORS.get(exc.kind, EVM_FAILED)
            return {"error": error(code, str(exc))}

    def _pyevm_answer(self, r: dict[str, Any], collect: bool = False) -> dict[str, Any]:
        """A py-evm result as `_call` answers (or raises CallFailed)."""
        gas = r["gas_used"]
        if r["ok"]:
            output = r["output"]
            if len(output) > self.limits.max_return_bytes:
                msg = f"return data of {len(output)} bytes exceeds {self.limits.max_return_bytes}"
                raise CallFailed(error(EVM_FAILED, msg), gas)
            output = "0x" + bytes(output).hex()
            answer = {"ok": True, "output": output, "gas_used": gas, "logs": r["logs"]}
            return {**answer, "writes": r["writes"]} if collect else answer
        kind = r["kind"]
        if kind == "revert":
            raise CallFailed(revert_error(bytes(r["output"])), gas)
        if kind == "out_of_gas":
            raise CallFailed(error(GAS_EXHAUSTED, "out of gas (Basic)"), gas)
        if kind == "intrinsic":
            raise CallFailed(error(GAS_EXHAUSTED, "intrinsic gas too high"))
        if kind == "too_many_reads":
            raise CallFailed(error(EVM_FAILED, "EVM failed: the call kept reading new state"))
        raise CallFailed(error(EVM_FAILED, f"execution halted: {r.get('reason')}"), gas)

    @staticmethod
    def _revert(evm: EVM, checkpoint: Any) -> None:
        """Undo a call; an EVM whose journal broke (a panic inside pyrevm) is unusable."""
        try:
            evm.revert(checkpoint)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            raise Unusable(str(exc)) from None

    def calls(self, evm: EVM, job: dict[str, Any]) -> list[dict[str, Any]]:
        """Independent calls on the block's state; `fast_fail` stops at the first failure."""
        out: list[dict[str, Any]] = []
        if job.get("collect_writes"):
            return self._collect(evm, job, out)
        size = 0
        limits = self.limits
        # Each call runs on the block's state and is undone, so the same call twice in one
        # job has the same answer: it runs once (many clients polling the same view at the
        # head come as one coalesced job).
        done: dict[CallKey, dict[str, Any]] | None = {} if len(job["calls"]) > 1 else None
        # Across jobs too, on a warm EVM (its block's state) with the same block env: the
        # answers of successful calls with short return data, at most `warm_answers`.
        kept: dict[CallKey, dict[str, Any]] | None = None
        room = limits.warm_answers
        if room and self._key is not None and job["kind"] == "calls":
            kept = self._now.answers  # type: ignore[union-attr]
        progress = self.progress
        for call in job["calls"]:
            key = None
            try:
                if progress is not None:
                    progress[1] = time.monotonic()
                    progress[0] += 1
                if "invalid" in call:  # (`with_bytes`)
                    raise CallFailed(call["invalid"])
                if size > limits.max_response_bytes:
                    limit = limits.max_response_bytes
                    raise CallFailed(error(EVM_FAILED, f"response exceeds {limit} bytes"))
                key = call_key(call)
                answer = done.get(key) if done is not None else None
                if answer is not None:
                    out.append(answer)
                    if not answer["ok"]:
                        if job.get("fast_fail"):
                            break
                        continue
                elif kept is not None and key in kept:
                    out.append(answer := kept[key])  # (only successful answers are kept)
                else:
                    out.append(answer := self._isolated(evm, call, key))
                    if done is not None:
                        done[key] = answer
                    if (
                        kept is not None
                        and len(kept) < room
                        and len(answer["output"]) <= 2 + 2 * ANSWER_BYTES
                    ):
                        kept[key] = answer
                size += (len(answer["output"]) - 2) // 2
            except CallFailed as exc:
                out.append(failed := {"ok": False, "error": exc.error, "gas_used": exc.gas_used})
                if key is not None and done is not None:
                    done[key] = failed  # (within the job only: a failed read may not last)
                if job.get("fast_fail"):
                    break
        return out

    def _collect(
        self, evm: EVM, job: dict[str, Any], out: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """Simulated transactions (`collect_writes`) on a fresh EVM: each sees the writes
        of the ones before it, so none is undone and none is answered as another."""
        size = 0
        progress = self.progress
        for call in job["calls"]:
            try:
                if progress is not None:
                    progress[1] = time.monotonic()
                    progress[0] += 1
                if "invalid" in call:
                    raise CallFailed(call["invalid"])
                if size > self.limits.max_response_bytes:
                    limit = self.limits.max_response_bytes
                    raise CallFailed(error(EVM_FAILED, f"response exceeds {limit} bytes"))
                out.append(self._collected(evm, call))
                size += (len(out[-1]["output"]) - 2) // 2
            except CallFailed as exc:
                out.append({"ok": False, "error": exc.error, "gas_used": exc.gas_used})
                if job.get("fast_fail"):
                    break
        return out

    # -- gas estimation ---------------------------------------------------------------

    def _fits(self, evm: EVM, call: dict[str, Any], gas: int) -> tuple[bool, CallFailed | None]:
        try:
            self._isolated(evm, {**call, "gas": gas})
            return True, None
        except CallFailed as exc:
            return False, exc

    def estimate(self, evm: EVM, job: dict[str, Any]) -> int:
        """geth's search: run at the cap, then bisect between gas used and the cap.

        A plain transfer (no data, no access list, to an account without code) is 21000
        without running, as in geth and anvil. A revert at the cap is the answer (-39000);
        running out of gas at the cap is -39001. The search is exact (to 1 gas), as anvil's
        is. With a price (`gasPrice` or `maxFeePerGas`), the cap is also what the sender
        can pay for after `value`, as in geth and anvil.
        """
        call = job["calls"][0]
        hi = call["gas"]
        balance, code = self._peek(evm, call)
        if not call["data"] and not call["access_list"] and call["to"] is not None and not code:
            return TRANSFER_GAS
        if call["max_fee"]:
            available = balance - call["value"]
            if available < 0:
                msg = "insufficient funds for gas * price + value"
                raise CallFailed(error(BALANCE_EXHAUSTED, msg))
            hi = min(hi, available // call["max_fee"])
            call = {**call, "gas": hi}
        first = self._isolated_or_fail(evm, call)
        used = first["gas_used"]
        lo = max(used - 1, 20_999)
        optimistic = min(hi, (used + 2300) * 64 // 63)
        ok, _ = self._fits(evm, call, optimistic)
        if ok:
            hi = optimistic
        else:
            lo = max(lo, optimistic)
        while hi - lo > 1:
            mid = (hi + lo) // 2
            ok, failure = self._fits(evm, call, mid)
            if ok:
                hi = mid
            elif failure is not None and failure.error["code"] not in (
                GAS_EXHAUSTED,
                EVM_REVERT,
                EVM_FAILED,
            ):
                raise failure
            else:
                lo = mid
        return hi

    def _peek(self, evm: EVM, call: dict[str, Any]) -> tuple[int, bytes]:
        """The sender's balance and the callee's code, read inside a snapshot so that a
        warm EVM's journal is left as it was."""
        checkpoint = evm.snapshot()
        try:
            balance = evm.get_balance(call["from"])
            code = b"" if call["to"] is None else bytes(evm.get_code(call["to"]) or b"")
        finally:
            self._revert(evm, checkpoint)
        return balance, code

    def _isolated_or_fail(self, evm: EVM, call: dict[str, Any]) -> dict[str, Any]:
        try:
            return self._isolated(evm, call)
        except CallFailed as exc:
            if exc.error["code"] == GAS_EXHAUSTED:
                msg = f"gas required exceeds allowance ({call['gas']})"
                raise CallFailed(error(GAS_EXHAUSTED, msg), exc.gas_used) from None
            raise

    # -- tracing ----------------------------------------------------------------------

    def trace(self, evm: EVM, job: dict[str, Any], call: dict[str, Any]) -> dict[str, Any]:
        """geth's struct-log shape built from pyrevm's EIP-3155 lines, or from py-evm's
        steps when the call may read BASEFEE (pyrevm runs it with a base fee of 0)."""
        sink = TraceSink(self.limits.max_trace_steps, self.limits.max_trace_bytes)
        checkpoint = evm.snapshot()
        evm.tracing = True
        failed: CallFailed | None = None
        result: dict[str, Any] | None = None
        exact = False
        try:
            with contextlib.redirect_stdout(sink):
                result = self._call(evm, call)
        except Exact:
            exact = True
        except CallFailed as exc:
            failed = exc
        except BaseException as exc:  # pyo3 PanicException when the sink refused a line
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            if not sink.overflow:
                raise
        finally:
            evm.tracing = False
        if sink.overflow:
            # The EVM was aborted mid-call; do not reuse it (it is never a warm one).
            limit = f"{self.limits.max_trace_steps} steps or {self.limits.max_trace_bytes} bytes"
            raise CallFailed(error(EVM_FAILED, f"trace exceeds {limit}"))
        ran = not exact and (failed is None or failed.gas_used > 0)
        seeds = self._basefee_seeds(evm, call) if ran else None
        if exact:
            seeds = []
        evm.revert(checkpoint)
        if seeds is not None:
            r = self._run_pyevm(call, seeds, trace_steps=self.limits.max_trace_steps)
            logs = r.get("struct_logs", [])
            result, failed = None, None
            try:
                result = self._pyevm_answer(r)
            except CallFailed as exc:
                failed = exc
        else:
            logs = sink.struct_logs()
        if failed is not None:
            data = failed.error.get("data")
            ret = data if isinstance(data, str) else "0x"
            return {
                "gas": failed.gas_used,
                "failed": True,
                "returnValue": ret,
                "error": failed.error,
                "structLogs": logs,
            }
        assert result is not None
        return {
            "gas": result["gas_used"],
            "failed": False,
            "returnValue": result["output"],
            "structLogs": logs,
        }


class TraceSink(io.TextIOBase):
    """Collects EIP-3155 lines written to sys.stdout by pyrevm, within limits."""

    def __init__(self, max_steps: int, max_bytes: int) -> None:
        self.max_steps = max_steps
        self.max_bytes = max_bytes
        self.lines: list[str] = []
        self.size = 0
        self.overflow = False
        self._partial = ""

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.size += len(s)
        text = self._partial + s
        parts = text.split("\n")
        self._partial = parts.pop()
        self.lines.extend(p for p in parts if p)
        if self.size > self.max_bytes or len(self.lines) > self.max_steps + 1:
            self.overflow = True
            raise TraceTooLong("trace limit reached")
        return len(s)

    def struct_logs(self) -> list[dict[str, Any]]:
        import orjson

        out: list[dict[str, Any]] = []
        shift: int | None = None
        for line in [*self.lines, self._partial] if self._partial else self.lines:
            step = orjson.loads(line)
            if "pc" not in step:
                continue  # the summary line
            if shift is None:
                # revm 8 counts the top frame as depth 2 under pyrevm; geth's starts at 1
                shift = step["depth"] - 1
            out.append(
                {
                    "pc": step["pc"],
                    "op": step["opName"],
                    "gas": int(step["gas"], 16),
                    "gasCost": int(step["gasCost"], 16),
                    "depth": step["depth"] - shift,
                    "stack": step.get("stack", []),
                    "refund": int(step.get("refund", "0x0"), 16),
                }
            )
        return out


def worker_main(conn: Any, limits: Limits, warm_blocks: int, progress: Any = None) -> None:
    """Entry point of a worker process: answer jobs from the pipe until it closes."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers end
    # py-evm (traces, eth_createAccessList, calls whose base fee matters) takes ~0.6 s of
    # CPU to import: done before READY (the forkserver has it loaded already: procs.py),
    # so it never delays nor counts against a job.
    from nodes.state.evm import pyevm, tracing  # noqa: F401

    runner = Runner(limits, warm_blocks, progress)
    envs = WorkerEnvs()
    conn.send(READY)
    while True:
        try:
            wire = conn.recv()
        except (EOFError, OSError):
            return
        try:
            job = unpack(wire, envs)
        except Exception as exc:
            # A job this worker cannot read (an env it was never sent): answered so, and
            # the worker ends, since raw messages of the job may follow in the pipe; the
            # node starts a fresh one, which it tells every env again.
            answer = {"error": error(EVM_FAILED, f"worker error: {str(exc)[:200]}")}
            with contextlib.suppress(BrokenPipeError, OSError):
                conn.send_bytes(pickle.dumps(answer, pickle.HIGHEST_PROTOCOL))
            return
        try:
            attached(job, conn)
        except (EOFError, OSError):
            return
        try:
            answer = runner.run(job)
        except Exception as exc:
            answer = {"error": error(EVM_FAILED, f"worker error: {str(exc)[:200]}")}
        try:
            conn.send_bytes(pickle.dumps(pack_answer(answer), pickle.HIGHEST_PROTOCOL))
        except (BrokenPipeError, OSError):
            return

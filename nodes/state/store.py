"""The state node's crash-safe store: LMDB, one write transaction per block.

Layout (named LMDB databases):

- `accounts` and `versions`: `address(20) | field(1) [| slot(32)] | height(8, big-endian)` →
  value at that height; `accounts` holds fields 1 balance, 2 nonce, 3 code, `versions` field
  4, the storage slots. Integers are stored as minimal big-endian bytes (zero = empty), code
  as raw bytes. A read at height h seeks to the first key after `prefix | h` and steps back
  one: O(log n) whatever the history length. The account fields are a tree of their own:
  a mainnet-shaped state has ten storage slots per account field, and in one tree of both a
  balance read walked five levels, the lower two missing the CPU's caches; the accounts'
  tree alone has four, whose branch pages (~0.5 MB at 1 M accounts) stay cached: a random
  balance seek at 11 M values runs ~1.5x as fast.
- `headers`: height → the block's Header (as sent by the write node) and ValidationHash.
- `hashes`: block hash(32) → height, for every canonical block ever applied (also below a
  `state` node's window, so `blockIsValid` stays answerable).
- `undo`: height → the version prefixes the block wrote; rolling a block back deletes exactly
  those versions, and pruning knows which older versions a window move makes obsolete.
- `meta`: head, earliest, chain id, kind, `format` (FORMAT; a store without it kept the
  account fields in `versions` and is moved to this layout when opened for writing), and
  `bodies_from`: every block from that height to the head has its body below (a store from
  before bodies were kept starts at head + 1).
- `blocks`: height → the block object as the execution client gave it, its transactions as
  hashes; `txs` and `receipts`: height → the block's transaction objects and receipts, packed
  (nodes/state/blockbody.py); `txhashes`: transaction hash(32) → height(8) | index(4).

Commits are durable (LMDB `sync`): kill -9 leaves either the whole block or none of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import struct
import threading
from _thread import get_ident
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import lmdb
import orjson

from chainstate.jsonrpc import BLOCK_NOT_FOUND, DATABASE_FAILED, JsonRpcError
from nodes.state.blockbody import BlockBody, packed_array, stored_count, unstored
from nodes.state.reader import HeaderInfo
from nodes.state.vendor import AccountDiff, VendorBlock

log = logging.getLogger(__name__)

_BE = struct.Struct(">Q")
F_BALANCE = b"\x01"
F_NONCE = b"\x02"
F_CODE = b"\x03"
F_STORAGE = b"\x04"
ACCOUNT_PREFIX = 21  # the length of an account field's prefix (a slot's is 53): `accounts`
FORMAT = 2  # the store's layout (`meta` `format`); 1 (no `format`): one tree of all fields

META_HEAD = b"head"
META_EARLIEST = b"earliest"
META_CHAIN_ID = b"chain_id"
META_KIND = b"kind"
META_BODIES_FROM = b"bodies_from"
META_FORMAT = b"format"
_BODY_DBS = (b"blocks", b"txs", b"receipts", b"txhashes")
_LOCATION = struct.Struct(">QI")  # height, index of a transaction
MAX_DBS = 16  # the store's ten databases plus those of its extensions


class StoreError(Exception):
    """A block could not be applied or rolled back; the store is unchanged."""


class OutOfOrder(StoreError):
    """The block is not the next height after the stored head."""


class ParentMismatch(StoreError):
    """The block's parentHash is not the stored head's hash: the source is on another fork."""


class ReorgTooDeep(StoreError):
    """A rollback would go below this node's earliest block."""


class PreStateMismatch(StoreError):
    """The block's `pre` values differ from the stored state at its parent."""


class StoreFailure(StoreError):
    """LMDB itself failed (disk full, map full, I/O error)."""


class DuplicateTransaction(StoreError):
    """The block lists a transaction the node already holds in another block."""


class StoreExtension(Protocol):
    """More named databases kept in step with the blocks (e.g. the log index): each hook
    runs inside the block's own write transaction, so a crash keeps them consistent."""

    def attached(self, env: lmdb.Environment, txn: lmdb.Transaction, bounds: Any) -> None: ...

    def applied(self, txn: lmdb.Transaction, block: VendorBlock) -> None: ...

    def rolled_back(self, txn: lmdb.Transaction, height: int) -> None: ...

    def pruned(self, txn: lmdb.Transaction, earliest: int) -> None: ...


def _addr(address: str) -> bytes:
    return bytes.fromhex(address[2:])


# An undo record's prefixes: an address, then a field byte, then a slot after F_STORAGE.
_PREFIX = re.compile(rb"(?s).{20}(?:\x04.{32}|.)")


def _split_prefixes(blob: bytes) -> list[bytes]:
    """The prefixes of an undo record (account prefixes are 21 bytes, storage ones 53), split
    by one regex call: a block's record holds thousands, a Python step each cost ~1 ms."""
    return _PREFIX.findall(blob)


def out_of_range(height: int, bounds: tuple[int, int] | None) -> JsonRpcError:
    if bounds is None:
        return JsonRpcError(BLOCK_NOT_FOUND, "block not found: this node holds no blocks yet")
    lo, hi = bounds
    return JsonRpcError(
        BLOCK_NOT_FOUND, f"block {height} is outside this node's range [{lo}, {hi}]"
    )


def header_info(stored: dict[str, Any]) -> HeaderInfo:
    h = stored["header"]

    def q(name: str) -> int:
        value = h.get(name)
        return int(value, 16) if value else 0

    return HeaderInfo(
        number=q("number"),
        hash=h["hash"],
        parent_hash=h["parentHash"],
        timestamp=q("timestamp"),
        miner=h["miner"],
        gas_limit=q("gasLimit"),
        gas_used=q("gasUsed"),
        base_fee_per_gas=q("baseFeePerGas"),
        mix_hash=h.get("mixHash") or "0x" + "00" * 32,
        difficulty=q("difficulty"),
        validation_hash=stored["validationHash"],
        excess_blob_gas=q("excessBlobGas") if "excessBlobGas" in h else None,
    )


class StateView:
    """Reads at one height inside one read transaction (for batches of reads)."""

    def __init__(self, store: StateStore, txn: lmdb.Transaction, height: int) -> None:
        self._store = store
        self._txn = txn
        self.height = height

    def balance(self, address: str) -> int:
        return self._store._int(self._txn, _addr(address) + F_BALANCE, self.height)

    def nonce(self, address: str) -> int:
        return self._store._int(self._txn, _addr(address) + F_NONCE, self.height)

    def code(self, address: str) -> bytes:
        return self._store._value(self._txn, _addr(address) + F_CODE, self.height) or b""

    def storage(self, address: str, slot: int) -> int:
        prefix = _addr(address) + F_STORAGE + slot.to_bytes(32, "big")
        return self._store._int(self._txn, prefix, self.height)


def seek(cur: lmdb.Cursor, prefix: bytes, height: int) -> bytes | None:
    """The newest version of `prefix` at or below `height` (a cursor on `versions`): seek
    to the first key after `prefix | height` and step back once; None if never written."""
    found = cur.prev() if cur.set_range(prefix + _BE.pack(height + 1)) else cur.last()
    if not found:
        return None
    key = cur.key()
    if len(key) == len(prefix) + 8 and key.startswith(prefix):
        return cur.value()
    return None


def seek_span(cur: lmdb.Cursor, prefix: bytes, height: int) -> tuple[bytes | None, int, int | None]:
    """`seek`, with the heights its answer holds for: (value, the height of its version (0
    when never written), the height of the next version, None when none is written yet).
    The next version is where the seek lands before it steps back, so this costs no more."""
    size = len(prefix) + 8
    if cur.set_range(prefix + _BE.pack(height + 1)):
        key = cur.key()
        ours = len(key) == size and key.startswith(prefix)
        until = _BE.unpack_from(key, len(prefix))[0] if ours else None
        found = cur.prev()
    else:
        until, found = None, cur.last()
    if found:
        key = cur.key()
        if len(key) == size and key.startswith(prefix):
            return cur.value(), _BE.unpack_from(key, len(prefix))[0], until
    return None, 0, until


def oldest(cur: lmdb.Cursor, prefix: bytes, limit: bytes) -> bytes | None:
    """The oldest version of `prefix` when its key is at most `limit` (`prefix` | a height
    packed), else None: one seek, no step back. At the store's earliest height it is the
    newest version at or below it, since each field and slot has at most one there: a
    `state` node's window move deletes the older ones (`_prune`), and an archive's first
    height has one version of each."""
    if cur.set_range(prefix):
        key = cur.key()
        # (A key from `prefix` up to `limit` starts with `prefix`: a version of it.)
        if key <= limit:
            return cur.value()
    return None


class Snapshot:
    """The store as of one read transaction: its bounds and a cursor for version seeks in
    each of `accounts` and `versions`."""

    __slots__ = ("accounts", "bounds", "cursor", "txn")

    def __init__(
        self,
        txn: lmdb.Transaction,
        bounds: tuple[int, int] | None,
        cursors: tuple[lmdb.Cursor, lmdb.Cursor],
    ) -> None:
        self.txn = txn
        self.bounds = bounds
        self.accounts, self.cursor = cursors

    def close(self) -> None:
        self.txn.abort()

    def value(self, prefix: bytes, height: int) -> bytes | None:
        """The newest version of `prefix` at or below `height`, or None if never written."""
        cur = self.accounts if len(prefix) == ACCOUNT_PREFIX else self.cursor
        return seek(cur, prefix, height)


class KeptSnapshot(Snapshot):
    """The snapshot the store keeps for the reads of one event loop's thread until the next
    write begins (`StateStore.snapshot`): the store ends it, so `close` leaves it open."""

    __slots__ = ("generation", "loop", "thread")

    def __init__(
        self,
        txn: lmdb.Transaction,
        bounds: tuple[int, int] | None,
        cursors: tuple[lmdb.Cursor, lmdb.Cursor],
        generation: int,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        super().__init__(txn, bounds, cursors)
        self.generation = generation
        self.loop = loop
        self.thread = get_ident()

    def close(self) -> None:
        pass

    def end(self) -> None:
        with contextlib.suppress(lmdb.Error):
            self.txn.abort()


class BodyReads:
    """Block bodies inside one read transaction (a commit cannot tear what it reads).

    A block's body is held when the block is in range and at or above `bodies_from`."""

    __slots__ = ("_store", "_txn", "bodies_from", "bounds")

    def __init__(self, store: StateStore, txn: lmdb.Transaction) -> None:
        self._store = store
        self._txn = txn
        self.bounds = store._bounds(txn)
        raw = txn.get(META_BODIES_FROM, db=store._meta)
        head = -1 if self.bounds is None else self.bounds[1]
        self.bodies_from = head + 1 if raw is None else _BE.unpack(raw)[0]

    def held(self, height: int) -> bool:
        bounds = self.bounds
        return bounds is not None and max(bounds[0], self.bodies_from) <= height <= bounds[1]

    def whole_chain(self) -> bool:
        """True when the node holds every body from block 0 to its head (so a transaction
        it does not know is not on its chain)."""
        return self.bounds is not None and self.bodies_from == 0

    def _get(self, height: int, db: Any) -> bytes | None:
        return self._txn.get(_BE.pack(height), db=db) if self.held(height) else None

    def _list(self, height: int, db: Any) -> bytes | None:
        record = self._get(height, db)
        return None if record is None else unstored(record)

    def shell(self, height: int) -> bytes | None:
        """The block object with its transactions as hashes, as JSON; None when not held."""
        return self._get(height, self._store._blocks)

    def transactions(self, height: int) -> bytes | None:
        """The packed transaction objects (nodes/state/blockbody.py); None when not held."""
        return self._list(height, self._store._txs)

    def transaction_count(self, height: int) -> int | None:
        """How many transactions the block has; None when not held."""
        record = self._get(height, self._store._txs)
        return None if record is None else stored_count(record)

    def receipts(self, height: int) -> bytes | None:
        """The packed receipts; None when not held."""
        return self._list(height, self._store._receipts)

    def location(self, tx_hash: str) -> tuple[int, int] | None:
        """(height, index) of a transaction of a held block, by its lowercase 0x hash."""
        try:
            key = bytes.fromhex(tx_hash[2:])
        except ValueError:
            return None
        raw = self._txn.get(key, db=self._store._txhashes) if len(key) == 32 else None
        if raw is None:
            return None
        height, index = _LOCATION.unpack(raw)
        return (height, index) if self.held(height) else None

    def body(self, height: int) -> dict[str, Any] | None:
        """`{"block": <block object with full transactions>, "receipts": [...]}`."""
        shell, txs, receipts = self.shell(height), self.transactions(height), self.receipts(height)
        if shell is None or txs is None or receipts is None:
            return None
        block = orjson.loads(shell)
        block["transactions"] = orjson.loads(packed_array(txs))
        return {"block": block, "receipts": orjson.loads(packed_array(receipts))}


class StateStore:
    """Implements nodes.state.reader.StateReader over LMDB.

    Reads run in any thread (each opens a short read transaction, but for the event loop's
    reads, which share one until the next write: `snapshot`); writes (`apply`, `rollback`)
    are serialised by a lock and are each one LMDB write transaction.
    """

    def __init__(
        self, path: Path, *, kind: str = "state", window: int = 128, map_size_mb: int = 65536
    ) -> None:
        self.path = Path(path)
        self.kind = kind
        self.window = window
        self.map_size = map_size_mb * 1024 * 1024
        self._env: lmdb.Environment | None = None
        self._write_lock = threading.Lock()
        self.extensions: list[StoreExtension] = []
        # Rollbacks committed so far: what was read at a height before a rollback may be
        # gone (a cache of headers keys on it; read it *before* reading the store).
        self.rollbacks = 0
        # (earliest, head) as of the last commit of this process, for `range()` (None: read
        # them). Only a writing store keeps it; every read of data re-checks its height
        # inside its own transaction, so a stale value only delays a -39006.
        self._known_range: tuple[int, int] | None = None
        self._writer = False
        # Write transactions begun (odd while one commits, even once it has): a snapshot
        # begun and checked at the same even value sees exactly the bounds of that value, so
        # they are read from the store once per commit, not twice per request (`snapshot`).
        self._generation = 0
        self._snapshot_bounds: tuple[int, tuple[int, int] | None] | None = None
        # The read snapshot of the current generation that the event loop's reads share
        # (`snapshot`); ended by the loop once a write commits, so it never pins old pages
        # for longer than a commit.
        self._kept: KeptSnapshot | None = None

    # lifecycle -------------------------------------------------------------------------

    def open(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        env = lmdb.open(
            str(self.path), map_size=self.map_size, max_dbs=MAX_DBS, sync=True, metasync=True,
            readahead=False,
        )  # fmt: skip
        env.reader_check()  # free reader slots left by a killed process
        self._meta = env.open_db(b"meta")
        self._acct = env.open_db(b"accounts")
        self._ver = env.open_db(b"versions")
        self._hdr = env.open_db(b"headers")
        self._hashes = env.open_db(b"hashes")
        self._undo = env.open_db(b"undo")
        self._blocks, self._txs, self._receipts, self._txhashes = (
            env.open_db(name) for name in _BODY_DBS
        )
        with env.begin(write=True) as txn:
            stored = txn.get(META_KIND, db=self._meta)
            head = txn.get(META_HEAD, db=self._meta)
            if stored == b"state" and self.kind == "archive" and head:
                env.close()
                raise StoreError(
                    f"{self.path}: a pruned `state` store cannot be reopened as `archive`"
                )
            txn.put(META_KIND, self.kind.encode(), db=self._meta)
            try:
                self._check_format(txn, head is not None)
            except StoreError:
                env.close()
                raise
            if txn.get(META_BODIES_FROM, db=self._meta) is None:
                # a store from before bodies were kept has none up to its head
                start = 0 if head is None else _BE.unpack(head)[0] + 1
                txn.put(META_BODIES_FROM, _BE.pack(start), db=self._meta)
        self._env = env
        self._writer = True
        self._snapshot_bounds = None  # another process may have written it while closed
        self._kept = None
        self._known_range = self.bounds()

    def open_readonly(self) -> None:
        """Open an existing store for reading only, beside the process that writes it (LMDB
        serves many reader processes): the EVM feed process reads through this. Never
        writes, so it neither creates the store nor frees stale reader slots."""
        env = lmdb.open(
            str(self.path), map_size=self.map_size, max_dbs=MAX_DBS, readonly=True, readahead=False
        )
        try:
            self._meta = env.open_db(b"meta", create=False)
            with env.begin() as txn:
                self._format(txn)
            self._acct = env.open_db(b"accounts", create=False)
            self._ver = env.open_db(b"versions", create=False)
            self._hdr = env.open_db(b"headers", create=False)
            self._hashes = env.open_db(b"hashes", create=False)
            self._undo = env.open_db(b"undo", create=False)
            self._blocks, self._txs, self._receipts, self._txhashes = (
                env.open_db(name, create=False) for name in _BODY_DBS
            )
        except (lmdb.Error, StoreError):
            env.close()
            raise
        self._env = env

    def _format(self, txn: lmdb.Transaction, *, movable: bool = False) -> int:
        """The stored layout's FORMAT (1 when it has none); StoreError when this program
        cannot read it (an older one it can move to its own when `movable`)."""
        raw = txn.get(META_FORMAT, db=self._meta)
        found = 1 if raw is None else int(raw)
        if found > FORMAT:
            raise StoreError(
                f"{self.path}: the store's format is {found}, newer than this program's ({FORMAT})"
            )
        if found < FORMAT and not movable:
            raise StoreError(
                f"{self.path}: the store's format is {found}, this program reads {FORMAT}: "
                "open it once with its node, which moves it to this format"
            )
        return found

    def _check_format(self, txn: lmdb.Transaction, has_blocks: bool) -> None:
        """Move a format-1 store (every field in `versions`) to this format in the opening
        write transaction, so a crash leaves it whole in one format or the other."""
        if self._format(txn, movable=True) == 1 and has_blocks:
            moved = _move_account_versions(txn, self._ver, self._acct)
            log.warning("%s: moved %d account versions to their own database", self.path, moved)
        txn.put(META_FORMAT, str(FORMAT).encode(), db=self._meta)

    def attach(self, extension: StoreExtension) -> None:
        """Open an extension's databases (one write transaction, given the store's bounds)
        and call its hooks from now on."""

        def attach(txn: lmdb.Transaction) -> None:
            assert self._env is not None
            extension.attached(self._env, txn, self._bounds(txn))

        self._write(attach)
        self.extensions.append(extension)

    def free_stale_readers(self) -> int:
        """Free the LMDB reader slots of dead processes (a killed read-only reader leaves
        its slot behind, which keeps old pages from being reused); how many were freed."""
        env = self._env
        return 0 if env is None else env.reader_check()

    def close(self) -> None:
        with self._write_lock:
            self._kept = None  # (closing the environment ends its transaction)
            if self._env is not None:
                self._env.close()
                self._env = None
            self._known_range = None

    # reading ---------------------------------------------------------------------------

    @contextmanager
    def _reading(self) -> Iterator[lmdb.Transaction]:
        env = self._env
        if env is None:
            raise JsonRpcError(DATABASE_FAILED, "state store is closed")
        try:
            with env.begin() as txn:
                yield txn
        except lmdb.Error as exc:
            log.error("state store read failed: %s", exc)
            raise JsonRpcError(DATABASE_FAILED, "state store read failed") from None

    def _bounds(self, txn: lmdb.Transaction) -> tuple[int, int] | None:
        head = txn.get(META_HEAD, db=self._meta)
        if head is None:
            return None
        return _BE.unpack(txn.get(META_EARLIEST, db=self._meta))[0], _BE.unpack(head)[0]

    def _check(self, txn: lmdb.Transaction, height: int) -> None:
        bounds = self._bounds(txn)
        if bounds is None or not bounds[0] <= height <= bounds[1]:
            raise out_of_range(height, bounds)

    def _value(self, txn: lmdb.Transaction, prefix: bytes, height: int) -> bytes | None:
        """The newest version of `prefix` at or below `height`, or None if never written."""
        return seek(txn.cursor(db=self._db_of(prefix)), prefix, height)

    def _db_of(self, prefix: bytes) -> Any:
        """The database holding the versions of `prefix`: `accounts` or `versions`."""
        return self._acct if len(prefix) == ACCOUNT_PREFIX else self._ver

    def _int(self, txn: lmdb.Transaction, prefix: bytes, height: int) -> int:
        return int.from_bytes(self._value(txn, prefix, height) or b"", "big")

    def bounds(self) -> tuple[int, int] | None:
        """(earliest, head), or None before the first block."""
        with self._reading() as txn:
            return self._bounds(txn)

    def range(self) -> tuple[int, int]:
        known = self._known_range
        if known is not None:
            return known
        with self._reading() as txn:
            bounds = self._bounds(txn)
        if bounds is None:
            raise out_of_range(0, None)
        return bounds

    def header_fields(self, height: int) -> dict[str, Any]:
        """The stored Header object and ValidationHash of a block in range:
        `{"header": {...}, "validationHash": "0x…"}`."""
        with self._reading() as txn:
            self._check(txn, height)
            raw = txn.get(_BE.pack(height), db=self._hdr)
        if raw is None:  # only if the store was damaged outside this program
            raise JsonRpcError(DATABASE_FAILED, f"header {height} missing from the state store")
        return orjson.loads(raw)

    def header(self, height: int) -> HeaderInfo:
        return header_info(self.header_fields(height))

    def head_hash(self) -> tuple[int, str] | None:
        """(height, hash) of the head, or None before the first block."""
        with self._reading() as txn:
            bounds = self._bounds(txn)
            if bounds is None:
                return None
            raw = txn.get(_BE.pack(bounds[1]), db=self._hdr)
        return bounds[1], orjson.loads(raw)["header"]["hash"]

    def stored_header(self, txn: lmdb.Transaction, height: int) -> bytes | None:
        """The header stored for `height` as its bytes, in `txn` (None if none): two reads
        of one block compare equal unless a reorg replaced it."""
        return txn.get(_BE.pack(height), db=self._hdr)  # type: ignore[no-any-return]

    def hash_at(self, height: int) -> str | None:
        """Hash of the stored block at `height` while it is in range, else None."""
        with self._reading() as txn:
            raw = txn.get(_BE.pack(height), db=self._hdr)
        return None if raw is None else orjson.loads(raw)["header"]["hash"]

    def height_of(self, block_hash: str) -> int | None:
        with self._reading() as txn:
            raw = txn.get(bytes.fromhex(block_hash[2:]), db=self._hashes)
        return None if raw is None else _BE.unpack(raw)[0]

    def balance(self, address: str, height: int) -> int:
        with self.view(height) as v:
            return v.balance(address)

    def nonce(self, address: str, height: int) -> int:
        with self.view(height) as v:
            return v.nonce(address)

    def code(self, address: str, height: int) -> bytes:
        with self.view(height) as v:
            return v.code(address)

    def storage(self, address: str, slot: int, height: int) -> int:
        with self.view(height) as v:
            return v.storage(address, slot)

    def snapshot(self) -> Snapshot:
        """One read transaction for a batch of reads at any heights (bounds read once);
        the caller must `close()` it and must not await before it does. -39005 when the
        store is closed or fails.

        In an event loop's thread of the store's writing process, every snapshot until the
        next write begins is one kept transaction and cursor (`KeptSnapshot`): no write
        began since it did, so it sees exactly what a new transaction would, and beginning
        one costs more than most reads. Other threads get a transaction of their own."""
        kept = self._kept
        if kept is not None and kept.generation == self._generation and kept.thread == get_ident():
            return kept
        env = self._env
        if env is None:
            raise JsonRpcError(DATABASE_FAILED, "state store is closed")
        try:
            generation = self._generation
            txn = env.begin()
            bounds = self._bounds_of(txn, generation)
            cursors = txn.cursor(self._acct), txn.cursor(self._ver)
        except lmdb.Error as exc:
            log.error("state store read failed: %s", exc)
            raise JsonRpcError(DATABASE_FAILED, "state store read failed") from None
        if self._writer:
            loop = self._keeping_loop(generation)
            if loop is not None:
                if kept is not None:
                    kept.end()  # (this thread's, of an older generation)
                kept = self._kept = KeptSnapshot(txn, bounds, cursors, generation, loop)
                if self._generation != generation:  # a write began meanwhile: its commit
                    loop.call_soon(self._end_stale, kept)  # may have missed this one
                return kept
        return Snapshot(txn, bounds, cursors)

    def _keeping_loop(self, generation: int) -> asyncio.AbstractEventLoop | None:
        """The running event loop when a transaction begun at `generation` may be kept: no
        write began before or since it did (`_bounds_of`; this process is the store's only
        writer), and no other thread keeps one; else None."""
        if generation & 1 or self._generation != generation:
            return None
        old = self._kept
        if old is not None and old.thread != get_ident():
            return None
        return asyncio._get_running_loop()  # (None outside a loop, without raising)

    def discard(self, snap: Snapshot) -> None:
        """Stop keeping `snap` (a read in it failed): the next read begins a new one."""
        if snap is self._kept:
            self._kept = None
            snap.end()  # type: ignore[attr-defined]

    def _release_kept(self) -> None:
        """After a commit: end the kept snapshot in its own thread (at once when that is
        this one, else from its loop), so it holds the pages of an old version no longer
        than that. A loop that has closed ends nothing: its thread ends the snapshot at its
        next read, when it sees the new generation."""
        kept = self._kept
        if kept is None:
            return
        if kept.thread == get_ident():
            self._end_stale(kept)
            return
        with contextlib.suppress(RuntimeError):  # (the loop closed)
            kept.loop.call_soon_threadsafe(self._end_stale, kept)

    def _end_stale(self, kept: KeptSnapshot) -> None:
        if self._kept is kept and kept.generation != self._generation:
            self._kept = None
            kept.end()

    def _bounds_of(self, txn: lmdb.Transaction, generation: int) -> tuple[int, int] | None:
        """The bounds `txn` sees, `generation` read just before it began. When this process
        is the store's only writer and no write began since (the generation is even and
        unchanged after `begin`), no commit can lie between the two: the bounds of that
        generation are `txn`'s, cached after the first snapshot that read them."""
        if not self._writer or generation & 1 or self._generation != generation:
            return self._bounds(txn)
        cached = self._snapshot_bounds
        if cached is not None and cached[0] == generation:
            return cached[1]
        bounds = self._bounds(txn)
        if self._generation == generation:
            self._snapshot_bounds = (generation, bounds)
        return bounds

    @contextmanager
    def view(self, height: int) -> Iterator[StateView]:
        """A consistent view at `height` for many reads; -39006 when out of range."""
        with self._reading() as txn:
            self._check(txn, height)
            yield StateView(self, txn, height)

    def written_at(self, height: int) -> list[tuple[bytes, bytes]]:
        """(prefix, raw value) of everything block `height` wrote (its undo record), for
        heights above the earliest; [] when the store has no record of it."""
        out = []
        hb = _BE.pack(height)
        with self._reading() as txn:
            for prefix in _split_prefixes(txn.get(hb, db=self._undo) or b""):
                value = txn.get(prefix + hb, db=self._db_of(prefix))
                if value is not None:
                    out.append((prefix, value))
        return out

    def validations(self, start: int, count: int) -> list[dict[str, Any]]:
        """Checker records for heights [start, start+count) that this node holds."""
        out: list[dict[str, Any]] = []
        with self._reading() as txn:
            bounds = self._bounds(txn)
            if bounds is None:
                return out
            lo, hi = max(start, bounds[0]), min(start + count - 1, bounds[1])
            if lo > hi:
                return out
            cur = txn.cursor(db=self._hdr)
            if not cur.set_range(_BE.pack(lo)):
                return out
            for key, raw in cur:
                height = _BE.unpack(key)[0]
                if height > hi:
                    break
                stored = orjson.loads(raw)
                out.append(
                    {
                        "height": height,
                        "id": stored["header"]["hash"],
                        "parent_id": stored["header"]["parentHash"],
                        "validation_hash": stored["validationHash"],
                    }
                )
        return out

    # block bodies ----------------------------------------------------------------------

    @contextmanager
    def bodies(self) -> Iterator[BodyReads]:
        """Block bodies in one read transaction; -39005 when the store is closed or fails."""
        with self._reading() as txn:
            yield BodyReads(self, txn)

    def block_body(self, height: int) -> dict[str, Any] | None:
        """`{"block": <the block object with full transaction objects>, "receipts": [...]}`
        as ingested, or None when this node does not hold block `height`'s body."""
        with self.bodies() as bodies:
            return bodies.body(height)

    def transaction_location(self, tx_hash: str) -> tuple[int, int] | None:
        """(height, index in the block) of a transaction by its lowercase 0x hash, or None
        when no block this node holds has it."""
        with self.bodies() as bodies:
            return bodies.location(tx_hash)

    def transaction_count(self, height: int) -> int | None:
        """How many transactions block `height` has; None when its body is not held."""
        with self.bodies() as bodies:
            return bodies.transaction_count(height)

    def chain_id(self) -> int | None:
        with self._reading() as txn:
            raw = txn.get(META_CHAIN_ID, db=self._meta)
        return None if raw is None else _BE.unpack(raw)[0]

    def set_chain_id(self, chain_id: int) -> None:
        self._write(lambda txn: txn.put(META_CHAIN_ID, _BE.pack(chain_id), db=self._meta))

    # writing ---------------------------------------------------------------------------

    def write(self, fn: Any) -> Any:
        """Run `fn(txn)` in one write transaction, serialised with block writes (for
        extensions that fill their databases outside `apply`); raises StoreFailure."""
        return self._write(fn)

    def _write(self, fn: Any) -> Any:
        with self._write_lock:
            if self._env is None:
                raise StoreFailure("state store is closed")
            self._known_range = None  # while it changes, `range()` reads the store
            self._generation += 1  # odd: a snapshot begun from here on reads the bounds
            try:
                with self._env.begin(write=True) as txn:
                    return fn(txn)
            except lmdb.Error as exc:
                raise StoreFailure(f"state store write failed: {exc}") from exc
            finally:
                self._generation += 1  # even again: committed (or aborted)
                self._release_kept()
                with contextlib.suppress(JsonRpcError):
                    self._known_range = self.bounds()

    def apply(self, block: VendorBlock, *, verify_pre: bool = True) -> None:
        """Apply the next block in one transaction; raises StoreError and changes nothing if
        it does not follow the head or its `pre` disagrees with the stored state."""
        self._write(lambda txn: self._apply(txn, block, verify_pre))

    def apply_many(self, blocks: list[VendorBlock], *, verify_pre: bool = True) -> None:
        """Apply consecutive blocks in one transaction: all of them or (StoreError) none.
        One commit writes a page the blocks share once and syncs once, where a commit per
        block rewrites it and syncs each time (most of a block's cost on a slow disk)."""

        def apply(txn: lmdb.Transaction) -> None:
            bounds = self._bounds(txn)
            for block in blocks:
                self._apply(txn, block, verify_pre, prune=False)
            if blocks:  # (a store's first block is block 0, its earliest)
                self._prune(txn, 0 if bounds is None else bounds[0], blocks[-1].number)

        self._write(apply)

    def _apply(
        self, txn: lmdb.Transaction, block: VendorBlock, verify_pre: bool, *, prune: bool = True
    ) -> None:
        """Write one block; `prune=False` leaves the window's move to the caller, which
        prunes once for every block of its transaction (`_prune`)."""
        bounds = self._bounds(txn)
        height = block.number
        if bounds is None:
            if height != 0:
                raise OutOfOrder(f"the first block must be block 0, got {height}")
            earliest = 0
        else:
            earliest, head = bounds
            if height != head + 1:
                raise OutOfOrder(f"expected block {head + 1}, got {height}")
            head_hash = orjson.loads(txn.get(_BE.pack(head), db=self._hdr))["header"]["hash"]
            if block.parent_hash != head_hash:
                raise ParentMismatch(
                    f"block {height} has parent {block.parent_hash}, stored head is {head_hash}"
                )
            if verify_pre:
                self._verify_pre(txn, block)
        hb = _BE.pack(height)
        writes = block_writes(block)
        # in key order: each leaf page is reached once, from the branch pages just used
        accounts, slots = _versions(writes, hb)
        txn.cursor(db=self._acct).putmulti(accounts)
        txn.cursor(db=self._ver).putmulti(slots)
        if bounds is not None:  # the first block's record would never be read: it is the
            # earliest block until pruned (no rollback below it, pruning reads the blocks above)
            txn.put(hb, b"".join(prefix for prefix, _ in writes), db=self._undo)
        stored = {"header": block.header, "validationHash": block.validation_hash}
        txn.put(hb, orjson.dumps(stored), db=self._hdr)
        txn.put(bytes.fromhex(block.hash[2:]), hb, db=self._hashes)
        self._put_body(txn, hb, height, block.body)
        txn.put(META_HEAD, hb, db=self._meta)
        if bounds is None:
            txn.put(META_EARLIEST, hb, db=self._meta)
        for extension in self.extensions:
            extension.applied(txn, block)
        if prune:
            self._prune(txn, earliest, height)

    def _put_body(
        self, txn: lmdb.Transaction, hb: bytes, height: int, body: BlockBody | None
    ) -> None:
        """Keep a block's body and index its transactions (in the block's transaction)."""
        if body is None:  # (a block made in process without one): held bodies start above it
            txn.put(META_BODIES_FROM, _BE.pack(height + 1), db=self._meta)
            return
        for index, tx_hash in enumerate(body.tx_hashes):
            held = txn.get(tx_hash, db=self._txhashes)
            if held is not None:
                raise DuplicateTransaction(
                    f"block {height} lists transaction 0x{tx_hash.hex()}, which block "
                    f"{_LOCATION.unpack(held)[0]} already has"
                )
            txn.put(tx_hash, _LOCATION.pack(height, index), db=self._txhashes)
        txn.put(hb, body.shell, db=self._blocks)
        txn.put(hb, body.transactions, db=self._txs)
        txn.put(hb, body.receipts, db=self._receipts)

    def backfilled_body(self, txn: lmdb.Transaction, block: VendorBlock) -> bool:
        """Keep the body of a block the store held before it kept bodies (in a write
        transaction of the store, see `write`): only the block just below the held bodies,
        with the stored block's hash; False (nothing written) otherwise."""
        hb = _BE.pack(block.number)
        bounds = self._bounds(txn)
        stored = txn.get(hb, db=self._hdr)
        if (
            block.body is None
            or bounds is None
            or block.number < bounds[0]
            or self._bodies_from(txn) != block.number + 1
            or stored is None
            or orjson.loads(stored)["header"]["hash"] != block.hash
        ):
            return False
        self._put_body(txn, hb, block.number, block.body)
        txn.put(META_BODIES_FROM, hb, db=self._meta)
        return True

    def _drop_body(self, txn: lmdb.Transaction, hb: bytes) -> None:
        """Delete a block's body and its transactions' index entries (if it has them)."""
        shell = txn.get(hb, db=self._blocks)
        if shell is None:
            return
        for tx_hash in orjson.loads(shell)["transactions"]:
            txn.delete(bytes.fromhex(tx_hash[2:]), db=self._txhashes)
        for db in (self._blocks, self._txs, self._receipts):
            txn.delete(hb, db=db)

    def _bodies_from(self, txn: lmdb.Transaction) -> int:
        return _BE.unpack(txn.get(META_BODIES_FROM, db=self._meta))[0]

    def _verify_pre(self, txn: lmdb.Transaction, block: VendorBlock) -> None:
        """Every `pre` value equals the stored one at the parent height. Compared encoded
        (integers are stored minimal, so equal bytes are equal values), in key order: one
        cursor, whose seeks mostly land on the page the previous one read."""
        parent = block.number - 1
        accounts, slots = txn.cursor(db=self._acct), txn.cursor(db=self._ver)
        for prefix, expected in sorted(_encoded(block.pre)):
            cur = accounts if len(prefix) == ACCOUNT_PREFIX else slots
            if (seek(cur, prefix, parent) or b"") != expected:
                raise PreStateMismatch(
                    f"block {block.number}: pre {_field_name(prefix)} of 0x{prefix[:20].hex()} "
                    f"differs from the stored state at block {parent}"
                )

    def _prune(self, txn: lmdb.Transaction, old_earliest: int, head: int) -> None:
        """Move a `state` node's window: keep, per field and slot, only the newest version
        at or below the new earliest height (and everything above it).

        Once for all the heights leaving the window in one transaction: a key written at
        several of them is pruned once, from its newest, and the keys are visited in order
        (each seek mostly lands on the page the previous one left)."""
        if self.kind != "state":
            return
        new_earliest = max(old_earliest, head - self.window + 1)
        if new_earliest == old_earliest:
            return
        newest: dict[bytes, bytes] = {}  # prefix → its newest version key leaving the window
        for height in range(old_earliest + 1, new_earliest + 1):
            hb = _BE.pack(height)
            newest.update(dict.fromkeys(_split_prefixes(txn.get(hb, db=self._undo) or b""), hb))
        accounts = sorted(prefix for prefix in newest if len(prefix) == ACCOUNT_PREFIX)
        slots = sorted(prefix for prefix in newest if len(prefix) != ACCOUNT_PREFIX)
        _drop_older(txn.cursor(db=self._acct), accounts, newest)
        _drop_older(txn.cursor(db=self._ver), slots, newest)
        for height in range(old_earliest, new_earliest + 1):
            txn.delete(_BE.pack(height), db=self._undo)
        for height in range(old_earliest, new_earliest):
            txn.delete(_BE.pack(height), db=self._hdr)
            self._drop_body(txn, _BE.pack(height))
        if self._bodies_from(txn) < new_earliest:
            txn.put(META_BODIES_FROM, _BE.pack(new_earliest), db=self._meta)
        txn.put(META_EARLIEST, _BE.pack(new_earliest), db=self._meta)
        for extension in self.extensions:
            extension.pruned(txn, new_earliest)

    def replace(self, depth: int, blocks: list[VendorBlock], *, verify_pre: bool = True) -> int:
        """A reorg in one transaction: roll back the `depth` newest blocks and apply `blocks`
        (the new chain above the fork point), so a reader sees the old chain or the new one,
        never the fork point between; raises StoreError and changes nothing when a step
        fails. Returns the new head height."""

        def replace(txn: lmdb.Transaction) -> int:
            for _ in range(depth):
                self._rollback(txn)
            earliest = self._bounds(txn)
            for block in blocks:
                self._apply(txn, block, verify_pre, prune=False)
            bounds = self._bounds(txn)
            assert earliest is not None and bounds is not None  # (the earliest block stays)
            self._prune(txn, earliest[0], bounds[1])
            return bounds[1]

        new_head: int = self._write(replace)
        self.rollbacks += depth
        return new_head

    def rollback(self) -> int:
        """Remove the head block (one transaction); returns the new head height."""
        try:
            return self._write(self._rollback)
        finally:
            self.rollbacks += 1

    def _rollback(self, txn: lmdb.Transaction) -> int:
        bounds = self._bounds(txn)
        if bounds is None:
            raise ReorgTooDeep("no block to roll back")
        earliest, head = bounds
        if head <= earliest:
            raise ReorgTooDeep(
                f"cannot roll back block {head}: it is this node's earliest block "
                f"(a `{self.kind}` node keeps {self.window if self.kind == 'state' else 'all'} "
                "blocks)"
            )
        hb = _BE.pack(head)
        for prefix in _split_prefixes(txn.get(hb, db=self._undo) or b""):
            txn.delete(prefix + hb, db=self._db_of(prefix))
        stored = orjson.loads(txn.get(hb, db=self._hdr))
        txn.delete(bytes.fromhex(stored["header"]["hash"][2:]), db=self._hashes)
        txn.delete(hb, db=self._hdr)
        txn.delete(hb, db=self._undo)
        self._drop_body(txn, hb)
        if self._bodies_from(txn) > head:
            txn.put(META_BODIES_FROM, hb, db=self._meta)  # (held: none, as the new head's)
        txn.put(META_HEAD, _BE.pack(head - 1), db=self._meta)
        for extension in self.extensions:
            extension.rolled_back(txn, head)
        return head - 1


def _drop_older(cur: lmdb.Cursor, prefixes: list[bytes], newest: dict[bytes, bytes]) -> None:
    """Delete, for each of `prefixes` (sorted), its versions older than `prefix |
    newest[prefix]`: visited in key order, each seek mostly lands on the page the previous
    one left."""
    set_range, key, delete = cur.set_range, cur.key, cur.delete
    for prefix in prefixes:
        keep = prefix + newest[prefix]
        # from the oldest version up, deleting each older than `keep`: with the usual
        # one obsolete version, four cursor calls instead of six walking down from `keep`.
        # A key from `prefix` up to `keep` is a version of it: it starts with the prefix,
        # and every key of a field or slot is its prefix and a height.
        found = set_range(prefix)
        while found and key() < keep:
            found = delete()  # moves to the next key


def _versions(
    writes: tuple[tuple[bytes, bytes], ...], hb: bytes
) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]]]:
    """A block's writes as (key, value) versions at height `hb`, those of `accounts` and
    those of `versions` apart, each in key order."""
    accounts: list[tuple[bytes, bytes]] = []
    slots: list[tuple[bytes, bytes]] = []
    for prefix, value in writes:
        (accounts if len(prefix) == ACCOUNT_PREFIX else slots).append((prefix + hb, value))
    return accounts, slots


def _move_account_versions(txn: lmdb.Transaction, old: Any, new: Any) -> int:
    """Move every account field's version from `old` to `new` (format 1 to 2); how many.
    An account's fields sort before its slots, so after them the walk jumps to the next
    address instead of stepping through the slots."""
    cur, out = txn.cursor(db=old), txn.cursor(db=new)
    moved = 0
    found = cur.first()
    while found:
        key = cur.key()
        if len(key) == ACCOUNT_PREFIX + 8:
            out.put(key, cur.value(), append=True)
            moved += 1
            found = cur.delete()  # moves to the next key
        elif key[20:21] == F_STORAGE:
            found = cur.set_range(key[:20] + b"\x05")
        else:
            found = cur.next()
    return moved


def _field_name(prefix: bytes) -> str:
    """What a version prefix names, for error messages: balance, nonce, code or a slot."""
    if prefix[20:21] == F_STORAGE:
        return f"slot 0x{prefix[21:].hex()}"
    return {F_BALANCE: "balance", F_NONCE: "nonce", F_CODE: "code"}[prefix[20:21]]


def block_writes(block: VendorBlock) -> tuple[tuple[bytes, bytes], ...]:
    """(prefix, raw value) of everything a block's `post` writes, in key order, as `apply`
    stores it; encoded once per block (kept in `block.writes`)."""
    writes = block.writes
    if writes is None:
        writes = tuple(sorted(_encoded(block.post)))
        object.__setattr__(block, "writes", writes)  # a cache of the frozen block's `post`
    return writes


def _encoded(side: dict[str, AccountDiff]) -> list[tuple[bytes, bytes]]:
    """(prefix, encoded value) of every field and slot the accounts of `side` list: integers
    as minimal big-endian bytes, code as it is. A block lists thousands of slots, so each is
    encoded inline, without a call per value."""
    out: list[tuple[bytes, bytes]] = []
    append, extend = out.append, out.extend
    for address, acc in side.items():
        a = bytes.fromhex(address[2:])
        if (value := acc.balance) is not None:
            append((a + F_BALANCE, value.to_bytes((value.bit_length() + 7) // 8, "big")))
        if (value := acc.nonce) is not None:
            append((a + F_NONCE, value.to_bytes((value.bit_length() + 7) // 8, "big")))
        if acc.code is not None:
            append((a + F_CODE, acc.code))
        if acc.storage:
            a4 = a + F_STORAGE
            extend(
                [
                    (a4 + slot.to_bytes(32, "big"), v.to_bytes((v.bit_length() + 7) // 8, "big"))
                    for slot, v in acc.storage.items()
                ]
            )
    return out

"""A block's body (the block object, its transactions and receipts) taken from a
`trace_vendorBlock`'s BlockFile and checked against its Header before the node keeps it.

The write node passes the execution client's block and receipts through unchanged
(docs/vendor-block.md), and BlockFile is not covered by the ValidationHash; the Header is.
So the body must fit the Header: every field the Header has is the block's own (so the roots,
bloom, size and hash the answers carry are the checked ones), the transactions and receipts
name this block and their position in it, the receipts are in transaction order and add up
to the Header's `gasUsed`, and empty lists have the empty roots the Header must then carry. A
block whose body fails is rejected whole, like any malformed block.

Each object is kept as the JSON the execution client sent (key order and fields), so the
answers are byte for byte what the client would give. Block 0's BlockFile lists the genesis
allocation as synthetic transactions; they are not transactions: block 0 has none.

A list of objects is packed as `count(4) | end offset of each (4 each) | JSON array`, so the
whole array is a slice of the record and so is each object (offsets within the array). The
store keeps a packed list behind one byte: 0 as is, 1 zlib-compressed (level 1, for lists
of at least COMPRESS_FROM bytes): receipts shrink about 12 times (their blooms are mostly
zeros), transactions about 4, for ~2 ms of ingest CPU per block of 200 transactions and
~0.25 ms to read back one of its lists.
"""

from __future__ import annotations

import functools
import operator
import struct
import zlib
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import orjson

from chainstate.hexcodec import is_address, is_hash
from nodes.state.hexbulk import all_hex, column, quantities

_U32 = struct.Struct(">I")
COMPRESS_FROM = 1024  # bytes of a packed list from which it is stored compressed
_RAW, _ZLIB = b"\x00", b"\x01"
# keccak256(rlp(empty list)) and the root of an empty trie: what a header must name when the
# block has no uncles, or no transactions, receipts or withdrawals.
EMPTY_UNCLES = "0x1dcc4de8dec75d7aab85b567b6ccd41ad312451b948a7413f0a142fd40d49347"
EMPTY_ROOT = "0x56e81f171bcc55a6ff8345e692c0f86e5b48e01b996cadc001622fb5e363b421"
# Header fields that are quantities (compared as numbers: the Header re-encodes them).
QUANTITIES = frozenset(
    ("number", "timestamp", "gasLimit", "gasUsed", "baseFeePerGas", "difficulty", "size",
     "blobGasUsed", "excessBlobGas")
)  # fmt: skip


class BlockBodyError(ValueError):
    """The BlockFile's block or receipts do not fit the block's Header."""


@dataclass(frozen=True, slots=True)
class BlockBody:
    """A checked body, encoded as the store keeps it."""

    shell: bytes  # the block object with its transactions as hashes (the `full=false` form)
    transactions: bytes  # packed transaction objects, encoded for the store (`stored`)
    receipts: bytes  # packed receipts, encoded for the store
    tx_hashes: tuple[bytes, ...]  # 32 bytes each, in block order


def pack(raws: list[bytes]) -> bytes:
    """`count | end offsets | [raw0,raw1,…]`: the array and each item are slices."""
    ends, at = [], 1
    for raw in raws:
        at += len(raw)
        ends.append(at)
        at += 1  # the comma (or the closing bracket after the last)
    head = _U32.pack(len(raws)) + b"".join(_U32.pack(end) for end in ends)
    return head + b"[" + b",".join(raws) + b"]"


def stored(packed: bytes) -> bytes:
    """A packed list as the store keeps it (compressed when large)."""
    if len(packed) >= COMPRESS_FROM:
        return _ZLIB + zlib.compress(packed, 1)
    return _RAW + packed


def unstored(record: bytes) -> bytes:
    """The packed list of a stored record."""
    return zlib.decompress(record[1:]) if record[:1] == _ZLIB else record[1:]


def stored_count(record: bytes) -> int:
    """How many items a stored record lists (only its first bytes are decompressed)."""
    if record[:1] == _ZLIB:
        return packed_count(zlib.decompressobj().decompress(record[1:], 4))
    return packed_count(record[1:])


def packed_count(blob: bytes) -> int:
    return _U32.unpack_from(blob)[0]


def packed_array(blob: bytes) -> bytes:
    """The JSON array of every item."""
    return blob[4 + 4 * packed_count(blob) :]


def packed_item(blob: bytes, index: int) -> bytes | None:
    """Item `index` as JSON, or None when out of range."""
    count = packed_count(blob)
    if not 0 <= index < count:
        return None
    base = 4 + 4 * count
    end = _U32.unpack_from(blob, 4 + 4 * index)[0]
    start = 1 if index == 0 else _U32.unpack_from(blob, 4 * index)[0] + 1
    return blob[base + start : base + end]


def parse_block_body(block_file: Any, header: dict[str, Any]) -> BlockBody:
    """Check a BlockFile against its (already checked) Header; raises BlockBodyError."""
    number = int(header["number"], 16)
    where = f"block {number}"
    if not isinstance(block_file, dict) or not isinstance(block_file.get("block"), dict):
        raise BlockBodyError(f"{where}: BlockFile.block must be the block object")
    block = block_file["block"]
    _check_header_fields(block, header, where)
    receipts = block_file.get("receipts")
    if receipts is None:
        receipts = []
    if not isinstance(receipts, list):
        raise BlockBodyError(f"{where}: BlockFile.receipts must be a list")
    txs = block.get("transactions")
    if not isinstance(txs, list):
        raise BlockBodyError(f"{where}: the block's transactions must be a list")
    if number == 0:
        txs = []  # the genesis allocation, listed as synthetic transactions
    hashes = _transactions_ok(txs, header)
    if hashes is None:
        hashes = _check_transactions(txs, header, where)
    if not _receipts_ok(receipts, txs, hashes, header):
        _check_receipts(receipts, txs, header, where)
    _check_uncles(block, header, where)
    _check_withdrawals(block, header, where)
    _check_empty_roots(header, txs, where)
    shell = dict(block)
    shell["transactions"] = [tx["hash"] for tx in txs]
    return BlockBody(
        orjson.dumps(shell),
        stored(pack(list(map(orjson.dumps, txs)))),
        stored(pack(list(map(orjson.dumps, receipts)))),
        tuple(bytes.fromhex(h[2:]) for h in hashes),
    )


def _check_header_fields(block: dict[str, Any], header: dict[str, Any], where: str) -> None:
    """Every Header field is the block's own (the Header re-encodes them canonically)."""
    for name, value in header.items():
        theirs = block.get(name)
        if name in QUANTITIES:
            same = _number(theirs) == int(value, 16)
        else:
            same = isinstance(theirs, str) and theirs.lower() == value
        if not same:
            raise BlockBodyError(
                f"{where}: the block's {name} {theirs!r:.80} is not the Header's {value!r:.80} "
                "(BlockFile does not belong to this Header)"
            )


def _number(value: Any) -> int | None:
    if isinstance(value, str) and value[:2] in ("0x", "0X"):
        try:
            return int(value, 16)
        except ValueError:
            return None
    return None


def _quantity(obj: dict[str, Any], name: str, where: str) -> int:
    value = _number(obj.get(name))
    if value is None:
        raise BlockBodyError(f"{where}: {name} must be a hex quantity")
    return value


@functools.lru_cache(maxsize=8)
def _indices(count: int) -> list[str]:
    """`0x0`, `0x1`, … : the transaction indices of a block of `count` transactions."""
    return [hex(i) for i in range(count)]


def _names_block_all(items: list[dict[str, Any]], header: dict[str, Any]) -> bool:
    """Whether every item names the Header's block hash and, as the Header writes it, its
    number (a number written another way is left to the item-by-item check)."""
    count = len(items)
    return (
        column(items, "blockHash").count(header["hash"]) == count
        and column(items, "blockNumber").count(header["number"]) == count
    )


def _transactions_ok(txs: list[Any], header: dict[str, Any]) -> list[str] | None:
    """The transactions' hashes when `_check_transactions` would pass them all, checked a
    column at a time (a block has hundreds: a few calls per item cost more than the rest of
    its body); None when a check fails, and `_check_transactions` names the failure."""
    if not all(map(isinstance, txs, repeat(dict))):
        return None
    hashes = column(txs, "hash")
    try:
        if not all_hex(hashes, 66):
            return None
    except TypeError:  # a hash that is not a string
        return None
    if len(set(hashes)) != len(hashes) or not _names_block_all(txs, header):
        return None
    return hashes if column(txs, "transactionIndex") == _indices(len(txs)) else None


def _receipts_ok(
    receipts: list[Any], txs: list[dict[str, Any]], hashes: list[str], header: dict[str, Any]
) -> bool:
    """Whether `_check_receipts` would pass them all (for transactions that passed), checked
    a column at a time; False leaves it to `_check_receipts` to name the failure."""
    count = len(txs)
    if len(receipts) != count or not all(map(isinstance, receipts, repeat(dict))):
        return False
    if column(receipts, "transactionHash") != hashes or not _names_block_all(receipts, header):
        return False
    if column(receipts, "transactionIndex") != _indices(count):
        return False
    if column(receipts, "from") != column(txs, "from"):
        return False
    totals = quantities(column(receipts, "cumulativeGasUsed"))
    used = quantities(column(receipts, "gasUsed"))
    if totals is None or used is None:
        return False
    # each receipt's gas is its cumulative gas less the one before (so they never go down)
    if list(map(operator.sub, totals, [0, *totals[:-1]])) != used:
        return False
    if (totals[-1] if totals else 0) != int(header["gasUsed"], 16):
        return False
    return _logs_name_their_transactions(receipts, hashes)


def _logs_name_their_transactions(receipts: list[dict[str, Any]], hashes: list[str]) -> bool:
    """Whether each receipt's logs name its transaction's hash and index as written."""
    indices = _indices(len(hashes))
    for logs, tx_hash, index in zip(column(receipts, "logs"), hashes, indices, strict=True):
        if not logs:
            continue
        if type(logs) is not list or not all(map(isinstance, logs, repeat(dict))):
            return False
        count = len(logs)
        if column(logs, "transactionHash").count(tx_hash) != count:
            return False
        if column(logs, "transactionIndex").count(index) != count:
            return False
    return True


def _check_transactions(txs: list[Any], header: dict[str, Any], where: str) -> list[str]:
    """The hashes of the block's transactions, each checked to name this block and its index."""
    hashes: list[str] = []
    seen: set[str] = set()
    for i, tx in enumerate(txs):
        at = f"{where}, transaction {i}"
        if not isinstance(tx, dict):
            raise BlockBodyError(f"{at}: not an object (the block must have full transactions)")
        tx_hash = tx.get("hash")
        if not is_hash(tx_hash, lower=True):
            raise BlockBodyError(f"{at}: hash must be a lowercase 32-byte 0x hash")
        if tx_hash in seen:
            raise BlockBodyError(f"{at}: {tx_hash} is listed twice")
        seen.add(tx_hash)
        _names_block(tx, header, at)
        if _quantity(tx, "transactionIndex", at) != i:
            raise BlockBodyError(f"{at}: names index {tx.get('transactionIndex')!r:.20}")
        hashes.append(tx_hash)
    return hashes


def _names_block(obj: dict[str, Any], header: dict[str, Any], at: str) -> None:
    if obj.get("blockHash") != header["hash"]:
        raise BlockBodyError(f"{at}: names block {obj.get('blockHash')!r:.80}")
    if _quantity(obj, "blockNumber", at) != int(header["number"], 16):
        raise BlockBodyError(f"{at}: names block number {obj.get('blockNumber')!r:.20}")


def _check_receipts(
    receipts: list[Any], txs: list[Any], header: dict[str, Any], where: str
) -> None:
    """One receipt per transaction, in order, naming it and the block; their gas adds up to
    the Header's `gasUsed`."""
    if len(receipts) != len(txs):
        raise BlockBodyError(f"{where}: {len(receipts)} receipts for {len(txs)} transactions")
    cumulative = 0
    for i, (receipt, tx) in enumerate(zip(receipts, txs, strict=True)):
        at = f"{where}, receipt {i}"
        if not isinstance(receipt, dict):
            raise BlockBodyError(f"{at}: not an object")
        if receipt.get("transactionHash") != tx["hash"]:
            raise BlockBodyError(f"{at}: names transaction {receipt.get('transactionHash')!r:.80}")
        if _quantity(receipt, "transactionIndex", at) != i:
            raise BlockBodyError(f"{at}: names index {receipt.get('transactionIndex')!r:.20}")
        _names_block(receipt, header, at)
        if _lower(receipt.get("from")) != _lower(tx.get("from")):
            raise BlockBodyError(f"{at}: from {receipt.get('from')!r:.50} is not the sender's")
        total = _quantity(receipt, "cumulativeGasUsed", at)
        if "gasUsed" in receipt and _quantity(receipt, "gasUsed", at) != total - cumulative:
            raise BlockBodyError(f"{at}: gasUsed does not match cumulativeGasUsed")
        if total < cumulative:
            raise BlockBodyError(f"{at}: cumulativeGasUsed goes down")
        cumulative = total
        for log in receipt.get("logs") or []:
            if not isinstance(log, dict) or log.get("transactionHash") != tx["hash"]:
                raise BlockBodyError(f"{at}: a log names another transaction")
            if _number(log.get("transactionIndex")) != i:
                raise BlockBodyError(f"{at}: a log names another transaction index")
    if cumulative != int(header["gasUsed"], 16):
        raise BlockBodyError(
            f"{where}: the receipts use {cumulative} gas, the Header says {header['gasUsed']}"
        )


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


def _check_uncles(block: dict[str, Any], header: dict[str, Any], where: str) -> None:
    uncles = block.get("uncles", [])
    if not isinstance(uncles, list) or not all(is_hash(u) for u in uncles):
        raise BlockBodyError(f"{where}: uncles must be a list of block hashes")
    if not uncles and header.get("sha3Uncles", EMPTY_UNCLES) != EMPTY_UNCLES:
        raise BlockBodyError(f"{where}: no uncles, but the Header's sha3Uncles is not empty")


def _check_withdrawals(block: dict[str, Any], header: dict[str, Any], where: str) -> None:
    """Since Shanghai the block lists its withdrawals; they must give the Header's root."""
    withdrawals = block.get("withdrawals")
    root = header.get("withdrawalsRoot")
    if root is None:
        if withdrawals:
            raise BlockBodyError(f"{where}: withdrawals without a withdrawalsRoot in the Header")
        return
    if not isinstance(withdrawals, list):
        raise BlockBodyError(f"{where}: the block has a withdrawalsRoot but no withdrawals list")
    if withdrawals_root(withdrawals, where) != root:
        raise BlockBodyError(f"{where}: the withdrawals do not give the Header's withdrawalsRoot")


def withdrawals_root(withdrawals: list[Any], where: str) -> str:
    """The trie root of a withdrawals list (EIP-4895: key rlp(i), value
    rlp([index, validatorIndex, address, amount]))."""
    if not withdrawals:
        return EMPTY_ROOT
    # Imported here: they pull in eth_utils (~0.5 s), and a devnet block has no withdrawals.
    import rlp
    from trie import HexaryTrie

    trie = HexaryTrie({})
    for i, w in enumerate(withdrawals):
        at = f"{where}, withdrawal {i}"
        if not isinstance(w, dict):
            raise BlockBodyError(f"{at}: not an object")
        address = w.get("address")
        if not is_address(address):
            raise BlockBodyError(f"{at}: address must be a 0x address")
        fields = [
            _quantity(w, "index", at),
            _quantity(w, "validatorIndex", at),
            bytes.fromhex(address[2:]),
            _quantity(w, "amount", at),
        ]
        trie[rlp.encode(i)] = rlp.encode(fields)
    return "0x" + trie.root_hash.hex()


def _check_empty_roots(header: dict[str, Any], txs: list[Any], where: str) -> None:
    """A block without transactions has the empty transactions and receipts roots."""
    if txs:
        return
    for name in ("transactionsRoot", "receiptsRoot"):
        if header.get(name, EMPTY_ROOT) != EMPTY_ROOT:
            raise BlockBodyError(f"{where}: no transactions, but the Header's {name} is not empty")

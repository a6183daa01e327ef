"""The logs of one block, taken from a `trace_vendorBlock`'s BlockFile and checked.

The write node passes the execution client's receipts through unchanged (docs/vendor-block.md),
and BlockFile is not covered by the ValidationHash. So before a state node indexes a block's
logs they are checked against what the hash does cover, the Header: every log must name the
block (hash and number), have the shape eth_getLogs answers (lowercase hex, at most four
32-byte topics), and together the logs must give exactly the header's `logsBloom`. A block
whose logs fail is rejected whole, like any malformed block.

Each log is kept as the JSON object the execution client sent (its key order and fields, e.g.
anvil's `blockTimestamp`), so eth_getLogs answers byte for byte what the client would.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from itertools import chain, repeat
from typing import Any

import orjson
from Crypto.Hash import keccak

from chainstate.hexcodec import is_address, is_data, is_hash, is_quantity
from nodes.state.hexbulk import all_hex, column, quantities

MAX_TOPICS = 4


class BlockLogsError(ValueError):
    """The BlockFile's logs do not fit the block's Header."""


@dataclass(frozen=True, slots=True)
class BlockLog:
    """One log, ready to index: the raw bytes keys and the JSON object as answered."""

    address: bytes  # 20 bytes
    topics: tuple[bytes, ...]  # each 32 bytes
    raw: bytes  # the log object as JSON


def parse_block_logs(block_file: Any, header: dict[str, Any]) -> tuple[BlockLog, ...]:
    """The block's logs in order (receipts in transaction order, logs in receipt order)."""
    number = int(header["number"], 16)
    block_hash = header["hash"]
    receipts = block_file.get("receipts") if isinstance(block_file, dict) else None
    if receipts is None:
        receipts = []
    if not isinstance(receipts, list):
        raise BlockLogsError(f"block {number}: BlockFile.receipts must be a list")
    logs = _logs_ok(receipts, header)
    out = list(map(_entry, logs)) if logs is not None else _checked(receipts, number, block_hash)
    bloom = 0
    for entry in out:
        bloom |= _bloom_bits(entry.address)
        for topic in entry.topics:
            bloom |= _bloom_bits(topic)
    declared = header.get("logsBloom")
    if isinstance(declared, str) and _bloom_value(declared, number) != bloom:
        raise BlockLogsError(
            f"block {number}: the receipts' logs do not give the header's logsBloom "
            "(BlockFile does not belong to this Header)"
        )
    return tuple(out)


def _logs_ok(receipts: list[Any], header: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Every log of the block when `_checked` would pass them all, checked a field at a time
    over all of them (a call per field and log costs more than the rest of the logs' parse);
    None when one fails, and `_checked` names the failure."""
    if not all(map(isinstance, receipts, repeat(dict))):
        return None
    lists = column(receipts, "logs")
    if not all(map(isinstance, lists, repeat(list))):
        return None
    logs = list(chain.from_iterable(lists))
    if not all(map(isinstance, logs, repeat(dict))):
        return None
    count = len(logs)
    topics = column(logs, "topics")
    if not all(map(isinstance, topics, repeat(list))):
        return None
    if max(map(len, topics), default=0) > MAX_TOPICS:
        return None
    try:
        if not all_hex(column(logs, "address"), 42) or not all_hex(
            [*chain.from_iterable(topics), *column(logs, "transactionHash")], 66
        ):
            return None
    except TypeError:  # not a string
        return None
    if not all(map(is_data, column(logs, "data"), repeat(True))):
        return None
    if column(logs, "blockHash").count(header["hash"]) != count:
        return None
    if column(logs, "blockNumber").count(header["number"]) != count:
        return None
    if quantities(column(logs, "transactionIndex")) is None:
        return None
    indices = quantities(column(logs, "logIndex"))
    if indices is None or not all(map(operator.lt, indices, indices[1:])):
        return None
    return logs


def _checked(receipts: list[Any], number: int, block_hash: str) -> list[BlockLog]:
    """The logs checked one by one, raising the first failure."""
    out: list[BlockLog] = []
    last_index = -1
    for t, receipt in enumerate(receipts):
        logs = receipt.get("logs") if isinstance(receipt, dict) else None
        if not isinstance(logs, list):
            raise BlockLogsError(f"block {number}: receipt {t} has no logs list")
        for log in logs:
            entry = _check(log, number, block_hash, t)
            index = int(log["logIndex"], 16)
            if index <= last_index:
                raise BlockLogsError(f"block {number}: logIndex {index} is out of order")
            last_index = index
            out.append(entry)
    return out


def _entry(log: dict[str, Any]) -> BlockLog:
    """A log `_logs_ok` passed, ready to index."""
    return BlockLog(
        bytes.fromhex(log["address"][2:]),
        tuple(bytes.fromhex(topic[2:]) for topic in log["topics"]),
        orjson.dumps(log),
    )


def _check(log: Any, number: int, block_hash: str, receipt: int) -> BlockLog:
    where = f"block {number}, receipt {receipt}"
    if not isinstance(log, dict):
        raise BlockLogsError(f"{where}: a log is not an object")
    address, topics, data = log.get("address"), log.get("topics"), log.get("data")
    if not is_address(address, lower=True):
        raise BlockLogsError(f"{where}: log address must be a lowercase 0x address")
    if not isinstance(topics, list) or len(topics) > MAX_TOPICS:
        raise BlockLogsError(f"{where}: log topics must be a list of at most {MAX_TOPICS}")
    for topic in topics:
        if not is_hash(topic, lower=True):
            raise BlockLogsError(f"{where}: log topic must be a lowercase 32-byte 0x hash")
    if not is_data(data, lower=True):
        raise BlockLogsError(f"{where}: log data must be lowercase 0x hex bytes")
    if log.get("blockHash") != block_hash:
        raise BlockLogsError(f"{where}: log names block {log.get('blockHash')!r:.80}")
    for name in ("blockNumber", "transactionIndex", "logIndex"):
        value = log.get(name)
        if not is_quantity(value, lower=True):
            raise BlockLogsError(f"{where}: log {name} must be a hex quantity")
    if int(log["blockNumber"], 16) != number:
        raise BlockLogsError(f"{where}: log names block number {log['blockNumber']}")
    tx_hash = log.get("transactionHash")
    if not is_hash(tx_hash, lower=True):
        raise BlockLogsError(f"{where}: log transactionHash must be a 32-byte 0x hash")
    return _entry(log)


def _bloom_value(declared: str, number: int) -> int:
    try:
        return int(declared, 16)
    except ValueError:
        raise BlockLogsError(f"block {number}: Header.logsBloom is not hex") from None


@functools.lru_cache(maxsize=65536)  # topics and emitters repeat block after block
def _bloom_bits(value: bytes) -> int:
    """The three bits `value` sets in a 2048-bit logs bloom (yellow paper, M3:2048)."""
    digest = keccak.new(digest_bits=256, data=value).digest()
    bits = 0
    for i in (0, 2, 4):
        bits |= 1 << (((digest[i] << 8) | digest[i + 1]) & 2047)
    return bits

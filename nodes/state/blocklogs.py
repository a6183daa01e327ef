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

from dataclasses import dataclass
from typing import Any

import orjson
from Crypto.Hash import keccak

from chainstate.hexcodec import is_address, is_data, is_hash, is_quantity

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
    out: list[BlockLog] = []
    bloom = 0
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
            bloom |= _bloom_bits(entry.address)
            for topic in entry.topics:
                bloom |= _bloom_bits(topic)
            out.append(entry)
    declared = header.get("logsBloom")
    if isinstance(declared, str) and _bloom_value(declared, number) != bloom:
        raise BlockLogsError(
            f"block {number}: the receipts' logs do not give the header's logsBloom "
            "(BlockFile does not belong to this Header)"
        )
    return tuple(out)


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
    return BlockLog(
        bytes.fromhex(address[2:]),
        tuple(bytes.fromhex(topic[2:]) for topic in topics),
        orjson.dumps(log),
    )


def _bloom_value(declared: str, number: int) -> int:
    try:
        return int(declared, 16)
    except ValueError:
        raise BlockLogsError(f"block {number}: Header.logsBloom is not hex") from None


def _bloom_bits(value: bytes) -> int:
    """The three bits `value` sets in a 2048-bit logs bloom (yellow paper, M3:2048)."""
    digest = keccak.new(digest_bits=256, data=value).digest()
    bits = 0
    for i in (0, 2, 4):
        bits |= 1 << (((digest[i] << 8) | digest[i + 1]) & 2047)
    return bits

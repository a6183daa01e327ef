"""The eth_getLogs filter object: one parser and one matcher for every component.

The state node answers `eth_getLogs` with it, the proxy routes by it (the oldest block of the
range decides) and matches the logs of new blocks against installed filters and `logs`
subscriptions with it. The rules are geth's (`eth/filters`):

- `blockHash` (one block), or `fromBlock`/`toBlock` (tags or hex heights; omitted or null
  means `latest`); both at once is an error;
- `address`: one address or a list (any of them); omitted, null or `[]` means any;
- `topics`: up to 4 positions; each is null (any), one topic, or a list of topics (any of
  them; a null inside the list or an empty list means any). A log matches when every
  position that is not a wildcard holds one of its topics.

Addresses and topics are compared lowercase. Error codes follow the project's conventions:
-32602 for a malformed filter, -39007 for a malformed block id, -32005 for a list over a
limit (geth's `--rpc.logquerylimit`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from chainstate.blockref import BlockRef, parse_block_id
from chainstate.jsonrpc import INVALID_BLOCK_ID, INVALID_PARAMS, SERVER_BUSY, JsonRpcError

FIELDS = ("fromBlock", "toBlock", "address", "topics", "blockHash")
MAX_TOPICS = 4  # LOG0..LOG4: a log has at most four topics
DEFAULT_MAX_LIST = 1000  # geth's --rpc.logquerylimit: addresses, or topics in one position
LATEST = BlockRef(tag="latest")

_ADDRESS = re.compile(r"^0x[0-9a-fA-F]{40}$")
_HASH = re.compile(r"^0x[0-9a-fA-F]{64}$")
_HEIGHT = re.compile(r"^0x(0|[1-9a-fA-F][0-9a-fA-F]{0,15})$")
_TAGS = ("latest", "pending", "safe", "finalized", "earliest")


def _invalid(message: str) -> JsonRpcError:
    return JsonRpcError(INVALID_PARAMS, message)


@dataclass(frozen=True, slots=True)
class LogFilter:
    """A parsed filter. `addresses` None = any address; `topics[i]` None = any topic there
    (trailing wildcards are dropped, so `topics` may be shorter than the request's)."""

    from_ref: BlockRef | None = LATEST  # None when the filter names a blockHash
    to_ref: BlockRef | None = LATEST
    block_hash: str | None = None
    addresses: frozenset[str] | None = None
    topics: tuple[frozenset[str] | None, ...] = ()

    @property
    def oldest(self) -> BlockRef:
        """The block that decides routing: the named block, else the start of the range."""
        if self.block_hash is not None:
            return BlockRef(hash=self.block_hash)
        return self.from_ref or LATEST

    def matches(self, log: dict[str, Any]) -> bool:
        """Whether a log object (as nodes answer it: lowercase hex) passes the filter."""
        if self.addresses is not None and log.get("address") not in self.addresses:
            return False
        if self.topics:
            have = log.get("topics") or ()
            for i, wanted in enumerate(self.topics):
                if wanted is not None and (i >= len(have) or have[i] not in wanted):
                    return False
        return True

    def in_range(self, height: int) -> bool:
        """For live filters (geth): a concrete fromBlock/toBlock bounds the heights matched;
        tags leave that end open (`earliest` is block 0)."""
        lo, hi = _bound(self.from_ref), _bound(self.to_ref)
        return (lo is None or height >= lo) and (hi is None or height <= hi)

    def to_obj(self) -> dict[str, Any]:
        """The filter as a request object again (for eth_getFilterLogs)."""
        obj: dict[str, Any] = {}
        if self.block_hash is not None:
            obj["blockHash"] = self.block_hash
        else:
            obj["fromBlock"] = _ref_text(self.from_ref)
            obj["toBlock"] = _ref_text(self.to_ref)
        if self.addresses is not None:
            obj["address"] = sorted(self.addresses)
        if self.topics:
            obj["topics"] = [None if t is None else sorted(t) for t in self.topics]
        return obj


def _bound(ref: BlockRef | None) -> int | None:
    if ref is None:
        return None
    if ref.tag == "earliest":
        return 0
    return ref.number


def _ref_text(ref: BlockRef | None) -> str:
    if ref is None or ref.tag is not None:
        return "latest" if ref is None else str(ref.tag)
    return hex(ref.number or 0)


def parse_filter(value: Any, *, max_list: int = DEFAULT_MAX_LIST) -> LogFilter:
    """Parse a filter object; raises JsonRpcError with geth's message where geth has one."""
    if not isinstance(value, dict):
        raise _invalid("invalid filter: expected an object")
    unknown = [k for k in value if k not in FIELDS]
    if unknown:
        raise _invalid(f"unknown field `{unknown[0]}` in filter, expected one of {list(FIELDS)}")
    block_hash = value.get("blockHash")
    from_raw, to_raw = value.get("fromBlock"), value.get("toBlock")
    addresses = _addresses(value.get("address"), max_list)
    topics = _topics(value.get("topics"), max_list)
    if block_hash is not None:
        if from_raw is not None or to_raw is not None:
            raise _invalid(
                "cannot specify both BlockHash and FromBlock/ToBlock, choose one or the other"
            )
        if not isinstance(block_hash, str) or not _HASH.fullmatch(block_hash):
            raise _invalid("invalid blockHash: expected a 32-byte 0x hash")
        return LogFilter(None, None, block_hash.lower(), addresses, topics)
    start, end = _block(from_raw, "fromBlock"), _block(to_raw, "toBlock")
    if start.number is not None and end.number is not None and start.number > end.number:
        raise invalid_range(start.number, end.number)
    return LogFilter(start, end, None, addresses, topics)


def invalid_range(start: int, end: int) -> JsonRpcError:
    return _invalid(f"invalid block range params: fromBlock {start:#x} is after toBlock {end:#x}")


def _block(value: Any, name: str) -> BlockRef:
    """A filter's block: a tag or a hex height (no EIP-1898 objects, no hashes: geth's
    rpc.BlockNumber)."""
    if value is None:
        return LATEST
    if isinstance(value, str) and (value in _TAGS or _HEIGHT.fullmatch(value)):
        return parse_block_id(value)
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    raise JsonRpcError(
        INVALID_BLOCK_ID, f"invalid {name}: {shown} (expected a tag or a hex height)"
    )


def _addresses(value: Any, max_list: int) -> frozenset[str] | None:
    if value is None:
        return None
    return _alternatives(value, _ADDRESS, "address", max_list, null_is_any=False)


def _topics(value: Any, max_list: int) -> tuple[frozenset[str] | None, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _invalid("invalid topics: expected an array")
    if len(value) > MAX_TOPICS:
        raise _invalid(f"exceed max topics: {len(value)} positions, a log has at most {MAX_TOPICS}")
    positions = [
        None if item is None else _alternatives(item, _HASH, "topic(s)", max_list, null_is_any=True)
        for item in value
    ]
    while positions and positions[-1] is None:
        positions.pop()
    return tuple(positions)


_SHAPES = {"address": ("a 20-byte 0x address", "addresses"),
           "topic(s)": ("a 32-byte 0x hash", "topics in one position")}  # fmt: skip


def _alternatives(
    value: Any, pattern: re.Pattern[str], what: str, max_list: int, *, null_is_any: bool
) -> frozenset[str] | None:
    """One value or a list of them (any of them matches), lowercased. None (any): an empty
    list, or a null inside the list where geth allows it (topics)."""
    if type(value) is str and pattern.fullmatch(value):  # the common case: one value
        return frozenset((value.lower(),))
    shape, plural = _SHAPES[what]
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise _invalid(f"invalid {what}: expected one value or a list of them")
    if len(items) > max_list:
        raise too_many(plural, len(items), max_list)
    out = set()
    for item in items:
        if item is None and null_is_any:
            return None
        if not isinstance(item, str) or not pattern.fullmatch(item):
            raise _invalid(f"invalid {what}: {item!r:.80} is not {shape}")
        out.add(item.lower())
    return frozenset(out) if out else None


def too_many(what: str, count: int, limit: int) -> JsonRpcError:
    return JsonRpcError(
        SERVER_BUSY, f"exceed max addresses or topics per search position: {count} {what}, "
        f"at most {limit} (max_log_query_list)"
    )  # fmt: skip

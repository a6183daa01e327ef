"""Read-your-writes: a client that saw its transaction mined can read the state it produced.

The Leader's execution client knows a block before the state nodes have ingested it. Until a
`latest` read can be answered at that block, a transaction lookup shows the transaction as
not mined yet (`UNMINED_FIELDS`), and a lookup the state nodes answer `null` (a pending
transaction lives only in the Leader's execution client) is asked of the Leader next.
"""

from __future__ import annotations

from typing import Any

import orjson

from chainstate.jsonrpc import METHOD_NOT_FOUND
from proxy.methods import LEADER_FALLBACK
from proxy.model import Pool
from proxy.reads import Reads
from proxy.request import Item
from proxy.select import Selector

# Answers that show the block a transaction was mined in, and what hides it: the whole
# receipt (null, as for a pending transaction), or the transaction's block fields.
UNMINED_FIELDS = {
    "eth_getTransactionReceipt": None,
    "eth_getTransactionByHash": ("blockHash", "blockNumber", "transactionIndex"),
}


def hide_unreadable(method: str, answer: dict[str, Any], readable: int | None) -> bool:
    """Show the transaction of `answer` as pending when its block is above `readable`
    (None: no reader to wait for). Returns whether `answer` was changed."""
    result = answer.get("result")
    if readable is None or not isinstance(result, dict):
        return False
    try:
        number = int(result.get("blockNumber"), 16)
    except (TypeError, ValueError):
        return False  # pending already, or not a transaction object
    if number <= readable:
        return False
    fields = UNMINED_FIELDS[method]
    answer["result"] = None if fields is None else {**result, **dict.fromkeys(fields)}
    return True


def not_held(answer: dict[str, Any]) -> bool:
    """Whether a reader's answer to a transaction lookup says it does not hold it: `null`,
    or "method not found" (a state node that does not serve it: the Leader's client does)."""
    error = answer.get("error")
    if error is None:
        return answer.get("result") is None
    return type(error) is dict and error.get("code") == METHOD_NOT_FOUND


def not_held_raw(raw: bytes) -> bool:
    """`not_held` of a single answer's bytes."""
    if raw.find(b"null") < 0 and raw.find(b"-32601") < 0:
        return False
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    return type(answer) is dict and not_held(answer)


def to_leader(pool: Pool, it: Item) -> bool:
    """A transaction the state nodes do not hold (`null`) is asked of the Leader next; False
    when there is none, or the Leader answered already."""
    if it.spec.writer or pool.leader_node() is None:
        return False
    it.spec = LEADER_FALLBACK[it.method]
    return True


class ReadYourWrites:
    """What a `latest` read is answered at now, and the answers it hides."""

    def __init__(self, selector: Selector, reads: Reads | None) -> None:
        self.selector = selector
        self.reads = reads

    def readable(self, pool: Pool) -> int | None:
        """The highest block a `latest` read is answered at now (`Selector.readable_head`),
        never below the one the pool's `latest` reached (proxy/heads.py): a transaction in
        a block up to it is shown as mined."""
        readable = self.selector.readable_head(pool)
        view = None if self.reads is None else self.reads.heads.views.get(pool.id)
        floor = None if view is None else view.floor
        if readable is None or floor is None:
            return readable
        return max(readable, floor)

    def view(self, pool: Pool, method: str, raw: bytes) -> bytes:
        """`raw` with a transaction whose block the pool cannot read yet shown as pending."""
        if method not in UNMINED_FIELDS:
            return raw
        try:
            answer = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return raw
        if isinstance(answer, dict) and hide_unreadable(method, answer, self.readable(pool)):
            return orjson.dumps(answer)
        return raw

"""A node's upstream budget and rate-limit backoff: what keeps the proxy inside a provider's
limits, the way it keeps a client inside its own.

- **Budget**: a node entry's `budget` (requests per second, 0: none) is a token bucket of
  one second; an attempt sent to the node takes a token. A node whose bucket is empty is out
  of rotation until a token is back.
- **Backoff**: a node that answers HTTP 429 or a rate-limit JSON-RPC error (`limited`) is out
  of rotation for `BACKOFF_FIRST` seconds, doubled for each rate limit in a row up to
  `BACKOFF_MAX`, and its item is retried on another node; an answer that is not a rate limit
  ends the row.

Out of rotation means `Node.blocked`, as an open breaker does: the routes skip the node
while another is eligible, and try it anyway when every node is out (failing open beats
refusing everything). The state is shown by getAllNodes (`to_obj`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import orjson

BACKOFF_FIRST = 1.0  # seconds out after a first rate limit
BACKOFF_MAX = 30.0  # the longest backoff
# JSON-RPC error codes providers answer a rate limit with: -32005 (EIP-1474 "limit
# exceeded", Infura), -32007 and -32029 (QuickNode, Chainstack), 429 (Alchemy)
LIMIT_CODES = frozenset({-32005, -32007, -32029, 429})
# ... and texts of their messages, whatever the code (lower case)
LIMIT_TEXTS = ("rate limit", "too many requests", "request limit", "limit exceeded", "rate-limit")
_MARKS = (b"-32005", b"-32007", b"-32029", b"429", b"limit", b"too many")  # (lower case)
# ... but an answer refusing the request's size is no rate limit, whatever its code: the
# node is well and any other would refuse the same request (our nodes' budgets, named by
# their settings, and providers' "query returned more than N results")
TOO_LARGE_TEXTS = (
    "batch_answer_bytes",
    "max_logs_per_response",
    "max_blocks_per_query",
    "max addresses or topics",
    "too many slots",
    "query returned more than",
)
_TOO_LARGE_MARKS = tuple(t.encode() for t in TOO_LARGE_TEXTS)
# Answers above this size are peeked at near each `"error"` only (its code and message), not
# lower-cased whole: a batch of big eth_getLogs answers is tens of MB.
WHOLE_PEEK_BYTES = 64 * 1024
ERROR_WINDOW = 4096


def limited(raw: bytes) -> bool:
    """Whether a node's answer (a single answer or a batch) says it is rate limited: an error
    with one of LIMIT_CODES, or a message with one of LIMIT_TEXTS (not a revert's, whose
    text is the contract's). Peeks before it decodes: an answer without an error costs one
    `find`, an error without a mark a few more."""
    if not _may_be_limited(raw):
        return False
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    answers = obj if isinstance(obj, list) else [obj]
    return any(isinstance(a, dict) and limited_error(a.get("error")) for a in answers)


def _may_be_limited(raw: bytes) -> bool:
    """Whether some error in `raw` holds a rate-limit mark and is not a size refusal (then
    `raw` is decoded to be sure): small answers are peeked at whole, big ones at each error
    (from its `"error"` key to the next, at most ERROR_WINDOW bytes)."""
    at = raw.find(b'"error"')
    if at < 0:
        return False
    if len(raw) <= WHOLE_PEEK_BYTES:  # (only an answer holding an error pays for the copy)
        return _marked(raw.lower())
    while at >= 0:
        following = raw.find(b'"error"', at + 7)
        end = at + ERROR_WINDOW if following < 0 else min(following, at + ERROR_WINDOW)
        if _marked(raw[at:end].lower()):
            return True
        at = following
    return False


def _marked(low: bytes) -> bool:
    """Whether errors (lower case) hold a rate-limit mark, unless each refuses a size."""
    if not any(low.find(mark) >= 0 for mark in _MARKS):
        return False
    too_large = sum(low.count(mark) for mark in _TOO_LARGE_MARKS)
    return too_large < low.count(b'"error"')


def limited_error(err: Any) -> bool:
    """Whether one JSON-RPC error object is a rate limit."""
    if not isinstance(err, dict):
        return False
    code = err.get("code")
    message = err.get("message")
    text = message.lower() if isinstance(message, str) else ""
    if any(t in text for t in TOO_LARGE_TEXTS):
        return False
    if code in LIMIT_CODES and code is not True:
        return True
    if not text or code == 3:  # 3: a revert, its text the contract's
        return False
    return "revert" not in text and any(t in text for t in LIMIT_TEXTS)


class NodeBudget:
    """One node's budget and backoff. `changed` recomputes the node's `blocked`."""

    __slots__ = (
        "backoff",
        "cap",
        "changed",
        "limited_total",
        "out_until",
        "over_total",
        "rate",
        "stamp",
        "strikes",
        "timer",
        "tokens",
    )

    def __init__(self, rate: float, changed: Callable[[], None]) -> None:
        self.rate = rate  # requests per second (0: no budget)
        self.cap = max(1.0, rate)  # a second of it, at least one request
        self.tokens = self.cap
        self.stamp = time.monotonic()
        self.changed = changed
        self.strikes = 0  # rate limits in a row
        self.backoff = 0.0  # the current backoff's length
        self.out_until = 0.0  # monotonic time the node is back (0: in rotation)
        self.timer: asyncio.TimerHandle | None = None
        self.limited_total = 0  # rate limits the node answered
        self.over_total = 0  # times its budget ran out

    @property
    def out(self) -> bool:
        return self.out_until > 0.0

    def retune(self, rate: float) -> None:
        """A new budget for the node (its entry changed)."""
        self.rate = rate
        self.cap = max(1.0, rate)
        self.tokens = min(self.tokens, self.cap) if rate else self.cap

    def spend(self) -> None:
        """An attempt sent to the node: a token of its budget (no-op without one)."""
        if not self.rate:
            return
        now = time.monotonic()
        tokens = self.tokens + (now - self.stamp) * self.rate
        self.stamp = now
        tokens = (tokens if tokens < self.cap else self.cap) - 1.0
        self.tokens = tokens
        if tokens < 1.0:
            self.over_total += 1
            self._out(now, (1.0 - tokens) / self.rate)

    def rate_limited(self) -> None:
        """The node answered a rate limit: out for the next backoff of the row."""
        self.limited_total += 1
        self.strikes += 1
        self.backoff = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (self.strikes - 1))
        self._out(time.monotonic(), self.backoff)

    def answered(self) -> None:
        """An answer that is no rate limit ends the row of backoffs."""
        self.strikes = 0

    def _out(self, now: float, seconds: float) -> None:
        until = now + seconds
        if until <= self.out_until:
            return
        self.out_until = until
        if self.timer is not None:
            self.timer.cancel()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # (no loop to wake it: back at once)
            self.out_until = 0.0
            return
        else:
            self.timer = loop.call_later(seconds, self._back)
        self.changed()

    def _back(self) -> None:
        self.timer = None
        self.out_until = 0.0
        self.changed()

    def to_obj(self) -> dict[str, Any]:
        """getAllNodes' view."""
        now = time.monotonic()
        tokens = self.tokens + (now - self.stamp) * self.rate
        return {
            "budget_per_s": self.rate or None,
            "budget_left": round(min(tokens, self.cap), 3) if self.rate else None,
            "backed_off": self.out,
            "back_in_s": round(max(0.0, self.out_until - now), 3) if self.out else 0.0,
            "rate_limited": self.limited_total,
            "rate_limits_in_a_row": self.strikes,
            "budget_spent": self.over_total,
        }

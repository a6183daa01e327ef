"""Step 5 of routing in one place: what an attempt's result means for the item and the node.

Every result of an upstream attempt — a transport failure (an `UpstreamError` subclass, which
carries its outcome), an HTTP status, a JSON-RPC answer — is one `Outcome` here, and the
pipeline's retry loop acts on its flags only: `retry` (send the item again, to another
node), `prefer_archive` (that next node should be an archive node), `penalise` (count it
against the node's breaker: the node, not the request, is at fault). Nothing else in the
proxy decides what a result means.
"""

from __future__ import annotations

from typing import Any, ClassVar

import orjson

from chainstate.jsonrpc import BLOCK_NOT_FOUND, EVM_FAILED, RETRYABLE_CODES, TIME_LIMIT
from proxy.tenancy.nodebudget import limited, limited_error

UNSUPPORTED_PRECOMPILE = -39008


class Outcome:
    """What one result means; `name` is the label in metrics, traces and retry reasons."""

    __slots__ = ("final", "name", "penalise", "prefer_archive", "retry")

    def __init__(
        self, name: str, retry: bool, penalise: bool, prefer_archive: bool = False
    ) -> None:
        self.name = name
        self.retry = retry  # send the item again, to a node it has not tried
        self.penalise = penalise  # the node is at fault: counts toward opening its breaker
        self.prefer_archive = prefer_archive  # the next node should be an archive node
        self.final = not retry

    def __repr__(self) -> str:
        return f"Outcome({self.name})"


# Answers: the node answered the item.
OK = Outcome("ok", retry=False, penalise=False)
ERROR = Outcome("error", retry=False, penalise=False)  # a JSON-RPC error of the node: final
BLOCK_MISSING = Outcome("block_not_found", retry=True, penalise=False, prefer_archive=True)
PRECOMPILE = Outcome("unsupported_precompile", retry=True, penalise=False)
RETRYABLE = Outcome("retryable", retry=True, penalise=False)  # another code of RETRYABLE_CODES
MISSING = Outcome("missing_answer", retry=True, penalise=True)  # a batch answer without it
# A transaction the state nodes do not hold (`null`): asked of the Leader next (a pending one)
NOT_HELD = Outcome("not_held", retry=True, penalise=False)

# The node's rate limit (HTTP 429, or a rate-limit error in its answer): the node is backed
# off (proxy/tenancy/nodebudget.py) and the item retried elsewhere; not a fault of the node.
RATE_LIMITED = Outcome("rate_limited", retry=True, penalise=False)

# Transport: the attempt got no usable answer.
CONNECT = Outcome("connect", retry=True, penalise=True)
TIMEOUT = Outcome("timeout", retry=True, penalise=True)
HTTP = Outcome("http", retry=True, penalise=True)
INPROC = Outcome("inproc", retry=True, penalise=True)
BAD_RESPONSE = Outcome("bad_response", retry=True, penalise=True)
# The proxy's own limits, not the node's fault: the attempt waited for a connection slot or
# for room in the buffered-bytes budget until its deadline. Retried, never penalised.
SATURATED = Outcome("saturated", retry=True, penalise=False)
# An answer larger than max_answer_bytes: every node would give the same one. Final.
TOO_LARGE = Outcome("too_large", retry=False, penalise=False)
# A call the node's EVM stopped at its time limit by the call's own cost (-39004 with
# `data.reason` TIME_LIMIT): another node would spend the same. Final, not the node's fault.
# (A call that only waited in a node's queue past the attempt's deadline is a `timeout`,
# retried elsewhere: the node takes it off its queue.)
CALL_TIMEOUT = Outcome("call_timeout", retry=False, penalise=False)

_BY_CODE = {BLOCK_NOT_FOUND: BLOCK_MISSING, UNSUPPORTED_PRECOMPILE: PRECOMPILE}


class UpstreamError(Exception):
    """An attempt that got no usable answer; each subclass carries what that means
    (`outcome`: retried or final, the node penalised or not)."""

    outcome: ClassVar[Outcome] = BAD_RESPONSE

    def __init__(self, detail: str) -> None:
        super().__init__(f"{self.outcome.name}: {detail}")

    @property
    def kind(self) -> str:
        """The failure's label in metrics and spans."""
        return self.outcome.name


class ConnectFailed(UpstreamError):
    """No connection, or it broke before the answer was complete."""

    outcome = CONNECT


class TimedOut(UpstreamError):
    """No answer within the attempt's limit."""

    outcome = TIMEOUT


class HttpFailed(UpstreamError):
    """An HTTP status that carries no JSON-RPC answer (5xx, most 4xx)."""

    outcome = HTTP


class NodeFailed(UpstreamError):
    """An in-process node raised, or dropped the request."""

    outcome = INPROC


class BadResponse(UpstreamError):
    """An answer that is not JSON-RPC, or lacks an item's answer."""

    outcome = BAD_RESPONSE


class Saturated(UpstreamError):
    """The proxy's own limit held the attempt up until its deadline."""

    outcome = SATURATED


class TooLarge(UpstreamError):
    """An answer over max_answer_bytes."""

    outcome = TOO_LARGE


class RateLimited(UpstreamError):
    """The node's rate limit (HTTP 429): the node is backed off, the item retried elsewhere."""

    outcome = RATE_LIMITED


def of_code(code: int) -> Outcome:
    """The outcome of an answer carrying one of RETRYABLE_CODES."""
    return _BY_CODE.get(code, RETRYABLE)


def of_answer(answer: dict[str, Any]) -> Outcome:
    """The outcome of one decoded answer object."""
    err = answer.get("error")
    if err is None:
        return OK
    if isinstance(err, dict):
        code = err.get("code")
        if code in RETRYABLE_CODES:
            return of_code(code)
        if code == EVM_FAILED and _time_limit(err.get("data")):
            return CALL_TIMEOUT
        if limited_error(err):
            return RATE_LIMITED
    return ERROR


def _time_limit(data: Any) -> bool:
    return isinstance(data, dict) and data.get("reason") == TIME_LIMIT


def of_raw(raw: bytes) -> Outcome:
    """The outcome of a single answer's bytes, peeking before decoding anything: an answer
    without `-3900` in it is never retried, so it is not decoded.

    (`partition`, never `in`: bytes' `in` first tries its operand as an int and formats the
    TypeError it clears, ~2k instructions per test, and this runs twice per answer; and not
    `find`, whose arguments are parsed as a tuple: `partition`'s one argument costs a third
    of that.)"""
    if not raw.partition(b"-3900")[1]:
        if not raw.partition(b'"error"')[1]:
            return OK
        return RATE_LIMITED if limited(raw) else ERROR
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return ERROR
    return of_answer(obj) if isinstance(obj, dict) else ERROR


_RETRY_MARKS = tuple(b"%d" % code for code in RETRYABLE_CODES)


def answered(raw: bytes) -> str:
    """The label of an attempt the node answered (metrics and spans): `ok`, or the outcome
    of a single answer asking for a retry, or `retryable` for a batch answer with such an
    item (the engine classifies each item; this only names the attempt). An answer without
    `"error"` is `ok` after one scan: a retry and a rate limit are both errors."""
    if not raw.partition(b'"error"')[1]:  # (`partition`: see `of_raw`)
        return OK.name
    if not raw.partition(b"-3900")[1]:
        return RATE_LIMITED.name if limited(raw) else OK.name
    if raw.lstrip()[:1] == b"[":
        return RETRYABLE.name if any(raw.find(mark) >= 0 for mark in _RETRY_MARKS) else OK.name
    result = of_raw(raw)
    return result.name if result.retry else OK.name

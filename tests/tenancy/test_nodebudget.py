"""Which node answers are rate limits, and how a node's budget and backoff move (no I/O)."""

from __future__ import annotations

import orjson
import pytest

from proxy import outcome
from proxy.outcome import RateLimited
from proxy.tenancy.nodebudget import BACKOFF_MAX, NodeBudget, limited
from proxy.transport import http_answer


def _error(code: int, message: str, rid: int = 1) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}


@pytest.mark.parametrize(
    "answer",
    [
        _error(-32005, "limit exceeded"),
        _error(-32005, "daily request count exceeded, request rate limited"),
        _error(429, "Your app has exceeded its compute units per second capacity"),
        _error(-32007, "100/second request limit reached"),
        _error(-32000, "Too Many Requests"),
        _error(-32603, "rate limit exceeded, retry later"),
        [{"jsonrpc": "2.0", "id": 1, "result": "0x1"}, _error(-32005, "limit exceeded", 2)],
    ],
)
def test_rate_limit_answers(answer: object) -> None:
    raw = orjson.dumps(answer)
    assert limited(raw)
    if isinstance(answer, dict):
        assert outcome.of_raw(raw) is outcome.RATE_LIMITED
        assert outcome.answered(raw) == "rate_limited"


@pytest.mark.parametrize(
    "answer",
    [
        {"jsonrpc": "2.0", "id": 1, "result": "0x429"},
        {"jsonrpc": "2.0", "id": 1, "result": "rate limit"},  # a result's text is data
        _error(3, "execution reverted: rate limit exceeded"),  # the contract's text
        _error(-32000, "execution reverted: too many requests"),
        _error(-32602, "invalid params"),
        _error(-32000, "nonce too low"),
    ],
)
def test_answers_that_are_no_rate_limit(answer: object) -> None:
    raw = orjson.dumps(answer)
    assert not limited(raw)
    assert outcome.of_raw(raw) is not outcome.RATE_LIMITED


def test_an_http_429_is_a_rate_limit_retried_without_penalty() -> None:
    with pytest.raises(RateLimited) as caught:
        http_answer("http://node:8545", 429, b"Too Many Requests")
    result = caught.value.outcome
    assert result is outcome.RATE_LIMITED and result.retry and not result.penalise


async def test_backoff_doubles_and_ends_with_an_answer() -> None:
    changes: list[bool] = []
    budget = NodeBudget(0, lambda: changes.append(budget.out))
    budget.rate_limited()
    first = budget.backoff
    budget.rate_limited()
    assert budget.backoff == 2 * first and budget.out and changes[-1] is True
    for _ in range(20):
        budget.rate_limited()
    assert budget.backoff == BACKOFF_MAX
    budget.answered()
    budget.rate_limited()
    assert budget.backoff == first


async def test_a_budget_takes_the_node_out_when_spent() -> None:
    budget = NodeBudget(3, lambda: None)
    budget.spend()
    budget.spend()
    assert not budget.out
    budget.spend()
    assert budget.out and budget.to_obj()["budget_spent"] == 1
    budget.retune(0)
    assert budget.to_obj()["budget_per_s"] is None


@pytest.mark.parametrize(
    "message",
    [
        "the answers of this batch passed 33554432 bytes (batch_answer_bytes): this item was "
        "not run; ask for it in another request",
        "query exceeds max results 10000 (max_logs_per_response)",
        "query exceeds max block range 10000: 20001 blocks [0x0, 0x4e20] (max_blocks_per_query)",
        "query returned more than 10000 results",  # Infura's, also -32005
    ],
)
def test_a_refusal_of_the_requests_size_is_no_rate_limit(message: str) -> None:
    """-32005 is also what nodes answer a request too large for them: the node is well (no
    backoff) and any other would refuse the same request (no retry)."""
    raw = orjson.dumps(_error(-32005, message))
    assert not limited(raw)
    assert outcome.of_raw(raw) is outcome.ERROR
    assert outcome.answered(raw) == "ok"


def _big_batch(*errors: dict) -> bytes:
    big = {"jsonrpc": "2.0", "id": 0, "result": [{"data": "0x" + "ab" * 200_000}]}
    return orjson.dumps([big, *errors, big])


def test_a_big_batch_answer_is_peeked_at_each_error() -> None:
    refused = _error(-32005, "the answers of this batch passed 1 bytes (batch_answer_bytes)", 2)
    assert not limited(_big_batch(*[refused] * 30))
    assert limited(_big_batch(*[refused] * 30, _error(-32005, "limit exceeded", 3)))
    assert limited(_big_batch(_error(-32000, "Too Many Requests", 3), *[refused] * 3))
    revert = _error(3, "execution reverted: rate limit exceeded", 3)
    assert not limited(_big_batch(revert))

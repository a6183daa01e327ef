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

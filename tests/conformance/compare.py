"""Sends every case to the proxy and to anvil and says, for each, whether the answers are
equal, different in a way the table of listed differences allows (docs/proxy.md,
"Conformance with a full node"; `rules.py`), or different.

Two answers are equal when both are results and the results are equal, or both are errors
with the same `code` and the same `data` (error messages are worded differently by every
implementation and are not compared). anvil is asked again when the first answers differ:
what it says may change between two requests (the pending block's timestamp), and ours must
then equal one of the two.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.conformance.cases import Case
from tests.conformance.chain import Chain
from tests.conformance.rpc import Rpc

BATCH_SIZE = 50


def same(ours: Any, anvil: Any) -> bool:
    if isinstance(ours, list) and isinstance(anvil, list):
        return len(ours) == len(anvil) and all(map(same, ours, anvil))
    if not isinstance(ours, dict) or not isinstance(anvil, dict):
        return ours == anvil
    if "result" in ours and "result" in anvil:
        return ours["result"] == anvil["result"]
    if "error" in ours and "error" in anvil:
        mine, theirs = ours["error"], anvil["error"]
        if not isinstance(mine, dict) or not isinstance(theirs, dict):
            return False
        return mine.get("code") == theirs.get("code") and mine.get("data") == theirs.get("data")
    return False


@dataclass
class Outcome:
    case: Case
    ours: Any
    anvil: Any
    verdict: str = "equal"  # "equal", "allowed" or "different"
    rule: str = ""  # the listed difference that allows it
    batch: Any = None  # ours inside a batch, when that differs from ours alone
    compared: tuple[str, Any] | None = None  # a rule's own reference answer, when it failed


@dataclass
class Context:
    """What the rules may use: both endpoints, the chain, the heights our tags resolved to."""

    proxy: Rpc
    anvil: Rpc
    chain: Chain
    tag_heights: dict[str, int] = field(default_factory=dict)


def ask(rpc: Rpc, case: Case) -> Any:
    if case.flow is not None:
        return case.flow(rpc)
    return rpc.request(case.method, *case.params)


def tag_heights(rpc: Rpc) -> dict[str, int]:
    """The height `safe`, `finalized` and `latest` name on this endpoint right now."""
    heights = {}
    for tag in ("latest", "safe", "finalized"):
        block = rpc.request("eth_getBlockByNumber", tag, False).get("result")
        if isinstance(block, dict) and "number" in block:
            heights[tag] = int(block["number"], 16)
    return heights


def run(
    cases: list[Case], ctx: Context, allows: Callable[[Outcome, Context], str]
) -> list[Outcome]:
    """Every case asked of both; `allows` names the listed rule that allows a difference
    (the rules build on this module, so they come in as a parameter)."""
    outcomes = []
    for case in cases:
        anvil = ask(ctx.anvil, case)
        ours = ask(ctx.proxy, case)
        outcome = Outcome(case, ours, anvil)
        if not same(ours, anvil) and case.flow is None:
            again = ask(ctx.anvil, case)
            if same(ours, again):
                outcome.anvil = again
        if not same(outcome.ours, outcome.anvil):
            rule = allows(outcome, ctx)
            outcome.verdict, outcome.rule = ("allowed", rule) if rule else ("different", "")
        outcomes.append(outcome)
    return outcomes


def run_batches(outcomes: list[Outcome], proxy: Rpc) -> list[Outcome]:
    """Sends every plain read again in batches through the proxy; a batch must answer each
    item as the same request alone. Returns the outcomes whose batch answer differs."""
    items = [o for o in outcomes if o.case.batchable]
    differ = []
    for start in range(0, len(items), BATCH_SIZE):
        chunk = items[start : start + BATCH_SIZE]
        body = [
            {"jsonrpc": "2.0", "id": i, "method": o.case.method, "params": o.case.params}
            for i, o in enumerate(chunk)
        ]
        answers = proxy.post(body)
        by_id = {a.get("id"): a for a in answers} if isinstance(answers, list) else {}
        for i, outcome in enumerate(chunk):
            got = by_id.get(i, answers)
            if not same(got, outcome.ours) and not same(got, ask(proxy, outcome.case)):
                outcome.batch = got
                differ.append(outcome)
    return differ

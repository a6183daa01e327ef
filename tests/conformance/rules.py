"""The listed differences: when the proxy may answer otherwise than anvil, and why.

Each rule has an id, and the table of docs/proxy.md, "Conformance with a full node", has one
row per id with the methods, the case, both answers and the reason; a test keeps the two in
step. A rule
allows a difference only under its exact condition (the method, the kind of case, both
answers' shape), never a whole method.

Two kinds: *shape* rules say two answers are equivalent though not equal (anvil's extra
`totalDifficulty`); *reference* rules say which other answer of anvil ours must equal (anvil
asked at the height ours named for `safe`) — compared again with the shape rules, so one
case may need two rules ("safe-finalized+total-difficulty").
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conformance.cases import Case
from tests.conformance.compare import Context, Outcome, same, tag_heights
from tests.conformance.rpc import RpcError
from tests.conformance.spec import methods, result_violations

# The table of listed differences lives in the user docs, where clients read it.
ALLOWED_MD = Path(__file__).parents[2] / "docs" / "proxy.md"
ALLOWED_HEADING = "#### Conformance with a full node: the listed differences"

ShapeRule = Callable[[Case, Any, Any], bool]
ReferenceRule = Callable[[Outcome, Context], str]
SHAPE_RULES: dict[str, ShapeRule] = {}
REFERENCE_RULES: dict[str, ReferenceRule] = {}

BLOCK_TRACES = ("debug_traceBlockByNumber", "debug_traceBlockByHash")


def shape(rule_id: str) -> Callable[[ShapeRule], ShapeRule]:
    def register(fn: ShapeRule) -> ShapeRule:
        SHAPE_RULES[rule_id] = fn
        return fn

    return register


def reference(rule_id: str) -> Callable[[Callable[[Outcome, Context], bool | str]], ReferenceRule]:
    def register(fn: Callable[[Outcome, Context], bool | str]) -> ReferenceRule:
        def named(o: Outcome, ctx: Context) -> str:
            found = fn(o, ctx)
            if not found:
                return ""
            return rule_id if found is True else f"{rule_id}+{found}"

        REFERENCE_RULES[rule_id] = named
        return named

    return register


def result(answer: Any) -> Any:
    return answer.get("result") if isinstance(answer, dict) else None


def error_code(answer: Any) -> int | None:
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        return answer["error"].get("code")
    return None


def is_error(answer: Any) -> bool:
    return isinstance(answer, dict) and "error" in answer


def standard_code(code: int | None) -> bool:
    """A code client libraries know for a refused request: JSON-RPC's own, geth's -32000,
    EIP-1474's -3200x, or 3 (revert); never the state node's -39xxx (they stay between the
    nodes and the proxy) and never -32601 (the method is there)."""
    return code is not None and code != -32601 and (code == 3 or -32700 <= code <= -32000)


def equivalent(case: Case, ours: Any, anvil: Any) -> bool | str:
    """True if equal; the shape rule's id if one allows the difference; else False."""
    if same(ours, anvil):
        return True
    for rule_id, check in SHAPE_RULES.items():
        if check(case, ours, anvil):
            return rule_id
    return False


# -- shape rules ----------------------------------------------------------------------------


@shape("client-version")
def client_version(case: Case, ours: Any, anvil: Any) -> bool:
    """Each names its own software."""
    return case.method == "web3_clientVersion" and all(
        isinstance(result(a), str) and result(a) for a in (ours, anvil)
    )


@shape("total-difficulty")
def total_difficulty(case: Case, ours: Any, anvil: Any) -> bool:
    """anvil adds `totalDifficulty` to blocks; it left the spec's Block and geth's answers
    with the merge. Ours may leave it out; everything else equal."""
    if case.method not in ("eth_getBlockByNumber", "eth_getBlockByHash"):
        return False
    block = result(anvil)
    if not isinstance(block, dict) or "totalDifficulty" not in block:
        return False
    return result(ours) == {k: v for k, v in block.items() if k != "totalDifficulty"}


@shape("struct-logs")
def struct_logs(case: Case, ours: Any, anvil: Any) -> bool:
    """The default (struct log) tracer: anvil 1.7.1 answers empty `structLogs`; ours lists
    the executed steps. Everything else of each trace (gas, failed, returnValue) equal."""
    if case.method not in ("debug_traceTransaction", "debug_traceCall", *BLOCK_TRACES):
        return False
    mine, theirs = result(ours), result(anvil)
    if case.method in BLOCK_TRACES:
        if not isinstance(mine, list) or not isinstance(theirs, list) or len(mine) != len(theirs):
            return False
        pairs = [(m.get("result"), t.get("result")) for m, t in zip(mine, theirs, strict=True)]
        if any(m.get("txHash") != t.get("txHash") for m, t in zip(mine, theirs, strict=True)):
            return False
    else:
        pairs = [(mine, theirs)]
    steps_only = [only_steps_differ(m, t) for m, t in pairs]
    return all(d is not False for d in steps_only) and True in steps_only


def only_steps_differ(mine: Any, theirs: Any) -> bool | None:
    """True if the two traces differ only in ours having struct logs where anvil has none;
    None if they are equal; False otherwise."""
    if mine == theirs:
        return None
    if not isinstance(mine, dict) or not isinstance(theirs, dict) or theirs.get("structLogs"):
        return False

    def rest(trace: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in trace.items() if k != "structLogs"}

    return bool(mine.get("structLogs")) and rest(mine) == rest(theirs)


@shape("anvil-lacks-method")
def anvil_lacks_method(case: Case, ours: Any, anvil: Any) -> bool:
    """anvil does not have the method; ours answers it: a result that fits the spec's result
    schema, or for params the spec rejects an error with a standard code."""
    if error_code(anvil) != -32601 or case.method not in methods():
        return False
    if case.invalid or case.expected_error:
        return is_error(ours) and standard_code(error_code(ours))
    return "result" in ours and not result_violations(case.method, ours["result"])


def null_for_not_found(method: str) -> bool:
    """The method answers `null` for a block or transaction that does not exist."""
    if method in methods():
        return not result_violations(method, None)
    return method.startswith("eth_getUncle")


@shape("anvil-error-for-null")
def anvil_error_for_null(case: Case, ours: Any, anvil: Any) -> bool:
    """A block, transaction or uncle that does not exist: anvil answers an error for some of
    these methods where the spec and geth answer `null`; ours answers `null`."""
    mine = ours if isinstance(ours, dict) else {}
    return (
        null_for_not_found(case.method)
        and case.missing
        and is_error(anvil)
        and "result" in mine
        and mine["result"] is None
    )


@shape("missing-block-code")
def missing_block_code(case: Case, ours: Any, anvil: Any) -> bool:
    """State, calls, logs or traces at a block the chain does not have (a height above the
    head, an unknown hash), where the answer is an error and not `null`: both answer an
    error; anvil's code is its own (-32602 "BlockOutOfRangeError", -32001 "Resource not
    found"), ours a standard one (geth: -32000 "header not found")."""
    return (
        not null_for_not_found(case.method)
        and case.missing
        and is_error(anvil)
        and is_error(ours)
        and standard_code(error_code(ours))
    )


@shape("spec-expected-error")
def spec_expected_error(case: Case, ours: Any, anvil: Any) -> bool:
    """The spec's own test expects an error (geth's answer on the spec's chain): ours
    answers it with the spec's code (and its `data`, if the spec gives one); anvil answers
    something else."""
    want = case.expected_error
    if not want or not is_error(ours) or error_code(ours) != want.get("code"):
        return False
    return "data" not in want or ours["error"].get("data") == want["data"]


@shape("access-list-of-a-revert")
def access_list_of_a_revert(case: Case, ours: Any, anvil: Any) -> bool:
    """`eth_createAccessList` of a call that reverts: anvil answers the revert as an error
    (code 3); the spec (and geth) answer the access list with the failure in `error`. Ours
    answers that, fitting the spec's result schema."""
    mine = result(ours)
    return (
        case.method == "eth_createAccessList"
        and error_code(anvil) == 3
        and isinstance(mine, dict)
        and bool(mine.get("error"))
        and not result_violations(case.method, mine)
    )


@shape("anvil-halt-code")
def anvil_halt_code(case: Case, ours: Any, anvil: Any) -> bool:
    """A call that runs out of gas: anvil answers -32603 "EVM error OutOfGas"; geth and
    ours -32000 "out of gas"."""
    return (
        case.method in ("eth_call", "eth_estimateGas")
        and error_code(anvil) == -32603
        and "OutOfGas" in str(anvil["error"].get("message"))
        and error_code(ours) == -32000
    )


@shape("anvil-accepts-invalid")
def anvil_accepts_invalid(case: Case, ours: Any, anvil: Any) -> bool:
    """Params the spec rejects (a height without `0x`, a 33-byte storage key, a reversed or
    future `eth_getLogs` range): anvil answers them anyway; geth answers an error, and so
    does ours, with a standard code. (The spec's own such requests: `spec-expected-error`.)"""
    return case.invalid and "result" in anvil and is_error(ours) and standard_code(error_code(ours))


@shape("anvil-trace-of-nothing")
def anvil_trace_of_nothing(case: Case, ours: Any, anvil: Any) -> bool:
    """`debug_traceTransaction` of a hash that is no transaction: anvil answers an empty
    trace; geth (and the spec's test) an error; ours an error."""
    return (
        case.method == "debug_traceTransaction"
        and case.missing
        and "result" in anvil
        and is_error(ours)
        and standard_code(error_code(ours))
    )


@shape("anvil-empty-trace-for-null")
def anvil_empty_trace_for_null(case: Case, ours: Any, anvil: Any) -> bool:
    """`trace_block` of a block, `trace_transaction` of a transaction that does not exist:
    anvil answers `[]`; reth and erigon (the trace namespace's references) and ours `null`."""
    mine = ours if isinstance(ours, dict) else {}
    return (
        case.method in ("trace_block", "trace_transaction")
        and case.missing
        and result(anvil) == []
        and "result" in mine
        and mine["result"] is None
    )


@shape("filter-changes-history")
def filter_changes_history(case: Case, ours: Any, anvil: Any) -> bool:
    """A log filter whose range starts in the past: anvil's first `eth_getFilterChanges`
    answers the past logs too; geth's and ours only the logs of blocks added after the filter
    was made (the past ones come from `eth_getFilterLogs`). Every other step equal."""
    if case.method != "eth_newFilter" or not isinstance(ours, list) or len(ours) != len(anvil):
        return False
    steps = [i for i, (a, b) in enumerate(zip(ours, anvil, strict=True)) if not same(a, b)]
    return steps == [2] and result(ours[2]) == [] and result(anvil[2]) == result(anvil[1])


# -- reference rules ------------------------------------------------------------------------


@reference("safe-finalized")
def safe_finalized(o: Outcome, ctx: Context) -> bool | str:
    """Ours resolve `safe`/`finalized` to the checker's confirmed head; anvil to fixed
    distances below its head. Equivalent to anvil's answer at the height ours names (asked
    again, with ours, if the confirmed head moved meanwhile)."""
    text = json.dumps(o.case.params)
    tags = [t for t in ("safe", "finalized") if f'"{t}"' in text]
    if not tags or o.case.flow is not None:
        return False
    ours = o.ours
    for _ in range(2):
        heights = tag_heights(ctx.proxy)
        if any(tag not in heights for tag in tags):
            return False
        concrete = text
        for tag in tags:
            concrete = concrete.replace(f'"{tag}"', json.dumps(hex(heights[tag])))
        at_height = ctx.anvil.request(o.case.method, *json.loads(concrete))
        found = equivalent(o.case, ours, at_height)
        if found:
            return found
        ours = ctx.proxy.request(o.case.method, *o.case.params)
    o.compared = ("anvil at the height ours named", at_height)
    return False


@reference("anvil-requires-block")
def anvil_requires_block(o: Outcome, ctx: Context) -> bool | str:
    """The block parameter left out, which the spec makes optional (default `latest`): anvil
    rejects the call (-32602 "invalid length"); ours answers as at `latest`, equivalent to
    anvil's answer with `latest` given."""
    spec = methods().get(o.case.method)
    if spec is None or error_code(o.anvil) != -32602 or o.case.flow is not None:
        return False
    params = spec.get("params", [])
    given = len(o.case.params)
    if given >= len(params) or params[given].get("required") or params[given]["name"] != "Block":
        return False
    at_latest = ctx.anvil.request(o.case.method, *o.case.params, "latest")
    found = equivalent(o.case, o.ours, at_latest)
    if not found:
        o.compared = ("anvil with `latest` given", at_latest)
    return found


TRACED_TX = {
    "debug_traceTransaction": 0,
    "debug_traceBlockByNumber": None,
    "debug_traceBlockByHash": None,
}


def gas_before(ctx: Context, tx_hash: str) -> int:
    """The gas the transactions before `tx_hash` in its block used (anvil's receipt)."""
    receipt = ctx.anvil.call("eth_getTransactionReceipt", tx_hash)
    return int(receipt["cumulativeGasUsed"], 16) - int(receipt["gasUsed"], 16)


def without_gas_before(trace: Any, before: int) -> Any:
    """anvil's trace with the gas of the transactions before it taken off its total."""
    if not isinstance(trace, dict):
        return trace
    if isinstance(trace.get("gasUsed"), str):  # callTracer
        return {**trace, "gasUsed": hex(int(trace["gasUsed"], 16) - before)}
    if isinstance(trace.get("gas"), int) and "structLogs" in trace:  # struct logger
        return {**trace, "gas": trace["gas"] - before}
    return trace


@reference("anvil-cumulative-gas")
def anvil_cumulative_gas(o: Outcome, ctx: Context) -> bool | str:
    """Traces of a transaction that is not the first of its block: anvil 1.7.1 reports the
    block's gas used so far (the receipt's `cumulativeGasUsed`) as the transaction's own
    (`gasUsed` of the callTracer, `gas` of the struct logger). Equivalent once the gas of the
    transactions before it is taken off anvil's number."""
    if o.case.method not in ("debug_traceTransaction", *BLOCK_TRACES) or "result" not in o.anvil:
        return False
    theirs = o.anvil["result"]
    try:
        if o.case.method == "debug_traceTransaction":
            fixed: Any = without_gas_before(theirs, gas_before(ctx, o.case.params[0]))
        else:
            fixed = [
                {
                    **item,
                    "result": without_gas_before(
                        item.get("result"), gas_before(ctx, item["txHash"])
                    ),
                }
                for item in theirs
            ]
    except (KeyError, TypeError, ValueError, RpcError):
        return False
    if fixed == theirs:
        return False
    found = equivalent(o.case, o.ours, {**o.anvil, "result": fixed})
    return found if found is not True else True


def first_rule_that_allows(outcome: Outcome, ctx: Context) -> str:
    found = equivalent(outcome.case, outcome.ours, outcome.anvil)
    if isinstance(found, str):
        return found
    for check in REFERENCE_RULES.values():
        rule_id = check(outcome, ctx)
        if rule_id:
            return rule_id
    return ""


def rule_ids() -> list[str]:
    return [*SHAPE_RULES, *REFERENCE_RULES]


def listed_rule_ids() -> list[str]:
    """The rule ids of the listed-differences table in docs/proxy.md (first column, in
    backticks)."""
    ids = []
    text = ALLOWED_MD.read_text()
    section = text[text.index(ALLOWED_HEADING) :].split("\n#", 1)[0]
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0].startswith("`") and cells[0].endswith("`"):
            ids.append(cells[0].strip("`"))
    return ids

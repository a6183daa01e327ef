"""The listed differences allow only what they say: each rule takes its own case and refuses
the nearest answers that are wrong (no stack needed)."""

from __future__ import annotations

from typing import Any

from tests.conformance.cases import Case
from tests.conformance.compare import same
from tests.conformance.rules import (
    SHAPE_RULES,
    equivalent,
    null_for_not_found,
    standard_code,
    without_gas_before,
)
from tests.conformance.spec import result_violations


def ok(value: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "result": value}


def err(code: int, data: str | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": "anything"}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": 1, "error": error}


def test_equal_means_equal_results_or_equal_error_code_and_data() -> None:
    assert same(ok("0x1"), ok("0x1"))
    assert not same(ok("0x1"), ok("0x01"))
    assert same(err(3, "0x08c379a0"), err(3, "0x08c379a0"))  # messages are not compared
    assert not same(err(3, "0x08c379a0"), err(-39000, "0x08c379a0"))
    assert not same(err(3, "0x08c379a0"), err(3, "0x4e487b71"))
    assert not same(ok(None), err(-32000))


def test_standard_codes_exclude_internal_and_method_not_found() -> None:
    assert standard_code(-32000) and standard_code(-32602) and standard_code(3)
    assert not standard_code(-39006) and not standard_code(-32601) and not standard_code(None)


def test_null_for_not_found_only_as_null() -> None:
    rule = SHAPE_RULES["anvil-error-for-null"]
    case = Case("eth_getBlockTransactionCountByNumber", "not found: future height", ["0x99"])
    assert rule(case, ok(None), err(-32602))
    assert not rule(case, err(-39006), err(-32602))
    assert not rule(case, ok("0x0"), err(-32602))
    found = Case("eth_getBlockTransactionCountByNumber", "transfers", ["0x3"])
    assert not rule(found, ok(None), err(-32602))
    state = Case("eth_getBalance", "not found: future height", ["0x0", "0x99"])
    assert not rule(state, ok(None), err(-32602))  # state of a missing block is an error


def test_state_at_a_missing_block_needs_a_standard_error() -> None:
    rule = SHAPE_RULES["missing-block-code"]
    case = Case("eth_getBalance", "not found: future height", ["0x0", "0x99"])
    assert rule(case, err(-32000), err(-32602))
    assert not rule(case, err(-39006), err(-32602))
    assert not rule(case, err(-32601), err(-32602))
    assert not rule(case, ok("0x0"), err(-32602))
    block = Case("eth_getBlockByNumber", "not found: future height", ["0x99", False])
    assert not rule(block, err(-32000), err(-32602))  # a missing block is null, not an error


def test_total_difficulty_is_the_only_field_ours_may_leave_out() -> None:
    case = Case("eth_getBlockByNumber", "transfers full=False", ["0x3", False])
    anvil = ok({"number": "0x3", "transactions": ["0xaa"], "totalDifficulty": "0x0"})
    assert (
        equivalent(case, ok({"number": "0x3", "transactions": ["0xaa"]}), anvil)
        == "total-difficulty"
    )
    assert not equivalent(case, ok({"number": "0x3", "transactions": []}), anvil)
    assert not equivalent(case, ok({"number": "0x3"}), anvil)


def test_struct_logs_only_when_anvil_has_none_and_the_rest_is_equal() -> None:
    rule = SHAPE_RULES["struct-logs"]
    case = Case("debug_traceTransaction", "erc20_transfer struct logs", ["0xaa"])
    anvil = ok({"failed": False, "gas": 51444, "returnValue": "0x01", "structLogs": []})
    steps = [{"pc": 0, "op": "PUSH1"}]
    assert rule(
        case, ok({"failed": False, "gas": 51444, "returnValue": "0x01", "structLogs": steps}), anvil
    )
    assert not rule(
        case, ok({"failed": False, "gas": 51000, "returnValue": "0x01", "structLogs": steps}), anvil
    )
    assert not rule(
        case,
        ok({"failed": False, "gas": 51444, "returnValue": "0x01", "structLogs": []}),
        ok({"structLogs": steps}),
    )


def test_a_method_anvil_lacks_must_fit_the_spec_schema() -> None:
    rule = SHAPE_RULES["anvil-lacks-method"]
    case = Case("eth_baseFee", "no params")
    assert rule(case, ok("0x7"), err(-32601))
    assert result_violations("eth_baseFee", 7)
    assert not rule(case, ok(7), err(-32601))  # a JSON number, not a hex quantity
    assert not rule(case, err(-32601), err(-32601))


def test_invalid_params_need_an_error_from_ours() -> None:
    rule = SHAPE_RULES["anvil-accepts-invalid"]
    case = Case("eth_getBlockByNumber", "bad: height without 0x", ["12", False])
    assert rule(case, err(-32602), ok({"number": "0xc"}))
    assert not rule(case, err(-39007), ok({"number": "0xc"}))
    assert not rule(case, ok({"number": "0xc"}), ok({"number": "0xc"}))
    good = Case("eth_getBlockByNumber", "transfers full=False", ["0x3", False])
    assert not rule(good, err(-32602), ok({"number": "0x3"}))


def test_filter_history_only_on_the_first_changes() -> None:
    rule = SHAPE_RULES["filter-changes-history"]
    case = Case("eth_newFilter", "logs filter", [{}])
    logs = [{"logIndex": "0x0"}]
    anvil = [ok("<filter id>"), ok(logs), ok(logs), ok(True), ok(False), err(-32000)]
    ours = [ok("<filter id>"), ok(logs), ok([]), ok(True), ok(False), err(-32000)]
    assert rule(case, ours, anvil)
    assert not rule(
        case, [ok("<filter id>"), ok([]), ok([]), ok(True), ok(False), err(-32000)], anvil
    )
    assert not rule(case, [*ours[:3], ok(False), ok(False), err(-32000)], anvil)


def test_spec_expected_error_needs_the_specs_code_and_data() -> None:
    rule = SHAPE_RULES["spec-expected-error"]
    want = {"code": -32602, "message": "invalid block range params"}
    case = Case(
        "eth_getLogs", "spec filter-error-reversed-block-range.io #1", [{}], "x", None, want
    )
    assert rule(case, err(-32602), ok([]))
    assert not rule(case, err(-32000), ok([]))
    assert not rule(case, ok([]), ok([]))
    assert not rule(Case("eth_getLogs", "reversed", [{}]), err(-32602), ok([]))
    revert = {"code": 3, "message": "execution reverted", "data": "0x08c379a0"}
    call = Case("eth_call", "spec call-revert-abi-error.io #1", [{}], "x", None, revert)
    assert rule(call, err(3, "0x08c379a0"), err(-32603))
    assert not rule(call, err(3, "0x"), err(-32603))


def test_out_of_gas_code_only_for_anvils_internal_error() -> None:
    rule = SHAPE_RULES["anvil-halt-code"]
    case = Case("eth_call", "out of gas", [{}, "latest"])
    anvil = {"jsonrpc": "2.0", "id": 1, "error": {"code": -32603, "message": "EVM error OutOfGas"}}
    assert rule(case, err(-32000), anvil)
    assert not rule(case, err(-39001), anvil)
    assert not rule(case, err(-32000), err(-32603))  # another internal error of anvil


def test_block_traces_may_differ_only_in_struct_logs() -> None:
    rule = SHAPE_RULES["struct-logs"]
    case = Case("debug_traceBlockByNumber", "logs struct logs", ["0x5"])
    steps = [{"pc": 0, "op": "PUSH1"}]
    plain = {"failed": False, "gas": 21000, "returnValue": "0x", "structLogs": []}
    call = {"failed": False, "gas": 51444, "returnValue": "0x01"}
    anvil = ok(
        [
            {"txHash": "0xa", "result": plain},
            {"txHash": "0xb", "result": {**call, "structLogs": []}},
        ]
    )
    ours = ok(
        [
            {"txHash": "0xa", "result": plain},
            {"txHash": "0xb", "result": {**call, "structLogs": steps}},
        ]
    )
    assert rule(case, ours, anvil)
    assert not rule(case, ours, ok(list(reversed(result_of(anvil)))))
    assert not rule(case, anvil, anvil)  # nothing differs: not this rule's business


def result_of(answer: dict[str, Any]) -> Any:
    return answer["result"]


def test_cumulative_gas_comes_off_the_top_level_only() -> None:
    call = {"from": "0x1", "gas": "0x0", "gasUsed": "0xa410", "calls": [{"gasUsed": "0x10"}]}
    fixed = without_gas_before(call, 21000)
    assert fixed["gasUsed"] == "0x5208" and fixed["calls"] == [{"gasUsed": "0x10"}]
    steps = {"failed": False, "gas": 42000, "returnValue": "0x", "structLogs": []}
    assert without_gas_before(steps, 21000)["gas"] == 21000
    assert without_gas_before({"output": "0x"}, 21000) == {"output": "0x"}


def test_null_for_not_found_follows_the_spec_schema() -> None:
    assert null_for_not_found("eth_getBlockByNumber")
    assert null_for_not_found("eth_getTransactionReceipt")
    assert null_for_not_found("eth_getUncleCountByBlockHash")
    assert not null_for_not_found("eth_getBalance")
    assert not null_for_not_found("eth_call")


def test_access_list_of_a_revert_reports_the_failure() -> None:
    rule = SHAPE_RULES["access-list-of-a-revert"]
    case = Case("eth_createAccessList", "reverting call", [{}, "latest"])
    anvil = err(3, "0x08c379a0")
    listed = {"accessList": [], "gasUsed": "0x5259", "error": "execution reverted"}
    assert rule(case, ok(listed), anvil)
    assert not rule(case, ok({"accessList": [], "gasUsed": "0x5259"}), anvil)
    assert not rule(case, ok({**listed, "gasUsed": 21081}), anvil)  # not a hex quantity
    assert not rule(case, ok(listed), ok({"accessList": [], "gasUsed": "0x5259"}))


def test_an_empty_trace_for_null_only_for_what_does_not_exist() -> None:
    rule = SHAPE_RULES["anvil-empty-trace-for-null"]
    missing = Case("trace_transaction", "not found: unknown hash", ["0x" + "00" * 31 + "ef"])
    assert rule(missing, ok(None), ok([]))
    assert not rule(missing, err(-32000), ok([]))  # an error is not `null`
    assert not rule(missing, ok([]), ok([]))  # (equal anyway: no rule needed)
    assert not rule(missing, ok(None), ok([{"action": {}}]))  # anvil found something
    found = Case("trace_block", "transfers", ["0x3"])
    assert not rule(found, ok(None), ok([]))  # an existing block is never traced as null

"""The list of what still differs from anvil: the different cases grouped by method and kind of
difference, with the component where each is most likely fixed."""

from __future__ import annotations

import json
from typing import Any

from tests.conformance.cases import NON_SPEC_METHODS
from tests.conformance.compare import Outcome, same
from tests.conformance.harness import Run
from tests.conformance.spec import methods, result_violations

# Which branch of the work serves each method (for the list of what still differs).
STATE = {
    "eth_getBlockByNumber", "eth_getBlockByHash", "eth_getBlockTransactionCountByNumber",
    "eth_getBlockTransactionCountByHash", "eth_getTransactionByBlockNumberAndIndex",
    "eth_getTransactionByBlockHashAndIndex", "eth_getBlockReceipts",
    "eth_getUncleCountByBlockHash", "eth_getUncleCountByBlockNumber",
    "eth_getUncleByBlockHashAndIndex", "eth_getUncleByBlockNumberAndIndex", "debug_getRawHeader",
    "debug_getRawBlock", "debug_getRawReceipts", "debug_getRawTransaction",
    "eth_getTransactionByHash", "eth_getTransactionReceipt", "eth_getLogs", "eth_baseFee",
}  # fmt: skip
EVM = {
    "eth_call", "eth_estimateGas", "eth_createAccessList", "eth_simulateV1",
    "debug_traceTransaction", "debug_traceCall", "debug_traceBlockByNumber",
    "debug_traceBlockByHash", "trace_block", "trace_transaction", "trace_filter",
    "trace_replayBlockTransactions",
}  # fmt: skip


def owner(outcome: Outcome) -> str:
    method = outcome.case.method
    """Where a difference is most likely fixed: the component that answers the method, or the
    proxy's method table, public-face codes or param checks."""
    area = "state node" if method in STATE else "state node EVM" if method in EVM else "proxy"
    ours = outcome.ours if isinstance(outcome.ours, dict) else {}
    code = (ours.get("error") or {}).get("code") if isinstance(ours.get("error"), dict) else None
    if code == -32601:
        return "proxy (method table)" + ("" if area == "proxy" else f" + {area}")
    if code is not None and code <= -39000 and area != "proxy":
        return f"proxy (error code) / {area}"
    if outcome.case.invalid:
        return f"proxy (params) / {area}" if area != "proxy" else area
    return area


def short(answer: Any, limit: int = 140) -> str:
    text = json.dumps(answer, separators=(",", ":"))
    if isinstance(answer, dict) and "result" in answer:
        text = json.dumps(answer["result"], separators=(",", ":"))
    elif isinstance(answer, dict) and "error" in answer:
        text = "error " + json.dumps(answer["error"], separators=(",", ":"))
    text = text.replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def differing_keys(ours: Any, anvil: Any, prefix: str = "") -> list[str]:
    """The paths where two JSON values differ, down through objects and equal-length lists."""
    if isinstance(ours, dict) and isinstance(anvil, dict):
        keys = []
        for k in sorted(set(ours) | set(anvil)):
            if k not in ours:
                keys.append(f"{prefix}{k} (only anvil)")
            elif k not in anvil:
                keys.append(f"{prefix}{k} (only ours)")
            elif ours[k] != anvil[k]:
                keys += differing_keys(ours[k], anvil[k], f"{prefix}{k}.")
        return keys
    if isinstance(ours, list) and isinstance(anvil, list):
        if len(ours) != len(anvil):
            return [f"{prefix}length {len(ours)} vs {len(anvil)}"]
        found: list[str] = []
        for o, a in zip(ours, anvil, strict=True):
            found += [k for k in differing_keys(o, a, f"{prefix}[].") if k not in found]
        return found
    return [prefix.rstrip(".") or "value"]


def describe(value: Any) -> str:
    return "null" if value is None else "a result"


def signature(outcome: Outcome) -> str:
    """What kind of difference this is, so that cases with the same one are listed once."""
    ours, anvil = outcome.ours, outcome.anvil
    if outcome.compared is not None:
        label, reference = outcome.compared
        return f"vs {label}: " + signature(Outcome(outcome.case, ours, reference))
    if isinstance(ours, list) and isinstance(anvil, list) and outcome.case.flow is not None:
        steps = [i for i, (o, a) in enumerate(zip(ours, anvil, strict=False)) if not same(o, a)]
        return f"flow steps {steps} differ: " + "; ".join(
            signature(Outcome(outcome.case, ours[i], anvil[i])) for i in steps[:2]
        )
    o_err = ours.get("error") if isinstance(ours, dict) else None
    a_err = anvil.get("error") if isinstance(anvil, dict) else None
    o_code = o_err.get("code") if isinstance(o_err, dict) else None
    a_code = a_err.get("code") if isinstance(a_err, dict) else None
    if o_code == -32601 and a_code != -32601:
        return "ours: -32601 method not found"
    if o_err is not None and a_err is not None:
        if o_code != a_code:
            return f"error code {o_code} vs anvil's {a_code}"
        return "error data differs"
    if o_err is not None:
        what = "null" if anvil.get("result") is None else "a result"
        return f"ours error {o_code}, anvil {what}"
    if a_err is not None:
        what = "null" if ours.get("result") is None else "a result"
        broken = result_violations(outcome.case.method, ours.get("result"))
        schema = f"; breaks the spec's result schema: {broken[0]}" if broken else ""
        return f"ours {what}, anvil error {a_code}{schema}"
    o, a = ours.get("result"), anvil.get("result")
    if o is None or a is None:
        return f"ours {describe(o)}, anvil {describe(a)}"
    keys = differing_keys(o, a)
    if keys == ["value"]:
        return (
            "value differs"
            if type(o) is type(a)
            else f"type {type(o).__name__} vs {type(a).__name__}"
        )
    return "differs in " + ", ".join(f"`{k}`" for k in keys[:8]) + (" …" if len(keys) > 8 else "")


def report(result: Run) -> str:
    spec_methods = set(methods())
    counts = {"equal": 0, "allowed": 0, "different": 0}
    for outcome in result.outcomes:
        counts[outcome.verdict] += 1
    by_method = result.by_method()
    failing = sorted(
        m for m, outs in by_method.items() if any(o.verdict == "different" for o in outs)
    )
    lines = [
        "## The last run",
        "",
        f"{len(by_method)} methods ({len(spec_methods & set(by_method))} of the spec's "
        f"{len(spec_methods)}, {len(set(NON_SPEC_METHODS) & set(by_method))} others), "
        f"{len(result.outcomes)} cases: {counts['equal']} equal, {counts['allowed']} different "
        f"in a listed way, **{counts['different']} different** in {len(failing)} methods; "
        f"{len(result.batch_differences)} answered otherwise inside a batch than alone.",
        "",
        f"Chain: head {result.chain.head}, blocks {json.dumps(result.chain.blocks)}; tags: "
        f"ours {json.dumps(result.tags.get('ours'))}, "
        f"anvil {json.dumps(result.tags.get('anvil'))}; state reads routed to "
        f"{json.dumps(result.routed)}; when the comparison began the proxy answered "
        f"{json.dumps(result.served)}.",
        "",
        "| method | difference | cases | example: ours | anvil | area |",
        "| - | - | - | - | - | - |",
    ]
    for method in failing:
        groups: dict[str, list[Outcome]] = {}
        for o in by_method[method]:
            if o.verdict == "different":
                groups.setdefault(signature(o), []).append(o)
        for sig, outs in groups.items():
            labels = ", ".join(o.case.label for o in outs[:3]) + (" …" if len(outs) > 3 else "")
            first = outs[0]
            lines.append(
                f"| {method} | {sig} | {len(outs)}/{len(by_method[method])}: {labels} | "
                f"{short(first.ours)} | {short(first.anvil)} | {owner(first)} |"
            )
    if result.batch_differences:
        lines += [
            "",
            "### Answered otherwise inside a batch",
            "",
            "| method | case | alone | in a batch |",
            "| - | - | - | - |",
        ]
        for o in result.batch_differences:
            lines.append(
                f"| {o.case.method} | {o.case.label} | {short(o.ours)} | {short(o.batch)} |"
            )
    allowed = [o for o in result.outcomes if o.verdict == "allowed"]
    if allowed:
        lines += [
            "",
            "### Different in a listed way (docs/proxy.md)",
            "",
            "| rule | cases |",
            "| - | - |",
        ]
        for rule_id in sorted({o.rule for o in allowed}):
            keys = [o.case.key for o in allowed if o.rule == rule_id]
            more = " …" if len(keys) > 4 else ""
            lines.append(f"| `{rule_id}` | {len(keys)}: {', '.join(keys[:4])}{more} |")
    return "\n".join(lines) + "\n"

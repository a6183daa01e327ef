"""The worker's side of traces: re-run a block's transactions (or a call object as a
transaction) on py-evm and answer each traced transaction in the asked tracer's shape.

Jobs (built by traces.py in the node): `replay` runs a block's transactions in order on the
state of its parent, checks each against its stored receipt, and traces those in `targets`
(stopping after the last); `trace_call` runs one call object as a transaction of its block.
`tracer` is `{"name": None | "callTracer" | "prestateTracer" | "parity", "config": {...}}`;
None is the struct logger (its options in `config`).

Imported by a worker only when a trace is asked (it imports py-evm).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eth._utils.address import generate_contract_address

from nodes.state.evm.pyevm import Source, intrinsic_gas
from nodes.state.evm.replay import (
    ReplayError,
    ReplayState,
    StepLimit,
    Tx,
    check_receipt,
    new_state,
    run_tx,
    tx_of_object,
)
from nodes.state.evm.tracers import (
    AccessListCollector,
    SteppedComputation,
    StructLogger,
    call_frames,
    error_of,
    parity_traces,
    prestate,
    state_diff,
    word,
)

MAX_ACCESS_LIST_RUNS = 8  # runs of eth_createAccessList while each finds more to list


class TraceFailed(Exception):
    """A trace that cannot be answered; `kind` says which error the node answers."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def run_job(
    job: dict[str, Any],
    source: Source,
    hash_of: Callable[[int], bytes],
    max_steps: int,
    max_bytes: int = 0,
) -> list[Any]:
    """The traced transactions' answers, in order (TraceFailed when the trace cannot be
    trusted or exceeds its limits)."""
    tracer = job["tracer"]
    state = new_state(job["block"], job["chain_id"], source, hash_of)
    logger: StructLogger | None = None
    if tracer["name"] is None:
        cfg = tracer["config"]
        logger = StructLogger(
            max_steps,
            stack=not cfg.get("disableStack", False),
            storage=not cfg.get("disableStorage", False),
            memory=bool(cfg.get("enableMemory", False)),
            return_data=bool(cfg.get("enableReturnData", False)),
            limit=int(cfg.get("limit") or 0),
            max_bytes=max_bytes,
        )
        state.computation_class = SteppedComputation
    try:
        if job["kind"] == "access_list":
            return [_access_list(job, source, hash_of)]
        if job["kind"] == "trace_call":
            return [_traced(state, _call_tx(state, job["call"]), job, logger, None)]
        return _replay(state, job, logger)
    except ReplayError as exc:
        raise TraceFailed("replay", str(exc)) from None
    except StepLimit as exc:
        raise TraceFailed("limit", f"trace exceeds its limit: {exc}") from None


def _replay(state: ReplayState, job: dict[str, Any], logger: StructLogger | None) -> list[Any]:
    targets = set(job["targets"])
    last = max(targets)
    out = []
    for i, (obj, receipt) in enumerate(zip(job["txs"], job["receipts"], strict=True)):
        if i > last:
            break
        if i in targets:
            out.append(_traced(state, tx_of_object(obj), job, logger, receipt))
        else:
            state.stepper = None
            check_receipt(run_tx(state, tx_of_object(obj), job["chain_id"], True), receipt)
    return out


def _traced(
    state: ReplayState,
    tx: Tx,
    job: dict[str, Any],
    logger: StructLogger | None,
    receipt: dict[str, Any] | None,
) -> Any:
    """Run one transaction with the tracer and answer it (a mined one checked against its
    receipt first)."""
    if logger is not None:
        logger.reset()
    state.stepper = logger
    ran = run_tx(state, tx, job["chain_id"], receipt is not None)
    state.stepper = None
    if receipt is not None:
        check_receipt(ran, receipt)
    tracer = job["tracer"]
    name, cfg = tracer["name"], tracer["config"]
    if logger is not None:
        return logger.result(ran, ran.gas_used)
    if name == "callTracer":
        with_log, only_top = bool(cfg.get("withLog")), bool(cfg.get("onlyTopCall"))
        return call_frames(ran, ran.gas_used, with_log, only_top)
    if name == "prestateTracer":
        return prestate(
            ran,
            state,
            diff=bool(cfg.get("diffMode")),
            code=not cfg.get("disableCode", False),
            storage=not cfg.get("disableStorage", False),
        )
    if name == "parity":
        return parity_traces(ran)
    if name == "replay":  # trace_replayBlockTransactions: the traces and the state diff
        diff = state_diff(ran, state) if cfg.get("stateDiff") else None
        return {"trace": parity_traces(ran), "stateDiff": diff}
    return {}  # noopTracer


def _access_list(
    job: dict[str, Any], source: Source, hash_of: Callable[[int], bytes]
) -> dict[str, Any]:
    """geth's eth_createAccessList: run the call with the list found so far applied, until
    a run touches nothing new; the list, that run's gas used and its error, if any."""
    call = job["call"]
    listed = call["access_list"]
    for _ in range(MAX_ACCESS_LIST_RUNS):
        state = new_state(job["block"], job["chain_id"], source, hash_of)
        state.computation_class = SteppedComputation
        tx = _call_tx(state, {**call, "access_list": listed})
        sender = bytes.fromhex(tx.sender[2:])
        to = (
            generate_contract_address(sender, tx.nonce)
            if tx.to is None
            else bytes.fromhex(tx.to[2:])
        )
        collector = AccessListCollector({sender, to}, listed)
        state.stepper = collector
        ran = run_tx(state, tx, job["chain_id"], False)
        found = collector.access_list()
        if _same_list(found, listed):
            out: dict[str, Any] = {
                "accessList": [
                    {"address": a, "storageKeys": [word(s) for s in slots]} for a, slots in found
                ],
                "gasUsed": hex(ran.gas_used),
            }
            if ran.computation.is_error:
                out["error"] = error_of(ran.computation)
            return out
        listed = found
    raise TraceFailed("limit", f"the access list did not settle in {MAX_ACCESS_LIST_RUNS} runs")


def _same_list(a: list[tuple[str, list[int]]], b: list[tuple[str, list[int]]]) -> bool:
    return {x: set(s) for x, s in a} == {x: set(s) for x, s in b}


def _call_tx(state: ReplayState, call: dict[str, Any]) -> Tx:
    """A call object as a transaction: the sender's nonce as it stands, the fees as the
    call gives them (a legacy price is its own priority fee: py-evm then charges it).
    The checks of eth_call: intrinsic gas within `gas`, funds for gas × max fee + value."""
    max_fee = call["max_fee"]
    tip = max_fee if call["tip"] is None else call["tip"]
    sender = bytes.fromhex(call["from"][2:])
    if intrinsic_gas(bytes(call["data"]), call["to"] is None, call["access_list"]) > call["gas"]:
        raise TraceFailed("gas", "intrinsic gas too high")
    if state.get_balance(sender) < call["gas"] * max_fee + call["value"]:
        raise TraceFailed("funds", "insufficient funds for gas * price + value")
    return Tx(
        sender=call["from"],
        to=call["to"],
        nonce=state.get_nonce(sender),
        gas=call["gas"],
        value=call["value"],
        data=bytes(call["data"]),
        max_fee=max_fee,
        tip=tip,
        access_list=call["access_list"],
    )

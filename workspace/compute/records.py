"""Run records (spec: Function run record) built from an execution Outcome."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from workspace.compute.runners import Outcome

LOCALS_JSON_MAX = 16 * 1024  # local_vars_json longer than this is cut to a valid JSON note


def new_run_id() -> str:
    return uuid.uuid4().hex


def _locals_json(local_vars: dict[str, Any]) -> str:
    text = json.dumps(local_vars, ensure_ascii=False, default=str)
    if len(text) <= LOCALS_JSON_MAX:
        return text
    return json.dumps({"_truncated": True, "names": sorted(local_vars)[:200]})


def build_run_record(
    *,
    run_id: str,
    language: str,
    code: str,
    parameters: list[dict[str, Any]],
    args: list[Any],
    arguments: list[dict[str, Any]],
    creator_id: str,
    created_at: float,
    outcome: Outcome,
    call_id: str | None = None,
) -> dict[str, Any]:
    """The spec's run record; failures live in `status` and `output.failure`, never raised."""
    return {
        "id": run_id,
        "language": language,
        "code": code,
        "parameters": parameters,
        "args": args,
        "arguments": arguments,
        "status": outcome.status,
        "output": {
            "text": outcome.text,
            "truncated": outcome.truncated,
            "original_size_bytes": outcome.original_size_bytes,
            "failure": outcome.failure,
            "error_stack": outcome.error_stack,
            "local_vars_json": _locals_json(outcome.local_vars),
            "execution_duration_ms": outcome.execution_duration_ms,
            "queue_wait_ms": outcome.queue_wait_ms,
            "call_id": call_id,
        },
        "return_value": outcome.return_value if outcome.status == "succeeded" else None,
        "creator_id": creator_id,
        "created_at": created_at,
        "started_at": outcome.started_at,
        "finished_at": outcome.finished_at if outcome.finished_at is not None else time.time(),
    }

"""chainstate_sdk: read and write your workspace tables and call chain state from a Function
or Notebook. Every call acts with the rights of whoever started the run.

    import chainstate_sdk as cs

    rows = cs.query("myspace.transfers", "SELECT * FROM transfers WHERE value > 10 LIMIT 5")
    cs.upsert("myspace.balances", {"id": "0xabc", "balance": "12"})
    head = cs.block_number(1337)
    with cs.task("index-block"):
        receipt = cs.chain_call(1337, "eth_getBlockByNumber", ["latest", False])

The sandbox has no network: calls travel over a Unix socket to the workspace, which checks
the run's token, records which tables the run read or wrote, and applies the caller's rights.
Only the standard library is used.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import time
from contextlib import contextmanager
from typing import Any

__all__ = [
    "ChainError",
    "SdkError",
    "block_number",
    "chain_call",
    "delete",
    "get_rows",
    "list_rows",
    "query",
    "report_block",
    "table",
    "task",
    "update",
    "upsert",
]

_SOCKET = os.environ.get("CHAINSTATE_SDK_SOCKET", "")
_TOKEN = os.environ.get("CHAINSTATE_SDK_TOKEN", "")
TIMEOUT_SECONDS = 60.0


class SdkError(Exception):
    """The workspace refused or failed a call: `code` is the envelope code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class ChainError(Exception):
    """A JSON-RPC error answered by chain state: `code`, `message`, `data`."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(f"{error.get('code')}: {error.get('message')}")
        self.code = error.get("code")
        self.message = error.get("message")
        self.data = error.get("data")


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("sdk", timeout=TIMEOUT_SECONDS)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def _request(method: str, path: str, body: Any = None) -> tuple[int, Any]:
    if not _SOCKET or not _TOKEN:
        raise SdkError(50000, "the SDK is only available inside a workspace run")
    conn = _UnixConnection(_SOCKET)
    try:
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Run {_TOKEN}", "Content-Type": "application/json"}
        conn.request(method, path, body=payload, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    return resp.status, (json.loads(raw) if raw else None)


def _api(method: str, path: str, params: dict[str, Any]) -> Any:
    if method == "GET":
        from urllib.parse import urlencode

        clean = {k: (json.dumps(v) if isinstance(v, list) else v) for k, v in params.items()}
        path = f"{path}?{urlencode({k: v for k, v in clean.items() if v is not None})}"
        _, doc = _request("GET", path)
    else:
        _, doc = _request("POST", path, params)
    if not isinstance(doc, dict) or doc.get("code") != 0:
        code = doc.get("code", 50000) if isinstance(doc, dict) else 50000
        message = doc.get("message", "no answer") if isinstance(doc, dict) else "no answer"
        raise SdkError(int(code), str(message))
    return doc.get("data")


def table(table_id: str) -> dict[str, Any]:
    """The table's definition (GET /v1/table)."""
    return _api("GET", "/v1/table", {"id": table_id})


def query(table_id: str, sql: str) -> list[dict[str, Any]]:
    """Rows of one `SELECT *` over the table (POST /v1/table/row/query)."""
    return _api("POST", "/v1/table/row/query", {"table_id": table_id, "sql": sql})["rows"]


def get_rows(table_id: str, pks: list[str]) -> list[dict[str, Any]]:
    return _api("POST", "/v1/table/row/get", {"table_id": table_id, "pks": pks})["rows"]


def list_rows(
    table_id: str,
    filter: list[dict[str, Any]] | None = None,
    order_by: str | None = None,
    direction: str = "desc",
    start: int = 0,
    limit: int = 1000,
) -> list[dict[str, Any]]:
    params = {
        "table_id": table_id,
        "filter": json.dumps(filter) if filter is not None else None,
        "order_by": order_by,
        "direction": direction,
        "start": start,
        "limit": limit,
    }
    return _api("GET", "/v1/table/row/list", params)["rows"]


def upsert(table_id: str, row: dict[str, Any]) -> None:
    """Insert or update one row by its `id` (POST /v1/table/row/create)."""
    _api("POST", "/v1/table/row/create", {"table_id": table_id, "data": row})


def update(table_id: str, row_id: str, data: dict[str, Any]) -> None:
    _api("POST", "/v1/table/row/update", {"table_id": table_id, "id": row_id, "data": data})


def delete(table_id: str, row_id: str) -> None:
    _api("POST", "/v1/table/row/delete", {"table_id": table_id, "id": row_id})


_ids = iter(range(1, 1 << 62))


def chain_call(chain_id: int | str, method: str, params: list[Any] | None = None) -> Any:
    """One JSON-RPC call to chain state; returns `result` or raises ChainError."""
    body = {"jsonrpc": "2.0", "id": next(_ids), "method": method, "params": params or []}
    status, doc = _request("POST", f"/v1/chainstate/{chain_id}", body)
    if isinstance(doc, dict) and "error" in doc and "jsonrpc" in doc:
        raise ChainError(doc["error"])
    if isinstance(doc, dict) and "result" in doc:
        result = doc["result"]
        if method.startswith("eth_getBlockBy") and isinstance(result, dict):
            with _quiet():
                report_block(chain_id, int(result["number"], 16), int(result["timestamp"], 16))
        return result
    code = doc.get("code", status) if isinstance(doc, dict) else status
    message = doc.get("message", "chain state call failed") if isinstance(doc, dict) else ""
    raise SdkError(int(code), str(message))


def block_number(chain_id: int | str) -> int:
    return int(chain_call(chain_id, "eth_blockNumber"), 16)


def report_block(chain_id: int | str, number: int, timestamp: float) -> None:
    """Feed the instance's `block_lag` chart: the newest block this run has processed."""
    _request(
        "POST",
        "/sdk/metric",
        {"kind": "block", "chain_id": str(chain_id), "number": number, "timestamp": timestamp},
    )


@contextmanager
def task(name: str = "task"):  # type: ignore[no-untyped-def]
    """Time a unit of work for the instance's `tasks` and `task_duration` charts."""
    t0 = time.monotonic()
    ok = True
    try:
        yield
    except BaseException:
        ok = False
        raise
    finally:
        ms = (time.monotonic() - t0) * 1000
        with _quiet():
            _request("POST", "/sdk/metric", {"kind": "task", "name": name, "ms": ms, "ok": ok})


def _quiet() -> contextlib.suppress:
    """Metrics must never break the user's code."""
    return contextlib.suppress(Exception)

"""A small JSON-RPC client on one kept-alive HTTP connection, as client libraries talk."""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import urlsplit


class RpcError(Exception):
    def __init__(self, method: str, error: Any) -> None:
        super().__init__(f"{method}: {error}")
        self.error = error


class Rpc:
    """`POST` JSON-RPC bodies to one URL over a persistent connection (reopened if the server
    closed it, as clients do)."""

    def __init__(self, url: str, timeout: float = 60) -> None:
        parts = urlsplit(url)
        self.url = url
        self.path = parts.path or "/"
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
        self._next_id = 0

    def post(self, body: Any) -> Any:
        """The decoded answer to `body` (a request object or a batch); None for an empty
        answer (only notifications)."""
        data = json.dumps(body).encode()
        headers = {"content-type": "application/json"}
        for attempt in (1, 2):
            try:
                self.conn.request("POST", self.path, data, headers)
                resp = self.conn.getresponse()
                raw = resp.read()
                break
            except (http.client.HTTPException, ConnectionError):
                self.conn.close()
                if attempt == 2:
                    raise
        return json.loads(raw) if raw else None

    def request(self, method: str, *params: Any) -> dict[str, Any]:
        """The whole answer object (`result` or `error`) of one call."""
        self._next_id += 1
        return self.post(
            {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": list(params)}
        )

    def call(self, method: str, *params: Any) -> Any:
        """The `result` of one call; RpcError if it answered an error."""
        answer = self.request(method, *params)
        if "error" in answer:
            raise RpcError(method, answer["error"])
        return answer["result"]

    def close(self) -> None:
        self.conn.close()

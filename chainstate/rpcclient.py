"""A small JSON-RPC client over `http://` or `inproc://` URLs, for node-to-node calls.

The proxy's data path has its own tuned forwarding; this client serves the control paths
(the checker polling replicas, state nodes following a write node, leader lookups).
"""

from __future__ import annotations

import itertools
from typing import Any

import aiohttp
import orjson

from chainstate.inproc import InprocRegistry, is_inproc
from chainstate.jsonrpc import INVALID_PARAMS, JsonRpcError


class RpcUnavailable(ConnectionError):
    """The endpoint could not be reached or did not answer JSON-RPC."""


class RpcClient:
    """Calls one JSON-RPC endpoint. Errors answered by the endpoint raise JsonRpcError;
    transport failures raise RpcUnavailable."""

    def __init__(
        self,
        url: str,
        *,
        registry: InprocRegistry | None = None,
        session: aiohttp.ClientSession | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.url = url
        self._registry = registry
        self._session = session
        self._own_session = session is None and not is_inproc(url)
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._ids = itertools.count(1)

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def call(self, method: str, params: list[Any] | dict[str, Any] | None = None) -> Any:
        rid = next(self._ids)
        request = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params or []}
        try:
            body = orjson.dumps(request)
        except TypeError:  # params passed on from a client, nested deeper than orjson writes
            raise JsonRpcError(INVALID_PARAMS, "invalid params: nested too deep") from None
        answer = await self._send(body)
        if not isinstance(answer, dict):
            raise RpcUnavailable(f"{self.url}: unexpected answer to {method}")
        if "error" in answer:
            err = answer["error"] or {}
            code = int(err.get("code", -32603))
            raise JsonRpcError(code, str(err.get("message")), err.get("data"))
        return answer.get("result")

    async def _send(self, body: bytes) -> Any:
        try:
            raw = await (self._send_inproc(body) if is_inproc(self.url) else self._send_http(body))
            return orjson.loads(raw)
        except (aiohttp.ClientError, TimeoutError, OSError, orjson.JSONDecodeError) as exc:
            raise RpcUnavailable(f"{self.url}: {type(exc).__name__}: {exc}") from None

    async def _send_inproc(self, body: bytes) -> bytes:
        handler = self._registry.resolve(self.url) if self._registry else None
        if handler is None:
            raise RpcUnavailable(f"{self.url}: no such in-process node")
        return await handler(body)

    async def _send_http(self, body: bytes) -> bytes:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        headers = {"content-type": "application/json"}
        async with self._session.post(
            self.url, data=body, headers=headers, timeout=self._timeout
        ) as resp:
            if resp.status >= 500 and resp.content_type != "application/json":
                raise RpcUnavailable(f"{self.url}: HTTP {resp.status}")
            return await resp.read()

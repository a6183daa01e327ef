"""JSON-RPC client for an Ethereum execution client (anvil, geth…), with batches.

The write node and the workload driver make many small reads per block; a batch carries
them in one HTTP round trip. Built on the shared `chainstate.rpcclient.RpcClient`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from chainstate.jsonrpc import INTERNAL_ERROR, JsonRpcError
from chainstate.rpcclient import RpcClient, RpcUnavailable

Call = tuple[str, list[Any]]


class EthClient(RpcClient):
    """`call` for one request, `batch` for many (results in the order of the calls)."""

    async def batch(self, calls: Sequence[Call], max_batch: int = 500) -> list[Any]:
        """Results of `calls`, sent as batches of at most `max_batch` items.

        The first error answered by the execution client is raised as JsonRpcError.
        """
        results: list[Any] = []
        for start in range(0, len(calls), max_batch):
            results.extend(await self._batch_once(calls[start : start + max_batch]))
        return results

    async def _batch_once(self, calls: Sequence[Call]) -> list[Any]:
        if not calls:
            return []
        ids = [next(self._ids) for _ in calls]
        body = [
            {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
            for rid, (method, params) in zip(ids, calls, strict=True)
        ]
        answer = await self._send(orjson.dumps(body))
        if not isinstance(answer, list):
            if isinstance(answer, dict) and "error" in answer:
                err = answer["error"] or {}
                raise JsonRpcError(int(err.get("code", INTERNAL_ERROR)), str(err.get("message")))
            raise RpcUnavailable(f"{self.url}: batch answered with {type(answer).__name__}")
        by_id = {item.get("id"): item for item in answer if isinstance(item, dict)}
        out: list[Any] = []
        for rid, (method, _) in zip(ids, calls, strict=True):
            item = by_id.get(rid)
            if item is None:
                raise RpcUnavailable(f"{self.url}: no answer to {method} in a batch")
            if "error" in item:
                err = item["error"] or {}
                code = int(err.get("code", INTERNAL_ERROR))
                raise JsonRpcError(code, f"{method}: {err.get('message')}", err.get("data"))
            out.append(item.get("result"))
        return out

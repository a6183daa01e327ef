"""The Executor: turns validated requests into worker jobs and answers into results.

A job carries everything a worker needs (state URL, height, block env, chain id, spec, the
calls, overrides), so workers are stateless apart from their warm caches.
"""

from __future__ import annotations

import asyncio
from typing import Any

from chainstate.jsonrpc import JsonRpcError
from nodes.state.evm.pool import WorkerPool
from nodes.state.evm.settings import EvmSettings


def raise_error(err: dict[str, Any]) -> None:
    raise JsonRpcError(err["code"], err["message"], err.get("data"))


class Executor:
    """Runs calls, sequences, estimates and traces on the worker pool."""

    def __init__(self, settings: EvmSettings) -> None:
        self.settings = settings
        self.pool = WorkerPool(settings)

    async def start(self) -> None:
        await self.pool.start()

    async def close(self) -> None:
        await self.pool.close()

    def job(
        self,
        kind: str,
        fork_url: str,
        height: int,
        block: dict[str, Any],
        calls: list[dict[str, Any]],
        **extra: Any,
    ) -> dict[str, Any]:
        return {
            "kind": kind,
            "fork_url": fork_url,
            "height": height,
            "block": block,
            "chain_id": self.settings.chain_id,
            "spec_id": self.settings.spec_id,
            "calls": calls,
            **extra,
        }

    async def run(self, job: dict[str, Any]) -> dict[str, Any]:
        limit = (
            self.settings.trace_timeout if job["kind"] == "trace" else self.settings.call_timeout
        )
        answer = await self.pool.run(job, limit)
        if "error" in answer:
            raise_error(answer["error"])
        return answer

    async def call(self, job: dict[str, Any]) -> dict[str, Any]:
        """One call; its failure is raised as the JSON-RPC error."""
        result = (await self.run(job))["results"][0]
        if not result["ok"]:
            raise_error(result["error"])
        return result

    async def calls(self, job: dict[str, Any], parallel: bool) -> list[dict[str, Any]]:
        """Independent calls; with `parallel`, split in chunks over the workers."""
        calls = job["calls"]
        chunks = 1
        if parallel and self.pool.size > 1 and len(calls) > 1:
            chunks = min(self.pool.size, len(calls))
        if chunks == 1:
            return (await self.run(job))["results"]
        size = -(-len(calls) // chunks)
        parts = [calls[i : i + size] for i in range(0, len(calls), size)]
        answers = await asyncio.gather(*(self.run({**job, "calls": p}) for p in parts))
        out: list[dict[str, Any]] = []
        for answer in answers:
            out.extend(answer["results"])
            if job.get("fast_fail") and any(not r["ok"] for r in answer["results"]):
                break
        return out

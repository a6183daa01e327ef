"""FAKE state/archive/write nodes for the proxy tests (tests only; real HTTP on loopback).

A fake answers every served method with `{"node", "method", "height"}` so a test sees which
node served an item at which height, keeps a window of heights like a `state` node (outside
it → -39006), and can be made slow, failing or dead. Block hashes carry their height (and a
fork number, `reorg`), so a hash names a block of this node's chain or is unknown (-39006);
`eth_getBlockByNumber` answers carry `number`, `hash` and `parentHash` too.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web

from chainstate.jsonrpc import BLOCK_NOT_FOUND, JsonRpcError
from proxy.methods import MethodTable
from tests.conftest import free_port

TABLE = MethodTable(("trace_vendorBlock",))


def block_hash(height: int, fork: int = 0) -> str:
    """The hash of block `height` of fork `fork` (0: the chain every fake starts on)."""
    return "0x" + ((height << 64) | fork).to_bytes(32, "big").hex()


def hash_parts(value: str) -> tuple[int, int]:
    """(height, fork) of a fake block hash."""
    number = int(value, 16)
    return number >> 64, number & (2**64 - 1)


class FakeNode:
    def __init__(
        self,
        name: str,
        kind: str = "state",
        head: int = 1000,
        window: int = 128,
    ) -> None:
        self.name = name
        self.kind = kind
        self.head = head
        self.window = window
        self.delay = 0.0  # seconds before answering data requests
        self.poll_delay = 0.0  # seconds before answering health polls
        self.http_status: int | None = None  # answer everything (polls too) with this status
        self.error_code: int | None = None  # answer every data item with this error
        self.method_errors: dict[str, int] = {}  # answer items of these methods with an error
        self.fail_every = 0  # answer every Nth data request with HTTP 503 (0: never)
        self.pad = 0  # characters of padding in every data answer (large answers)
        self.reverse = False  # answer batches in reverse order (JSON-RPC allows any order)
        self.stalled: str | None = None  # blockx_health says "stalled" with this reason
        self.received: list[dict[str, Any]] = []  # data items (polls excluded)
        self.bodies: list[bytes] = []
        self.forks: list[tuple[int, int]] = []  # (from height, fork number), see `reorg`
        self.port = free_port()
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def entry(self, weight: int = 1) -> dict[str, Any]:
        return {"key": self.name, "url": self.url, "kind": self.kind, "weight": weight}

    async def start(self) -> FakeNode:
        app = web.Application()
        app.router.add_post("/", self._handle)
        # a hung answer (`delay`) is cut short on stop, not waited out (aiohttp's default
        # 60 s grace kept a hung-node test's teardown waiting for its 30 s delay)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def reorg(self, from_height: int, fork: int) -> None:
        """Blocks from `from_height` up are now those of fork `fork` (other hashes)."""
        self.forks.append((from_height, fork))

    def fork_at(self, height: int) -> int:
        fork = 0
        for start, number in self.forks:
            if height >= start:  # a later reorg from a lower height replaces what was above
                fork = number
        return fork

    def hash_at(self, height: int) -> str:
        return block_hash(height, self.fork_at(height))

    def header(self, height: int) -> dict[str, Any]:
        return {
            "number": hex(height),
            "hash": self.hash_at(height),
            "parentHash": self.hash_at(height - 1) if height > 0 else "0x" + "00" * 32,
        }

    @property
    def earliest(self) -> int:
        return 0 if self.kind == "archive" else max(0, self.head - self.window + 1)

    def data_items(self, method: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self.received if method is None or r.get("method") == method]

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        payload = orjson.loads(body)
        items = payload if isinstance(payload, list) else [payload]
        polling = any(i.get("method") in ("blockx_range", "writer_health") for i in items)
        if self.http_status is not None:
            return web.Response(status=self.http_status, text="fake failure")
        if not polling:
            self.bodies.append(body)
            if self.fail_every and len(self.bodies) % self.fail_every == 0:
                return web.Response(status=503, text="fake: every Nth request fails")
            self.received.extend(items)
            if self.delay:
                await asyncio.sleep(self.delay)
        elif self.poll_delay:
            await asyncio.sleep(self.poll_delay)
        answers = [a for a in (self._answer(i, polling) for i in items) if a is not None]
        if not answers:
            return web.Response(status=204)
        if self.reverse and not polling:
            answers.reverse()
        out = answers if isinstance(payload, list) else answers[0]
        return web.Response(body=orjson.dumps(out), content_type="application/json")

    def _answer(self, item: dict[str, Any], polling: bool) -> dict[str, Any] | None:
        rid = item.get("id")
        try:
            result = self._result(item, polling)
        except JsonRpcError as exc:
            answer = {"jsonrpc": "2.0", "id": rid, "error": exc.to_obj()}
        else:
            answer = {"jsonrpc": "2.0", "id": rid, "result": result}
        return None if "id" not in item else answer

    def _result(self, item: dict[str, Any], polling: bool) -> Any:
        method = item["method"]
        if method == "eth_blockNumber":
            return hex(self.head)
        if method == "blockx_range":
            return {"earliest": self.earliest, "latest": self.head}
        if method == "blockx_health":  # as a state node reports itself
            if self.stalled is not None:
                return {"status": "stalled", "reason": self.stalled, "head": self.head}
            return {"status": "ok", "head": self.head}
        if polling and method == "eth_getBlockByNumber":
            return self.header(self.head)
        if self.error_code is not None:
            raise JsonRpcError(self.error_code, f"{self.name}: forced error")
        if method in self.method_errors:
            raise JsonRpcError(self.method_errors[method], f"{self.name}: forced {method} error")
        _, ref = TABLE.target(method, item.get("params"))
        height = self.head
        if ref is not None and not ref.contains:  # Contains: the node's own view
            if ref.number is not None:
                height = ref.number
            elif ref.hash is not None:
                height, fork = hash_parts(ref.hash)
                if fork != self.fork_at(height):
                    raise JsonRpcError(BLOCK_NOT_FOUND, f"{self.name}: block {ref.hash} not known")
            elif ref.tag == "earliest":
                height = 0
        if not self.earliest <= height <= self.head:
            raise JsonRpcError(BLOCK_NOT_FOUND, f"{self.name}: block {height} not held")
        answer = {"node": self.name, "method": method, "height": height}
        if method == "eth_getBlockByNumber":
            answer.update(self.header(height))
        if self.pad:
            answer["pad"] = "x" * self.pad
        return answer

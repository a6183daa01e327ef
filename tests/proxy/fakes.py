"""FAKE state/archive/write nodes for the proxy tests (tests only; real HTTP on loopback).

The bench's fake node (`bench.fakenode`: its chain of hashed blocks with a head, a window and
reorgs, its lean HTTP server) answering in another way: every served method with `{"node",
"method", "height"}`, so a test sees which node served an item at which height. Like a
`state` node it keeps a window of heights (outside it → -39006); a block hash names a block
of this node's chain (its height, and its fork after `reorg`) or is unknown (-39006);
`eth_getBlockByNumber` answers carry `number`, `hash` and `parentHash` too. It records what
it was sent and can be made slow, failing or dead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from bench import fakenode
from bench.fakenode import FakeNodeSettings, block_hash
from chainstate.httpserver import Request, Response
from chainstate.jsonrpc import JsonRpcError
from proxy.methods import MethodTable
from tests.conftest import free_port

__all__ = ["FakeNode", "block_hash"]

TABLE = MethodTable(("trace_vendorBlock",))
POLLS = ("blockx_range", "writer_health")  # the proxy's health polls: not data requests
# a hung answer (`delay`) is cut short on stop, not waited out (a hung-node test's teardown
# would otherwise wait for its 30 s delay)
STOP_GRACE = 0.2


class FakeNode(fakenode.FakeNode):
    def __init__(
        self,
        name: str,
        kind: str = "state",
        head: int = 1000,
        window: int = 128,
    ) -> None:
        settings = FakeNodeSettings(
            kind=kind, head=head, window=window, port=free_port(), stop_grace=STOP_GRACE
        )
        super().__init__(settings)
        self.name = name
        self.delay = 0.0  # seconds before answering data requests
        self.poll_delay = 0.0  # seconds before answering health polls
        self.http_status: int | None = None  # answer everything (polls too) with this status
        self.error_code: int | None = None  # answer every data item with this error
        self.method_errors: dict[str, int] = {}  # answer items of these methods with an error
        self.fail_every = 0  # answer every Nth data request with HTTP 503 (0: never)
        self.pad = 0  # characters of padding in every data answer (large answers)
        self.reverse = False  # answer batches in reverse order (JSON-RPC allows any order)
        # the bytes of every data batch's answer, made from its items (a node's own shapes)
        self.batch_answer: Callable[[list[dict[str, Any]]], bytes] | None = None
        self.stalled: str | None = None  # blockx_health says "stalled" with this reason
        self.received: list[dict[str, Any]] = []  # data items (polls excluded)
        self.bodies: list[bytes] = []

    @property
    def head(self) -> int:
        return self.settings.head

    @head.setter
    def head(self, height: int) -> None:
        self.settings.head = height

    @property
    def kind(self) -> str:
        return self.settings.kind

    @property
    def url(self) -> str:  # known before start and after stop (a dead node's address)
        return f"http://127.0.0.1:{self.settings.port}"

    def entry(self, weight: int = 1) -> dict[str, Any]:
        return {"key": self.name, "url": self.url, "kind": self.kind, "weight": weight}

    async def start(self) -> FakeNode:
        await super().start()
        return self

    def route(self, method: bytes, path: bytes) -> Any:
        return self._handle if method == b"POST" else super().route(method, path)

    def reorg(self, from_height: int, fork: int) -> None:
        """Blocks from `from_height` up are now those of fork `fork` (other hashes)."""
        self.rpc.chain.reorg(from_height, fork)

    def hash_at(self, height: int) -> str:
        return self.rpc.chain.hash_at(height)

    def header(self, height: int) -> dict[str, Any]:
        return {
            "number": hex(height),
            "hash": self.hash_at(height),
            "parentHash": self.hash_at(height - 1) if height > 0 else "0x" + "00" * 32,
        }

    @property
    def earliest(self) -> int:
        return self.rpc.chain.earliest(self.head)

    def data_items(self, method: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self.received if method is None or r.get("method") == method]

    def _handle(self, request: Request) -> Response | Awaitable[Response]:
        """The answer, at once (no task, as a real node's port answers plain reads) unless
        it is to be late."""
        body = request.body
        payload = orjson.loads(body)
        items = payload if isinstance(payload, list) else [payload]
        polling = any(i.get("method") in POLLS for i in items)
        if self.http_status is not None:
            return self.http_status, b"fake failure"
        if not polling:
            self.bodies.append(body)
            if self.fail_every and len(self.bodies) % self.fail_every == 0:
                return 503, b"fake: every Nth request fails"
            self.received.extend(items)
            if self.delay:
                return self._later(self.delay, payload, polling)
        elif self.poll_delay:
            return self._later(self.poll_delay, payload, polling)
        return self._reply(payload, polling)

    async def _later(self, seconds: float, payload: Any, polling: bool) -> Response:
        await asyncio.sleep(seconds)
        return self._reply(payload, polling)

    def _reply(self, payload: Any, polling: bool) -> Response:
        if self.batch_answer is not None and not polling and isinstance(payload, list):
            return 200, self.batch_answer(payload)
        items = payload if isinstance(payload, list) else [payload]
        answers = [a for a in (self._answer(i, polling) for i in items) if a is not None]
        if not answers:
            return 204, b""
        if self.reverse and not polling:
            answers.reverse()
        return 200, orjson.dumps(answers if isinstance(payload, list) else answers[0])

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
            height = self.rpc.chain.resolve(ref, self.head)  # -39006 outside the window
        answer = {"node": self.name, "method": method, "height": height}
        if method == "eth_getBlockByNumber":
            answer.update(self.header(height))
        if self.pad:
            answer["pad"] = "x" * self.pad
        return answer

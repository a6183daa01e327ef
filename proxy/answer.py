"""The last step: what the client gets for an item once no further attempt will serve it.

A single request's answer is the node's bytes as they came, unless they must change: a
transaction to show as pending (proxy/ryw.py), a -39xxx code of a standard method shown as
geth's (proxy/face.py), the client's id as it wrote it. An item that ran out of attempts
gets the last answer a node gave, else an error saying why no node answered or none was
eligible.
"""

from __future__ import annotations

from typing import Any

import orjson

from chainstate.jsonrpc import INTERNAL_ERROR, JsonRpcError, error_response, restore_ids
from proxy.face import Face
from proxy.metrics import ProxyMetrics
from proxy.model import Node, Pool
from proxy.outcome import UpstreamError
from proxy.parse import NO_NODE_KEY
from proxy.request import Ctx, Item
from proxy.ryw import UNMINED_FIELDS, ReadYourWrites


class Answers:
    def __init__(self, face: Face, ryw: ReadYourWrites, metrics: ProxyMetrics) -> None:
        self.face = face
        self.ryw = ryw
        self.metrics = metrics

    def single(
        self, ctx: Ctx, item: Item, body: bytes, out: bytes | None, answers: list[Any]
    ) -> tuple[int, bytes]:
        """A request object's answer: the node's bytes (`out`), else what `answers` holds.
        (`body`: the client's bytes, for an id orjson would change.)"""
        notif, rid, spec = item.notif, item.rid, item.spec
        if out is None:
            answer = answers[0]
            if answer is None:  # a notification
                return 204, b""
            out = answer if type(answer) is bytes else orjson.dumps(answer)
            if spec.standard and out.find(b"-390") >= 0:  # (a node's code: proxy/face.py)
                out = self.face.raw(spec, out, ctx.pool, item.ref)
        else:
            if item.method in UNMINED_FIELDS:
                out = self.ryw.view(ctx.pool, item.method, out)
            # (a node's code: proxy/face.py; `partition`, a third of `find`'s cost here; bytes
            # written early were found without one: `Ctx.answer_early`)
            if spec.standard and out is not ctx.written and out.partition(b"-390")[1]:
                out = self.face.raw(spec, out, ctx.pool, item.ref)
            if type(rid) is orjson.Fragment:  # as the client wrote it, not as parsed
                out = restore_ids(body, out)  # (last: the steps above decode the answer)
        return (204, b"") if notif or not out else (200, out)

    def give_up(self, ctx: Ctx, it: Item, answers: list[Any], exc: JsonRpcError | None) -> None:
        """Final answer of an item no further attempt will serve: the last answer a node
        gave, else an error saying why no node answered (or why none was eligible)."""
        node_key = it.tried[-1].key if it.tried else NO_NODE_KEY
        if it.last is not None:
            answer, result = it.last, "error"
            if type(answer) is dict:  # (a single's bytes: `single`)
                self.face.answer(it.spec, answer, ctx.pool, it.ref)
        elif it.err is not None or exc is None:
            answer = error_response(it.rid, INTERNAL_ERROR, "")
            answer["error"] = failed(ctx.pool, it.method, it.tried, it.err).to_obj()
            result = "upstream_failed"
        else:
            answer, result = error_response(it.rid, exc.code, exc.message), "no_node"
        self.metrics.request(ctx.chain, it.method, node_key, result)
        if not it.notif:
            answers[it.pos] = answer


def failed(
    pool: Pool, method: str, tried: list[Node], failure: UpstreamError | None
) -> JsonRpcError:
    """Why no node answered an item after its attempts."""
    last = tried[-1] if tried else None
    if last is not None and last.entry.kind == "writer":
        msg = (
            f"{method}: the Leader write node {last.key} ({last.entry.url}) did not answer: "
            f"{failure}; if it stays down, switch the Leader: "
            f"POST /{pool.id}/writers/switchLeader"
        )
    else:
        msg = f"{method}: no node answered after {len(tried)} attempt(s); last error: {failure}"
    return JsonRpcError(INTERNAL_ERROR, msg)

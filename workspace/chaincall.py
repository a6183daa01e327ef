"""POST /v1/chainstate/{chain_id}: a JSON-RPC body forwarded to the routing proxy.

In `chainstate up` the proxy runs in the same process and `chainstate_forward` calls its
engine directly; a standalone `chainstate workspace` forwards over HTTP to
`settings.proxy_url` + `/{chain_id}`. The proxy's answer (status and body) is returned as is:
this endpoint speaks JSON-RPC, not the workspace envelope, except for workspace-level
failures (auth, unreachable proxy), which use the envelope.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from workspace.errors import UPSTREAM, UPSTREAM_TIMEOUT, ApiError, invalid
from workspace.http import AppCtx, Call, Endpoint, Forward

CHAIN_RE = re.compile(r"0x[0-9a-fA-F]+|[0-9]+")
# Request headers passed on to the proxy (usage keys and tracing attributes).
PASS_HEADERS = (
    "client-id",
    "x-vendor-biz",
    "x-vendor-source",
    "x-vendor-source-host",
    "x-vendor-env",
    "content-type",
)


def http_forward(ctx: AppCtx) -> Forward:
    """Forward over HTTP to the proxy at settings.proxy_url (standalone workspace)."""

    async def forward(chain_id: str, body: bytes, headers: Mapping[str, str]) -> tuple[int, bytes]:
        if ctx.http is None:
            ctx.http = aiohttp.ClientSession()
        url = f"{ctx.settings.proxy_url.rstrip('/')}/{chain_id}"
        timeout = aiohttp.ClientTimeout(total=ctx.settings.forward_timeout_s)
        async with ctx.http.post(url, data=body, headers=dict(headers), timeout=timeout) as resp:
            return resp.status, await resp.read()

    return forward


async def call_forward(
    ctx: AppCtx, chain_id: str, body: bytes, headers: Mapping[str, str]
) -> tuple[int, bytes]:
    try:
        return await asyncio.wait_for(
            ctx.forward(chain_id, body, headers), ctx.settings.forward_timeout_s
        )
    except TimeoutError:
        raise ApiError(UPSTREAM_TIMEOUT, "the chain-state proxy did not answer in time") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise ApiError(UPSTREAM, f"the chain-state proxy could not be reached: {exc}") from None


async def chain_height(ctx: AppCtx, chain_id: str) -> int | None:
    """The chain's latest block number through the proxy, or None when unavailable."""
    return await _block_number(ctx, chain_id, "latest")


async def finalized_height(ctx: AppCtx, chain_id: str) -> int | None:
    return await _block_number(ctx, chain_id, "finalized")


async def _block_number(ctx: AppCtx, chain_id: str, tag: str) -> int | None:
    if not CHAIN_RE.fullmatch(chain_id):
        return None
    if tag == "latest":
        req: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber", "params": []}
    else:
        req = {"jsonrpc": "2.0", "id": 1, "method": "eth_getBlockByNumber", "params": [tag, False]}
    try:
        status, body = await asyncio.wait_for(
            ctx.forward(chain_id, orjson.dumps(req), {"content-type": "application/json"}),
            ctx.settings.chain_height_timeout_s,
        )
        answer = orjson.loads(body) if status == 200 else None
        result = answer.get("result") if isinstance(answer, dict) else None
        if isinstance(result, dict):
            result = result.get("number")
        return int(result, 16) if isinstance(result, str) else None
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError, orjson.JSONDecodeError):
        return None


def routes(ctx: AppCtx) -> list[Endpoint]:
    async def chainstate(call: Call) -> Any:
        request = call.request
        chain_id = request.match_info["chain_id"]
        if not CHAIN_RE.fullmatch(chain_id):
            raise invalid(f"chain_id must be a decimal or 0x-hex chain id; got {chain_id!r}")
        body = await request.read()  # client_max_size bounds it (413)
        headers = {h: request.headers[h] for h in PASS_HEADERS if h in request.headers}
        headers.setdefault("content-type", "application/json")
        status, answer = await call_forward(ctx, chain_id, body, headers)
        if status == 204 or not answer:
            return web.Response(status=204)
        return web.Response(status=status, body=answer, content_type="application/json")

    return [
        Endpoint(
            "POST",
            "/v1/chainstate/{chain_id}",
            chainstate,
            (),
            "Forward a JSON-RPC request or batch to the chain-state proxy for chain_id; the "
            "answer is the proxy's JSON-RPC response (not the envelope)",
            {},
            "chainstate",
            access_key=True,
            raw=True,
        )
    ]

"""What a route module declares: `Endpoint`s whose handlers take a `Call`.

A route module (listed in `workspace.app.ROUTE_MODULES`) exposes
`routes(ctx: AppCtx) -> list[Endpoint]`. The app turns each Endpoint into an aiohttp route
that authenticates, parses parameters (query string for GET, JSON body for POST) against
`params`, runs the handler and wraps its return value in the `{"code", "message", "data"}`
envelope. The same declarations produce /v1/openapi.json.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import ClientSession, web

from workspace.auth import Principal, authenticate
from workspace.coltypes import FLOAT_EXACT
from workspace.db import Database
from workspace.errors import (
    INTERNAL,
    INVALID_JSON,
    INVALID_PARAMS,
    TOO_LARGE,
    UNSUPPORTED_MEDIA,
    ApiError,
    ok,
)
from workspace.settings import WorkspaceSettings
from workspace.validate import Field, parse_fields

log = logging.getLogger("workspace")

DEFAULT_JSON_DEPTH = WorkspaceSettings.max_json_depth
# chainstate_forward(chain_id, body, headers) -> (HTTP status, body)
Forward = Callable[[str, bytes, Mapping[str, str]], Awaitable[tuple[int, bytes]]]


@dataclass
class AppCtx:
    """Everything a handler may use; one per application."""

    settings: WorkspaceSettings
    db: Database
    forward: Forward
    http: ClientSession | None = None
    # Tables with a `space` column counted in a Space's `content_count` (modules append).
    content_tables: list[str] = field(default_factory=lambda: ["ws_tables"])
    # table/instance/list provider: fn(conn, table_id, access, limit, account_id) -> data,
    # only that account's instances (set by workspace.compute_api).
    table_instances: Callable[..., Any] | None = None


@dataclass
class Call:
    """One authenticated request with its parsed parameters."""

    request: web.Request
    ctx: AppCtx
    params: dict[str, Any]
    principal: Principal | None

    @property
    def db(self) -> Database:
        return self.ctx.db

    @property
    def who(self) -> Principal:
        assert self.principal is not None
        return self.principal


Handler = Callable[[Call], Awaitable[Any]]


@dataclass(frozen=True)
class Endpoint:
    """One /v1 endpoint. `response` is the JSON Schema of `data` (for OpenAPI); `raw`
    handlers return a web.Response themselves and get the body unparsed."""

    method: str
    path: str
    handler: Handler
    params: tuple[Field, ...] = ()
    summary: str = ""
    response: dict[str, Any] = field(default_factory=dict)
    tag: str = ""
    access_key: bool = False
    auth: bool = True
    raw: bool = False


def json_response(payload: Any, status: int = 200) -> web.Response:
    return web.Response(body=dumps_exact(payload), status=status, content_type="application/json")


def dumps_exact(payload: Any) -> bytes:
    """orjson, or the standard library when a value holds an integer beyond 64 bits (a
    Function may return 10**30; orjson refuses it and JSON allows it)."""
    try:
        return orjson.dumps(payload, option=orjson.OPT_NON_STR_KEYS)
    except TypeError as exc:
        if "64-bit" not in str(exc):
            raise
        return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


def loads_exact(raw: bytes | str, max_depth: int = DEFAULT_JSON_DEPTH) -> Any:
    """Parse JSON with orjson, but keep integers beyond 64 bits exact, and refuse documents
    nested deeper than `max_depth` (the `max_json_depth` setting): later steps (storing,
    handing to a run, answering) recurse over values, and Python's recursion limit is ~1000.

    orjson reads such integers as floats (123456789012345678901234567890 becomes
    1.2345678901234568e+29), which would silently change a UINT256 value; when the result holds
    an integral float too large to be exact, the text is parsed again with the standard library.
    Raises ValueError (orjson.JSONDecodeError is one) with the reason.
    """
    doc = orjson.loads(raw)
    depth, big_float = json_shape(doc)
    if depth > max_depth:
        raise ValueError(f"nested deeper than {max_depth} levels (max_json_depth)")
    if not big_float:
        return doc
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def json_shape(doc: Any) -> tuple[int, bool]:
    """(nesting depth, whether an integral float is too large to be exact) of a JSON value;
    iterative, so any depth is measured without recursion."""
    stack = [(doc, 1)]
    deepest = 0
    big_float = False
    while stack:
        v, depth = stack.pop()
        if isinstance(v, float):
            big_float = big_float or (v.is_integer() and abs(v) > FLOAT_EXACT)
        elif isinstance(v, dict):
            deepest = max(deepest, depth)
            stack.extend((x, depth + 1) for x in v.values())
        elif isinstance(v, list):
            deepest = max(deepest, depth)
            stack.extend((x, depth + 1) for x in v)
    return deepest, big_float


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


async def read_json_body(
    request: web.Request, max_bytes: int, max_depth: int = DEFAULT_JSON_DEPTH
) -> dict[str, Any]:
    if request.content_length is not None and request.content_length > max_bytes:
        raise ApiError(TOO_LARGE, f"request body larger than {max_bytes} bytes")
    raw = await request.read()  # aiohttp enforces client_max_size (413) while reading
    if not raw.strip():
        return {}
    ctype = request.content_type
    if ctype not in ("application/json", "application/octet-stream") and not ctype.endswith(
        "+json"
    ):
        raise ApiError(
            UNSUPPORTED_MEDIA, "POST bodies must be JSON (Content-Type: application/json)"
        )
    try:
        body = loads_exact(raw, max_depth)
    except ValueError as exc:
        raise ApiError(INVALID_JSON, f"body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(INVALID_JSON, "body must be a JSON object")
    return body


def make_handler(
    ctx: AppCtx, ep: Endpoint
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The aiohttp handler for one Endpoint: auth, params, envelope."""

    async def handle(request: web.Request) -> web.StreamResponse:
        principal = None
        if ep.auth:
            principal = await ctx.db.read(authenticate, request.headers, ep.access_key)
        if ep.raw:
            params: dict[str, Any] = {}
        elif ep.method == "GET":
            query = dict(request.query)
            if len(query) != len(request.query):
                raise ApiError(INVALID_PARAMS, "each query parameter may be given once")
            params = parse_fields(ep.params, query, query=True)
        else:
            settings = ctx.settings
            body = await read_json_body(request, settings.max_body_bytes, settings.max_json_depth)
            params = parse_fields(ep.params, body, query=False)
        result = await ep.handler(Call(request, ctx, params, principal))
        if isinstance(result, web.StreamResponse):
            return result
        return json_response(ok(result))

    return handle


@web.middleware
async def envelope_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every failure becomes the error envelope with its HTTP status."""
    try:
        return await handler(request)
    except ApiError as exc:
        return json_response(exc.envelope(), exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = exc.status * 100
        reason = exc.reason or "error"
        if exc.status == 404:
            reason = f"no endpoint {request.method} {request.path}"
        elif exc.status == 405:
            reason = f"{request.method} is not allowed on {request.path}"
        elif exc.status == 413:
            reason = "request body larger than the configured max_body_bytes"
        return json_response({"code": code, "message": reason, "data": None}, exc.status)
    except Exception:
        log.exception("unhandled error", extra={"path": request.path})
        return json_response({"code": INTERNAL, "message": "internal error", "data": None}, 500)

"""GET /v1/openapi.json, built from the Endpoint declarations (so it cannot drift)."""

from __future__ import annotations

from typing import Any

from chainstate import __version__
from workspace.http import Endpoint
from workspace.validate import object_schema

ERROR = {
    "type": "object",
    "properties": {
        "code": {"type": "integer", "not": {"const": 0}},
        "message": {"type": "string"},
        "data": {"type": "null"},
    },
    "required": ["code", "message", "data"],
}


def _envelope(data: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"code": {"const": 0}, "message": {"const": "ok"}, "data": data},
        "required": ["code", "message", "data"],
    }


def _error_responses(ep: Endpoint) -> dict[str, Any]:
    err = {"description": "error envelope", "content": {"application/json": {"schema": ERROR}}}
    codes = ["400", "404", "409", "413", "415"]
    if ep.auth:
        codes += ["401", "403"]
    if ep.raw:
        codes += ["502", "504"]
    return {c: err for c in codes}


def build_openapi(endpoints: list[Endpoint]) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for ep in endpoints:
        op: dict[str, Any] = {
            "summary": ep.summary,
            "operationId": ep.method.lower()
            + ep.path.replace("/", "_").replace("{", "").replace("}", ""),
            "tags": [ep.tag] if ep.tag else [],
            "responses": _error_responses(ep),
        }
        if ep.auth:
            op["security"] = (
                [{"bearer": [], "account": []}, {"accessKey": []}]
                if ep.access_key
                else [{"bearer": [], "account": []}]
            )
        if ep.raw:
            op["parameters"] = [
                {
                    "name": "chain_id",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string", "pattern": "^(0x[0-9a-fA-F]+|[0-9]+)$"},
                }
            ]
            op["requestBody"] = {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {"description": "a JSON-RPC 2.0 request object or batch array"}
                    }
                },
            }
            op["responses"]["200"] = {
                "description": "the proxy's JSON-RPC response",
                "content": {"application/json": {"schema": {}}},
            }
        else:
            if ep.method == "GET":
                op["parameters"] = [
                    {"name": f.name, "in": "query", "required": f.required, "schema": f.schema()}
                    for f in ep.params
                ]
            else:
                op["requestBody"] = {
                    "required": True,
                    "content": {"application/json": {"schema": object_schema(ep.params)}},
                }
            op["responses"]["200"] = {
                "description": "success envelope",
                "content": {"application/json": {"schema": _envelope(ep.response)}},
            }
        paths.setdefault(ep.path, {})[ep.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "chainstate workspace API", "version": __version__},
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": {
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "personal access token; needs X-Account-ID",
                },
                "account": {"type": "apiKey", "in": "header", "name": "X-Account-ID"},
                "accessKey": {"type": "apiKey", "in": "header", "name": "AccessKey"},
            }
        },
    }

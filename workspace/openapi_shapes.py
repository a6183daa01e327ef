"""JSON Schemas of the response shapes (the `data` of each endpoint) for /v1/openapi.json."""

from __future__ import annotations

from typing import Any

STR: dict[str, Any] = {"type": "string"}
STR_NULL: dict[str, Any] = {"type": ["string", "null"]}
INT: dict[str, Any] = {"type": "integer"}
INT_NULL: dict[str, Any] = {"type": ["integer", "null"]}
NUM: dict[str, Any] = {"type": "number"}
NUM_NULL: dict[str, Any] = {"type": ["number", "null"]}
BOOL: dict[str, Any] = {"type": "boolean"}


def obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
    }


def arr(item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": item}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def page_of(item: dict[str, Any]) -> dict[str, Any]:
    return obj({"start": INT, "limit": INT, "items": arr(item), "total_count": INT})


ACCOUNT = obj(
    {
        "id": STR,
        "type": {"type": "string", "enum": ["personal", "org"]},
        "slug": STR_NULL,
        "display_name": STR_NULL,
        "avatar_url": STR_NULL,
        "avatar_thumbnail_url": STR_NULL,
    }
)
SPACE = obj(
    {
        "id": STR,
        "description": STR_NULL,
        "account_id": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
        "status": STR,
        "visibility": {"type": "string", "enum": ["public", "org", "private"]},
        "dep_count": INT,
        "content_count": INT,
        "created_at": NUM,
        "updated_at": NUM,
        "account": nullable(ACCOUNT),
    }
)
COLUMN = obj({"id": STR, "name": STR, "type": STR, "is_system": BOOL})
INDEX = obj(
    {"id": STR_NULL, "columns": arr(STR), "is_primary": BOOL, "is_system": BOOL, "is_hidden": BOOL}
)
TABLE_TYPE = {"type": "string", "enum": ["normal", "block_event", "block_state", "time"]}
TABLE_SUMMARY_PROPS: dict[str, Any] = {
    "id": STR,
    "space": STR,
    "name": STR_NULL,
    "chain_id": STR_NULL,
    "table_type": TABLE_TYPE,
    "description": STR_NULL,
    "created_at": NUM,
    "updated_at": NUM,
}
TABLE_SUMMARY = obj(TABLE_SUMMARY_PROPS)
TABLE_LIST_ITEM = obj(
    {
        **TABLE_SUMMARY_PROPS,
        "space_entity": nullable(SPACE),
        "deps": INT,
        "last_write_at_ms": INT_NULL,
    }
)
VIEW = {
    "anyOf": [
        {"type": "object", "additionalProperties": obj({"sort": INT})},
        {"type": "null"},
    ]
}
ID_LABEL = obj({"id": STR, "label": STR})
TABLE_DETAIL = obj(
    {
        **TABLE_SUMMARY_PROPS,
        "space_entity": nullable(SPACE),
        "columns": arr(COLUMN),
        "indexes": arr(INDEX),
        "view": VIEW,
        "start_height": INT_NULL,
        "deps": INT,
        "last_write_at_ms": INT_NULL,
        "first_write_at": NUM_NULL,
        "inited": BOOL,
        "table_rows": INT,
        "table_size": INT,
        "replica_num": INT,
        "s3_synced_at": NUM_NULL,
        "subtables": arr(ID_LABEL),
        "parent": obj({"id": STR, "table_type": TABLE_TYPE}),
        "label": STR,
        "relations": arr(ID_LABEL),
    },
    required=[*TABLE_SUMMARY_PROPS, "space_entity", "indexes", "view", "inited"],
)
ROW_COLUMN = obj({"id": STR, "name": STR, "type": STR}, required=["name", "type"])
ROW_RESULT_BASE: dict[str, Any] = {
    "columns": arr(ROW_COLUMN),
    "rows": arr({"type": "object"}),
    "total_count": INT_NULL,
}
ROW_GET = obj(ROW_RESULT_BASE)
ROW_LIST = obj({**ROW_RESULT_BASE, "start": INT, "limit": INT})
ROW_QUERY = obj({**ROW_RESULT_BASE, "rows_count": INT, "truncated": BOOL})
NULL = {"type": "null"}

"""Spaces: GET /v1/space, GET /v1/space/list, POST /v1/space/create (not shown in the spec)."""

from __future__ import annotations

import time
from typing import Any

from workspace.auth import VISIBLE_SQL, Principal, get_account, visible_params
from workspace.db import Conn
from workspace.errors import conflict, forbidden, not_found
from workspace.http import AppCtx, Call, Endpoint
from workspace.openapi_shapes import SPACE, page_of
from workspace.validate import ACCOUNT_ID, DIRECTION, SPACE_ID, START, Field, Int, Str

VISIBILITIES = ("public", "org", "private")
STATUS_ACTIVE = "active"


def space_json(conn: Conn, row: dict[str, Any], content_tables: list[str]) -> dict[str, Any]:
    content = sum(
        int(conn.scalar(f"SELECT COUNT(*) FROM {t} WHERE space = ?", [row["id"]]) or 0)
        for t in content_tables
    )
    return {
        "id": row["id"],
        "description": row["description"],
        "account_id": row["account_id"],
        "status": row["status"],
        "visibility": row["visibility"],
        "dep_count": int(row["dep_count"]),
        "content_count": content,
        "created_at": float(row["created_at"]),
        "updated_at": float(row["updated_at"]),
        "account": get_account(conn, row["account_id"]),
    }


def visible_space(conn: Conn, who: Principal, space_id: str) -> dict[str, Any] | None:
    """The Space row if it exists and the caller may see it."""
    return conn.one(
        f"SELECT * FROM ws_spaces s WHERE s.id = ? AND {VISIBLE_SQL}",
        [space_id, *visible_params(who)],
    )


def writable_space(conn: Conn, who: Principal, space_id: str) -> dict[str, Any]:
    """The Space row if the caller's account owns it; 404 if unseen, 403 if read-only."""
    row = visible_space(conn, who, space_id)
    if row is None:
        raise not_found(f"space {space_id!r}")
    if row["account_id"] != who.account_id:
        raise forbidden(f"space {space_id!r} belongs to another account; it is read-only here")
    return row


def routes(ctx: AppCtx) -> list[Endpoint]:
    content_tables = ctx.content_tables

    async def get_space(call: Call) -> Any:
        def q(conn: Conn) -> Any:
            row = visible_space(conn, call.who, call.params["id"])
            return None if row is None else space_json(conn, row, content_tables)

        return await call.db.read(q)

    async def list_spaces(call: Call) -> Any:
        p = call.params

        def q(conn: Conn) -> Any:
            where, params = VISIBLE_SQL, visible_params(call.who)
            if p["account_id"] is not None:
                where += " AND s.account_id = ?"
                params = [*params, p["account_id"]]
            total = conn.scalar(f"SELECT COUNT(*) FROM ws_spaces s WHERE {where}", params)
            order = f"s.{p['order_by']} {p['direction'].upper()}, s.id {p['direction'].upper()}"
            rows = conn.all(
                f"SELECT s.*, (SELECT COUNT(*) FROM ws_tables t WHERE t.space = s.id) AS tc "
                f"FROM ws_spaces s WHERE {where} ORDER BY {order} LIMIT ? OFFSET ?",
                [*params, p["limit"], p["start"]],
            )
            items = [
                {**space_json(conn, r, content_tables), "table_count": int(r["tc"])} for r in rows
            ]
            return {"start": p["start"], "limit": p["limit"], "items": items, "total_count": total}

        return await call.db.read(q)

    async def create_space(call: Call) -> Any:
        p = call.params

        def q(conn: Conn) -> Any:
            if conn.scalar("SELECT 1 FROM ws_spaces WHERE id = ?", [p["id"]]):
                raise conflict(f"space {p['id']!r} already exists")
            now = time.time()
            conn.execute(
                "INSERT INTO ws_spaces (id, account_id, description, status, visibility, "
                "dep_count, created_at, updated_at) VALUES (?,?,?,?,?,0,?,?)",
                [
                    p["id"],
                    call.who.account_id,
                    p["description"],
                    STATUS_ACTIVE,
                    p["visibility"],
                    now,
                    now,
                ],
            )
            row = conn.one("SELECT * FROM ws_spaces WHERE id = ?", [p["id"]])
            return space_json(conn, row or {}, content_tables)

        return await call.db.run(q)

    nullable_space = {"anyOf": [SPACE, {"type": "null"}]}
    space_item = {
        **SPACE,
        "properties": {**SPACE["properties"], "table_count": {"type": "integer"}},
    }
    return [
        Endpoint(
            "GET",
            "/v1/space",
            get_space,
            (Field("id", Str(1, 64), required=True),),
            "Get a Space (data null when it does not exist or is not visible)",
            nullable_space,
            "space",
        ),
        Endpoint(
            "GET",
            "/v1/space/list",
            list_spaces,
            (
                Field("start", START, default=0),
                Field("limit", Int(1, 1000), default=100),
                Field("account_id", ACCOUNT_ID, nullable=True),
                Field(
                    "order_by", Str(enum=("id", "created_at", "updated_at")), default="updated_at"
                ),
                Field("direction", DIRECTION, default="desc"),
            ),
            "List the Spaces visible to the calling account",
            page_of(space_item),
            "space",
        ),
        Endpoint(
            "POST",
            "/v1/space/create",
            create_space,
            (
                Field("id", SPACE_ID, required=True),
                Field("description", Str(max_len=255), nullable=True),
                Field("visibility", Str(enum=VISIBILITIES), default="private"),
            ),
            "Create a Space owned by the calling account (not shown in the spec)",
            SPACE,
            "space",
        ),
    ]

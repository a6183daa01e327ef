"""Table endpoints: create, get, list, init, columns/update|validate, indexes/update,
view/update, id_types, templates, start_height/editable|update, instance/list."""

from __future__ import annotations

import sys
import time
import uuid
from typing import Any

from workspace import tabledefs as td
from workspace.auth import VISIBLE_SQL, Principal, visible_params
from workspace.chaincall import chain_height
from workspace.coltypes import ID_TYPES, TYPES
from workspace.db import Conn
from workspace.errors import conflict, forbidden, invalid, not_found
from workspace.http import AppCtx, Call, Endpoint
from workspace.openapi_shapes import (
    BOOL,
    COLUMN,
    INDEX,
    INT,
    STR,
    STR_NULL,
    TABLE_DETAIL,
    TABLE_LIST_ITEM,
    TABLE_SUMMARY,
    arr,
    obj,
    page_of,
)
from workspace.spaces import space_json, writable_space
from workspace.tabledefs import Table
from workspace.validate import (
    DIRECTION,
    ID_255,
    SPACE_ID,
    START,
    Arr,
    Bool,
    Field,
    Int,
    Obj,
    Str,
)


def load_table(conn: Conn, who: Principal, table_id: str, write: bool = False) -> Table:
    """The table if the caller may see it (404 otherwise); with `write`, 403 unless the
    caller's account owns its Space."""
    row = conn.one(
        f"SELECT t.*, s.account_id AS owner FROM ws_tables t JOIN ws_spaces s ON s.id = t.space "
        f"WHERE t.id = ? AND {VISIBLE_SQL}",
        [table_id, *visible_params(who)],
    )
    if row is None:
        raise not_found(f"table {table_id!r}")
    if write and row["owner"] != who.account_id:
        raise forbidden(f"table {table_id!r} belongs to another account; it is read-only here")
    return Table.from_row(row)


def table_deps(conn: Conn, table_id: str) -> int:
    """Readers of the table recorded by the compute module (0 when it is not loaded)."""
    store = sys.modules.get("workspace.compute.store")
    return int(store.table_reader_count(conn, table_id)) if store is not None else 0


def require_inited(table: Table) -> None:
    if not table.inited:
        raise conflict(f"table {table.id!r} is not initialized; call POST /v1/table/init first")


def summary(t: Table) -> dict[str, Any]:
    return {
        "id": t.id,
        "space": t.space,
        "name": t.name,
        "chain_id": t.chain_id,
        "table_type": t.table_type,
        "description": t.description,
        "created_at": t.created_at,
        "updated_at": t.updated_at,
    }


def table_size(conn: Conn, t: Table) -> int:
    if not t.inited:
        return 0
    if conn.dialect == "sqlite":
        names = [t.physical] + [td.index_name(t.physical, i["id"]) for i in t.indexes]
        marks = ",".join("?" * len(names))
        return int(
            conn.scalar(f"SELECT SUM(pgsize) FROM dbstat WHERE name IN ({marks})", names) or 0
        )
    return int(conn.scalar("SELECT pg_total_relation_size(?::regclass)", [td.q(t.physical)]) or 0)


def detail(conn: Conn, t: Table, content_tables: list[str], is_l1: bool = False) -> dict:
    space = conn.one("SELECT * FROM ws_spaces WHERE id = ?", [t.space])
    indexes = t.indexes if is_l1 else [i for i in t.indexes if not i["is_hidden"]]
    rows = conn.scalar(f"SELECT COUNT(*) FROM {td.q(t.physical)}") if t.inited else 0
    out = {
        **summary(t),
        "space_entity": space_json(conn, space, content_tables) if space else None,
        "indexes": indexes,
        "view": t.view,
        "start_height": t.start_height,
        "deps": table_deps(conn, t.id),
        "last_write_at_ms": t.last_write_at_ms,
        "first_write_at": t.first_write_at,
        "inited": t.inited,
        "table_rows": int(rows or 0),
        "table_size": table_size(conn, t),
        "replica_num": 1,
        "s3_synced_at": None,
        "subtables": [],
        "parent": {"id": t.id, "table_type": t.table_type},
        "label": "l1" if is_l1 else t.table_type,
        "relations": [],
    }
    if t.inited:
        out["columns"] = t.columns
    return out


COLUMN_ITEM = Obj(
    (
        Field("id", Str(1, 64), required=True),
        Field("name", Str(1, 64), required=True),
        Field("type", Str(1), required=True),
        Field("is_system", Bool(), nullable=True, doc="read-only, ignored"),
    )
)
INDEX_ITEM = Obj(
    (
        Field("id", Str(1, 64), nullable=True),
        Field("columns", Arr(Str(1, 64), min_items=1), required=True),
        Field("is_hidden", Bool(), nullable=True, doc="read-only, ignored"),
        Field("is_system", Bool(), nullable=True, doc="read-only, ignored"),
        Field("is_primary", Bool(), nullable=True, doc="read-only, ignored"),
    )
)
VIEW = Obj(values=Obj((Field("sort", Int(0), required=True),)))
TABLE_TYPE = Str(enum=td.TABLE_TYPES)
ID_PARAM = Field("id", ID_255, required=True, doc="full table id")


def routes(ctx: AppCtx) -> list[Endpoint]:
    settings = ctx.settings
    content = ctx.content_tables

    async def create(call: Call) -> Any:
        p = call.params
        table_type, chain_id = p["table_type"], p["chain_id"] or None
        if table_type in td.BLOCK_TYPES:
            if not chain_id:
                raise invalid(f"chain_id is required for {table_type} tables")
            if not td.CHAIN_ID_RE.fullmatch(chain_id):
                raise invalid("chain_id must be 1-64 of A-Z a-z 0-9 _ -")
        elif chain_id:
            raise invalid("chain_id is only for block tables (block_event, block_state)")
        base = p["name"]
        if table_type in td.BLOCK_TYPES and base.endswith(f".{chain_id}"):
            base = base[: -len(chain_id) - 1]
        if not td.TABLE_NAME_RE.fullmatch(base):
            raise invalid(
                "name must use a-z, 0-9 and '_' and not start with a digit"
                + (" (the chain suffix is added for block tables)" if chain_id else "")
            )
        name = td.full_table_name(base, table_type, chain_id)
        full_id = f"{p['space']}.{name}"
        if len(full_id) > td.MAX_FULL_ID:
            raise invalid(
                f"the full table id {full_id!r} has {len(full_id)} characters; "
                f"at most {td.MAX_FULL_ID}"
            )

        def q(conn: Conn) -> Any:
            writable_space(conn, call.who, p["space"])
            if conn.scalar("SELECT 1 FROM ws_tables WHERE id = ?", [full_id]):
                raise conflict(f"table {full_id!r} already exists")
            now = time.time()
            conn.execute(
                "INSERT INTO ws_tables (id, space, name, chain_id, table_type, description, "
                "physical, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?)",
                [
                    full_id,
                    p["space"],
                    name,
                    chain_id,
                    table_type,
                    p["description"],
                    "t_" + uuid.uuid4().hex[:20],
                    now,
                    now,
                ],
            )
            conn.execute("UPDATE ws_spaces SET updated_at = ? WHERE id = ?", [now, p["space"]])
            return summary(load_table(conn, call.who, full_id))

        return await call.db.run(q)

    async def get(call: Call) -> Any:
        def q(conn: Conn) -> Any:
            t = load_table(conn, call.who, call.params["id"])
            return detail(conn, t, content, call.params["is_l1"])

        return await call.db.read(q)

    async def list_tables(call: Call) -> Any:
        p = call.params

        def q(conn: Conn) -> Any:
            where = f"{VISIBLE_SQL}"
            params: list[Any] = visible_params(call.who)
            if p["space"] is not None:
                if (
                    conn.one(
                        f"SELECT 1 FROM ws_spaces s WHERE s.id = ? AND {VISIBLE_SQL}",
                        [p["space"], *params],
                    )
                    is None
                ):
                    raise not_found(f"space {p['space']!r}")
                where += " AND t.space = ?"
                params.append(p["space"])
            if p["name"]:
                where += " AND t.name LIKE ? ESCAPE '\\'"
                escaped = p["name"].replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
                params.append(f"%{escaped}%")
            base = f"FROM ws_tables t JOIN ws_spaces s ON s.id = t.space WHERE {where}"
            total = conn.scalar(f"SELECT COUNT(*) {base}", params)
            d = p["direction"].upper()
            rows = conn.all(
                f"SELECT t.* {base} ORDER BY t.{p['order_by']} {d}, t.id {d} LIMIT ? OFFSET ?",
                [*params, p["limit"], p["start"]],
            )
            spaces: dict[str, Any] = {}
            items = []
            for r in rows:
                t = Table.from_row(r)
                if t.space not in spaces:
                    srow = conn.one("SELECT * FROM ws_spaces WHERE id = ?", [t.space])
                    spaces[t.space] = space_json(conn, srow, content) if srow else None
                items.append(
                    {
                        **summary(t),
                        "space_entity": spaces[t.space],
                        "deps": table_deps(conn, t.id),
                        "last_write_at_ms": t.last_write_at_ms if p["with_activity"] else None,
                    }
                )
            return {"start": p["start"], "limit": p["limit"], "items": items, "total_count": total}

        return await call.db.read(q)

    async def init(call: Call) -> Any:
        p = call.params

        def q(conn: Conn) -> Any:
            t = load_table(conn, call.who, p["id"], write=True)
            if t.inited:
                raise conflict(
                    f"table {t.id!r} is already initialized; use columns/update or indexes/update"
                )
            t.columns = td.check_columns(t.table_type, p["columns"], settings.max_columns)
            t.indexes = td.check_indexes(t, p["indexes"], t.columns, settings.max_indexes)
            t.view = td.check_view(p["view"], t.columns)
            t.inited = True
            td.create_physical(conn, t)
            t.save(conn, time.time())
            return detail(conn, t, content)

        return await call.db.run(q)

    async def columns_update(call: Call) -> Any:
        p = call.params

        def q(conn: Conn) -> Any:
            t = load_table(conn, call.who, p["id"], write=True)
            require_inited(t)
            new = td.check_columns(t.table_type, p["columns"], settings.max_columns)
            apply_column_changes(conn, t, new)
            t.view = td.check_view(p["view"], new) if p["view"] is not None else _prune_view(t)
            t.save(conn, time.time())
            return detail(conn, t, content)

        return await call.db.run(q)

    async def columns_validate(call: Call) -> Any:
        reason = td.column_name_problem(call.params["name"])
        return {"is_valid": reason is None, "reason": reason}

    async def indexes_update(call: Call) -> Any:
        p = call.params

        def q(conn: Conn) -> Any:
            t = load_table(conn, call.who, p["id"], write=True)
            require_inited(t)
            new = td.check_indexes(t, p["indexes"], t.columns, settings.max_indexes)
            old = {i["id"]: i for i in t.indexes if not i["is_system"]}
            wanted = {i["id"]: i for i in new if not i["is_system"]}
            for idx_id, idx in old.items():
                if idx_id not in wanted or wanted[idx_id]["columns"] != idx["columns"]:
                    td.drop_index(conn, t.physical, idx)
            for idx_id, idx in wanted.items():
                if idx_id not in old or old[idx_id]["columns"] != idx["columns"]:
                    td.create_index(conn, t.physical, idx)
            t.indexes = new
            t.save(conn, time.time())
            return detail(conn, t, content)

        return await call.db.run(q)

    async def view_update(call: Call) -> Any:
        p = call.params

        def q(conn: Conn) -> Any:
            t = load_table(conn, call.who, p["id"], write=True)
            require_inited(t)
            t.view = td.check_view(p["view"], t.columns)
            t.save(conn, time.time())
            return detail(conn, t, content)

        return await call.db.run(q)

    async def id_types(call: Call) -> Any:
        return list(ID_TYPES)

    async def templates(call: Call) -> Any:
        cols, idxs = td.template(call.params["table_type"])
        return {"columns": cols, "indexes": idxs}

    def editable_reason(conn: Conn, t: Table) -> str | None:
        if not t.is_block:
            return "only block tables have a start height"
        if not t.inited:
            return "the table is not initialized"
        if conn.scalar("SELECT 1 FROM ws_table_blocks WHERE table_id = ? LIMIT 1", [t.id]):
            return "the table has processed blocks"
        return None

    async def start_height_editable(call: Call) -> Any:
        def q(conn: Conn) -> Any:
            t = load_table(conn, call.who, call.params["id"])
            reason = editable_reason(conn, t)
            return {"editable": reason is None, "reason": reason}

        return await call.db.read(q)

    async def start_height_update(call: Call) -> Any:
        p = call.params
        t0 = await call.db.read(load_table, call.who, p["id"], True)
        if not t0.is_block:
            raise conflict("only block tables have a start height")
        height = await chain_height(ctx, t0.chain_id or "")
        if height is None:
            raise conflict(f"the current height of chain {t0.chain_id} is unavailable; retry later")
        if p["start_height"] > height:
            raise invalid(f"start_height {p['start_height']} is above the chain's height {height}")

        def q(conn: Conn) -> Any:
            t = load_table(conn, call.who, p["id"], write=True)
            reason = editable_reason(conn, t)
            if reason:
                raise conflict(f"start height is not editable: {reason}")
            t.start_height = p["start_height"]
            t.save(conn, time.time())
            return detail(conn, t, content)

        return await call.db.run(q)

    async def instance_list(call: Call) -> Any:
        p = call.params
        provider = ctx.table_instances

        def q(conn: Conn) -> Any:
            t = load_table(conn, call.who, p["id"])
            if provider is None:  # no compute module: no instance can touch a table
                return {"instances": [], "count": 0}
            return provider(conn, t.id, p["access"], p["limit"], call.who.account_id)

        return await call.db.read(q)

    T = "table"
    instance_item = obj(
        {
            "id": STR,
            "last_accessed_at_ms": {"type": ["integer", "null"]},
            "name": STR_NULL,
            "display_status": STR,
            "launched": STR,
            "notebook_id": STR_NULL,
            "schedule_id": STR_NULL,
            "exit_message": STR_NULL,
        }
    )
    return [
        Endpoint(
            "GET",
            "/v1/table",
            get,
            (
                ID_PARAM,
                Field(
                    "is_l1",
                    Bool(),
                    default=False,
                    doc="true: the stored (L1) definition incl. hidden indexes",
                ),
            ),
            "Get a table's detail",
            TABLE_DETAIL,
            T,
        ),
        Endpoint(
            "POST",
            "/v1/table/create",
            create,
            (
                Field("space", SPACE_ID, required=True),
                Field("name", Str(1, 255), required=True),
                Field("table_type", TABLE_TYPE, required=True),
                Field("chain_id", Str(max_len=64), nullable=True, default=""),
                Field("description", Str(max_len=255), nullable=True),
            ),
            "Create a table (uninitialized)",
            TABLE_SUMMARY,
            T,
        ),
        Endpoint(
            "GET",
            "/v1/table/list",
            list_tables,
            (
                Field("start", START, default=0),
                Field("limit", Int(1, 100), default=10),
                Field(
                    "order_by",
                    Str(enum=("id", "name", "created_at", "updated_at")),
                    default="updated_at",
                ),
                Field("direction", DIRECTION, default="desc"),
                Field("space", Str(1, 64), nullable=True),
                Field("name", Str(max_len=255), nullable=True, doc="substring of the name"),
                Field(
                    "with_activity",
                    Bool(),
                    default=False,
                    doc="fill last_write_at_ms (null otherwise)",
                ),
            ),
            "List tables in visible Spaces",
            page_of(TABLE_LIST_ITEM),
            T,
        ),
        Endpoint(
            "POST",
            "/v1/table/init",
            init,
            (
                ID_PARAM,
                Field("columns", Arr(COLUMN_ITEM), nullable=True),
                Field("indexes", Arr(INDEX_ITEM), nullable=True),
                Field("view", VIEW, nullable=True),
            ),
            "Set a table's schema and create its storage",
            TABLE_DETAIL,
            T,
        ),
        Endpoint(
            "POST",
            "/v1/table/columns/update",
            columns_update,
            (
                ID_PARAM,
                Field("columns", Arr(COLUMN_ITEM), required=True),
                Field("view", VIEW, nullable=True),
            ),
            "Replace the column list",
            TABLE_DETAIL,
            T,
        ),
        Endpoint(
            "POST",
            "/v1/table/columns/validate",
            columns_validate,
            (Field("name", Str(1), required=True),),
            "Check a column name",
            obj({"is_valid": BOOL, "reason": STR_NULL}),
            T,
        ),
        Endpoint(
            "POST",
            "/v1/table/indexes/update",
            indexes_update,
            (ID_PARAM, Field("indexes", Arr(INDEX_ITEM), required=True)),
            "Replace the index list",
            TABLE_DETAIL,
            T,
        ),
        Endpoint(
            "POST",
            "/v1/table/view/update",
            view_update,
            (ID_PARAM, Field("view", VIEW, required=True, nullable=True)),
            "Replace the display settings",
            TABLE_DETAIL,
            T,
        ),
        Endpoint("GET", "/v1/table/id_types", id_types, (), "Primary key types", arr(STR), T),
        Endpoint(
            "GET",
            "/v1/table/templates",
            templates,
            (Field("table_type", TABLE_TYPE, default="normal"),),
            "System columns and indexes of a table type",
            obj({"columns": arr(COLUMN), "indexes": arr(INDEX)}),
            T,
        ),
        Endpoint(
            "GET",
            "/v1/table/instance/list",
            instance_list,
            (
                ID_PARAM,
                Field("access", Str(enum=("read", "write")), required=True),
                Field("limit", Int(1), default=100, doc="effective maximum 1000"),
            ),
            "The calling account's Notebook instances that read or wrote the table",
            obj({"instances": arr(instance_item), "count": INT}),
            T,
        ),
        Endpoint(
            "GET",
            "/v1/table/start_height/editable",
            start_height_editable,
            (ID_PARAM,),
            "Whether the start height can be set",
            obj({"editable": BOOL, "reason": STR_NULL}),
            T,
        ),
        Endpoint(
            "POST",
            "/v1/table/start_height/update",
            start_height_update,
            (ID_PARAM, Field("start_height", Int(0, 9223372036854775807), required=True)),
            "Set a block table's start height",
            TABLE_DETAIL,
            T,
        ),
    ]


def _prune_view(t: Table) -> dict[str, Any] | None:
    if t.view is None:
        return None
    ids = {c["id"] for c in t.columns}
    return {k: v for k, v in t.view.items() if k in ids}


def apply_column_changes(conn: Conn, t: Table, new: list[dict[str, Any]]) -> None:
    """Replace t.columns by `new` (matched by column id): drop, rename, add; types fixed."""
    old_by_id = {c["id"]: c for c in t.columns}
    old_sys = {c["name"]: c for c in t.columns if c["is_system"]}
    for c in new:  # system columns are matched by name and keep their id
        if c["is_system"] and c["name"] in old_sys:
            c["id"] = old_sys[c["name"]]["id"]
    new_by_id = {c["id"]: c for c in new}
    if len(new_by_id) != len(new):
        raise td.bad("column ids must be unique")
    indexed = {c: i["id"] for i in t.indexes for c in i["columns"]}
    dropped = [c for cid, c in old_by_id.items() if cid not in new_by_id]
    for c in dropped:
        if c["is_system"]:
            raise td.bad(f"system column {c['name']!r} cannot be removed")
        if c["name"] in indexed:
            raise td.bad(
                f"column {c['name']!r} is used by index {indexed[c['name']]!r}; "
                "remove it from the indexes first"
            )
    renamed = []
    for cid, c in new_by_id.items():
        old = old_by_id.get(cid)
        if old is None:
            continue
        if old["type"] != c["type"]:
            raise td.bad(
                f"column {old['name']!r}: type cannot change ({old['type']} -> {c['type']})"
            )
        if old["name"] != c["name"]:
            if old["is_system"]:
                raise td.bad(f"system column {old['name']!r} cannot be renamed")
            renamed.append((old["name"], c["name"]))
        c["is_system"] = old["is_system"]
    table = td.q(t.physical)
    for c in dropped:
        conn.execute(f"ALTER TABLE {table} DROP COLUMN {td.q(c['name'])}")
    for n, (src, _) in enumerate(renamed):
        conn.execute(f"ALTER TABLE {table} RENAME COLUMN {td.q(src)} TO {td.q(f'__tmp_{n}')}")
    for n, (_, dst) in enumerate(renamed):
        conn.execute(f"ALTER TABLE {table} RENAME COLUMN {td.q(f'__tmp_{n}')} TO {td.q(dst)}")
    for cid, c in new_by_id.items():
        if cid not in old_by_id:
            sql_type = TYPES[c["type"]].sql
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {td.q(c['name'])} {sql_type}")
    rename_map = dict(renamed)
    for idx in t.indexes:
        idx["columns"] = [rename_map.get(col, col) for col in idx["columns"]]
    t.columns = new

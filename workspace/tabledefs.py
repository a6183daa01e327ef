"""Table definitions: templates, the rules for columns/indexes/view, and the physical DDL.

Every function here either returns a checked definition or raises a 400 ApiError
(INVALID_DEFINITION) saying which rule was broken. Physical row tables are `t_<hex>`; column
names are used as (quoted) physical column names so row/query can use them directly.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from workspace.coltypes import ID_TYPES, TYPES
from workspace.db import Conn
from workspace.errors import INVALID_DEFINITION, ApiError

TABLE_TYPES = ("normal", "block_event", "block_state", "time")
BLOCK_TYPES = ("block_event", "block_state")
COLUMN_NAME_RE = re.compile(r"[a-z_][a-z0-9_]*")
ITEM_ID_RE = re.compile(r"[A-Za-z0-9_-]+")
TABLE_NAME_RE = re.compile(r"[a-z_][a-z0-9_]*")
CHAIN_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_FULL_ID = 64


def bad(message: str) -> ApiError:
    return ApiError(INVALID_DEFINITION, message)


def _col(name: str, type_: str) -> dict[str, Any]:
    return {"id": name, "name": name, "type": type_, "is_system": True}


def _idx(id_: str, cols: list[str], primary: bool = False, hidden: bool = False) -> dict:
    return {
        "id": id_,
        "columns": cols,
        "is_primary": primary,
        "is_system": True,
        "is_hidden": hidden,
    }


_BLOCK_COLS = [
    _col("id", "HASH"),
    _col("block_height", "BLOCKHEIGHT"),
    _col("block_id", "HASH"),
    _col("block_timestamp", "TIMESTAMP"),
]
_BLOCK_IDX = [
    _idx("primary", ["id"], primary=True),
    _idx("block_height", ["block_height"], hidden=True),
]
TEMPLATES: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {
    "normal": ([_col("id", "STRING")], [_idx("primary", ["id"], primary=True)]),
    "block_event": (_BLOCK_COLS, _BLOCK_IDX),
    "block_state": (_BLOCK_COLS, _BLOCK_IDX),
    "time": (
        [_col("id", "STRING"), _col("time_at", "TIMESTAMP"), _col("value", "FLOAT")],
        [_idx("primary", ["id"], primary=True), _idx("time_at", ["time_at"], hidden=True)],
    ),
}


def template(table_type: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    cols, idxs = TEMPLATES[table_type]
    return [dict(c) for c in cols], [dict(i, columns=list(i["columns"])) for i in idxs]


def column_name_problem(name: str) -> str | None:
    """Why `name` cannot be a column name, or None (POST /v1/table/columns/validate)."""
    if not 1 <= len(name) <= 64:
        return "a column name has 1-64 characters"
    if not COLUMN_NAME_RE.fullmatch(name):
        return "a column name uses a-z, 0-9 and '_' and does not start with a digit"
    if name.startswith("__"):
        return "names starting with '__' are reserved"
    return None


@dataclass
class Table:
    """A table's stored definition (a ws_tables row)."""

    id: str
    space: str
    name: str
    chain_id: str | None
    table_type: str
    description: str | None
    physical: str
    inited: bool
    columns: list[dict[str, Any]]
    indexes: list[dict[str, Any]]
    view: dict[str, Any] | None
    start_height: int | None
    first_write_at: float | None
    last_write_at_ms: int | None
    created_at: float
    updated_at: float

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Table:
        return cls(
            id=row["id"],
            space=row["space"],
            name=row["name"],
            chain_id=row["chain_id"],
            table_type=row["table_type"],
            description=row["description"],
            physical=row["physical"],
            inited=bool(row["inited"]),
            columns=json.loads(row["columns_json"]),
            indexes=json.loads(row["indexes_json"]),
            view=json.loads(row["view_json"]) if row["view_json"] else None,
            start_height=row["start_height"],
            first_write_at=row["first_write_at"],
            last_write_at_ms=row["last_write_at_ms"],
            created_at=float(row["created_at"]),
            updated_at=float(row["updated_at"]),
        )

    @property
    def is_block(self) -> bool:
        return self.table_type in BLOCK_TYPES

    def column(self, name: str) -> dict[str, Any] | None:
        return next((c for c in self.columns if c["name"] == name), None)

    def save(self, conn: Conn, now: float) -> None:
        self.updated_at = now
        conn.execute(
            "UPDATE ws_tables SET inited = ?, columns_json = ?, indexes_json = ?, view_json = ?, "
            "start_height = ?, updated_at = ? WHERE id = ?",
            [
                int(self.inited),
                json.dumps(self.columns),
                json.dumps(self.indexes),
                None if self.view is None else json.dumps(self.view),
                self.start_height,
                now,
                self.id,
            ],
        )


def full_table_name(name: str, table_type: str, chain_id: str | None) -> str:
    """Block table names carry the chain suffix `<name>.<chain_id>`."""
    if table_type in BLOCK_TYPES and not name.endswith(f".{chain_id}"):
        return f"{name}.{chain_id}"
    return name


def check_columns(
    table_type: str, given: list[dict[str, Any]] | None, max_columns: int
) -> list[dict[str, Any]]:
    """The checked column list for `given` (None: the template's)."""
    tmpl, _ = template(table_type)
    if given is None:
        return tmpl
    if len(given) > max_columns:
        raise bad(f"a table has at most {max_columns} columns; got {len(given)}")
    cols: list[dict[str, Any]] = []
    for i, item in enumerate(given):
        if not ITEM_ID_RE.fullmatch(item["id"]):
            raise bad(f"columns[{i}].id {item['id']!r} may use only A-Z a-z 0-9 _ -")
        problem = column_name_problem(item["name"])
        if problem:
            raise bad(f"columns[{i}].name {item['name']!r}: {problem}")
        type_ = item["type"].upper()
        if type_ not in TYPES:
            raise bad(f"columns[{i}].type {item['type']!r} is not one of {', '.join(TYPES)}")
        cols.append({"id": item["id"], "name": item["name"], "type": type_, "is_system": False})
    _unique(cols, "id")
    _unique(cols, "name")
    if table_type == "time":
        want = {(c["name"], c["type"]) for c in tmpl}
        if {(c["name"], c["type"]) for c in cols} != want:
            fixed = ", ".join(f"{c['name']} {c['type']}" for c in tmpl)
            raise bad(f"time tables have fixed columns: {fixed}")
        return tmpl
    if table_type == "normal":
        id_col = next((c for c in cols if c["name"] == "id"), None)
        if id_col is None:
            raise bad("a normal table requires a column named 'id' (its primary key)")
        if id_col["type"] not in ID_TYPES:
            raise bad(f"column 'id' must have a primary key type: {', '.join(ID_TYPES)}")
        id_col["is_system"] = True
        return cols
    by_name = {c["name"]: c for c in cols}
    missing = []
    for sys_col in tmpl:
        mine = by_name.get(sys_col["name"])
        if mine is None:
            missing.append(sys_col)
        elif mine["type"] != sys_col["type"]:
            raise bad(f"system column {sys_col['name']!r} has type {sys_col['type']}")
        else:
            mine["is_system"] = True
    out = missing + cols
    _unique(out, "id")
    return out


def _unique(items: list[dict[str, Any]], key: str) -> None:
    seen: set[str] = set()
    for item in items:
        if item[key] in seen:
            raise bad(f"column {key}s must be unique; {item[key]!r} appears twice")
        seen.add(item[key])


def check_indexes(
    table: Table, given: list[dict[str, Any]] | None, columns: list[dict[str, Any]], max_n: int
) -> list[dict[str, Any]]:
    """System indexes first, then the user's (ids required on normal tables)."""
    _, system = template(table.table_type)
    system_ids = {i["id"] for i in system}
    names = {c["name"] for c in columns}
    out: list[dict[str, Any]] = []
    seen: set[str] = set(system_ids)
    for i, item in enumerate(given or []):
        if item.get("id") in system_ids:
            continue  # system indexes are always kept; round-tripped items are ignored
        cols = item["columns"]
        for c in cols:
            if c not in names:
                raise bad(f"indexes[{i}] refers to unknown column {c!r}")
        if len(set(cols)) != len(cols):
            raise bad(f"indexes[{i}] lists a column twice")
        idx_id = item.get("id")
        if idx_id is None:
            if table.table_type == "normal":
                raise bad(f"indexes[{i}].id is required for normal tables")
            idx_id = _generated_id(cols, seen)
        if not ITEM_ID_RE.fullmatch(idx_id):
            raise bad(f"indexes[{i}].id {idx_id!r} may use only A-Z a-z 0-9 _ -")
        if idx_id in seen:
            raise bad(f"index ids must be unique; {idx_id!r} appears twice or is reserved")
        seen.add(idx_id)
        out.append(
            {
                "id": idx_id,
                "columns": list(cols),
                "is_primary": False,
                "is_system": False,
                "is_hidden": False,
            }
        )
    if len(out) > max_n:
        raise bad(f"a table has at most {max_n} indexes; got {len(out)}")
    return system + out


def _generated_id(cols: list[str], seen: set[str]) -> str:
    base = ("idx_" + "_".join(cols))[:60]
    candidate, n = base, 1
    while candidate in seen:
        n += 1
        candidate = f"{base[:58]}_{n}"
    return candidate


def check_view(view: dict[str, Any] | None, columns: list[dict[str, Any]]) -> dict | None:
    if view is None:
        return None
    ids = {c["id"] for c in columns}
    for key in view:
        if key not in ids:
            raise bad(f"view refers to unknown column id {key!r}")
    return {k: {"sort": v["sort"]} for k, v in view.items()}


# ---- physical DDL -------------------------------------------------------------------------


def q(name: str) -> str:
    """Quote an identifier (names are validated, so they never hold a double quote)."""
    return '"' + name.replace('"', '""') + '"'


def index_name(physical: str, index_id: str) -> str:
    return f"ix_{physical}_{hashlib.sha1(index_id.encode()).hexdigest()[:12]}"


def create_physical(conn: Conn, table: Table) -> None:
    defs = []
    for c in table.columns:
        sql_type = TYPES[c["type"]].sql
        pk = " PRIMARY KEY" if c["name"] == "id" else ""
        notnull = " NOT NULL" if c["is_system"] and not pk else ""
        defs.append(f"{q(c['name'])} {sql_type}{pk}{notnull}")
    conn.execute(f"CREATE TABLE {q(table.physical)} ({', '.join(defs)})")
    for idx in table.indexes:
        if not idx["is_primary"]:
            create_index(conn, table.physical, idx)


def create_index(conn: Conn, physical: str, idx: dict[str, Any]) -> None:
    cols = ", ".join(q(c) for c in idx["columns"])
    conn.execute(f"CREATE INDEX {q(index_name(physical, idx['id']))} ON {q(physical)} ({cols})")


def drop_index(conn: Conn, physical: str, idx: dict[str, Any]) -> None:
    conn.execute(f"DROP INDEX {q(index_name(physical, idx['id']))}")

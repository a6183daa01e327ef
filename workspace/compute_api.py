"""What the Function and Notebook endpoints share (workspace.functions, workspace.notebooks
both import it; neither imports the other): the compute service of the app (its set-up and
accessor), parameter and argument shapes, the name rule, the visible-Spaces filter, whose
rights a run gets, and the table/instance/list provider."""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from workspace.auth import VISIBLE_SQL, Principal, visible_params
from workspace.compute import store as cs
from workspace.compute.service import COMPUTE_KEY, ComputeService, ComputeSettings
from workspace.db import Conn
from workspace.errors import invalid
from workspace.http import AppCtx, Call
from workspace.openapi_shapes import STR, STR_NULL, arr, nullable, obj
from workspace.validate import Arr, Obj

NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")
TABLE_INSTANCES_MAX = 1000  # table/instance/list: effective maximum of `limit`

PARAMETER = obj(
    {
        "name": STR_NULL,
        "type": STR,
        "options": nullable(arr({})),
        "default": nullable(obj({"value": {}})),
        "id": {},
        "order": {"type": ["integer", "null"]},
    }
)
ARGUMENT = obj({"value": {}, "name": STR_NULL, "order": {"type": ["integer", "null"]}})
PARAMS_IN = Arr(Obj(free=True))


def compute(call: Call) -> ComputeService:
    return call.request.app[COMPUTE_KEY]


def setup(app: web.Application, ctx: AppCtx) -> None:
    """One compute service per app: started after the app's migrations, stopped before the
    database closes. Tests may replace `app[COMPUTE_KEY].settings` / `.clock` before start."""
    settings = ComputeSettings.from_mapping(
        ctx.settings.compute, ctx.settings.workspace_dir, ctx.settings.port
    )
    svc = ComputeService(ctx, settings)
    app[COMPUTE_KEY] = svc
    ctx.table_instances = table_instances  # table/instance/list reads compute's access records
    for table in ("ws_functions", "ws_notebooks"):
        if table not in ctx.content_tables:
            ctx.content_tables.append(table)

    async def start(_: web.Application) -> None:
        await svc.start()

    async def stop(_: web.Application) -> None:
        await svc.close()

    app.on_startup.append(start)
    app.on_shutdown.append(stop)


def check_name(name: str, space: str) -> None:
    if not NAME_RE.match(name):
        raise invalid("name must use A-Z, a-z, 0-9, '_' or '-' (not starting with '-')")
    if len(space) + 1 + len(name) > 255:
        raise invalid("the Function id <space>.<name> must be at most 255 characters")


def visible_spaces(who: Principal, space: str | None) -> cs.SpaceFilter:
    """SQL condition on a `space` column: the Spaces `who` may see (one of them when `space`
    is given), as a subquery rather than a list of every public Space's id."""
    sql = f"space IN (SELECT s.id FROM ws_spaces s WHERE {VISIBLE_SQL}"
    params: list[Any] = visible_params(who)
    if space is not None:
        sql += " AND s.id = ?"
        params.append(space)
    return sql + ")", params


def run_rights(who: Principal, owner_account: str) -> Principal:
    """Whose rights a saved Function or Notebook runs with: its owner's (like a SQL SECURITY
    DEFINER function). Code of another account never acts as the caller, so it can never
    read the caller's private tables or write the caller's rows; the caller's own code acts
    as the caller."""
    if owner_account == who.account_id:
        return who
    return Principal(owner_account, owner_account, "owner")


def table_instances(
    conn: Conn, table_id: str, access: str, limit: int, account_id: str
) -> dict[str, Any]:
    """table/instance/list data: the caller's instances that read or wrote `table_id`, newest
    first (another account's instances, names and exit messages are never shown)."""
    items = [
        {
            "id": doc["id"],
            "last_accessed_at_ms": at_ms,
            "name": doc["name"],
            "display_status": doc["display_status"],
            "launched": doc["launched"],
            "notebook_id": doc["notebook_id"],
            "schedule_id": doc["schedule_id"],
            "exit_message": doc["exit_message"],
        }
        for at_ms, doc in cs.table_accesses(
            conn, table_id, access, account_id, min(limit, TABLE_INSTANCES_MAX)
        )
    ]
    return {"instances": items, "count": len(items)}

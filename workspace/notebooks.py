"""Notebook endpoints: notebooks (create, get, delete, list), instances (create, get, list,
cancel, keepalive, set_background, logs/history, metrics, specs) and schedules (create, get,
list, delete, runs). Execution is the compute service's (set up by workspace.compute_api)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from workspace.auth import Principal, get_account
from workspace.compute import store as cs
from workspace.compute.instances import InstanceError
from workspace.compute.params import bind_names, check_arguments, check_parameters
from workspace.compute.scheduler import MODES, next_due, valid_cron
from workspace.compute_api import (
    ARGUMENT,
    PARAMETER,
    PARAMS_IN,
    check_name,
    compute,
    run_rights,
    visible_spaces,
)
from workspace.db import Conn
from workspace.errors import ApiError, conflict, forbidden, invalid, not_found
from workspace.http import AppCtx, Call, Endpoint
from workspace.openapi_shapes import (
    ACCOUNT,
    INT,
    INT_NULL,
    NULL,
    NUM,
    NUM_NULL,
    SPACE,
    STR,
    STR_NULL,
    arr,
    nullable,
    obj,
    page_of,
)
from workspace.spaces import space_json, visible_space, writable_space
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

BUSY = 42900  # instance/create: this server already runs its maximum of instances
INSTANCE_LIST_MAX = 50  # spec: effective maximum of instance/list `limit`

NOTEBOOK = obj(
    {
        "id": STR,
        "space": STR,
        "name": STR_NULL,
        "language": STR_NULL,
        "code": STR_NULL,
        "parameters": arr(PARAMETER),
        "created_at": NUM,
        "updated_at": NUM,
        "space_entity": nullable(SPACE),
    }
)
SCHEDULE = obj(
    {
        "id": STR,
        "space": STR,
        "content_type": STR_NULL,
        "content_id": STR_NULL,
        "cron": STR_NULL,
        "arguments": arr(ARGUMENT),
        "name": STR_NULL,
        "mode": STR_NULL,
        "max_cpu": INT_NULL,
        "max_memory": INT_NULL,
        "created_at": NUM,
        "updated_at": NUM,
        "deleted_at": NUM_NULL,
    }
)
SCHEDULE_RUN = obj(
    {
        "id": STR,
        "schedule_id": STR,
        "due_at": NUM,
        "status": {"type": "string", "enum": ["started", "skipped", "failed"]},
        "instance_id": STR_NULL,
        "reason": STR_NULL,
        "created_at": NUM,
    }
)
INSTANCE_PROPS: dict[str, Any] = {
    "id": STR,
    "notebook_id": STR_NULL,
    "name": STR_NULL,
    "code": STR_NULL,
    "parameters": arr(PARAMETER),
    "arguments": arr(ARGUMENT),
    "max_memory": INT_NULL,
    "max_cpu": INT_NULL,
    "max_network_rx": INT_NULL,
    "max_network_tx": INT_NULL,
    "account_id": STR_NULL,
    "user_id": STR_NULL,
    "schedule_id": STR_NULL,
    "background": {"type": ["boolean", "null"]},
    "debug": {"type": ["boolean", "null"]},
    "deadline": NUM_NULL,
    "status": {"type": "string", "enum": ["running", "ended"]},
    "exit_code": INT_NULL,
    "oom_killed": {"type": ["boolean", "null"]},
    "exited_at": NUM_NULL,
    "created_at": NUM,
    "updated_at": NUM,
    "display_status": {
        "type": "string",
        "enum": ["running", "succeeded", "failed", "canceled", "starting"],
    },
    "launched": {"type": "string", "enum": ["manual", "schedule"]},
    "exit_message": STR_NULL,
    "account": nullable(ACCOUNT),
    "user": nullable(
        obj({"id": STR, "created_at": NUM, "updated_at": NUM, "account": nullable(ACCOUNT)})
    ),
    "notebook": nullable(obj({"id": STR, "name": STR_NULL, "space": STR})),
    "schedule": nullable(SCHEDULE),
}
INSTANCE = obj(INSTANCE_PROPS)
INSTANCE_ITEM = obj(
    {k: v for k, v in INSTANCE_PROPS.items() if k != "code"},
)
CHART_SET = obj(
    {
        "instance_id": STR,
        "from": NUM,
        "to": NUM,
        "step": INT,
        "charts": {
            "type": "object",
            "additionalProperties": obj(
                {"unit": STR, "series": arr(obj({"name": STR, "points": arr(arr(NUM))}))}
            ),
        },
    }
)
CONTAINER_CHARTS = {
    "cpu": "percent",
    "memory": "bytes",
    "net_rx": "bytes_per_sec",
    "net_tx": "bytes_per_sec",
}
BLOCKX_CHARTS = {"block_lag": "ms", "tasks": "per_sec", "task_duration": "ms", "calls": "per_sec"}
SCHEDULE_PUBLIC = tuple(SCHEDULE["properties"])


def notebook_json(conn: Conn, nb: dict[str, Any], content: list[str], code: bool) -> dict:
    space = conn.one("SELECT * FROM ws_spaces WHERE id = ?", [nb["space"]])
    out = {
        "id": nb["id"],
        "space": nb["space"],
        "name": nb["name"],
        "language": nb["language"],
        "code": nb["code"],
        "parameters": nb["parameters"],
        "created_at": nb["created_at"],
        "updated_at": nb["updated_at"],
        "space_entity": space_json(conn, space, content) if space else None,
    }
    if not code:
        del out["code"]
    return out


def load_notebook(conn: Conn, who: Principal, notebook_id: str, write: bool = False) -> dict:
    nb = cs.get_notebook(conn, notebook_id)
    if nb is None or visible_space(conn, who, nb["space"]) is None:
        raise not_found(f"notebook {notebook_id!r}")
    if write and nb["account_id"] != who.account_id:
        raise forbidden(f"notebook {notebook_id!r} belongs to another account; it is read-only")
    return nb


def schedule_json(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: doc.get(k) for k in SCHEDULE_PUBLIC}


def instance_json(conn: Conn, doc: dict[str, Any], code: bool) -> dict[str, Any]:
    out = {k: v for k, v in doc.items() if k in INSTANCE_PROPS}
    out["account"] = get_account(conn, doc["account_id"])
    user = get_account(conn, doc["user_id"]) if doc.get("user_id") else None
    out["user"] = (
        {"id": user["id"], "created_at": None, "updated_at": None, "account": user}
        if user
        else None
    )
    if user:
        created = conn.scalar("SELECT created_at FROM ws_accounts WHERE id = ?", [user["id"]])
        out["user"]["created_at"] = out["user"]["updated_at"] = float(created or 0)
    nb = cs.get_notebook(conn, doc["notebook_id"]) if doc.get("notebook_id") else None
    out["notebook"] = (
        {"id": nb["id"], "name": nb["name"], "space": nb["space"]}
        if nb
        else (
            {"id": doc["notebook_id"], "name": doc.get("name"), "space": doc.get("space")}
            if doc.get("notebook_id")
            else None
        )
    )
    sched = cs.get_schedule(conn, doc["schedule_id"]) if doc.get("schedule_id") else None
    out["schedule"] = schedule_json(sched) if sched else None
    if not code:
        out.pop("code", None)
    return out


def load_instance(conn: Conn, who: Principal, instance_id: str) -> dict[str, Any]:
    doc = cs.get_instance(conn, instance_id)
    if doc is None or doc["account_id"] != who.account_id:
        raise not_found(f"instance {instance_id!r}")
    return doc


def chart_set(
    instance_id: str, points: dict[str, list[list[float]]], units: dict[str, str], step: float
) -> dict[str, Any]:
    stamps = [p[0] for series in points.values() for p in series]
    now = time.time()
    return {
        "instance_id": instance_id,
        "from": min(stamps) if stamps else now,
        "to": max(stamps) if stamps else now,
        "step": max(1, round(step)),
        "charts": {
            name: {"unit": unit, "series": [{"name": name, "points": points.get(name, [])}]}
            for name, unit in units.items()
        },
    }


def instance_error(exc: InstanceError) -> ApiError:
    if exc.kind == "not_found":
        return not_found(str(exc).removesuffix(" not found"))
    if exc.kind == "busy":
        return ApiError(BUSY, str(exc))
    return invalid(str(exc))


def routes(ctx: AppCtx) -> list[Endpoint]:
    content = ctx.content_tables

    # notebooks ---------------------------------------------------------------------------

    async def nb_get(call: Call) -> Any:
        def q(conn: Conn) -> Any:
            nb = load_notebook(conn, call.who, call.params["id"])
            return notebook_json(conn, nb, content, code=True)

        return await call.db.read(q)

    async def nb_create(call: Call) -> Any:
        p = call.params
        check_name(p["name"], p["space"])
        params = check_parameters(p["parameters"], consecutive=False, identifiers=True)
        nid = f"{p['space']}.{p['name']}"

        def q(conn: Conn) -> Any:
            writable_space(conn, call.who, p["space"])
            if cs.get_notebook(conn, nid) is not None:
                raise conflict(f"notebook {nid!r} already exists")
            now = time.time()
            nb = {
                "id": nid,
                "space": p["space"],
                "account_id": call.who.account_id,
                "name": p["name"],
                "language": p["language"],
                "code": p["code"] or "",
                "parameters": params,
                "created_at": now,
                "updated_at": now,
            }
            cs.put_notebook(conn, nb)
            conn.execute("UPDATE ws_spaces SET updated_at = ? WHERE id = ?", [now, p["space"]])
            return notebook_json(conn, nb, content, code=True)

        return await call.db.run(q)

    async def nb_delete(call: Call) -> Any:
        def q(conn: Conn) -> None:
            nb = load_notebook(conn, call.who, call.params["id"], write=True)
            cs.delete_notebook(conn, nb["id"])
            now = time.time()
            for sched in cs.active_schedules(conn):  # its schedules stop with it
                if sched["content_id"] == nb["id"]:
                    sched["deleted_at"] = now
                    sched["updated_at"] = now
                    cs.put_schedule(conn, sched)

        await call.db.run(q)

    async def nb_list(call: Call) -> Any:
        p = call.params

        def q(conn: Conn) -> Any:
            spaces = visible_spaces(call.who, p["space"])
            items, total = cs.list_notebooks(
                conn, spaces, p["name"], p["start"], p["limit"], p["order_by"], p["direction"]
            )
            out = [notebook_json(conn, nb, content, code=False) for nb in items]
            return {"start": p["start"], "limit": p["limit"], "items": out, "total_count": total}

        return await call.db.read(q)

    # instances ---------------------------------------------------------------------------

    async def inst_create(call: Call) -> Any:
        p = call.params
        arguments = check_arguments(p["arguments"])
        nb = await call.db.read(lambda c: load_notebook(c, call.who, p["notebook_id"]))
        globals_ = bind_names(nb["parameters"], arguments)
        try:
            doc = await compute(call).manager.launch(
                code=nb["code"],
                notebook=nb,
                parameters=nb["parameters"],
                arguments=arguments,
                globals_=globals_,
                account_id=call.who.account_id,
                user_id=call.who.user_id,
                rights_account_id=run_rights(call.who, nb["account_id"]).account_id,
                name=p["name"],
                background=p["background"],
                max_cpu=p["max_cpu"],
                max_memory=p["max_memory"],
                debug=p["debug"],
            )
        except InstanceError as exc:
            raise instance_error(exc) from None
        return await call.db.read(lambda c: instance_json(c, doc, code=True))

    async def inst_get(call: Call) -> Any:
        def q(conn: Conn) -> Any:
            return instance_json(conn, load_instance(conn, call.who, call.params["id"]), True)

        return await call.db.read(q)

    async def inst_list(call: Call) -> Any:
        p = call.params
        limit = min(p["limit"], INSTANCE_LIST_MAX)

        def q(conn: Conn) -> Any:
            docs, total = cs.list_instances(conn, call.who.account_id, p, p["start"], limit)
            items = [instance_json(conn, d, False) for d in docs]
            return {"total_count": total, "instances": items}

        return await call.db.read(q)

    async def owned(call: Call) -> str:
        doc = await call.db.read(lambda c: load_instance(c, call.who, call.params["id"]))
        return str(doc["id"])

    async def inst_cancel(call: Call) -> Any:
        try:
            await compute(call).manager.cancel(await owned(call))
        except InstanceError as exc:
            raise instance_error(exc) from None

    async def inst_keepalive(call: Call) -> Any:
        await compute(call).manager.keepalive(await owned(call))

    async def inst_background(call: Call) -> Any:
        try:
            await compute(call).manager.set_background(await owned(call), call.params["background"])
        except InstanceError as exc:
            raise instance_error(exc) from None

    async def inst_logs(call: Call) -> Any:
        instance_id = await owned(call)
        manager = compute(call).manager  # a file read: off the event loop
        logs, cursor = await asyncio.to_thread(manager.logs, instance_id, call.params["timestamp"])
        return {"logs": logs, "timestamp": cursor}

    async def inst_container(call: Call) -> Any:
        svc = compute(call)
        instance_id = await owned(call)
        points = svc.manager.container_points(instance_id)
        step = svc.settings.instance.metrics_interval_seconds
        return chart_set(instance_id, points, CONTAINER_CHARTS, step)

    async def inst_blockx(call: Call) -> Any:
        svc = compute(call)
        instance_id = await owned(call)
        points = svc.manager.container_points(instance_id)
        step = svc.settings.instance.metrics_interval_seconds
        return chart_set(instance_id, points, BLOCKX_CHARTS, step)

    async def specs(call: Call) -> Any:
        svc = compute(call)
        quotas = svc.settings.instance.allowed_quotas
        return {
            "allowed_quota_spec": [{"max_cpu": c, "max_memory": m} for c, m in quotas],
            "sandbox": svc.describe(),
        }

    # schedules ---------------------------------------------------------------------------

    async def sch_create(call: Call) -> Any:
        p = call.params
        if not valid_cron(p["cron"]):
            raise invalid(f"cron {p['cron']!r} is not a valid 5-field cron expression (UTC)")
        arguments = check_arguments(p["arguments"])
        quotas = compute(call).settings.instance
        cpu = p["max_cpu"] if p["max_cpu"] is not None else quotas.default_max_cpu
        mem = p["max_memory"] if p["max_memory"] is not None else quotas.default_max_memory
        if not quotas.quota_allowed(cpu, mem):
            raise invalid(f"quota max_cpu={cpu} max_memory={mem} is not allowed; see specs")

        def q(conn: Conn) -> Any:
            nb = load_notebook(conn, call.who, p["notebook_id"], write=True)
            bind_names(nb["parameters"], arguments)  # the arguments must fit now
            now = time.time()
            doc = {
                "id": uuid.uuid4().hex,
                "space": nb["space"],
                "account_id": call.who.account_id,
                "user_id": call.who.user_id,
                "content_type": "notebook",
                "content_id": nb["id"],
                "cron": p["cron"],
                "arguments": arguments,
                "name": p["name"] if p["name"] is not None else nb["name"],
                "mode": p["mode"],
                "max_cpu": cpu,
                "max_memory": mem,
                "created_at": now,
                "updated_at": now,
                "deleted_at": None,
                "last_due_at": now,
            }
            cs.put_schedule(conn, doc)
            return schedule_json(doc)

        return await call.db.run(q)

    def load_schedule(conn: Conn, who: Principal, schedule_id: str) -> dict[str, Any]:
        doc = cs.get_schedule(conn, schedule_id)
        if doc is None or doc["account_id"] != who.account_id:
            raise not_found(f"schedule {schedule_id!r}")
        return doc

    async def sch_get(call: Call) -> Any:
        def q(conn: Conn) -> Any:
            doc = load_schedule(conn, call.who, call.params["id"])
            out = schedule_json(doc)
            if doc["deleted_at"] is None:
                out["next_run_at"] = next_due(
                    doc["cron"], doc.get("last_due_at") or doc["created_at"]
                )
            return out

        return await call.db.read(q)

    async def sch_list(call: Call) -> Any:
        p = call.params

        def q(conn: Conn) -> Any:
            items, total = cs.list_schedules(
                conn,
                call.who.account_id,
                p["notebook_id"],
                p["include_deleted"],
                p["start"],
                p["limit"],
            )
            out = [schedule_json(d) for d in items]
            return {"start": p["start"], "limit": p["limit"], "items": out, "total_count": total}

        return await call.db.read(q)

    async def sch_delete(call: Call) -> Any:
        def q(conn: Conn) -> None:
            doc = load_schedule(conn, call.who, call.params["id"])
            if doc["deleted_at"] is None:
                doc["deleted_at"] = doc["updated_at"] = time.time()
                cs.put_schedule(conn, doc)

        await call.db.run(q)

    async def sch_runs(call: Call) -> Any:
        p = call.params

        def q(conn: Conn) -> Any:
            doc = load_schedule(conn, call.who, p["id"])
            items, total = cs.list_schedule_runs(conn, doc["id"], p["start"], p["limit"])
            return {"start": p["start"], "limit": p["limit"], "items": items, "total_count": total}

        return await call.db.read(q)

    id_param = Field("id", ID_255, required=True)
    tag = "notebook"
    max_cpu = Field("max_cpu", Int(1, 100_000), nullable=True, doc="100 = one vCPU")
    max_mem = Field("max_memory", Int(1, 2**50), nullable=True, doc="bytes")
    page = (Field("start", START, default=0), Field("limit", Int(1, 100), default=20))
    return [
        Endpoint("GET", "/v1/notebook", nb_get, (id_param,), "Get a Notebook", NOTEBOOK, tag),
        Endpoint(
            "POST",
            "/v1/notebook/create",
            nb_create,
            (
                Field("space", SPACE_ID, required=True),
                Field("name", Str(1, 255), required=True),
                Field("language", Str(enum=("python",)), default="python"),
                Field("code", Str(), nullable=True, default=""),
                Field("parameters", PARAMS_IN, nullable=True, default=[]),
            ),
            "Create a Notebook (python); its id is <space>.<name>",
            NOTEBOOK,
            tag,
        ),
        Endpoint(
            "POST",
            "/v1/notebook/delete",
            nb_delete,
            (id_param,),
            "Delete a Notebook (its schedules stop; running instances continue)",
            NULL,
            tag,
        ),
        Endpoint(
            "GET",
            "/v1/notebook/list",
            nb_list,
            (
                *page,
                Field(
                    "order_by",
                    Str(enum=("id", "name", "created_at", "updated_at")),
                    default="updated_at",
                ),
                Field("direction", DIRECTION, default="desc"),
                Field("space", SPACE_ID, nullable=True),
                Field("name", Str(1, 255), doc="substring of the name"),
            ),
            "List visible Notebooks (without code)",
            page_of(obj({k: v for k, v in NOTEBOOK["properties"].items() if k != "code"})),
            tag,
        ),
        Endpoint(
            "POST",
            "/v1/notebook/instance/create",
            inst_create,
            (
                Field("notebook_id", ID_255, required=True),
                Field("arguments", Arr(Obj(free=True)), default=[]),
                Field("name", Str(1, 255), nullable=True),
                Field("background", Bool(), default=False),
                Field("debug", Bool(), default=False),
                max_cpu,
                max_mem,
            ),
            "Start an instance of a Notebook by hand (quotas: see instance/specs)",
            INSTANCE,
            tag,
        ),
        Endpoint(
            "GET",
            "/v1/notebook/instance",
            inst_get,
            (id_param,),
            "Get an instance of the calling account",
            INSTANCE,
            tag,
        ),
        Endpoint(
            "GET",
            "/v1/notebook/instance/list",
            inst_list,
            (
                Field("start", START, default=0),
                Field("limit", Int(1), default=10, doc="effective maximum 50"),
                Field("notebook_id", ID_255, nullable=True),
                Field("schedule_id", ID_255, nullable=True),
                Field("display_status", Str(enum=("running", "succeeded", "failed", "canceled"))),
                Field("launched", Str(enum=("manual", "schedule"))),
                Field("keyword", Str(0, 255)),
                Field("name", Str(0, 255)),
            ),
            "The calling account's instances, newest first",
            obj({"total_count": INT, "instances": arr(INSTANCE_ITEM)}),
            tag,
        ),
        Endpoint(
            "POST",
            "/v1/notebook/instance/cancel",
            inst_cancel,
            (id_param,),
            "Cancel a running instance",
            NULL,
            tag,
        ),
        Endpoint(
            "POST",
            "/v1/notebook/instance/keepalive",
            inst_keepalive,
            (id_param,),
            "Extend a foreground instance's deadline to 150 s from now",
            NULL,
            tag,
        ),
        Endpoint(
            "POST",
            "/v1/notebook/instance/set_background",
            inst_background,
            (id_param, Field("background", Bool(), default=True)),
            "Move an instance to the background (one way)",
            NULL,
            tag,
        ),
        Endpoint(
            "GET",
            "/v1/notebook/instance/logs/history",
            inst_logs,
            (id_param, Field("timestamp", Int(0), nullable=True)),
            "Log lines after the `timestamp` cursor (pass the returned one back unchanged)",
            obj(
                {
                    "logs": arr(obj({"timestamp": INT, "type": STR, "message": STR})),
                    "timestamp": NUM,
                }
            ),
            tag,
        ),
        Endpoint(
            "GET",
            "/v1/notebook/instance/metrics/blockx",
            inst_blockx,
            (id_param,),
            "block_lag, tasks, task_duration and calls fed by the SDK",
            CHART_SET,
            tag,
        ),
        Endpoint(
            "GET",
            "/v1/notebook/instance/metrics/container",
            inst_container,
            (id_param,),
            "cpu, memory, net_rx and net_tx sampled from the instance's processes",
            CHART_SET,
            tag,
        ),
        Endpoint(
            "GET",
            "/v1/notebook/instance/specs",
            specs,
            (),
            "Allowed quotas (max_cpu, max_memory) and what the sandbox enforces here",
            obj(
                {
                    "allowed_quota_spec": arr(obj({"max_cpu": INT_NULL, "max_memory": INT_NULL})),
                    "sandbox": {"type": "object"},
                }
            ),
            tag,
        ),
        Endpoint(
            "POST",
            "/v1/notebook/schedule/create",
            sch_create,
            (
                Field("notebook_id", ID_255, required=True),
                Field("cron", Str(1, 255), required=True, doc="5 fields, evaluated in UTC"),
                Field("arguments", Arr(Obj(free=True)), default=[]),
                Field("name", Str(1, 255), nullable=True),
                Field(
                    "mode",
                    Str(enum=MODES),
                    default="skip",
                    doc="skip: a run still going when the next is due makes that one "
                    "skipped; parallel: start anyway",
                ),
                max_cpu,
                max_mem,
            ),
            "Run a Notebook on a cron schedule (background instances)",
            SCHEDULE,
            tag,
        ),
        Endpoint(
            "GET",
            "/v1/notebook/schedule",
            sch_get,
            (id_param,),
            "Get a schedule",
            {**SCHEDULE, "properties": {**SCHEDULE["properties"], "next_run_at": NUM}},
            tag,
        ),
        Endpoint(
            "GET",
            "/v1/notebook/schedule/list",
            sch_list,
            (
                *page,
                Field("notebook_id", ID_255, nullable=True),
                Field("include_deleted", Bool(), default=False),
            ),
            "The calling account's schedules",
            page_of(SCHEDULE),
            tag,
        ),
        Endpoint(
            "POST",
            "/v1/notebook/schedule/delete",
            sch_delete,
            (id_param,),
            "Delete a schedule (kept with deleted_at; it fires no more)",
            NULL,
            tag,
        ),
        Endpoint(
            "GET",
            "/v1/notebook/schedule/runs",
            sch_runs,
            (id_param, *page),
            "Each due time of a schedule: started, skipped (and why) or failed",
            page_of(SCHEDULE_RUN),
            tag,
        ),
    ]

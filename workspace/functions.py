"""Function endpoints: get, create, update, delete, list (name/code keyword search), invoke,
run (run record), and test cases. Also sets the compute service up for the app (`setup`, from
workspace.compute_api) and holds the schema of everything compute stores (`MIGRATIONS`)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from workspace.auth import Principal
from workspace.compute import store as cs
from workspace.compute.params import bind, check_arguments, check_parameters
from workspace.compute.records import build_run_record, new_run_id
from workspace.compute.runners import DEFAULT_ENTRY, IDENTIFIER, LANGUAGES
from workspace.compute_api import (
    ARGUMENT,
    PARAMETER,
    PARAMS_IN,
    check_name,
    compute,
    run_rights,
    setup,
    visible_spaces,
)
from workspace.db import Conn
from workspace.errors import ApiError, conflict, forbidden, invalid, not_found
from workspace.http import AppCtx, Call, Endpoint
from workspace.openapi_shapes import (
    BOOL,
    INT,
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
    AnyJSON,
    Arr,
    Field,
    Int,
    Obj,
    Str,
)

MIGRATIONS = cs.MIGRATIONS
__all__ = ["MIGRATIONS", "routes", "setup"]
FUNCTION_FAILED = 42200  # function/invoke: the Function failed or timed out (message says how)
MAX_MATCHED_LINES = 10  # spec: at most 10 matched_lines per list item

FUNCTION = obj(
    {
        "id": STR,
        "space": STR,
        "name": STR_NULL,
        "language": STR_NULL,
        "code": STR_NULL,
        "parameters": arr(PARAMETER),
        "return_type": STR_NULL,
        "created_at": NUM,
        "updated_at": NUM,
        "space_entity": nullable(SPACE),
    }
)
FUNCTION_ITEM = {
    **FUNCTION,
    "properties": {
        **FUNCTION["properties"],
        "matched_lines": arr(obj({"line": INT, "text": STR})),
        "matched_line_count": INT,
    },
}
TESTCASE = obj(
    {"id": STR, "function_id": STR_NULL, "arguments": arr({}), "created_at": NUM, "updated_at": NUM}
)
RUN_RECORD = obj(
    {
        "id": STR,
        "language": STR,
        "code": STR,
        "parameters": arr(PARAMETER),
        "args": arr({}),
        "arguments": arr(ARGUMENT),
        "status": {"type": "string", "enum": ["succeeded", "failed", "timeout"]},
        "output": obj(
            {
                "text": STR,
                "truncated": BOOL,
                "original_size_bytes": INT,
                "failure": nullable(obj({"code": STR, "message": STR, "retryable": BOOL})),
                "error_stack": STR,
                "local_vars_json": STR,
                "execution_duration_ms": INT,
                "queue_wait_ms": INT,
                "call_id": STR_NULL,
            }
        ),
        "return_value": {},
        "creator_id": STR,
        "created_at": NUM,
        "started_at": NUM_NULL,
        "finished_at": NUM_NULL,
    }
)

# helpers ---------------------------------------------------------------------------


def function_json(conn: Conn, fn: dict[str, Any], content: list[str]) -> dict[str, Any]:
    space = conn.one("SELECT * FROM ws_spaces WHERE id = ?", [fn["space"]])
    return {
        "id": fn["id"],
        "space": fn["space"],
        "name": fn["name"],
        "language": fn["language"],
        "code": fn["code"],
        "parameters": fn["parameters"],
        "return_type": fn["return_type"],
        "created_at": fn["created_at"],
        "updated_at": fn["updated_at"],
        "space_entity": space_json(conn, space, content) if space else None,
    }


def load_function(conn: Conn, who: Principal, function_id: str, write: bool = False) -> dict:
    """The Function if its Space is visible (404 otherwise); `write` needs the owner (403)."""
    fn = cs.get_function(conn, function_id)
    if fn is None or visible_space(conn, who, fn["space"]) is None:
        raise not_found(f"function {function_id!r}")
    if write and fn["account_id"] != who.account_id:
        raise forbidden(f"function {function_id!r} belongs to another account; it is read-only")
    return fn


def code_matches(code: str, keyword: str) -> tuple[list[dict[str, Any]], int]:
    """Lines of `code` containing `keyword` (ASCII letters in any case): the first
    MAX_MATCHED_LINES and how many there are."""
    needle = cs.ascii_lower(keyword)
    hits = [
        {"line": i, "text": line}
        for i, line in enumerate(code.splitlines(), start=1)
        if needle in cs.ascii_lower(line)
    ]
    return hits[:MAX_MATCHED_LINES], len(hits)


def outcome_error(record: dict[str, Any]) -> ApiError:
    failure = record["output"]["failure"] or {}
    what = "timed out" if record["status"] == "timeout" else "failed"
    return ApiError(
        FUNCTION_FAILED,
        f"the Function {what}: {failure.get('code', 'error')}: {failure.get('message', '')}",
    )


def routes(ctx: AppCtx) -> list[Endpoint]:
    content = ctx.content_tables

    async def get(call: Call) -> Any:
        def q(conn: Conn) -> Any:
            return function_json(conn, load_function(conn, call.who, call.params["id"]), content)

        return await call.db.read(q)

    async def create(call: Call) -> Any:
        p = call.params
        check_name(p["name"], p["space"])
        params = check_parameters(p["parameters"], consecutive=True, identifiers=False)
        fid = f"{p['space']}.{p['name']}"

        def q(conn: Conn) -> Any:
            writable_space(conn, call.who, p["space"])
            if cs.get_function(conn, fid) is not None:
                raise conflict(f"function {fid!r} already exists")
            if conn.scalar(
                "SELECT 1 FROM ws_functions WHERE space = ? AND name = ?", [p["space"], p["name"]]
            ):
                raise conflict(f"a Function named {p['name']!r} already exists in the space")
            now = time.time()
            fn = {
                "id": fid,
                "space": p["space"],
                "account_id": call.who.account_id,
                "name": p["name"],
                "language": p["language"],
                "code": p["code"],
                "parameters": params,
                "return_type": p["return_type"],
                "created_at": now,
                "updated_at": now,
            }
            cs.put_function(conn, fn)
            conn.execute("UPDATE ws_spaces SET updated_at = ? WHERE id = ?", [now, p["space"]])
            return function_json(conn, fn, content)

        return await call.db.run(q)

    async def update(call: Call) -> Any:
        p = call.params
        params = None
        if p["parameters"] is not None:
            params = check_parameters(p["parameters"], consecutive=True, identifiers=False)

        def q(conn: Conn) -> Any:
            fn = load_function(conn, call.who, p["id"], write=True)
            if p["name"] is not None and p["name"] != fn["name"]:
                check_name(p["name"], fn["space"])
                if conn.scalar(
                    "SELECT 1 FROM ws_functions WHERE space = ? AND name = ? AND id <> ?",
                    [fn["space"], p["name"], fn["id"]],
                ):
                    raise conflict(f"a Function named {p['name']!r} already exists in the space")
                fn["name"] = p["name"]
            for key in ("language", "code", "return_type"):
                if p[key] is not None:
                    fn[key] = p[key]
            if params is not None:
                fn["parameters"] = params
            fn["updated_at"] = time.time()
            cs.put_function(conn, fn)
            return function_json(conn, fn, content)

        return await call.db.run(q)

    async def delete(call: Call) -> Any:
        def q(conn: Conn) -> None:
            fn = load_function(conn, call.who, call.params["id"], write=True)
            cs.delete_function(conn, fn["id"])

        await call.db.run(q)

    async def list_functions(call: Call) -> Any:
        p = call.params

        def q(conn: Conn) -> Any:
            spaces = visible_spaces(call.who, p["space"])
            order = (p["order_by"], p["direction"], p["start"], p["limit"])
            keyword = p["keyword"]
            page: list[tuple[dict[str, Any], dict[str, Any]]]
            if keyword and p["match_type"] == "code":
                page, total = cs.search_function_code(
                    conn, spaces, p["name"], *order, keyword, lambda c: code_matches(c, keyword)
                )
            else:
                fns, total = cs.list_functions(conn, spaces, p["name"], *order, keyword)
                page = [(fn, {}) for fn in fns]
            out = [{**function_json(conn, fn, content), **extra} for fn, extra in page]
            return {"start": p["start"], "limit": p["limit"], "items": out, "total_count": total}

        return await call.db.read(q)

    async def invoke(call: Call) -> Any:
        fn = await call.db.read(lambda conn: load_function(conn, call.who, call.params["id"]))
        arguments = [{"value": v, "name": None, "order": None} for v in call.params["arguments"]]
        args = bind(fn["parameters"], arguments)
        record = await execute(
            call,
            fn["language"],
            fn["code"],
            None,
            fn["parameters"],
            args,
            arguments,
            reader=fn["id"],
            rights=run_rights(call.who, fn["account_id"]),
        )
        if record["status"] != "succeeded":
            raise outcome_error(record)
        return record["return_value"]

    async def run(call: Call) -> Any:
        p = call.params
        func_name = p["func_name"] or None
        if func_name and p["language"] != "sql" and not IDENTIFIER.match(func_name):
            raise invalid(f"func_name {func_name!r} is not a valid identifier")
        params = check_parameters(p["parameters"], consecutive=True, identifiers=False)
        arguments = check_arguments(p["arguments"])
        args = bind(params, arguments)
        return await execute(
            call,
            p["language"],
            p["code"],
            func_name,
            params,
            args,
            arguments,
            reader="",
            rights=call.who,
        )

    async def execute(
        call: Call,
        language: str,
        code: str,
        func_name: str | None,
        params: list[dict[str, Any]],
        args: list[Any],
        arguments: list[dict[str, Any]],
        reader: str,
        rights: Principal,
    ) -> dict[str, Any]:
        run_id = new_run_id()
        created = time.time()
        outcome = await compute(call).run_function(
            call.who, rights, language, code, func_name, args, reader, run_id
        )
        return build_run_record(
            run_id=run_id,
            language=language,
            code=code,
            parameters=params,
            args=args,
            arguments=arguments,
            creator_id=call.who.user_id,
            created_at=created,
            outcome=outcome,
        )

    # test cases --------------------------------------------------------------------------

    def load_testcase(conn: Conn, who: Principal, tc_id: str, write: bool) -> dict[str, Any]:
        tc = cs.get_testcase(conn, tc_id)
        if tc is None:
            raise not_found(f"test case {tc_id!r}")
        try:
            load_function(conn, who, tc["function_id"], write=write)
        except ApiError as exc:
            if exc.status == 404:
                raise not_found(f"test case {tc_id!r}") from None
            raise
        return tc

    def ensure_unique(conn: Conn, function_id: str, arguments: list[Any], own: str) -> None:
        other = cs.find_testcase_by_args(conn, function_id, cs.args_key(arguments))
        if other is not None and other != own:
            raise conflict(
                f"test case {other!r} of function {function_id!r} has the same arguments"
            )

    async def tc_get(call: Call) -> Any:
        return await call.db.read(lambda c: load_testcase(c, call.who, call.params["id"], False))

    async def tc_create(call: Call) -> Any:
        p = call.params

        def q(conn: Conn) -> Any:
            fn = load_function(conn, call.who, p["function_id"], write=True)
            ensure_unique(conn, fn["id"], p["arguments"], "")
            now = time.time()
            tc = {
                "id": uuid.uuid4().hex,
                "function_id": fn["id"],
                "arguments": p["arguments"],
                "created_at": now,
                "updated_at": now,
            }
            cs.put_testcase(conn, tc)
            return tc

        return await call.db.run(q)

    async def tc_update(call: Call) -> Any:
        p = call.params

        def q(conn: Conn) -> Any:
            tc = load_testcase(conn, call.who, p["id"], True)
            ensure_unique(conn, tc["function_id"], p["arguments"], tc["id"])
            tc["arguments"] = p["arguments"]
            tc["updated_at"] = time.time()
            cs.put_testcase(conn, tc)
            return tc

        return await call.db.run(q)

    async def tc_delete(call: Call) -> Any:
        def q(conn: Conn) -> None:
            tc = load_testcase(conn, call.who, call.params["id"], True)
            cs.delete_testcase(conn, tc["id"])

        await call.db.run(q)

    async def tc_list(call: Call) -> Any:
        p = call.params

        def q(conn: Conn) -> Any:
            fn = load_function(conn, call.who, p["function_id"])
            items, total = cs.list_testcases(
                conn, fn["id"], p["start"], p["limit"], p["order_by"], p["direction"]
            )
            return {"start": p["start"], "limit": p["limit"], "items": items, "total_count": total}

        return await call.db.read(q)

    id_param = Field("id", ID_255, required=True, doc="full Function id <space>.<name>")
    language = Str(enum=LANGUAGES)
    tag = "function"
    default_entries = ", ".join(f"{k}: {v!r}" for k, v in DEFAULT_ENTRY.items() if v)
    return [
        Endpoint("GET", "/v1/function", get, (id_param,), "Get a Function", FUNCTION, tag),
        Endpoint(
            "POST",
            "/v1/function/create",
            create,
            (
                Field("space", SPACE_ID, required=True),
                Field("name", Str(1, 255), required=True),
                Field("language", language, required=True),
                Field("code", Str(), default=""),
                Field("parameters", PARAMS_IN, default=[]),
                Field("return_type", Str(), default=""),
            ),
            "Create a Function; its id is <space>.<name> and never changes",
            FUNCTION,
            tag,
        ),
        Endpoint(
            "POST",
            "/v1/function/update",
            update,
            (
                id_param,
                Field("name", Str(1, 255)),
                Field("language", language),
                Field("code", Str()),
                Field("parameters", PARAMS_IN),
                Field("return_type", Str()),
            ),
            "Update a Function: omitted fields are kept, parameters replaced whole, "
            "renaming keeps the id",
            FUNCTION,
            tag,
        ),
        Endpoint(
            "POST", "/v1/function/delete", delete, (id_param,), "Delete a Function", NULL, tag
        ),
        Endpoint(
            "POST",
            "/v1/function/invoke",
            invoke,
            (Field("id", ID_255, required=True), Field("arguments", Arr(AnyJSON()), required=True)),
            "Run a saved Function with positional arguments; data is its return value "
            f"(a failure is error code {FUNCTION_FAILED})",
            {},
            tag,
            access_key=True,
        ),
        Endpoint(
            "POST",
            "/v1/function/run",
            run,
            (
                Field("language", language, required=True),
                Field("code", Str(1), required=True),
                Field(
                    "func_name",
                    Str(0, 128),
                    default="",
                    doc=f"entry function; empty means the default ({default_entries})",
                ),
                Field("parameters", PARAMS_IN, default=[]),
                Field("arguments", Arr(Obj(free=True)), default=[]),
            ),
            "Run code once; failures are reported inside the run record",
            RUN_RECORD,
            tag,
        ),
        Endpoint(
            "GET",
            "/v1/function/list",
            list_functions,
            (
                Field("start", START, default=0),
                Field("limit", Int(1, 10000), default=20),
                Field(
                    "order_by",
                    Str(enum=("id", "name", "created_at", "updated_at")),
                    default="updated_at",
                ),
                Field("direction", DIRECTION, default="desc"),
                Field("space", SPACE_ID, nullable=True),
                Field("name", Str(1, 255)),
                Field("keyword", Str(1, 255), nullable=True),
                Field("match_type", Str(enum=("name", "code")), default="name"),
            ),
            "List visible Functions; `keyword` searches names or code lines",
            page_of(FUNCTION_ITEM),
            tag,
        ),
        Endpoint(
            "GET", "/v1/function/testcase", tc_get, (id_param,), "Get a test case", TESTCASE, tag
        ),
        Endpoint(
            "POST",
            "/v1/function/testcase/create",
            tc_create,
            (
                Field("function_id", ID_255, required=True),
                Field("arguments", Arr(AnyJSON()), default=[]),
            ),
            "Create a test case (HTTP 409 when another has the same arguments)",
            TESTCASE,
            tag,
        ),
        Endpoint(
            "POST",
            "/v1/function/testcase/update",
            tc_update,
            (id_param, Field("arguments", Arr(AnyJSON()), default=[])),
            "Replace a test case's arguments (HTTP 409 on a duplicate)",
            TESTCASE,
            tag,
        ),
        Endpoint(
            "POST",
            "/v1/function/testcase/delete",
            tc_delete,
            (id_param,),
            "Delete a test case",
            NULL,
            tag,
        ),
        Endpoint(
            "GET",
            "/v1/function/testcase/list",
            tc_list,
            (
                Field("function_id", ID_255, required=True),
                Field("start", START, default=0),
                Field("limit", Int(1, 100), default=20),
                Field(
                    "order_by", Str(enum=("id", "created_at", "updated_at")), default="updated_at"
                ),
                Field("direction", DIRECTION, default="desc"),
            ),
            "List a Function's test cases",
            page_of(TESTCASE),
            tag,
        ),
    ]

"""The /v1 workspace application.

Route registration: `ROUTE_MODULES` lists modules; each exposes
`routes(ctx: AppCtx) -> list[workspace.http.Endpoint]` and may define
`MIGRATIONS: list[workspace.db.Migration]` (its own schema, applied at start-up in list
order under the module's name) and `setup(app: web.Application, ctx: AppCtx) -> None` (for
background work via `app.cleanup_ctx`). Endpoint handlers get a `Call` (parsed params,
principal, ctx) and return the envelope's `data`; auth, parameter checks, errors and the
OpenAPI document (GET /v1/openapi.json) come from the Endpoint declarations.
To add Functions/Notebooks: write `workspace/functions.py` with `routes`/`MIGRATIONS`, append
"workspace.functions" to ROUTE_MODULES, and append "ws_functions" to
`ctx.content_tables` in `setup` so Spaces count it in `content_count`.
"""

from __future__ import annotations

import importlib
import json
import os
from typing import Any

from aiohttp import web

from workspace import auth
from workspace.chaincall import http_forward
from workspace.db import Database, open_database
from workspace.db.schema import MIGRATIONS as CORE_MIGRATIONS
from workspace.http import (
    AppCtx,
    Endpoint,
    Forward,
    envelope_middleware,
    json_response,
    make_handler,
)
from workspace.openapi import build_openapi
from workspace.settings import WorkspaceSettings

ROUTE_MODULES: list[str] = [
    "workspace.spaces",
    "workspace.tables",
    "workspace.rows",
    "workspace.stats",
    "workspace.chaincall",
    "workspace.functions",  # Functions + the compute service (sandbox, runners, SDK)
    "workspace.notebooks",  # Notebooks, instances, schedules (after workspace.functions)
]
CTX_KEY = web.AppKey("workspace_ctx", AppCtx)
LOCAL_SLUG = "local"


def _modules() -> list[Any]:
    return [importlib.import_module(name) for name in ROUTE_MODULES]


def migrate_all(db: Database) -> None:
    """Core schema, then each route module's MIGRATIONS (idempotent)."""
    db.migrate("workspace.core", CORE_MIGRATIONS)
    for module in _modules():
        steps = getattr(module, "MIGRATIONS", None)
        if steps:
            db.migrate(module.__name__, steps)


def create_app(
    settings: WorkspaceSettings, *, chainstate_forward: Forward | None = None
) -> web.Application:
    """The workspace aiohttp app. `chainstate_forward` answers /v1/chainstate/{chain_id}
    in process (chainstate up); None forwards over HTTP to settings.proxy_url."""
    app = web.Application(
        middlewares=[envelope_middleware], client_max_size=settings.max_body_bytes
    )
    db = open_database(settings)
    ctx = AppCtx(settings=settings, db=db, forward=chainstate_forward)  # type: ignore[arg-type]
    if chainstate_forward is None:
        ctx.forward = http_forward(ctx)
    app[CTX_KEY] = ctx
    endpoints: list[Endpoint] = []
    modules = _modules()
    for module in modules:
        endpoints += module.routes(ctx)
        if hasattr(module, "setup"):
            module.setup(app, ctx)
    for ep in endpoints:
        app.router.add_route(ep.method, ep.path, make_handler(ctx, ep))
    doc = build_openapi(endpoints)

    async def openapi(request: web.Request) -> web.Response:
        return json_response(doc)

    app.router.add_get("/v1/openapi.json", openapi)

    async def lifecycle(app: web.Application) -> Any:
        migrate_all(db)
        yield
        if ctx.http is not None:
            await ctx.http.close()
        await db.close()

    app.cleanup_ctx.append(lifecycle)
    return app


def get_ctx(app: web.Application) -> AppCtx:
    return app[CTX_KEY]


def ensure_local_account(settings: WorkspaceSettings) -> tuple[str, str]:
    """The local account and a personal access token for it, created once and kept in a
    0600 file under the data dir so the same token works after restarts."""
    path = settings.local_token_file
    db = open_database(settings)
    try:
        migrate_all(db)
        if path.exists():
            saved = json.loads(path.read_text())
            if db.run_sync(auth.credential_valid, saved.get("token", "")):
                return saved["account_id"], saved["token"]

        def make(conn: Any) -> tuple[str, str]:
            row = conn.one("SELECT id FROM ws_accounts WHERE slug = ?", [LOCAL_SLUG])
            if row is None:
                row = auth.create_account(conn, "personal", LOCAL_SLUG, "Local user")
            _, token = auth.create_credential(conn, "token", row["id"], "local (chainstate up)")
            return row["id"], token

        account_id, token = db.run_sync(make)
        settings.ensure_workspace_dir()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"account_id": account_id, "token": token}, fh)
        os.chmod(path, 0o600)
        return account_id, token
    finally:
        db.close_sync()

"""`chainstate workspace` (serve the /v1 API) and the credential commands:
`chainstate account create|add-member`, `chainstate token create|list|revoke`,
`chainstate access-key create|list|revoke`. Secrets are printed once, never logged."""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from chainstate.config import DEVNET_CONFIG, load_config
from chainstate.runner import run, start_site, wait_for_stop
from workspace import auth
from workspace.errors import ApiError
from workspace.settings import WorkspaceSettings


def _db_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=str(DEVNET_CONFIG), help="TOML config (default: devnet)")
    p.add_argument("--data-dir", help="data directory (overrides the config's data_dir)")
    p.add_argument("--database", help="'sqlite' or postgresql://… (overrides [workspace])")


def settings_from_args(args: argparse.Namespace) -> WorkspaceSettings:
    config = load_config(args.config)
    if args.data_dir:
        config["data_dir"] = str(Path(args.data_dir).resolve())
    settings = WorkspaceSettings.from_config(config)
    return settings.with_overrides(
        database=args.database,
        host=getattr(args, "host", None),
        port=getattr(args, "port", None),
        proxy_url=getattr(args, "proxy_url", None),
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("workspace", help="serve the /v1 workspace data API")
    _db_options(p)
    p.add_argument("--host", help="listen address (default from config: 127.0.0.1)")
    p.add_argument("--port", type=int, help="listen port (default from config: 8668)")
    p.add_argument("--proxy-url", help="routing proxy for /v1/chainstate (default :8663)")
    p.add_argument(
        "--no-local-account",
        action="store_true",
        help="do not create/print the local account and token",
    )
    p.set_defaults(func=cmd_serve)

    acc = subparsers.add_parser("account", help="workspace accounts")
    acc_sub = acc.add_subparsers(dest="account_cmd", required=True)
    c = acc_sub.add_parser("create", help="create an account; prints its id")
    _db_options(c)
    c.add_argument("--type", choices=auth.ACCOUNT_TYPES, default="personal")
    c.add_argument("--slug")
    c.add_argument("--display-name")
    c.add_argument(
        "--member-of",
        action="append",
        default=[],
        metavar="ORG_ID",
        help="make the new account a member of this org account (repeatable)",
    )
    c.set_defaults(func=cmd_account_create)
    m = acc_sub.add_parser("add-member", help="let MEMBER act as ORG and see its org Spaces")
    _db_options(m)
    m.add_argument("org_id")
    m.add_argument("member_id")
    m.set_defaults(func=cmd_account_add_member)

    for name, kind, what in (
        ("token", "token", "personal access tokens"),
        ("access-key", "key", "access keys (reach only function/invoke and chainstate)"),
    ):
        top = subparsers.add_parser(name, help=what)
        sub = top.add_subparsers(dest=f"{kind}_cmd", required=True)
        c = sub.add_parser("create", help="create one; the secret is printed once")
        _db_options(c)
        c.add_argument("--account", required=True, help="owning account id")
        c.add_argument("--name")
        c.set_defaults(func=lambda a, k=kind: cmd_cred_create(a, k))
        ls = sub.add_parser("list", help="list (without secrets)")
        _db_options(ls)
        ls.add_argument("--account")
        ls.set_defaults(func=lambda a, k=kind: cmd_cred_list(a, k))
        rv = sub.add_parser("revoke", help="revoke by id")
        _db_options(rv)
        rv.add_argument("id")
        rv.set_defaults(func=lambda a, k=kind: cmd_cred_revoke(a, k))


def _with_db(args: argparse.Namespace, fn: Any, *fn_args: Any) -> Any:
    from workspace.app import migrate_all
    from workspace.db import open_database

    db = open_database(settings_from_args(args))
    try:
        migrate_all(db)
        return db.run_sync(fn, *fn_args)
    finally:
        db.close_sync()


def _out(doc: Any) -> None:
    print(json.dumps(doc, indent=None))


def _fail(exc: ApiError) -> int:
    print(f"chainstate: {exc.message}", file=sys.stderr)
    return 1


def cmd_account_create(args: argparse.Namespace) -> int:
    def make(conn: Any) -> dict[str, Any]:
        account = auth.create_account(conn, args.type, args.slug, args.display_name)
        for org in args.member_of:
            auth.add_member(conn, org, account["id"])
        return account

    try:
        _out(_with_db(args, make))
    except ApiError as exc:
        return _fail(exc)
    return 0


def cmd_account_add_member(args: argparse.Namespace) -> int:
    try:
        _with_db(args, auth.add_member, args.org_id, args.member_id)
    except ApiError as exc:
        return _fail(exc)
    _out({"org_id": args.org_id, "member_id": args.member_id})
    return 0


def cmd_cred_create(args: argparse.Namespace, kind: str) -> int:
    try:
        cred_id, secret = _with_db(args, auth.create_credential, kind, args.account, args.name)
    except ApiError as exc:
        return _fail(exc)
    field = "token" if kind == "token" else "access_key"
    _out({"id": cred_id, "account_id": args.account, field: secret})
    return 0


def cmd_cred_list(args: argparse.Namespace, kind: str) -> int:
    for row in _with_db(args, auth.list_credentials, kind, args.account):
        _out(row)
    return 0


def cmd_cred_revoke(args: argparse.Namespace, kind: str) -> int:
    if not _with_db(args, auth.revoke_credential, kind, args.id):
        print(f"chainstate: no active credential {args.id}", file=sys.stderr)
        return 1
    _out({"revoked": args.id})
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from workspace.app import create_app, ensure_local_account

    settings = settings_from_args(args)

    async def main() -> None:
        async with AsyncExitStack() as stack:
            app = create_app(settings)
            await start_site(stack, app, settings.host, settings.port)
            url = f"http://{settings.host}:{settings.port}"
            print(f"workspace API: {url}/v1  (OpenAPI: {url}/v1/openapi.json)", flush=True)
            if not args.no_local_account:
                account_id, token = ensure_local_account(settings)
                print(
                    f"  curl -s '{url}/v1/space/list' -H 'Authorization: Bearer {token}' "
                    f"-H 'X-Account-ID: {account_id}'",
                    flush=True,
                )
            await wait_for_stop()

    run(main)
    return 0

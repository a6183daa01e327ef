"""`chainstate keys`: projects, keys, pool access and usage through a proxy's admin API.

Every command is one admin call (docs/tenancy.md lists them); answers are printed as JSON. A
key is printed once, by `create` and `rotate`: keep it then.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from chainstate.config import ConfigError

DEFAULT_ADMIN = "http://127.0.0.1:8663"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "keys",
        help="projects, API keys, pool access and usage (a proxy's admin API)",
        description=__doc__.splitlines()[0],
    )
    p.add_argument(
        "--admin", default=DEFAULT_ADMIN, help=f"admin API URL (default {DEFAULT_ADMIN})"
    )
    p.add_argument(
        "--admin-token",
        default=os.environ.get("CHAINSTATE_ADMIN_TOKEN"),
        help="admin token (default: $CHAINSTATE_ADMIN_TOKEN)",
    )
    sub = p.add_subparsers(dest="keys_command", metavar="COMMAND")

    def settings(q: argparse.ArgumentParser) -> None:
        q.add_argument("--name", help="a name to recognize it by")
        q.add_argument("--limits", type=_json, help="JSON, e.g. '{\"requests_per_second\": 50}'")
        q.add_argument("--rules", type=_json, help='JSON, e.g. \'{"methods_denied": ["debug_*"]}\'')

    sub.add_parser("projects", help="list projects").set_defaults(func=_projects)
    q = sub.add_parser("add-project", help="create a project")
    q.add_argument("project", help="project id: lower-case letters, digits, '_' or '-'")
    settings(q)
    q.set_defaults(func=_add_project)
    q = sub.add_parser("set-project", help="change a project's name, limits or rules")
    q.add_argument("project")
    settings(q)
    q.set_defaults(func=_set_project)
    q = sub.add_parser("delete-project", help="delete a project without keys")
    q.add_argument("project")
    q.set_defaults(func=lambda a: _call(a, "POST", f"/tenancy/projects/{_seg(a.project)}/delete"))
    q = sub.add_parser("list", help="list keys (never the keys themselves)")
    q.add_argument("--project")
    q.set_defaults(func=_list)
    q = sub.add_parser("create", help="create a key in a project; the key is printed once")
    q.add_argument("project")
    settings(q)
    q.set_defaults(func=_create)
    q = sub.add_parser("set", help="change a key's name, limits or rules")
    q.add_argument("id", help="the key's id (kXXXXXXXXXXXX)")
    settings(q)
    q.set_defaults(func=_set)
    for name, what in (
        ("rotate", "a new secret for the key (printed once)"),
        ("revoke", "revoke a key"),
    ):
        q = sub.add_parser(name, help=what)
        q.add_argument("id")
        q.set_defaults(func=lambda a, n=name: _call(a, "POST", f"/tenancy/keys/{_seg(a.id)}/{n}"))
    q = sub.add_parser("pool", help="show or set a pool's access for requests without a key")
    q.add_argument("pool")
    q.add_argument("--anonymous", choices=("on", "off"))
    q.add_argument("--limits", type=_json, help="limits of each anonymous client address")
    q.add_argument("--rules", type=_json)
    q.add_argument("--reset", action="store_true", help="back to the [proxy.tenancy] defaults")
    q.set_defaults(func=_pool)
    q = sub.add_parser("usage", help="totals per hour or day")
    q.add_argument("--key", help="a key id")
    q.add_argument("--project")
    q.add_argument("--by", choices=("hour", "day"), default="hour")
    q.add_argument("--since", help="unix time or ISO date (default: 24 hours, or 30 days)")
    q.set_defaults(func=_usage)
    p.set_defaults(func=lambda _a: p.print_help() or 2)


def _json(text: str) -> Any:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _seg(text: str) -> str:
    return urllib.parse.quote(text, safe="")


def _fields(args: argparse.Namespace) -> dict[str, Any]:
    return {
        k: getattr(args, k)
        for k in ("name", "limits", "rules")
        if getattr(args, k, None) is not None
    }


def _call(args: argparse.Namespace, method: str, path: str, body: Any = None) -> int:
    data = None if method == "GET" else json.dumps(body or {}).encode()
    request = urllib.request.Request(f"{args.admin.rstrip('/')}{path}", data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if args.admin_token:
        request.add_header("Authorization", f"Bearer {args.admin_token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            answer, ok = resp.read(), True
    except urllib.error.HTTPError as exc:
        answer, ok = exc.read(), False
    except (urllib.error.URLError, OSError) as exc:
        raise ConfigError(f"cannot reach the admin API at {args.admin}: {exc}") from None
    try:
        print(json.dumps(json.loads(answer), indent=2))
    except json.JSONDecodeError:
        print(answer.decode(errors="replace"), file=sys.stderr)
    return 0 if ok else 1


def _projects(a: argparse.Namespace) -> int:
    return _call(a, "GET", "/tenancy/projects")


def _add_project(a: argparse.Namespace) -> int:
    return _call(a, "POST", "/tenancy/projects", {"id": a.project, **_fields(a)})


def _set_project(a: argparse.Namespace) -> int:
    return _call(a, "POST", f"/tenancy/projects/{_seg(a.project)}", _fields(a))


def _list(a: argparse.Namespace) -> int:
    query = f"?project={_seg(a.project)}" if a.project else ""
    return _call(a, "GET", f"/tenancy/keys{query}")


def _create(a: argparse.Namespace) -> int:
    return _call(a, "POST", "/tenancy/keys", {"project": a.project, **_fields(a)})


def _set(a: argparse.Namespace) -> int:
    return _call(a, "POST", f"/tenancy/keys/{_seg(a.id)}", _fields(a))


def _pool(a: argparse.Namespace) -> int:
    path = f"/tenancy/pools/{_seg(a.pool)}"
    if a.reset:
        return _call(a, "POST", path, {"reset": True})
    body = {k: getattr(a, k) for k in ("limits", "rules") if getattr(a, k) is not None}
    if a.anonymous is not None:
        body["anonymous"] = a.anonymous == "on"
    return _call(a, "POST", path, body) if body else _call(a, "GET", path)


def _usage(a: argparse.Namespace) -> int:
    query = {k: getattr(a, k) for k in ("key", "project", "by", "since") if getattr(a, k)}
    return _call(a, "GET", "/tenancy/usage?" + urllib.parse.urlencode(query))

"""Accounts and credentials: personal access tokens and access keys, stored hashed.

A personal access token belongs to one account (its user) and must come with `X-Account-ID`:
the user's own account, or an `org` account the user is a member of. An access key acts as
its owning account and reaches only the endpoints marked `access_key=True`.
"""

from __future__ import annotations

import hashlib
import secrets
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workspace.db import Conn
from workspace.errors import FORBIDDEN, UNAUTHENTICATED, ApiError, conflict, invalid

TOKEN_PREFIX = "cspat_"
KEY_PREFIX = "csak_"
ACCOUNT_TYPES = ("personal", "org")


@dataclass(frozen=True)
class Principal:
    """Who is calling: `account_id` is the acting account (X-Account-ID or the key's owner),
    `user_id` the account owning the credential, `via` "token" or "key"."""

    account_id: str
    user_id: str
    via: str


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_account(
    conn: Conn,
    type_: str = "personal",
    slug: str | None = None,
    display_name: str | None = None,
) -> dict[str, Any]:
    if type_ not in ACCOUNT_TYPES:
        raise invalid(f"account type must be one of {', '.join(ACCOUNT_TYPES)}")
    if slug is not None and conn.scalar("SELECT 1 FROM ws_accounts WHERE slug = ?", [slug]):
        raise conflict(f"an account with slug {slug!r} already exists")
    account_id = uuid.uuid4().hex
    conn.execute(
        "INSERT INTO ws_accounts (id, type, slug, display_name, created_at) VALUES (?,?,?,?,?)",
        [account_id, type_, slug, display_name, int(time.time())],
    )
    return get_account(conn, account_id) or {}


def get_account(conn: Conn, account_id: str) -> dict[str, Any] | None:
    return conn.one(
        "SELECT id, type, slug, display_name, avatar_url, avatar_thumbnail_url "
        "FROM ws_accounts WHERE id = ?",
        [account_id],
    )


def add_member(conn: Conn, org_id: str, member_id: str) -> None:
    org = get_account(conn, org_id)
    if org is None or org["type"] != "org":
        raise invalid(f"{org_id} is not an org account")
    if get_account(conn, member_id) is None:
        raise invalid(f"account {member_id} does not exist")
    if not conn.scalar(
        "SELECT 1 FROM ws_members WHERE org_id = ? AND member_id = ?", [org_id, member_id]
    ):
        conn.execute(
            "INSERT INTO ws_members (org_id, member_id) VALUES (?, ?)", [org_id, member_id]
        )


def create_credential(
    conn: Conn, kind: str, account_id: str, name: str | None = None
) -> tuple[str, str]:
    """A new token (kind "token") or access key (kind "key"): (credential id, secret).
    The secret is shown once; only its SHA-256 is stored."""
    if get_account(conn, account_id) is None:
        raise invalid(f"account {account_id} does not exist")
    secret = (TOKEN_PREFIX if kind == "token" else KEY_PREFIX) + secrets.token_urlsafe(32)
    cred_id = uuid.uuid4().hex[:16]
    conn.execute(
        "INSERT INTO ws_credentials (id, kind, account_id, name, secret_hash, prefix, created_at)"
        " VALUES (?,?,?,?,?,?,?)",
        [cred_id, kind, account_id, name, hash_secret(secret), secret[:10], int(time.time())],
    )
    return cred_id, secret


def list_credentials(conn: Conn, kind: str, account_id: str | None) -> list[dict[str, Any]]:
    sql = (
        "SELECT id, account_id, name, prefix, created_at, revoked_at FROM ws_credentials "
        "WHERE kind = ?"
    )
    params: list[Any] = [kind]
    if account_id:
        sql += " AND account_id = ?"
        params.append(account_id)
    return conn.all(sql + " ORDER BY created_at, id", params)


def revoke_credential(conn: Conn, kind: str, cred_id: str) -> bool:
    cur = conn.execute(
        "UPDATE ws_credentials SET revoked_at = ? WHERE id = ? AND kind = ? AND revoked_at IS NULL",
        [int(time.time()), cred_id, kind],
    )
    return cur.rowcount > 0


def credential_valid(conn: Conn, secret: str) -> bool:
    return bool(
        conn.scalar(
            "SELECT 1 FROM ws_credentials WHERE secret_hash = ? AND revoked_at IS NULL",
            [hash_secret(secret)],
        )
    )


def _lookup(conn: Conn, kind: str, secret: str) -> str:
    row = conn.one(
        "SELECT account_id FROM ws_credentials WHERE secret_hash = ? AND kind = ? "
        "AND revoked_at IS NULL",
        [hash_secret(secret), kind],
    )
    if row is None:
        what = "personal access token" if kind == "token" else "access key"
        raise ApiError(UNAUTHENTICATED, f"unknown or revoked {what}")
    return str(row["account_id"])


def authenticate(conn: Conn, headers: Mapping[str, str], allow_key: bool) -> Principal:
    """Check the request's credential headers; raises 401/403 ApiErrors."""
    auth = headers.get("Authorization", "").strip()
    key = headers.get("AccessKey", "").strip()
    account = headers.get("X-Account-ID", "").strip()
    if auth and key:
        raise ApiError(UNAUTHENTICATED, "send either Authorization or AccessKey, not both")
    if key:
        if not allow_key:
            raise ApiError(
                FORBIDDEN,
                "access keys reach only POST /v1/function/invoke and "
                "POST /v1/chainstate/{chain_id}; use a personal access token",
            )
        owner = _lookup(conn, "key", key)
        if account and account != owner:
            raise ApiError(FORBIDDEN, "X-Account-ID does not match the access key's account")
        return Principal(account_id=owner, user_id=owner, via="key")
    if not auth:
        raise ApiError(
            UNAUTHENTICATED,
            "missing credentials: send Authorization: Bearer <token> and X-Account-ID",
        )
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(UNAUTHENTICATED, "Authorization must be 'Bearer <token>'")
    user = _lookup(conn, "token", token.strip())
    if not account:
        raise ApiError(UNAUTHENTICATED, "X-Account-ID is required with a personal access token")
    if account != user and not conn.scalar(
        "SELECT 1 FROM ws_members WHERE org_id = ? AND member_id = ?", [account, user]
    ):
        raise ApiError(FORBIDDEN, f"this token may not act as account {account}")
    return Principal(account_id=account, user_id=user, via="token")


# Visibility: a Space is readable when public, owned by the acting account, or `org` and
# owned by an org the acting account is a member of. Only the owner writes.
VISIBLE_SQL = (
    "(s.visibility = 'public' OR s.account_id = ? OR (s.visibility = 'org' AND s.account_id IN "
    "(SELECT org_id FROM ws_members WHERE member_id = ?)))"
)


def visible_params(principal: Principal) -> list[str]:
    return [principal.account_id, principal.account_id]

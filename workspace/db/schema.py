"""The core workspace schema (accounts, credentials, spaces, tables, stats)."""

from __future__ import annotations

from workspace.db import Migration

MIGRATIONS: list[Migration] = [
    """CREATE TABLE ws_accounts (
        id TEXT PRIMARY KEY, type TEXT NOT NULL, slug TEXT UNIQUE, display_name TEXT,
        avatar_url TEXT, avatar_thumbnail_url TEXT, created_at BIGINT NOT NULL)""",
    # member_id may act as org_id (X-Account-ID) and sees its `org` Spaces.
    """CREATE TABLE ws_members (
        org_id TEXT NOT NULL REFERENCES ws_accounts (id),
        member_id TEXT NOT NULL REFERENCES ws_accounts (id), PRIMARY KEY (org_id, member_id))""",
    # kind: 'token' (personal access token) or 'key' (access key). Only hashes are stored.
    """CREATE TABLE ws_credentials (
        id TEXT PRIMARY KEY, kind TEXT NOT NULL,
        account_id TEXT NOT NULL REFERENCES ws_accounts (id), name TEXT,
        secret_hash TEXT NOT NULL UNIQUE, prefix TEXT NOT NULL,
        created_at BIGINT NOT NULL, revoked_at BIGINT)""",
    """CREATE TABLE ws_spaces (
        id TEXT PRIMARY KEY, account_id TEXT NOT NULL REFERENCES ws_accounts (id),
        description TEXT, status TEXT NOT NULL, visibility TEXT NOT NULL,
        dep_count INTEGER NOT NULL DEFAULT 0,
        created_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX ws_spaces_account ON ws_spaces (account_id)",
    """CREATE TABLE ws_tables (
        id TEXT PRIMARY KEY, space TEXT NOT NULL REFERENCES ws_spaces (id), name TEXT NOT NULL,
        chain_id TEXT, table_type TEXT NOT NULL, description TEXT,
        physical TEXT NOT NULL UNIQUE, inited INTEGER NOT NULL DEFAULT 0,
        columns_json TEXT NOT NULL DEFAULT '[]', indexes_json TEXT NOT NULL DEFAULT '[]',
        view_json TEXT, start_height BIGINT, first_write_at DOUBLE PRECISION,
        last_write_at_ms BIGINT,
        created_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX ws_tables_space ON ws_tables (space)",
    # Row-write counters, bumped in the same transaction as the write.
    """CREATE TABLE ws_stats_minute (
        table_id TEXT NOT NULL, minute_at BIGINT NOT NULL, rows BIGINT NOT NULL,
        PRIMARY KEY (table_id, minute_at))""",
    """CREATE TABLE ws_stats_daily (
        table_id TEXT NOT NULL, day TEXT NOT NULL, rows BIGINT NOT NULL,
        PRIMARY KEY (table_id, day))""",
    # One entry per processed block of a block table.
    """CREATE TABLE ws_table_blocks (
        table_id TEXT NOT NULL, block_height BIGINT NOT NULL, rows BIGINT NOT NULL,
        lag_ms BIGINT, processed_at_ms BIGINT NOT NULL, PRIMARY KEY (table_id, block_height))""",
]

"""Workspace settings: every user-facing limit is a named setting with a documented default.

Read from the `[workspace]` section of the config (see docs/workspace.md, "Settings").
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from chainstate.config import ConfigError, resolve_path, section

SQLITE = "sqlite"


@dataclass(frozen=True)
class WorkspaceSettings:
    """The workspace API's configuration; limits not fixed by the spec are settings here."""

    host: str = "127.0.0.1"
    port: int = 8668
    data_dir: Path = Path(".chainstate")
    database: str = SQLITE  # "sqlite" (a file under data_dir/workspace) or postgresql://…
    proxy_url: str = "http://127.0.0.1:8663"
    db_readers: int = 4  # reader connections (threads) serving reads beside the one writer
    max_body_bytes: int = 8 * 1024 * 1024  # request bodies larger than this get HTTP 413
    max_json_depth: int = 64  # JSON nested deeper (bodies, filters, return values): a 400
    query_timeout_ms: int = 2000  # row/query wall-clock limit
    query_max_rows: int = 10000  # row/query: at most this many rows (spec: 10000)
    query_max_sql_bytes: int = 65536  # row/query: longer statements are refused (parse cost)
    row_list_max_limit: int = 10000  # row/list `limit` upper bound (spec: 10000)
    row_get_max_pks: int = 10000  # row/get `pks` upper bound (spec: 10000)
    max_columns: int = 256  # columns per table
    max_indexes: int = 32  # indexes per table
    max_value_bytes: int = 1024 * 1024  # one STRING cell
    max_filter_conditions: int = 32  # row/list `filter` conditions
    stats_daily_max_days: int = 366  # stats/daily `from`..`to` span
    completeness_max_ranges: int = 100  # stats/block: `completeness` is empty beyond this
    forward_timeout_s: float = 30.0  # /v1/chainstate/{chain_id} upstream timeout
    chain_height_timeout_s: float = 2.0  # chain height look-ups for stats and start_height
    # The top-level [compute] section, parsed by workspace.compute (docs/compute.md).
    compute: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> WorkspaceSettings:
        """Build from `config["workspace"]` and `config["data_dir"]`; unknown keys are errors."""
        sect = dict(section(config, "workspace"))
        data_dir = resolve_path(config, config.get("data_dir", ".chainstate"))
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {"data_dir": data_dir, "compute": dict(section(config, "compute"))}
        for key, value in sect.items():
            if key not in known or key in ("data_dir", "compute"):
                raise ConfigError(f"[workspace] unknown setting {key!r}")
            default = getattr(cls, key)
            want = type(default)
            ok = isinstance(value, want) or (want is float and isinstance(value, int))
            if not ok or (isinstance(value, bool) and want is not bool):
                raise ConfigError(f"[workspace] {key} must be a {want.__name__}")
            values[key] = want(value)
        settings = cls(**values)
        settings.check()
        return settings

    def check(self) -> None:
        if self.database != SQLITE and not self.database.startswith(
            ("postgresql://", "postgres://")
        ):
            raise ConfigError("[workspace] database must be 'sqlite' or a postgresql:// URL")
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, int | float) and not isinstance(value, bool) and value <= 0:
                raise ConfigError(f"[workspace] {f.name} must be positive")

    def with_overrides(self, **changes: Any) -> WorkspaceSettings:
        """A copy with some fields changed (CLI flags, tests)."""
        out = replace(self, **{k: v for k, v in changes.items() if v is not None})
        out.check()
        return out

    @property
    def workspace_dir(self) -> Path:
        return self.data_dir / "workspace"

    def ensure_workspace_dir(self) -> Path:
        """The workspace's folder, private to the server's user (see `private_dir`)."""
        return private_dir(self.workspace_dir)

    @property
    def sqlite_path(self) -> Path:
        return self.workspace_dir / "workspace.db"

    @property
    def local_token_file(self) -> Path:
        return self.workspace_dir / "local-token.json"


def private_dir(path: Path) -> Path:
    """Create `path` (mode 0700) or tighten it to 0700.

    Functions and Notebooks run under other uids on the same machine: the database, instance
    logs and build cache kept here must not be readable by them (they hold every account's data).
    """
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)
    return path

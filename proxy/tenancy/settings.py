"""Tenancy settings: the `[proxy.tenancy]` table, every field with its default (docs/tenancy.md)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from chainstate.config import ConfigError, resolve_path
from proxy.model import EntryError
from proxy.tenancy.model import Limits, Rules

USAGE_FILE = "tenancy-usage.sqlite"

QUOTA_FAIL = ("open", "closed")


@dataclass(frozen=True, slots=True)
class TenancySettings:
    # Pools without their own setting (`tenancy/pools/{poolId}`) serve requests without a key.
    anonymous: bool = True
    # Limits of each anonymous client address ([proxy.tenancy.anonymous_limits]); none by default.
    anonymous_limits: Limits = field(default_factory=Limits)
    # Networks of reverse proxies whose X-Forwarded-For is believed (e.g. ["10.0.0.0/8"]);
    # the client is then the right-most address not in these networks.
    trusted_proxies: tuple[str, ...] = ()
    # Shared counters for a fleet (redis://host:port/db); None: every limit is this proxy's own.
    redis_url: str | None = None
    redis_prefix: str = "chainstate:"  # prefix of every Redis key the proxies write
    redis_timeout: float = 0.25  # seconds one Redis round trip may take before it counts as down
    sync_interval: float = 0.05  # seconds between syncs of the local buckets with Redis
    # While Redis is down: "open" keeps counting quotas locally and admits; "closed" refuses
    # requests of subjects with a quota (HTTP 503) until the shared counts can be read again.
    quota_fail: str = "open"
    # Origins a CORS preflight is granted for when it names no key in its path; a key's own
    # `origins` rule decides for its requests.
    cors_origins: tuple[str, ...] = ("*",)
    cors_max_age: int = 600  # seconds a browser may keep a preflight's answer
    # JWTs (`Authorization: Bearer <jwt>`): HS256 with a shared secret and/or ES256 with a
    # public key (PEM file); `aud` must equal jwt_audience when set; the project is the
    # `jwt_project_claim` claim; `exp` is required.
    jwt_secret: str | None = None
    jwt_public_key: str | None = None  # path of a PEM file (resolved against the config's folder)
    jwt_audience: str | None = None
    jwt_project_claim: str = "project"
    jwt_leeway: float = 5.0  # seconds of clock skew accepted on exp/nbf
    # Usage totals per key and hour: in Redis with redis_url, else in this SQLite file (None:
    # in memory only). Defaults to tenancy-usage.sqlite beside the proxy's store file, or
    # under data_dir (else ./.chainstate/) with etcd (`_usage_file`).
    usage_path: str | None = None
    usage_flush: float = 10.0  # seconds between writes of the usage totals
    usage_retention_days: int = 400  # hour and day totals older than this are dropped
    max_clients: int = 100_000  # anonymous client addresses whose limits are kept (LRU)
    max_project_labels: int = 1000  # projects named in metrics; later ones count as "other"

    @classmethod
    def from_config(cls, config: dict[str, Any], store_path: str | None = None) -> TenancySettings:
        table = (config.get("proxy") or {}).get("tenancy") or {}
        if not isinstance(table, dict):
            raise ConfigError("[proxy.tenancy] must be a table")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(table) - set(known))
        if unknown:
            raise ConfigError(f"[proxy.tenancy] unknown settings {unknown}")
        values: dict[str, Any] = dict(table)
        try:
            values["anonymous_limits"] = Limits.from_obj(table.get("anonymous_limits"))
        except EntryError as exc:
            raise ConfigError(f"[proxy.tenancy] anonymous_{exc}") from None
        for name in ("trusted_proxies", "cors_origins"):
            if name in values:
                listed = values[name]
                if not isinstance(listed, list) or not all(isinstance(v, str) for v in listed):
                    raise ConfigError(f"[proxy.tenancy] {name} must be a list of strings")
                values[name] = tuple(listed)
        if values.get("jwt_public_key"):
            values["jwt_public_key"] = str(resolve_path(config, values["jwt_public_key"]))
        if values.get("usage_path"):
            values["usage_path"] = str(resolve_path(config, values["usage_path"]))
        elif "usage_path" not in table:
            found = _usage_file(config, store_path)
            values["usage_path"] = None if found is None else str(found)
        try:
            settings = cls(**values)
        except TypeError as exc:
            raise ConfigError(f"[proxy.tenancy] {exc}") from None
        settings.validate()
        return settings

    def validate(self) -> None:
        if not isinstance(self.anonymous, bool):
            raise ConfigError("[proxy.tenancy] anonymous must be true or false")
        for name in ("redis_timeout", "sync_interval", "usage_flush", "jwt_leeway"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"[proxy.tenancy] {name} must be a positive number")
        for name in ("max_clients", "max_project_labels", "usage_retention_days", "cors_max_age"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"[proxy.tenancy] {name} must be a positive integer")
        if self.quota_fail not in QUOTA_FAIL:
            raise ConfigError('[proxy.tenancy] quota_fail must be "open" or "closed"')
        if self.redis_url is not None and not self.redis_url.startswith(
            ("redis://", "rediss://", "unix://")
        ):
            raise ConfigError("[proxy.tenancy] redis_url must be redis://host:port[/db]")
        for net in self.trusted_proxies:
            try:
                ipaddress.ip_network(net, strict=False)
            except ValueError:
                raise ConfigError(
                    f"[proxy.tenancy] trusted_proxies: {net!r} is not an IP network"
                ) from None
        try:
            Rules.from_obj({"origins": list(self.cors_origins)})
        except EntryError as exc:
            raise ConfigError(f"[proxy.tenancy] cors_origins: {exc}") from None
        if self.jwt_public_key is not None and not Path(self.jwt_public_key).is_file():
            raise ConfigError(f"[proxy.tenancy] jwt_public_key {self.jwt_public_key} not found")


def _usage_file(config: dict[str, Any], store_path: str | None) -> Path | None:
    """Where usage totals are kept without Redis: beside a file store; with etcd (or the
    default store) under the config's `data_dir`, else ./.chainstate/ (the default store's
    folder); nowhere with `:memory:` (tests, benchmarks)."""
    if store_path == ":memory:":
        return None
    if store_path and not store_path.startswith("etcd://"):
        return Path(store_path).parent / USAGE_FILE
    if "data_dir" in config:
        return resolve_path(config, config["data_dir"]) / USAGE_FILE
    return Path(".chainstate") / USAGE_FILE

"""The admin API of projects, keys, pool access and usage (docs/tenancy.md).

Served with the rest of the admin API (same listener, same token and browser rules: the
routes are wrapped by `AdminApi.guarded`). Changes go to the config store and answer once
this proxy's registry has applied them, so the next request sees them. A key is answered
whole only by the call that creates or rotates it; every other answer shows its id and
first characters.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import orjson
from aiohttp import web

from proxy.admin import AdminError, json_object, reply
from proxy.model import EntryError, normalize_pool
from proxy.store import ConfigStore, StoreUnavailable
from proxy.tenancy.keys import key_hash, new_id, new_key, shown_prefix
from proxy.tenancy.model import KeyRecord, Limits, PoolAccess, Project, Rules, check_id
from proxy.tenancy.registry import Registry
from proxy.tenancy.service import Tenancy

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
CAS_ATTEMPTS = 5
MAX_USAGE_DAYS = 400


class TenancyAdmin:
    def __init__(self, tenancy: Tenancy, store: ConfigStore, apply_timeout: float) -> None:
        self.tenancy = tenancy
        self.registry: Registry = tenancy.registry
        self.store = store
        self.apply_timeout = apply_timeout

    def routes(self) -> list[tuple[str, str, Handler]]:
        """(method, path, handler) for `AdminApi.guarded`."""
        h = self._handled
        return [
            ("GET", "/tenancy/projects", h(self.list_projects)),
            ("POST", "/tenancy/projects", h(self.create_project)),
            ("GET", "/tenancy/projects/{project}", h(self.get_project)),
            ("POST", "/tenancy/projects/{project}", h(self.update_project)),
            ("POST", "/tenancy/projects/{project}/delete", h(self.delete_project)),
            ("GET", "/tenancy/keys", h(self.list_keys)),
            ("POST", "/tenancy/keys", h(self.create_key)),
            ("GET", "/tenancy/keys/{key}", h(self.get_key)),
            ("POST", "/tenancy/keys/{key}", h(self.update_key)),
            ("POST", "/tenancy/keys/{key}/rotate", h(self.rotate_key)),
            ("POST", "/tenancy/keys/{key}/revoke", h(self.revoke_key)),
            ("GET", "/tenancy/pools/{pool}", h(self.get_pool)),
            ("POST", "/tenancy/pools/{pool}", h(self.set_pool)),
            ("GET", "/tenancy/usage", h(self.get_usage)),
            ("GET", "/tenancy/health", h(self.get_health)),
        ]

    @staticmethod
    def _handled(handler: Handler) -> Handler:
        async def handled(request: web.Request) -> web.StreamResponse:
            try:
                return await handler(request)
            except AdminError as exc:
                return reply({"error": exc.reason}, exc.status)
            except EntryError as exc:
                return reply({"error": str(exc)}, 400)
            except StoreUnavailable as exc:
                return reply({"error": f"config store unavailable, nothing changed: {exc}"}, 503)

        return handled

    # ---- plumbing ------------------------------------------------------------------------

    @staticmethod
    async def _body(request: web.Request) -> dict[str, Any]:
        return await json_object(request)

    async def _write(self, key: str, expected: bytes | None, value: bytes | None) -> None:
        """Compare-and-set `key` (None: absent / delete), then wait until it is applied."""
        if not self.store.available:
            raise StoreUnavailable("the store does not answer")
        revision = await self.store.replace(key, expected, value)
        if revision is None:
            raise AdminError(409, f"{key} changed meanwhile; try again")
        if not await self.registry.wait_applied(revision, self.apply_timeout):
            raise AdminError(504, f"written at revision {revision} but not applied in time")

    async def _current(self, key: str) -> bytes | None:
        items, _ = await self.store.snapshot(key)
        return items.get(key)

    def _project(self, request: web.Request) -> Project:
        pid = request.match_info["project"]
        project = self.registry.projects.get(pid)
        if project is None:
            raise AdminError(404, f"unknown project {pid[:48]!r}")
        return project

    def _key(self, request: web.Request) -> KeyRecord:
        kid = request.match_info["key"]
        record = self.registry.keys.get(kid)
        if record is None:
            raise AdminError(404, f"unknown key id {kid[:48]!r}")
        return record

    # ---- projects ------------------------------------------------------------------------

    async def list_projects(self, request: web.Request) -> web.Response:
        projects = sorted(self.registry.projects.values(), key=lambda p: p.id)
        counts: dict[str, int] = {}
        for record in self.registry.keys.values():
            if not record.revoked:
                counts[record.project] = counts.get(record.project, 0) + 1
        return reply({"projects": [{**p.to_obj(), "keys": counts.get(p.id, 0)} for p in projects]})

    async def get_project(self, request: web.Request) -> web.Response:
        return reply(self._project(request).to_obj())

    async def create_project(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        project = Project.from_obj({**body, "created": int(time.time())})
        key = f"tenancy/projects/{project.id}"
        if project.id in self.registry.projects or await self._current(key) is not None:
            raise AdminError(409, f"project {project.id} exists")
        await self._write(key, None, orjson.dumps(project.to_obj()))
        return reply(project.to_obj(), 201)

    async def update_project(self, request: web.Request) -> web.Response:
        old = self._project(request)
        body = await self._body(request)
        unknown = sorted(set(body) - {"name", "limits", "rules"})
        if unknown:
            raise AdminError(400, f"only name, limits and rules can change (got {unknown})")
        merged = {**old.to_obj(), **body}
        project = Project.from_obj(merged)
        key = f"tenancy/projects/{old.id}"
        await self._write(key, await self._current(key), orjson.dumps(project.to_obj()))
        return reply(project.to_obj())

    async def delete_project(self, request: web.Request) -> web.Response:
        project = self._project(request)
        live = [r.id for r in self.registry.keys.values() if r.project == project.id]
        if live:
            raise AdminError(409, f"project {project.id} still has keys {sorted(live)[:10]}")
        key = f"tenancy/projects/{project.id}"
        await self._write(key, await self._current(key), None)
        return reply({"deleted": project.id})

    # ---- keys ----------------------------------------------------------------------------

    async def list_keys(self, request: web.Request) -> web.Response:
        wanted = request.query.get("project")
        records = sorted(self.registry.keys.values(), key=lambda r: (r.project, r.created, r.id))
        shown = [r.shown() for r in records if wanted is None or r.project == wanted]
        return reply({"keys": shown})

    async def get_key(self, request: web.Request) -> web.Response:
        return reply(self._key(request).shown())

    async def create_key(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        unknown = sorted(set(body) - {"project", "name", "limits", "rules"})
        if unknown:
            raise AdminError(400, f"unknown fields {unknown}")
        project = check_id(body.get("project"), "project")
        if project not in self.registry.projects:
            raise AdminError(404, f"unknown project {project!r}: create it first")
        secret = new_key()
        record = KeyRecord.from_obj(
            {
                "id": new_id(),
                "project": project,
                "hash": key_hash(secret),
                "prefix": shown_prefix(secret),
                "name": body.get("name", ""),
                "limits": Limits.from_obj(body.get("limits")).to_obj(),
                "rules": Rules.from_obj(body.get("rules")).to_obj(),
                "created": int(time.time()),
            }
        )
        await self._write(f"tenancy/keys/{record.id}", None, orjson.dumps(record.to_obj()))
        return reply({**record.shown(), "key": secret}, 201)

    async def update_key(self, request: web.Request) -> web.Response:
        old = self._key(request)
        body = await self._body(request)
        unknown = sorted(set(body) - {"name", "limits", "rules"})
        if unknown:
            raise AdminError(400, f"only name, limits and rules can change (got {unknown})")
        return reply((await self._replace(old, body)).shown())

    async def rotate_key(self, request: web.Request) -> web.Response:
        """A new secret for the same key id, settings and usage; the old one stops working
        on every proxy as soon as the change reaches it."""
        old = self._key(request)
        if old.revoked:
            raise AdminError(409, f"key {old.id} is revoked")
        secret = new_key()
        record = await self._replace(
            old, {"hash": key_hash(secret), "prefix": shown_prefix(secret)}
        )
        return reply({**record.shown(), "key": secret})

    async def revoke_key(self, request: web.Request) -> web.Response:
        old = self._key(request)
        if old.revoked:
            return reply(old.shown())
        return reply((await self._replace(old, {"revoked": int(time.time())})).shown())

    async def _replace(self, old: KeyRecord, change: dict[str, Any]) -> KeyRecord:
        key = f"tenancy/keys/{old.id}"
        current = await self._current(key)
        base = orjson.loads(current) if current is not None else old.to_obj()
        record = KeyRecord.from_obj({**base, **change})
        await self._write(key, current, orjson.dumps(record.to_obj()))
        return record

    # ---- pools ---------------------------------------------------------------------------

    def _pool_id(self, request: web.Request) -> str:
        raw = request.match_info["pool"]
        pool = normalize_pool(raw)
        if pool is None:
            raise AdminError(400, f"{raw[:48]!r} is not a chain or pool id")
        return pool

    async def get_pool(self, request: web.Request) -> web.Response:
        pool = self._pool_id(request)
        access = self.registry.pools.get(pool)
        if access is None:
            s = self.tenancy.settings
            return reply(
                {
                    "pool": pool,
                    "stored": False,
                    **PoolAccess(s.anonymous, s.anonymous_limits).to_obj(),
                }
            )
        return reply({"pool": pool, "stored": True, **access.to_obj()})

    async def set_pool(self, request: web.Request) -> web.Response:
        """The pool's access for requests without a key; `{"reset": true}` goes back to the
        `[proxy.tenancy]` defaults."""
        pool = self._pool_id(request)
        body = await self._body(request)
        key = f"tenancy/pools/{pool}"
        current = await self._current(key)
        if body.get("reset") is True:
            await self._write(key, current, None)
            return await self.get_pool(request)
        access = PoolAccess.from_obj(body)
        await self._write(key, current, orjson.dumps(access.to_obj()))
        return reply({"pool": pool, "stored": True, **access.to_obj()})

    # ---- usage and health ----------------------------------------------------------------

    async def get_usage(self, request: web.Request) -> web.Response:
        """`?key=ID` or `?project=ID` (else every one), `by=hour|day` (default hour),
        `since=` a unix time or an ISO date/time (default: 24 hours, or 30 days by day)."""
        q = request.query
        by = q.get("by", "hour")
        if by not in ("hour", "day"):
            raise AdminError(400, "by must be hour or day")
        now = time.time()
        since = _since(q.get("since"), now - (86400 if by == "hour" else 30 * 86400))
        if now - since > MAX_USAGE_DAYS * 86400:
            raise AdminError(400, f"since is more than {MAX_USAGE_DAYS} days ago")
        await self.tenancy.usage.flush()  # this proxy's latest counts included
        sink = self.tenancy.usage.sink
        if sink is None:
            raise AdminError(503, "usage is not being recorded yet")
        rows = await sink.totals(q.get("project"), q.get("key"), by, since)
        return reply({"by": by, "since": int(since), "usage": rows})

    async def get_health(self, request: web.Request) -> web.Response:
        return reply(self.tenancy.health())


def _since(value: str | None, default: float) -> float:
    if value is None:
        return default
    try:
        return float(value)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise AdminError(400, f"since {value[:40]!r} is not a unix time or ISO date") from None
    if parsed.tzinfo is None:  # a date or time without a zone is UTC
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()

"""The admin API: pools, nodes, weights, method routes, mirrors, writers, version mode.

Its own route table, served on the data port or on a separate listener (`admin_port`), and
optionally behind `Authorization: Bearer <admin_token>`. Persisted changes are written to the
store and the call returns once the watch has applied them (the one code path that changes
routing state); in-memory local nodes are changed directly. docs/admin-api.md documents
every body and answer.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from chainstate.blockref import parse_block_ctx
from chainstate.jsonrpc import JsonRpcError
from proxy.adminguard import AdminGuard, admin_names
from proxy.engine import Engine
from proxy.health import HeadTracker
from proxy.model import (
    EntryError,
    MirrorEntry,
    Node,
    NodeEntry,
    Pool,
    RouteRule,
    WriterEntry,
    check_key,
    check_method,
    check_version,
    check_weight,
    mirror_id,
    normalize_chain,
    normalize_pool,
)
from proxy.reads import Reads
from proxy.select import NoEligibleNode
from proxy.settings import ProxySettings
from proxy.state import RoutingState
from proxy.store import ConfigStore, StoreUnavailable

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_ADMIN_BODY = 64 * 1024  # admin bodies are small objects
STORE_HEADER = "X-Config-Store"  # "available" | "unavailable" on every admin answer
CAS_ATTEMPTS = 5  # compare-and-set retries of one admin change before answering 409
# A writer further behind the Leader than this is refused by switchLeader (unless forced):
# state nodes would stop ingesting until it caught up, or for good if it is stuck.
LEADER_MAX_LAG = 8


class AdminError(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


async def json_object(request: web.Request) -> dict[str, Any]:
    """An admin request's body: a JSON object of at most MAX_ADMIN_BODY bytes ({} when
    empty); AdminError (413, 400) otherwise."""
    raw = await request.read()
    if len(raw) > MAX_ADMIN_BODY:
        raise AdminError(413, f"body larger than {MAX_ADMIN_BODY} bytes")
    if not raw.strip():
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise AdminError(400, f"body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise AdminError(400, "body must be a JSON object")
    return body


def reply(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


class AdminApi:
    def __init__(
        self,
        settings: ProxySettings,
        state: RoutingState,
        store: ConfigStore,
        engine: Engine,
        tracker: HeadTracker | None = None,
        reads: Reads | None = None,
    ) -> None:
        self.settings = settings
        self.state = state
        self.store = store
        self.engine = engine
        self.tracker = tracker  # polls a writer on the spot before it becomes the Leader
        self.reads = reads  # the response cache and the chain followed per pool
        self.token = settings.admin_token
        self.guard = AdminGuard(settings.admin_token, admin_names(settings))
        self._write_lock = asyncio.Lock()

    # ---- plumbing ------------------------------------------------------------------------

    def routes(self) -> list[web.RouteDef]:
        g, p = self._get, self._post
        return [
            g("/getChains", self.get_chains),
            g("/{pool}/getAllNodes", self.get_all_nodes),
            g("/{pool}/debug_chooseOneNode", self.debug_choose),
            p("/{pool}/addNode", self.add_node),
            p("/{pool}/updateNode/{key}", self.update_node),
            p("/{pool}/deleteNode/{key}", self.delete_node),
            p("/{pool}/addLocalNode", self.add_local_node),
            p("/{pool}/deleteLocalNode/{key}", self.delete_local_node),
            p("/{pool}/setWeight", self.set_weight),
            g("/{pool}/getWeight", self.get_weight),
            p("/{pool}/deleteWeight", self.delete_weight),
            g("/{pool}/getMethodRoutes", self.get_routes),
            p("/{pool}/addMethodRoute", self.add_route),
            p("/{pool}/removeMethodRoute", self.remove_route),
            p("/{pool}/deleteMethodRoute/{method}", self.delete_method_route),
            g("/{pool}/getMirrors", self.get_mirrors),
            p("/{pool}/addMirror", self.add_mirror),
            p("/{pool}/deleteMirror", self.delete_mirror),
            p("/{pool}/deleteAllMirrors", self.delete_all_mirrors),
            g("/{pool}/writers", self.get_writers),
            g("/{pool}/writers/leader", self.get_leader),
            p("/{pool}/writers/switchLeader", self.switch_leader),
            p("/{pool}/writers/addWriter", self.add_writer),
            p("/{pool}/writers/deleteWriter/{key}", self.delete_writer),
            g("/{pool}/cache", self.get_cache),
            p("/{pool}/cache/flush", self.flush_cache),
            g("/{pool}/getVersion", self.get_version),
            p("/{pool}/setVersion", self.set_version),
        ]

    def guarded(self, method: str, path: str, handler: Handler) -> web.RouteDef:
        """A route of another part (tenancy) under this API's guard: token, errors and, for
        POSTs, one change at a time."""
        return self._post(path, handler) if method == "POST" else self._get(path, handler)

    def _get(self, path: str, handler: Handler) -> web.RouteDef:
        return web.get(path, self._guard(handler), allow_head=False)

    def _post(self, path: str, handler: Handler) -> web.RouteDef:
        async def serialized(request: web.Request) -> web.StreamResponse:
            # The body is read before the lock is taken (a client that stops sending holds
            # nothing but its own request), within client_read_timeout.
            await self._read_whole(request)
            # Changes are read-modify-write (e.g. a method's rule list): one at a time here.
            async with self._write_lock:
                return await handler(request)

        return web.post(path, self._guard(serialized))

    async def _read_whole(self, request: web.Request) -> None:
        """The request's body read (aiohttp keeps it for `request.read()`), or AdminError."""
        if request.content_length is not None and request.content_length > MAX_ADMIN_BODY:
            raise AdminError(413, f"body larger than {MAX_ADMIN_BODY} bytes")
        limit = self.settings.client_read_timeout
        try:
            await asyncio.wait_for(request.read(), limit)
        except TimeoutError:
            msg = f"body not received within {limit}s (client_read_timeout)"
            raise AdminError(408, msg) from None
        except web.HTTPRequestEntityTooLarge:
            raise AdminError(413, f"body larger than {MAX_ADMIN_BODY} bytes") from None

    def _guard(self, handler: Handler) -> Handler:
        """Host, Origin, content type and token checks (proxy/adminguard.py) and error
        mapping shared by every admin handler."""

        async def guarded(request: web.Request) -> web.StreamResponse:
            refused = self.guard.refusal(request)
            if refused is not None:
                return refused
            try:
                response = await handler(request)
            except AdminError as exc:
                response = reply({"error": exc.reason}, exc.status)
            except EntryError as exc:
                response = reply({"error": str(exc)}, 400)
            except StoreUnavailable as exc:
                msg = f"config store unavailable, nothing changed: {exc}"
                response = reply({"error": msg}, 503)
            except OSError as exc:  # the file store could not write (disk full, permissions)
                msg = f"config store write failed, nothing changed: {exc}"
                response = reply({"error": msg}, 503)
            # Reads keep answering from the last known configuration during a store outage;
            # every answer says whether that configuration may be stale.
            response.headers[STORE_HEADER] = self._store_state()
            return response

        return guarded

    def _store_state(self) -> str:
        return "available" if self.store.available else "unavailable"

    @staticmethod
    def _pool_id(request: web.Request) -> str:
        raw = request.match_info["pool"]
        pool_id = normalize_pool(raw)
        if pool_id is None:
            raise AdminError(
                400, f"{raw!r} is not a chain id or pool id (e.g. 1337, 0x539, 1-blue)"
            )
        return pool_id

    def _pool(self, request: web.Request) -> Pool:
        pool_id = self._pool_id(request)
        pool = self.state.pools.get(pool_id)
        if pool is None:
            raise AdminError(404, f"unknown pool {pool_id}")
        return pool

    @staticmethod
    async def _body(request: web.Request) -> dict[str, Any]:
        return await json_object(request)

    async def _put(self, key: str, obj: Any) -> int:
        self._check_store()
        return await self._applied(await self.store.put(key, orjson.dumps(obj)))

    async def _delete(self, key: str) -> int:
        self._check_store()
        return await self._applied(await self.store.delete(key))

    async def _delete_prefix(self, prefix: str) -> int:
        self._check_store()
        return await self._applied(await self.store.delete_prefix(prefix))

    async def _update(self, key: str, change: Callable[[bytes | None], Any]) -> int:
        """Read-modify-write of one key with compare-and-set (several proxies may change it
        at once): `change(current)` returns the new JSON value, or None to delete the key."""
        self._check_store()
        replace = getattr(self.store, "replace", None)
        for _ in range(CAS_ATTEMPTS):
            items, _rev = await self.store.snapshot(key)
            current = items.get(key)
            new = change(current)
            value = None if new is None else orjson.dumps(new)
            if replace is None:  # a store without compare-and-set: last writer wins
                revision = await (self.store.put(key, value) if value else self.store.delete(key))
            else:
                revision = await replace(key, current, value)
            if revision is not None:
                return await self._applied(revision)
        raise AdminError(409, f"{key} kept changing concurrently; try again")

    def _check_store(self) -> None:
        if not self.store.available:
            raise StoreUnavailable("the store does not answer")

    async def _applied(self, revision: int) -> int:
        if not await self.state.wait_applied(revision, self.settings.admin_apply_timeout):
            raise AdminError(
                504,
                f"written at revision {revision} but not applied within "
                f"{self.settings.admin_apply_timeout}s (admin_apply_timeout)",
            )
        return revision

    # ---- chains and nodes ----------------------------------------------------------------

    async def get_chains(self, request: web.Request) -> web.Response:
        chains = []
        for chain in self.state.chains():
            active = self.state.pool_for_chain(chain)
            pools = sorted(p for p in self.state.pools if p.partition("-")[0] == chain)
            chains.append(
                {
                    "chain": chain,
                    "version": self.state.versions.get(chain),
                    "active_pool": active.id if active else None,
                    "pools": pools,
                    "head": active.head() if active else None,
                    "nodes": len(active.readers) if active else 0,
                }
            )
        return reply({"chains": chains, "config_store": self._store_state()})

    async def get_all_nodes(self, request: web.Request) -> web.Response:
        """Every node with what the proxy observed, including the failsafe parts (breaker,
        checker verdict, latency cost, routable), and the pool's admission figures and the
        checker's last report."""
        pool = self._pool(request)
        self.engine.metrics.settle()  # the in-process answers' books folded in first
        cost = self.engine.selector.cost
        every = (*pool.readers, *pool.fulls)
        nodes = [{**n.to_obj(), **n.failsafe_obj(cost(n))} for n in every]
        limit = self.engine.admission.limit(pool, time.perf_counter())
        answer = {
            "pool": pool.id,
            "head": pool.head(),
            "nodes": nodes,
            "inflight": pool.inflight,
            "inflight_limit": limit or None,
            "checker": pool.verdicts,
        }
        if self.reads is not None:
            answer["cache"] = self._cache_figures(pool.id)
        return reply(answer)

    # ---- the read path: cache, coalescing, the chain followed ----------------------------

    def _cache_figures(self, pool_id: str) -> dict[str, Any]:
        assert self.reads is not None
        cache = self.reads.cache
        stats = cache.stats_of(pool_id).to_obj()
        looked = stats["hits"] + stats["misses"]
        return {
            "enabled": cache.enabled(pool_id),
            **stats,
            "hit_ratio": round(stats["hits"] / looked, 4) if looked else None,
            "max_bytes": cache.max_bytes,
            "total_bytes": cache.bytes,
            "total_entries": len(cache),
        }

    async def get_cache(self, request: web.Request) -> web.Response:
        pool_id = self._pool(request).id
        if self.reads is None:
            raise AdminError(404, "this proxy has no read cache")
        view = self.reads.heads.views.get(pool_id)
        return reply(
            {
                "pool": pool_id,
                "cache": self._cache_figures(pool_id),
                "coalesce": self.reads.coalescer is not None,
                "in_flight": 0
                if self.reads.coalescer is None
                else len(self.reads.coalescer.flights),
                "chain": None if view is None else view.to_obj(),
                "checker": self.reads.heads.checkers.get(pool_id),
                "checker_error": self.reads.heads.checker_errors.get(pool_id),
            }
        )

    async def flush_cache(self, request: web.Request) -> web.Response:
        """Empty the pool's cache in every proxy process sharing the store (the write goes
        through the store; this process has flushed once it is applied)."""
        pool_id = self._pool(request).id
        if self.reads is None:
            raise AdminError(404, "this proxy has no read cache")
        before = self.reads.cache.stats_of(pool_id).flushed
        stamp = {"at": time.time(), "id": secrets.token_hex(8)}
        await self._put(f"pools/{pool_id}/cache/flush", stamp)
        flushed = self.reads.cache.stats_of(pool_id).flushed - before
        return reply({"pool": pool_id, "flushed": flushed, **self._cache_figures(pool_id)})

    async def debug_choose(self, request: web.Request) -> web.Response:
        q = request.query
        raw_pool = request.match_info["pool"]
        method = q.get("method", "eth_call")
        resolved = self.engine.resolve(raw_pool)
        if resolved is None:
            raise AdminError(404, f"unknown chain or pool {raw_pool!r}")
        _, pool = resolved
        try:
            spec = self.engine.methods.spec(method)
            ref = None
            if "block" in q or "type" in q:
                kind = q.get("type", "Equals")
                block = q.get("block", "latest")
                if kind not in ("Equals", "Contains"):
                    raise AdminError(400, 'type must be "Equals" or "Contains"')
                ref = parse_block_ctx({"block_id": block, "type": kind})
        except JsonRpcError as exc:
            raise AdminError(400, exc.message) from None
        need = self.engine.selector.need(pool, ref)
        answer: dict[str, Any] = {
            "pool": pool.id,
            "method": method,
            "block": None if ref is None else ref.describe(),
            "type": None if ref is None else ("Contains" if ref.contains else "Equals"),
            "kind": "writer"
            if self.engine.selector.to_leader(pool, spec, ref)
            else ("full" if spec.trie else need.kind),
        }
        self.engine.metrics.settle()  # the latency costs as of now
        try:
            choice = self.engine.selector.choose(pool, method, spec, ref)
        except NoEligibleNode as exc:
            return reply({**answer, "node": None, "reason": exc.message})
        return reply({**answer, "node": choice.node.to_obj(), "reason": choice.reason})

    async def add_node(self, request: web.Request) -> web.Response:
        pool_id = self._pool_id(request)
        entry = NodeEntry.from_obj(await self._body(request), self.settings.max_weight)
        pool = self.state.pools.get(pool_id)
        if pool is not None and pool.find(entry.key) is not None:
            raise AdminError(409, f"node {entry.key} already exists in pool {pool_id}")
        await self._update(f"pools/{pool_id}/nodes/{entry.key}", _create(entry.to_obj()))
        return reply({"pool": pool_id, "node": self._node(pool_id, entry.key)}, 201)

    def _node(self, pool_id: str, key: str) -> dict[str, Any] | None:
        pool = self.state.pools.get(pool_id)
        node = pool.find(key) if pool else None
        self.engine.metrics.settle()
        return node.to_obj() if node else None

    async def update_node(self, request: web.Request) -> web.Response:
        pool = self._pool(request)
        key = request.match_info["key"]
        node = pool.find(key)
        if node is None:
            raise AdminError(404, f"unknown node {key} in pool {pool.id}")
        body = await self._body(request)
        if body.get("key", key) != key:
            raise AdminError(400, "key cannot change; delete the node and add it again")
        if not body:
            raise AdminError(400, "nothing to update: send url, kind, weight and/or enabled")
        entry = NodeEntry.from_obj({**node.entry.to_obj(), **body}, self.settings.max_weight)
        if node.local:
            pool.local[key] = _renewed(node, entry)
            pool.rebuild()
        else:
            await self._put(f"pools/{pool.id}/nodes/{key}", entry.to_obj())
        return reply({"pool": pool.id, "node": self._node(pool.id, key)})

    async def delete_node(self, request: web.Request) -> web.Response:
        pool = self._pool(request)
        key = request.match_info["key"]
        if key not in pool.nodes:
            hint = " (it is a local node: use deleteLocalNode)" if key in pool.local else ""
            raise AdminError(404, f"unknown node {key} in pool {pool.id}{hint}")
        await self._delete(f"pools/{pool.id}/nodes/{key}")
        if key in pool.weights:
            await self._delete(f"pools/{pool.id}/weights/{key}")
        return reply({"pool": pool.id, "deleted": key})

    async def add_local_node(self, request: web.Request) -> web.Response:
        pool_id = self._pool_id(request)
        entry = NodeEntry.from_obj(await self._body(request), self.settings.max_weight)
        pool = self.state.pool(pool_id, create=True)
        assert pool is not None
        if pool.find(entry.key) is not None:
            raise AdminError(409, f"node {entry.key} already exists in pool {pool_id}")
        pool.local[entry.key] = Node(entry, local=True, breaker_settings=self.state.breaker)
        pool.rebuild()
        return reply({"pool": pool_id, "node": pool.local[entry.key].to_obj()}, 201)

    async def delete_local_node(self, request: web.Request) -> web.Response:
        pool = self._pool(request)
        key = request.match_info["key"]
        if key not in pool.local:
            raise AdminError(404, f"unknown local node {key} in pool {pool.id}")
        del pool.local[key]
        pool.rebuild()
        if pool.empty:
            self.state.remove(pool.id)
        return reply({"pool": pool.id, "deleted": key})

    # ---- weights -------------------------------------------------------------------------

    async def set_weight(self, request: web.Request) -> web.Response:
        pool = self._pool(request)
        body = await self._body(request)
        key = check_key(body.get("key"), "key")
        weight = check_weight(body.get("weight"), self.settings.max_weight)
        if set(body) - {"key", "weight"}:
            raise AdminError(400, 'setWeight takes {"key", "weight"} only')
        if pool.find(key) is None:
            raise AdminError(404, f"unknown node {key} in pool {pool.id}")
        await self._put(f"pools/{pool.id}/weights/{key}", {"weight": weight})
        return reply({"pool": pool.id, **self._weight(pool, key)})

    @staticmethod
    def _weight(pool: Pool, key: str) -> dict[str, Any]:
        node = pool.find(key)
        base = node.entry.weight if node else None
        override = pool.weights.get(key)
        effective = override if override is not None else base
        return {"key": key, "weight": effective, "base": base, "override": override}

    async def get_weight(self, request: web.Request) -> web.Response:
        pool = self._pool(request)
        key = request.query.get("key")
        if key is None:
            return reply(
                {"pool": pool.id, "weights": [self._weight(pool, n.key) for n in pool.readers]}
            )
        if pool.find(key) is None:
            raise AdminError(404, f"unknown node {key} in pool {pool.id}")
        return reply({"pool": pool.id, **self._weight(pool, key)})

    async def delete_weight(self, request: web.Request) -> web.Response:
        pool = self._pool(request)
        key = check_key((await self._body(request)).get("key"), "key")
        if key not in pool.weights:
            raise AdminError(404, f"no weight override for {key} in pool {pool.id}")
        await self._delete(f"pools/{pool.id}/weights/{key}")
        return reply({"pool": pool.id, **self._weight(pool, key)})

    # ---- method routes -------------------------------------------------------------------

    async def get_routes(self, request: web.Request) -> web.Response:
        pool = self._pool(request)
        routes = {m: [r.to_obj() for r in rules] for m, rules in sorted(pool.routes.items())}
        return reply({"pool": pool.id, "routes": routes})

    async def add_route(self, request: web.Request) -> web.Response:
        pool = self._pool(request)
        rule = RouteRule.from_obj(await self._body(request))
        if rule.method not in self.engine.methods.specs:
            raise AdminError(400, f"method {rule.method} is not served by the proxy")
        if self.engine.methods.spec(rule.method).writer:
            raise AdminError(400, f"{rule.method} always goes to the Leader write node")
        missing = [k for k in rule.nodes or () if pool.find(k) is None]
        if missing:
            raise AdminError(400, f"unknown node(s) {missing} in pool {pool.id}")

        def add(current: bytes | None) -> list[dict[str, Any]]:
            rules = _rules(current)
            return [r.to_obj() for r in (rules if rule in rules else [*rules, rule])]

        await self._update(f"pools/{pool.id}/routes/{rule.method}", add)
        rules = pool.routes.get(rule.method, [])
        return reply({"pool": pool.id, "method": rule.method, "rules": [r.to_obj() for r in rules]})

    async def remove_route(self, request: web.Request) -> web.Response:
        pool = self._pool(request)
        rule = RouteRule.from_obj(await self._body(request))

        def remove(current: bytes | None) -> list[dict[str, Any]] | None:
            rules = _rules(current)
            if rule not in rules:
                raise AdminError(404, f"no such rule for {rule.method} in pool {pool.id}")
            left = [r.to_obj() for r in rules if r != rule]
            return left or None

        await self._update(f"pools/{pool.id}/routes/{rule.method}", remove)
        rules = pool.routes.get(rule.method, [])
        return reply({"pool": pool.id, "method": rule.method, "rules": [r.to_obj() for r in rules]})

    async def delete_method_route(self, request: web.Request) -> web.Response:
        pool = self._pool(request)
        method = check_method(request.match_info["method"])
        if method not in pool.routes:
            raise AdminError(404, f"no rules for {method} in pool {pool.id}")
        await self._delete(f"pools/{pool.id}/routes/{method}")
        return reply({"pool": pool.id, "method": method, "rules": []})

    # ---- mirrors -------------------------------------------------------------------------

    async def get_mirrors(self, request: web.Request) -> web.Response:
        pool = self._pool(request)
        return reply({"pool": pool.id, "mirrors": [m.to_obj() for m in pool.mirrors.values()]})

    async def add_mirror(self, request: web.Request) -> web.Response:
        pool = self._pool(request)
        mirror = MirrorEntry.from_obj(await self._body(request))
        unserved = sorted((mirror.methods or set()) - set(self.engine.methods.specs))
        if unserved:
            raise AdminError(400, f"method(s) {unserved} are not served by the proxy")
        existed = mirror.id in pool.mirrors
        await self._put(f"pools/{pool.id}/mirrors/{mirror.id}", mirror.to_obj())
        return reply({"pool": pool.id, "mirror": mirror.to_obj()}, 200 if existed else 201)

    async def delete_mirror(self, request: web.Request) -> web.Response:
        pool = self._pool(request)
        body = await self._body(request)
        if "id" in body:
            mid = body["id"]
        elif isinstance(body.get("url"), str):
            mid = mirror_id(body["url"])
        else:
            raise AdminError(400, 'deleteMirror needs {"url"} or {"id"}')
        if mid not in pool.mirrors:
            raise AdminError(404, f"no such mirror in pool {pool.id}")
        await self._delete(f"pools/{pool.id}/mirrors/{mid}")
        return reply({"pool": pool.id, "deleted": mid})

    async def delete_all_mirrors(self, request: web.Request) -> web.Response:
        pool = self._pool(request)
        count = len(pool.mirrors)
        if count:
            await self._delete_prefix(f"pools/{pool.id}/mirrors/")
        return reply({"pool": pool.id, "deleted": count})

    # ---- writers -------------------------------------------------------------------------

    def _writer(self, pool: Pool, node: Node) -> dict[str, Any]:
        """A writer as the admin API shows it: its entry, what the health poll saw, and the
        writer's own report (its execution client's head and its lag behind it)."""
        heads = [w.head for w in pool.writers.values() if w.head is not None]
        report = self.tracker.writer_report(node) if self.tracker is not None else {}
        return {
            "key": node.key,
            "url": node.entry.url,
            "leader": pool.leader == node.key,
            "head": node.head,
            "behind": None if node.head is None else max(heads) - node.head,
            "execution_head": report.get("execution_head"),
            "lag": report.get("lag"),
            "state": report.get("state"),
            "healthy": node.healthy,
            "latency_ms": None if node.latency_ms is None else round(node.latency_ms, 3),
            "last_error": node.last_error,
        }

    async def get_writers(self, request: web.Request) -> web.Response:
        pool = self._pool(request)
        writers = [self._writer(pool, n) for n in pool.writers.values()]
        return reply({"pool": pool.id, "leader": pool.leader, "writers": writers})

    async def get_leader(self, request: web.Request) -> web.Response:
        pool = self._pool(request)
        leader = pool.leader_node()
        if leader is None:
            raise AdminError(404, f"pool {pool.id} has no Leader write node")
        return reply({"pool": pool.id, "leader": self._writer(pool, leader)})

    async def switch_leader(self, request: web.Request) -> web.Response:
        pool = self._pool(request)
        body = await self._body(request)
        if set(body) - {"key", "force"}:
            raise AdminError(400, 'switchLeader takes {"key": "<writer>", "force": false} only')
        key = check_key(body.get("key"), "key")
        force = body.get("force", False)
        if not isinstance(force, bool):
            raise AdminError(400, "force must be true or false")
        node = pool.writers.get(key)
        if node is None:
            raise AdminError(404, f"unknown writer {key} in pool {pool.id}")
        problem = await self._writer_problem(node)
        if problem is not None:
            problem = f"writer {key} is unhealthy ({problem})"
        else:
            problem = _lagging(pool, node)
        if problem is not None and not force:
            raise AdminError(
                409,
                f"{problem}; the Leader stays {pool.leader}. "
                f'Send {{"key": "{key}", "force": true}} to switch anyway',
            )
        previous = pool.leader
        await self._put(f"pools/{pool.id}/leader", {"key": key})
        leader = self._writer(pool, pool.writers[key])
        return reply({"pool": pool.id, "previous": previous, "leader": leader, "forced": force})

    async def _writer_problem(self, node: Node) -> str | None:
        """Why `node` should not lead, from a poll made now (None: it answers)."""
        if self.tracker is None:
            return None if node.healthy else (node.last_error or "marked unhealthy")
        return await self.tracker.poll_writer(node)

    async def add_writer(self, request: web.Request) -> web.Response:
        pool_id = self._pool_id(request)
        body = await self._body(request)
        leader, force = body.pop("leader", False), body.pop("force", False)
        if not isinstance(leader, bool) or not isinstance(force, bool):
            raise AdminError(400, "leader and force must be true or false")
        writer = WriterEntry.from_obj(body)
        pool = self.state.pools.get(pool_id)
        if pool is not None and writer.key in pool.writers:
            raise AdminError(409, f"writer {writer.key} already exists in pool {pool_id}")
        if leader and not force:
            probe = Node(NodeEntry(key=writer.key, url=writer.url, kind="writer"))
            problem = await self._writer_problem(probe)
            if problem is not None:
                raise AdminError(
                    409,
                    f"writer {writer.key} does not answer ({problem}), so it cannot lead; "
                    'add it without "leader", or with "force": true',
                )
        await self._update(f"pools/{pool_id}/writers/{writer.key}", _create(writer.to_obj()))
        if leader:
            await self._put(f"pools/{pool_id}/leader", {"key": writer.key})
        pool = self.state.pools[pool_id]
        node = pool.writers[writer.key]
        await self._writer_problem(node)  # the answer shows its health at once
        return reply({"pool": pool_id, "writer": self._writer(pool, node)}, 201)

    async def delete_writer(self, request: web.Request) -> web.Response:
        pool = self._pool(request)
        key = request.match_info["key"]
        if key not in pool.writers:
            raise AdminError(404, f"unknown writer {key} in pool {pool.id}")
        if pool.leader == key:
            raise AdminError(409, f"{key} is the Leader: switch the Leader first")
        await self._delete(f"pools/{pool.id}/writers/{key}")
        return reply({"pool": pool.id, "deleted": key})

    # ---- version mode --------------------------------------------------------------------

    def _chain(self, request: web.Request) -> str:
        raw = request.match_info["pool"]
        chain = normalize_chain(raw)
        if chain is None:
            raise AdminError(400, f"{raw!r} is not a chain id (version mode is per chain)")
        return chain

    async def get_version(self, request: web.Request) -> web.Response:
        chain = self._chain(request)
        version = self.state.versions.get(chain)
        pool = self.state.pool_for_chain(chain)
        return reply({"chain": chain, "version": version, "active_pool": pool.id if pool else None})

    async def set_version(self, request: web.Request) -> web.Response:
        chain = self._chain(request)
        body = await self._body(request)
        if set(body) != {"version"}:
            raise AdminError(400, 'setVersion takes {"version": "<V>"} or {"version": null}')
        if body["version"] is None:
            await self._delete(f"{chain}/version")
        else:
            version = check_version(body["version"])
            await self._put(f"{chain}/version", version)
        return await self.get_version(request)


def _lagging(pool: Pool, node: Node) -> str | None:
    """Why `node` is too far behind the current Leader to take over, or None."""
    leader = pool.leader_node()
    if leader is None or leader is node or leader.head is None or node.head is None:
        return None
    lag = leader.head - node.head
    if lag <= LEADER_MAX_LAG:
        return None
    return (
        f"writer {node.key} is {lag} blocks behind the Leader {leader.key} (head {node.head} "
        f"vs {leader.head}, at most {LEADER_MAX_LAG} allowed): state nodes would wait for it"
    )


def _renewed(node: Node, entry: NodeEntry) -> Node:
    """The node with a changed entry; observations are kept while the URL stays the same."""
    if node.entry.url == entry.url:
        node.take_entry(entry)
        return node
    return Node(entry, local=node.local, breaker_settings=node.breaker_settings)


def _create(obj: dict[str, Any]) -> Callable[[bytes | None], dict[str, Any]]:
    """A change that creates a key and refuses (409) when another proxy created it first."""

    def create(current: bytes | None) -> dict[str, Any]:
        if current is not None:
            raise AdminError(409, f"{obj['key']} already exists")
        return obj

    return create


def _rules(current: bytes | None) -> list[RouteRule]:
    """The stored rule list of one method (a bad stored value counts as none)."""
    if current is None:
        return []
    try:
        return [RouteRule.from_obj(r) for r in orjson.loads(current)]
    except (EntryError, orjson.JSONDecodeError, TypeError):
        return []

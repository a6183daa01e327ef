"""The one call the request path makes at admission: `Gate.admit`.

Given the request's pool, credential (a path key, or the Authorization header), headers,
body and client address, it answers:

- None: admitted, nothing to follow (anonymous traffic without in-flight limits);
- a `Ticket`: admitted; the caller routes its answers through it (errors per key, in-flight
  counts, CORS headers);
- an answer to send at once: 401 (no, unknown, revoked or expired credential), 403 (a rule:
  chain, method, origin, address, eth_getLogs range, batch size), 429 + Retry-After with a
  JSON-RPC -32005 naming the limit, or 503 when a quota cannot be checked (`quota_fail`).
  A batch is admitted or refused whole.

A credential is resolved once (hash lookup or JWT verification) and its subject kept until the
registry changes, so a known key costs a dict lookup; limiters outlive those changes.

A single request of a subject whose only checks are its rates and quotas takes one unit of a
**lease**: a few tokens taken at once from every bucket and quota of the subject (at most
`LEASE_SECONDS` of each bucket's rate, at least one), so most requests cost a decrement
instead of a token-bucket update per limit, and are counted in the usage tally when the
lease is settled. Leases are settled (what was used counted, the rest given back) before
every sync of the limiters, every usage flush and every read of the counts.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Mapping
from typing import Any

import orjson
from cachetools import LRUCache

from chainstate.jsonrpc import SERVER_BUSY
from proxy.model import Pool
from proxy.tenancy.http import peer_of
from proxy.tenancy.identity import AuthError, ClientAddress, JwtVerifier, bearer, looks_like_jwt
from proxy.tenancy.keys import key_hash, looks_like_key
from proxy.tenancy.limits import MIN_RATE, Bucket, InFlight, Quota
from proxy.tenancy.model import Limits, PoolAccess
from proxy.tenancy.registry import Registry
from proxy.tenancy.rules import Policy
from proxy.tenancy.settings import TenancySettings
from proxy.tenancy.shared import Active
from proxy.tenancy.usage import ANONYMOUS, Tally, Usage

UNAUTHORIZED = -32001  # no usable credential (HTTP 401)
FORBIDDEN = -32002  # a rule refused the request (HTTP 403)
LIMIT_EXCEEDED = SERVER_BUSY  # -32005, EIP-1474 "limit exceeded" (HTTP 429)
MAX_SUBJECTS = 10_000  # credentials (and refusals of bad ones) kept resolved
# A lease holds at most this many seconds of a bucket's rate (and at least one token), and at
# most 1/QUOTA_LEASE_SHARE of a quota: what a lease may hold unused until it is settled.
LEASE_SECONDS = 0.01
QUOTA_LEASE_SHARE = 1000
MAX_LEASE = 1 << 16  # requests of a subject without rates or quotas counted per lease
Answer = tuple[int, bytes] | tuple[int, bytes, bytes]
_METHOD = b'"method"'
_ERROR = b'"error"'
_WHITESPACE = b" \t\r\n"
_new = object.__new__
monotonic = time.monotonic


def _error(status: int, code: int, message: str, extra: bytes = b"") -> Answer:
    body = orjson.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}})
    return (status, body, extra) if extra else (status, body)


class Limiters:
    """The limiters of one set of `Limits` (a key's, a project's, or one client address's)."""

    __slots__ = ("buckets", "inflight", "items", "quotas")

    def __init__(self, name: str, limits: Limits, now: float, wall: float) -> None:
        self.buckets: list[Bucket] = []  # one token per request
        self.items: list[Bucket] = []  # one token per request item
        self.quotas: list[Quota] = []
        self.inflight: InFlight | None = None
        burst = limits.burst_seconds
        if limits.requests_per_second:
            rate = limits.requests_per_second
            self.buckets.append(
                Bucket(f"{name}:rps", f"requests_per_second={rate:g}", rate, burst, now)
            )
        if limits.items_per_second:
            rate = limits.items_per_second
            self.items.append(Bucket(f"{name}:ips", f"items_per_second={rate:g}", rate, burst, now))
        for period, value, setting in (
            ("day", limits.daily_items, "daily_items"),
            ("month", limits.monthly_items, "monthly_items"),
        ):
            if value:
                self.quotas.append(
                    Quota(f"{name}:{period}", f"{setting}={value}", value, period, wall)
                )
        if limits.concurrent:
            setting = f"concurrent={limits.concurrent}"
            self.inflight = InFlight(limits.concurrent, setting, f"{name}:cc")


class Subject:
    """One key with its project, one JWT project, or one pool's anonymous clients."""

    __slots__ = (
        "checks",
        "expires",
        "fast",
        "follow",
        "inflight",
        "items",
        "lease",
        "leased",
        "leases",
        "left",
        "limiters",
        "name",
        "per_client",
        "policy",
        "quotas",
        "rates",
        "single",
        "tally",
    )

    def __init__(
        self,
        name: str,
        policy: Policy,
        limiters: list[Limiters],
        tally: Tally,
        per_client: Limits | None = None,
        expires: float = 0.0,
    ) -> None:
        self.name = name  # as refusals name it: "key k1a2b3 (project acme)"
        self.policy = policy
        self.tally = tally
        self.per_client = per_client  # anonymous: limits of each client address
        self.expires = expires  # a JWT's exp (0: none)
        self.limiters = limiters
        self.rates = [b for lim in limiters for b in lim.buckets]
        self.items = [b for lim in limiters for b in lim.items]
        self.single = self.rates + self.items  # what a single request takes a token of
        self.quotas = [q for lim in limiters for q in lim.quotas]
        self.inflight = [lim.inflight for lim in limiters if lim.inflight is not None]
        # keyed traffic is followed to its answer (errors per key); anonymous only when needed
        self.follow = (
            tally.key != ANONYMOUS
            or bool(self.inflight)
            or (per_client is not None and per_client.concurrent > 0)
        )
        # Single requests take a unit of the lease: nothing to check but rates and quotas
        self.leases = not (
            policy.chains is not None
            or policy.networks
            or policy.needs_items
            or per_client is not None
            or self.inflight
        )
        # ... and with no expiry to check: `Gate.admit`'s first test suffices
        self.fast = self.leases and not expires
        # more than plain rates to check for a batch (or a single request without a lease)
        self.checks = not self.leases or bool(self.quotas)
        self.lease = 0  # units of the current lease
        self.left = 0  # units of it not used yet
        self.leased = False  # in the gate's list of subjects to settle


class Ticket:
    """One admitted request followed to its answer: an error answer counts for the key, once
    the answer is written. (Made without `__init__`'s call, by `Gate.admit`; the caller sets
    `request` before it hands `early`/`later` on.)"""

    __slots__ = ("request", "tally")

    request: Any
    tally: Tally

    def early(self, result: Any) -> bool:
        """`Request.answer_early` for the engine (a node's answer, final as it is)."""
        written = self.request.answer_early(result)
        if type(result) is bytes:
            if result.find(_ERROR) >= 0:
                self.tally.errors += 1
        elif result[0] >= 400 or result[1].find(_ERROR) >= 0:
            self.tally.errors += 1
        return written

    def later(self, answer: Awaitable[Any]) -> None:
        self.request.answer_later(self._watch(answer))

    def finish(self, result: Any) -> Any:
        """What the request path returns for it, followed."""
        if result is None:
            return None
        if type(result) is tuple or type(result) is bytes:
            return self._end(result)
        return self._watch(result)

    async def _watch(self, answer: Awaitable[Any]) -> Any:
        return self._end(await answer)

    def _end(self, result: Any) -> Any:
        if _failed(result):
            self.tally.errors += 1
        return result


class HeldTicket(Ticket):
    """A ticket that also holds places in flight (`concurrent`), given back with the answer,
    and adds the CORS headers a browser needs to read the answer."""

    __slots__ = ("done", "extra", "inflight")

    inflight: list[InFlight]
    extra: bytes  # header lines added to the answer
    done: bool

    def early(self, result: Any) -> bool:
        extra = self.extra
        written = self.request.answer_early(_with_headers(result, extra) if extra else result)
        if not self.done:
            self._release()
            if _failed(result):
                self.tally.errors += 1
        return written

    async def _watch(self, answer: Awaitable[Any]) -> Any:
        try:
            result = await answer
        except BaseException:
            self._release()
            raise
        return self._end(result)

    def _release(self) -> None:
        if not self.done:
            self.done = True
            for slot in self.inflight:
                slot.count -= 1

    def _end(self, result: Any) -> Any:
        if not self.done:
            self._release()
            if _failed(result):
                self.tally.errors += 1
        extra = self.extra
        return _with_headers(result, extra) if extra else result


def _failed(result: Any) -> bool:
    """An answer holding an error object, or an HTTP error status."""
    if type(result) is bytes:
        return result.find(_ERROR) >= 0
    return result[0] >= 400 or result[1].find(_ERROR) >= 0


def _with_headers(result: Any, extra: bytes) -> Any:
    if type(result) is bytes:
        return (200, result, extra) if result else (204, b"", extra)
    if len(result) == 2:
        return (result[0], result[1], extra)
    return (result[0], result[1], result[2] + extra)


def batch_items(body: bytes) -> int:
    """Items of a batch: its "method" members (a scan, no parse), unless a member name may be
    written with escapes (`"\\u006dethod"`), then the parsed array's length."""
    if body.find(b"\\u") < 0:
        return body.count(_METHOD) or 1
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return 1  # the engine answers the parse error
    return len(payload) if type(payload) is list and payload else 1


class Gate:
    def __init__(self, settings: TenancySettings, registry: Registry, usage: Usage) -> None:
        self.settings = settings
        self.registry = registry
        self.usage = usage
        self.jwt = JwtVerifier(settings)
        self.address = ClientAddress(settings.trusted_proxies)
        self.cors = Policy(_cors_rules(settings.cors_origins))
        self.active_limiters = Active()
        self.quota_closed = False  # quotas refused while their shared counts are unknown
        # Anything to check at all; else only requests with an Origin header come here.
        self.active = False
        self._version = -1
        self._subjects: dict[Any, Subject] = {}  # credential → subject
        self._refusals: dict[Any, Answer] = {}  # credential → its refusal
        self._leased: list[Subject] = []  # subjects holding a lease (settled together)
        # The in-flight places of the request being admitted when they are not its subject's
        # alone (an anonymous address's), from `_take` to `_admit` in the same call
        self._held: list[InFlight] | None = None
        self._limiters: dict[str, tuple[Limits, Limiters]] = {}  # outlive registry changes
        self._clients: LRUCache[tuple[str, str], Limiters] = LRUCache(settings.max_clients)
        self._refresh()
        registry.on_change = self._refresh  # (`active` may change: recomputed at once)
        usage.settle = self.settle

    # ---- the registry's records, compiled ---------------------------------------------------

    def _refresh(self) -> None:
        reg = self.registry
        self.settle()  # (the subjects are made again: what their leases counted is kept)
        self._version = reg.version
        self._subjects = {}
        self._refusals = {}
        s = self.settings
        self.active = not (
            reg.empty
            and s.anonymous
            and s.anonymous_limits.empty
            and not s.jwt_secret
            and not s.jwt_public_key
        )

    def _limiters_of(self, name: str, limits: Limits) -> Limiters | None:
        if limits.empty:
            return None
        kept = self._limiters.get(name)
        if kept is not None and kept[0] == limits:
            return kept[1]
        made = Limiters(name, limits, time.monotonic(), time.time())
        self._limiters[name] = (limits, made)
        return made

    def _key_subject(self, token: str) -> Subject | Answer:
        if not looks_like_key(token):
            return _error(401, UNAUTHORIZED, "unauthorized: malformed API key")
        record = self.registry.by_hash.get(key_hash(token))
        if record is None:
            return _error(401, UNAUTHORIZED, "unauthorized: unknown API key")
        if record.revoked:
            return _error(401, UNAUTHORIZED, f"unauthorized: key {record.id} was revoked")
        project = self.registry.projects.get(record.project)
        if project is None:
            return _error(401, UNAUTHORIZED, f"unauthorized: key {record.id} has no project")
        limiters = [
            lim
            for lim in (
                self._limiters_of(f"key:{record.id}", record.limits),
                self._limiters_of(f"project:{project.id}", project.limits),
            )
            if lim is not None
        ]
        return Subject(
            f"key {record.id} (project {project.id})",
            Policy(record.rules, project.rules),
            limiters,
            self.usage.tally(project.id, record.id),
        )

    def _jwt_subject(self, token: str) -> Subject | Answer:
        try:
            claims = self.jwt.verify(token)
        except AuthError as exc:
            return _error(401, UNAUTHORIZED, f"unauthorized: {exc}")
        project = self.registry.projects.get(claims.project)
        if project is None:
            return _error(
                401, UNAUTHORIZED, f"unauthorized: unknown project {claims.project[:48]!r}"
            )
        limiters = self._limiters_of(f"project:{project.id}", project.limits)
        return Subject(
            f"JWT (project {project.id})",
            Policy(project.rules),
            [limiters] if limiters is not None else [],
            self.usage.tally(project.id, "jwt"),
            expires=claims.expires,
        )

    def _anonymous(self, pool_id: str) -> Subject | Answer:
        access = self.registry.pools.get(pool_id)
        s = self.settings
        if access is None:
            access = PoolAccess(s.anonymous, s.anonymous_limits)
        if not access.anonymous:
            return _error(
                401,
                UNAUTHORIZED,
                f"unauthorized: chain {pool_id} needs an API key "
                "(Authorization: Bearer <key>, or POST /<chainId>/<key>)",
            )
        return Subject(
            f"anonymous clients of {pool_id}",
            Policy(access.rules),
            [],
            self.usage.tally(ANONYMOUS, ANONYMOUS),
            per_client=None if access.limits.empty else access.limits,
        )

    def _subject(
        self, cache_as: Any, path_key: str | None, raw: Mapping[bytes, bytes], pool_id: str
    ) -> Subject | Answer:
        """The subject of a credential not seen since the registry last changed (or of a JWT
        whose expiry is checked)."""
        if self._version != self.registry.version:
            self._refresh()
        found = self._subjects.get(cache_as)
        if found is not None:
            if not found.expires or time.time() < found.expires:
                return found
            self._forget(cache_as)
        refused = self._refusals.get(cache_as)
        if refused is not None:
            return refused
        token = path_key
        if token is None:
            auth = raw.get(b"authorization")
            if auth is not None:
                token = bearer(auth)
                if token is None:
                    return _error(401, UNAUTHORIZED, "unauthorized: Authorization must be Bearer")
        if token is None:
            made = self._anonymous(pool_id)
        elif looks_like_jwt(token):
            made = self._jwt_subject(token)
        else:
            made = self._key_subject(token)
        if type(made) is Subject:
            if len(self._subjects) >= MAX_SUBJECTS:
                self.settle()
                self._subjects.clear()
            self._subjects[cache_as] = made
        else:
            if len(self._refusals) >= MAX_SUBJECTS:
                self._refusals.clear()
            self._refusals[cache_as] = made  # type: ignore[assignment]
        return made

    def _forget(self, cache_as: Any) -> None:
        subject = self._subjects.pop(cache_as, None)
        if subject is not None and subject.leased:
            _settle(subject)
            subject.leased = False
            self._leased.remove(subject)

    # ---- admission -----------------------------------------------------------------------

    def admit(
        self,
        pool: Pool,
        path_key: str | None,
        raw: Mapping[bytes, bytes],
        body: bytes,
        conn: Any,
    ) -> Ticket | Answer | None:
        """The request path's one call (see the module's docstring). `raw`: lower-case
        header names → values; `conn`: the client's connection (its `transport` tells the
        remote address, read only when a rule or limit needs it). A single request of a
        known key with rates and quotas only costs a dict lookup, a decrement of its lease
        and its ticket; everything else goes on in `_admit`."""
        if path_key is not None:
            cache_as: Any = path_key
        else:
            auth = raw.get(b"authorization")
            cache_as = pool.id if auth is None else auth
        subject = self._subjects.get(cache_as)
        if (
            subject is not None
            and subject.fast
            and body
            and body[0] == 123  # `{`: a single request
            and b"origin" not in raw
        ):
            left = subject.left
            if left:
                subject.left = left - 1
            else:
                refused = self._renew(subject)
                if refused is not None:
                    return refused
            if subject.follow:
                ticket = _new(Ticket)
                ticket.tally = subject.tally
                return ticket
            return None
        return self._admit(subject, cache_as, pool, path_key, raw, body, conn)

    def _admit(
        self, subject: Subject | None, cache_as: Any, pool: Pool, path_key: str | None,
        raw: Mapping[bytes, bytes], body: bytes, conn: Any,
    ) -> Ticket | Answer | None:  # fmt: skip
        """`admit` for everything but a fast subject's single request without an Origin."""
        if subject is None or subject.expires:
            found = self._subject(cache_as, path_key, raw, pool.id)
            if type(found) is not Subject:
                return found  # type: ignore[return-value]
            subject = found
        origin = raw.get(b"origin")
        extra = b""
        if origin is not None:
            text = origin.decode("latin-1")
            if not subject.policy.allows_origin(text):
                why = f"origin {text[:100]} is not allowed"
                return self._refuse(subject, 403, FORBIDDEN, "origin", why, b"")
            extra = b"Access-Control-Allow-Origin: %b\r\nVary: Origin\r\n" % origin
        first = body[:1]
        if first in _WHITESPACE:
            first = body.lstrip(_WHITESPACE)[:1]
        batch = first == b"["
        if not batch and subject.leases:
            left = subject.left
            if left:
                subject.left = left - 1
            else:
                refused = self._renew(subject, extra)
                if refused is not None:
                    return refused
        elif subject.checks:
            refused = self._check(subject, pool, raw, body, batch, conn, extra)
            if refused is not None:
                return refused
        else:  # a batch of a subject with rates alone
            items = batch_items(body)
            if subject.single:
                limited = self._take_rates(subject.rates, subject.items, items)
                if limited is not None:
                    return self._limited(subject, limited, extra)
            tally = subject.tally
            tally.requests += 1
            tally.items += items
        slots = subject.inflight
        if self._held is not None:  # (`_take`'s: a client address's own place too)
            slots, self._held = self._held, None
        if slots or extra:
            held = _new(HeldTicket)
            held.tally = subject.tally
            held.inflight = slots
            held.extra = extra
            held.done = False
            if slots:
                now = monotonic()
                active = self.active_limiters
                for slot in slots:
                    slot.count += 1
                    slot.touched = now
                    if not slot.active:
                        slot.active = True
                        active.inflight.append(slot)
            return held
        if subject.follow:
            ticket = _new(Ticket)
            ticket.tally = subject.tally
            return ticket
        return None

    def upgrade(
        self, pool: Pool, path_key: str | None, raw: Mapping[bytes, bytes], conn: Any
    ) -> Answer | None:
        """A WebSocket upgrade: the credential, the pool's anonymous access and the rules
        that do not depend on a message (chain, origin, client address); None: admitted.
        Its messages are admitted one by one (`admit`), as requests."""
        cache_as: Any = path_key
        if path_key is None:
            auth = raw.get(b"authorization")
            cache_as = pool.id if auth is None else auth
        subject = self._subject(cache_as, path_key, raw, pool.id)
        if type(subject) is not Subject:
            return subject  # type: ignore[return-value]
        policy = subject.policy
        origin = raw.get(b"origin")
        if origin is not None and not policy.allows_origin(origin.decode("latin-1")):
            why = f"origin {origin.decode('latin-1')[:100]} is not allowed"
            return self._refuse(subject, 403, FORBIDDEN, "origin", why, b"")
        if policy.chains is not None and pool.id not in policy.chains:
            why = f"chain {pool.id} is not allowed"
            return self._refuse(subject, 403, FORBIDDEN, "chains", why, b"")
        if policy.networks:
            address = self.address.of(peer_of(conn), raw.get(b"x-forwarded-for"))
            if not policy.allows_address(address):
                why = f"address {address} is not allowed"
                return self._refuse(subject, 403, FORBIDDEN, "ips", why, b"")
        return None

    # ---- leases -------------------------------------------------------------------------

    def _renew(self, subject: Subject, extra: bytes = b"") -> Answer | None:
        """A subject's lease is used up: what it used goes to its tally, and a new one is
        taken from every bucket and quota of the subject, of which this request uses the
        first unit; or the refusal of the first limiter that has no token left."""
        lease = subject.lease
        if lease:
            tally = subject.tally
            tally.requests += lease
            tally.items += lease
            subject.lease = 0
        grant = MAX_LEASE
        buckets = subject.single
        if buckets:
            now = monotonic()
            for bucket in buckets:
                rate = bucket.rate
                tokens = bucket.tokens + (now - bucket.stamp) * rate
                if tokens > bucket.cap:
                    tokens = bucket.cap
                bucket.tokens = tokens
                bucket.stamp = now
                if tokens < 1.0:
                    wait = (1.0 - tokens) / max(rate, MIN_RATE)
                    return self._limited(subject, (bucket.limit, wait), extra)
                most = int(rate * LEASE_SECONDS)
                grant = min(grant, int(tokens), most if most > 1 else 1)
        quotas = subject.quotas
        wall = 0.0
        if quotas:
            wall = time.time()
            for quota in quotas:
                if self.quota_closed:
                    return self._limited(
                        subject, (f"{quota.setting} (shared counts unavailable)", -1.0), extra
                    )
                room = quota.room(wall)
                if room < 1:
                    return self._limited(subject, (quota.setting, quota.reset_after(wall)), extra)
                share = quota.limit // QUOTA_LEASE_SHARE
                grant = min(grant, room, share if share > 1 else 1)
        active = self.active_limiters
        for bucket in buckets:
            bucket.tokens -= grant
            bucket.pending += grant
            if not bucket.active:
                bucket.active = True
                active.buckets.append(bucket)
        for quota in quotas:
            quota.pending += grant
            quota.touched = wall
            if not quota.active:
                quota.active = True
                active.quotas.append(quota)
        subject.lease = grant
        subject.left = grant - 1
        if not subject.leased:
            subject.leased = True
            self._leased.append(subject)
        return None

    def settle(self) -> None:
        """Every lease handed back: what its subject used goes to its tally, the rest back to
        its buckets and quotas. Before a sync, a usage flush or a read of the counts."""
        leased = self._leased
        if leased:
            self._leased = []
            for subject in leased:
                _settle(subject)
                subject.leased = False

    # ---- checks ---------------------------------------------------------------------------

    def _check(
        self, subject: Subject, pool: Pool, raw: Mapping[bytes, bytes], body: bytes,
        batch: bool, conn: Any, extra: bytes,
    ) -> Answer | None:  # fmt: skip
        """Everything but a lease: chains, addresses, items, quotas, in-flight counts."""
        policy = subject.policy
        pool_id = pool.id
        if policy.chains is not None and pool_id not in policy.chains:
            why = f"chain {pool_id} is not allowed"
            return self._refuse(subject, 403, FORBIDDEN, "chains", why, extra)
        address = None
        if policy.networks or subject.per_client is not None:
            address = self.address.of(peer_of(conn), raw.get(b"x-forwarded-for"))
            if policy.networks and not policy.allows_address(address):
                why = f"address {address} is not allowed"
                return self._refuse(subject, 403, FORBIDDEN, "ips", why, extra)
        items = batch_items(body) if batch else 1
        if policy.needs_items:
            refused = self._check_items(policy, pool, body)
            if refused is not None:
                what, message = refused
                return self._refuse(subject, 403, FORBIDDEN, what, message, extra)
        limited = self._take(subject, address, pool_id, items)
        if limited is not None:
            return self._limited(subject, limited, extra)
        tally = subject.tally
        tally.requests += 1
        tally.items += items
        return None

    def _check_items(self, policy: Policy, pool: Pool, body: bytes) -> tuple[str, str] | None:
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None  # the engine answers the parse error
        objs = payload if isinstance(payload, list) else [payload]
        if policy.max_batch and isinstance(payload, list) and len(objs) > policy.max_batch:
            return (
                "max_batch",
                f"batch of {len(objs)} items, more than max_batch={policy.max_batch}",
            )
        head = None
        if policy.max_logs_range:
            heads = [n.head for n in pool.readers if n.head is not None]
            head = max(heads) if heads else None
        for obj in objs:
            why = policy.item_refusal(obj, head)
            if why is not None:
                return ("methods" if why.startswith("method") else "max_logs_range"), why
        return None

    def _take_rates(
        self, rates: list[Bucket], item_buckets: list[Bucket], items: int
    ) -> tuple[str, float] | None:
        """One token of every request bucket and `items` of every item bucket, or none:
        (setting, seconds to wait) of the first that refuses."""
        now = monotonic()
        for bucket in rates:
            wait = bucket.take(1, now)
            if wait:
                self._give_back(rates, item_buckets, bucket, items)
                return bucket.limit, wait
            if not bucket.active:
                bucket.active = True
                self.active_limiters.buckets.append(bucket)
        for bucket in item_buckets:
            wait = bucket.take(items, now)
            if wait:
                self._give_back(rates, item_buckets, bucket, items)
                return bucket.limit, wait
            if not bucket.active:
                bucket.active = True
                self.active_limiters.buckets.append(bucket)
        return None

    @staticmethod
    def _give_back(
        rates: list[Bucket], item_buckets: list[Bucket], refused: Bucket, items: int
    ) -> None:
        """The tokens taken before `refused` said no."""
        for bucket, n in (*((b, 1) for b in rates), *((b, items) for b in item_buckets)):
            if bucket is refused:
                return
            bucket.tokens += n
            bucket.pending -= n

    def _take(
        self, subject: Subject, address: str | None, pool_id: str, items: int
    ) -> tuple[str, float] | None:
        """Takes from every limiter of the request, or none."""
        rates, item_buckets, quotas = subject.rates, subject.items, subject.quotas
        inflight = subject.inflight
        if subject.per_client is not None and address is not None:
            client = self._clients.get((pool_id, address))
            if client is None:
                name = f"anon:{pool_id}:{address}"
                client = Limiters(name, subject.per_client, monotonic(), time.time())
                self._clients[(pool_id, address)] = client
            rates = rates + client.buckets
            item_buckets = item_buckets + client.items
            quotas = quotas + client.quotas
            if client.inflight is not None:
                inflight = [*inflight, client.inflight]
        for slot in inflight:
            if slot.count + slot.others >= slot.limit:
                return slot.setting, 1.0
        if quotas:
            wall = time.time()
            for i, quota in enumerate(quotas):
                if self.quota_closed:
                    return f"{quota.setting} (shared counts unavailable)", -1.0
                if not quota.take(items, wall):
                    for q in quotas[:i]:
                        q.pending -= items
                    return quota.setting, float(quota.reset_after(wall))
                if not quota.active:
                    quota.active = True
                    self.active_limiters.quotas.append(quota)
        limited = self._take_rates(rates, item_buckets, items)
        if limited is not None:
            for quota in quotas:
                quota.pending -= items
        elif inflight is not subject.inflight:
            self._held = inflight  # (the places `_admit` takes)
        return limited

    def _limited(self, subject: Subject, limited: tuple[str, float], extra: bytes) -> Answer:
        setting, wait = limited
        if wait < 0:  # a quota that cannot be checked (quota_fail = "closed")
            return self._refuse(
                subject, 503, LIMIT_EXCEEDED, setting.partition("=")[0],
                f"limit exceeded: {setting} of {subject.name}; retry later",
                extra + b"Retry-After: 1\r\n",
            )  # fmt: skip
        if wait == float("inf"):
            return self._refuse(
                subject, 429, LIMIT_EXCEEDED, setting.partition("=")[0],
                f"limit exceeded: the request is larger than {setting} of {subject.name} "
                "allows at once", extra,
            )  # fmt: skip
        retry = max(1, int(wait + 0.999))
        return self._refuse(
            subject, 429, LIMIT_EXCEEDED, setting.partition("=")[0],
            f"limit exceeded: {setting} of {subject.name}; retry after {retry}s",
            extra + b"Retry-After: %d\r\n" % retry,
        )  # fmt: skip

    @staticmethod
    def _refuse(
        subject: Subject, status: int, code: int, what: str, message: str, extra: bytes
    ) -> Answer:
        subject.tally.refuse(what)
        if code == FORBIDDEN:
            message = f"forbidden: {message} for {subject.name}"
        return _error(status, code, message, extra)

    # ---- CORS preflight ------------------------------------------------------------------

    def preflight(
        self, pool: Pool | None, path_key: str | None, raw: Mapping[bytes, bytes]
    ) -> Answer:
        """`OPTIONS /:chainId[/:key]`: a browser asks whether it may POST. Granted for the
        origins of the path's key, else for `cors_origins`; refused (403, no grant) else."""
        origin = raw.get(b"origin")
        allow = b"Allow: POST, OPTIONS\r\n"
        if origin is None:
            return (200, b"", allow)
        policy = self.cors
        if path_key is not None and pool is not None:
            subject = self._subject(path_key, path_key, raw, pool.id)
            if type(subject) is tuple:
                return subject
            policy = subject.policy  # type: ignore[union-attr]
        text = origin.decode("latin-1")
        if not policy.allows_origin(text):
            return _error(403, FORBIDDEN, f"forbidden: origin {text[:100]} is not allowed")
        wanted = raw.get(b"access-control-request-headers") or b"authorization, content-type"
        return (
            200,
            b"",
            b"Access-Control-Allow-Origin: %b\r\nVary: Origin\r\n"
            b"Access-Control-Allow-Methods: POST, OPTIONS\r\n"
            b"Access-Control-Allow-Headers: %b\r\nAccess-Control-Max-Age: %d\r\n%b"
            % (origin, wanted[:512], self.settings.cors_max_age, allow),
        )


def _settle(subject: Subject) -> None:
    """A subject's lease handed back (`Gate.settle`)."""
    left = subject.left
    used = subject.lease - left
    if used:
        tally = subject.tally
        tally.requests += used
        tally.items += used
    if left:
        for bucket in subject.single:
            tokens = bucket.tokens + left
            bucket.tokens = tokens if tokens < bucket.cap else bucket.cap
            bucket.pending -= left
        for quota in subject.quotas:
            quota.pending -= left
    subject.lease = subject.left = 0


def _cors_rules(origins: tuple[str, ...]) -> Any:
    from proxy.tenancy.model import Rules

    return Rules.from_obj({"origins": list(origins)})

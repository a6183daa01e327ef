"""The response cache's shared tier: answers of settled blocks kept in Redis for the fleet.

The per-process cache (proxy/cache.py) stays in front: a local hit never touches Redis. A
local miss of an answer the fleet may share (its block named by hash by the client, or at or
below the checker's confirmed head: never a `latest` read) is looked up here with a short
timeout (`cache_tier_timeout`); past it, or on any error, the read goes to a node as it
would without the tier. Answers are written behind the request path: `put` appends to a
bounded queue that one writer task sends in pipelined round trips.

A key names the fleet's generation, the pool and the block hash (one Redis hash per block,
its fields the method and params, hashed): a reorg deletes the blocks it dropped, a flush
starts a new generation (`INCR`; one for every pool: flushes are rare, and one number read
at subscription is all a proxy must know), so entries written before it are never read
again and expire (`cache_tier_ttl`). Both are published on one channel, so every proxy drops
or flushes its own cache too; a proxy whose subscription is down does not use the tier (it
could miss a flush), and reads the generation again when it is back (a change it missed
empties its own cache).

A breaker keeps a dead or slow Redis from costing anything per request: after
`cache_tier_failures` consecutive failures the tier is off, and one probe every
`cache_tier_retry` seconds (off the request path) turns it on again. The client: redis-py's
asyncio client (already the tenancy's).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, fields
from typing import Any

import orjson
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger(__name__)
Found = Callable[[bytes | None], None]  # a lookup's continuation: the value, or None

WRITE_BATCH = 256  # entries sent in one pipelined round trip at most
WRITE_TIMEOUT_FACTOR = 20  # a write round trip may take this many lookup timeouts


@dataclass(frozen=True, slots=True)
class TierSettings:
    """The `cache_tier_*` settings of `[proxy]` (docs/proxy.md lists them)."""

    url: str
    prefix: str = "chainstate:cache:"
    timeout: float = 0.1
    ttl: int = 86400
    failures: int = 3
    retry: float = 1.0
    queue: int = 10000
    connections: int = 32


@dataclass(slots=True)
class TierStats:
    """What the tier did since the proxy started (the admin API, /health and /metrics)."""

    lookups: int = 0  # lookups sent to Redis
    hits: int = 0
    misses: int = 0
    errors: int = 0  # lookups or writes that failed or timed out
    skipped: int = 0  # lookups not sent (the tier was off), writes during a flush
    writes: int = 0  # entries written
    dropped_writes: int = 0  # entries not queued: the write queue was full
    breaker_opens: int = 0
    flushes_published: int = 0
    drops_published: int = 0
    flushes_received: int = 0
    drops_received: int = 0

    def to_obj(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class SharedTier:
    """One proxy's connection to the shared tier. `on_flush(pool)` and `on_drop(pool,
    hashes)` empty this proxy's own cache when another proxy announces a flush or a reorg."""

    def __init__(self, settings: TierSettings) -> None:
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self.settings = settings
        self.timeout = settings.timeout
        # No retries inside the client: its default (three, backing off up to seconds) would
        # keep the writer busy long after Redis died; the breaker decides when to try again.
        pool = aioredis.BlockingConnectionPool.from_url(
            settings.url,
            max_connections=settings.connections,
            socket_connect_timeout=max(settings.timeout, 0.5),
            timeout=None,
            retry=Retry(NoBackoff(), 0),
        )
        self.redis: Any = aioredis.Redis(connection_pool=pool)
        self.id = uuid.uuid4().hex[:12]
        self.channel = f"{settings.prefix}events"
        self.stats = TierStats()
        self.on_flush: Callable[[str | None], None] = lambda _pool: None  # None: every pool
        self.on_drop: Callable[[str, list[str]], None] = lambda _pool, _hashes: None
        # Up: the breaker is closed and the subscription is live. Read per lookup and write.
        self.up = False
        self.subscribed = False
        self.failures = 0
        self.last_error = ""
        self.down_since: float | None = time.monotonic()
        self.gen: int | None = None  # the fleet's generation (None: unknown, or changing)
        self._seen_gen = -1  # the highest generation seen
        self._flushing = 0  # this proxy's flushes not yet sent
        self._writes: deque[tuple[str, bytes, bytes]] = deque()
        self._control: deque[tuple[str, str, list[str]]] = deque()  # (kind, pool, hashes)
        self._wake = asyncio.Event()
        self._breaker_closed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._lookups: list[tuple[str, bytes, int, Found]] = []  # this loop turn's lookups
        self._lookup_soon = False
        self._inflight: set[asyncio.Task[None]] = set()

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._breaker_closed = asyncio.Event()
        self._breaker_closed.set()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._write_loop()),
            loop.create_task(self._subscribe_loop()),
        ]

    async def close(self) -> None:
        for task in [*self._tasks, *self._inflight]:
            task.cancel()
        for task in [*self._tasks, *self._inflight]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        self.up = False
        with contextlib.suppress(Exception):
            await self.redis.aclose()

    def queued(self) -> int:
        """Answers waiting to be written."""
        return len(self._writes)

    def state(self) -> str:
        """`up`, `down` (the breaker is open or the subscription is lost) or `starting`."""
        if self.up:
            return "up"
        return "starting" if self.failures == 0 and not self.last_error else "down"

    def health(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state()}
        if self.last_error and not self.up:
            out["error"] = self.last_error
        return out

    # ---- the request path ----------------------------------------------------------------

    def ready(self, pool: str) -> bool:
        """Whether a lookup may be sent now (two attribute reads)."""
        if not self.up or self.gen is None:
            self.stats.skipped += 1
            return False
        return True

    def get(self, pool: str, block_hash: str, field: bytes, done: Found) -> None:
        """Look an answer up: `done(value)` is called with it, or with None (not there, the
        tier is off, or Redis did not answer in time). The lookups of one turn of the event
        loop go in one pipelined round trip (a cold proxy under load misses thousands of
        keys a second: one task and one round trip each cost more than the node's answer)."""
        gen = self.gen
        if gen is None:
            done(None)
            return
        self._lookups.append((self._key(pool, gen, block_hash), field, gen, done))
        if not self._lookup_soon:
            self._lookup_soon = True
            asyncio.get_running_loop().call_soon(self._send_soon)

    def _send_soon(self) -> None:
        self._lookup_soon = False
        batch, self._lookups = self._lookups, []
        if batch:
            task = asyncio.get_running_loop().create_task(self._look_up(batch))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _look_up(self, batch: list[tuple[str, bytes, int, Found]]) -> None:
        stats = self.stats
        stats.lookups += len(batch)
        values: list[Any] = [None] * len(batch)
        try:
            async with asyncio.timeout(self.timeout):
                pipe = self.redis.pipeline(transaction=False)
                for key, field, _, _ in batch:
                    pipe.hget(key, field)
                values = await pipe.execute()
        except Exception as exc:  # a timeout, a lost connection: the nodes answer instead
            self._failed(exc)
        else:
            self.failures = 0
        now = self.gen
        for (_, _, gen, done), value in zip(batch, values, strict=True):
            if value is None or gen != now:  # (flushed while it was asked: not used)
                stats.misses += 1
                value = None
            else:
                stats.hits += 1
            try:
                done(value)
            except Exception:  # one read's bookkeeping must not cost the others theirs
                log.exception("cache tier: a lookup's answer could not be handed over")

    def put(self, pool: str, block_hash: str, field: bytes, value: bytes) -> None:
        """Queue an answer for the shared tier; while the tier is off the queue waits (a
        proxy's first answers are the ones the fleet lacks), and what does not fit in it is
        not written (it is a cache)."""
        gen = self.gen
        if gen is None:
            self.stats.skipped += 1
            return
        if len(self._writes) >= self.settings.queue:
            self.stats.dropped_writes += 1
            return
        self._writes.append((self._key(pool, gen, block_hash), field, value))
        self._wake.set()

    def flush(self, pool: str) -> None:
        """This proxy flushed `pool`: a new generation for the fleet, announced."""
        self.gen = None  # no lookup until the new generation is known
        self._flushing += 1
        self._control.append(("flush", pool, []))
        self._wake.set()

    def drop(self, pool: str, hashes: Iterable[str]) -> None:
        """A reorg dropped these blocks here: delete them and tell the fleet."""
        dropped = list(hashes)
        if dropped:
            self._control.append(("drop", pool, dropped))
            self._wake.set()

    @staticmethod
    def field(method: str, params: bytes) -> bytes:
        """The field of an answer within its block's hash: 16 bytes of BLAKE2b of the method
        and params (params may be up to 128 KiB; a 128-bit digest keeps Redis' memory per
        entry small)."""
        digest = hashlib.blake2b(method.encode(), digest_size=16)
        digest.update(b"\0")
        digest.update(params)
        return digest.digest()

    def _key(self, pool: str, gen: int, block_hash: str) -> str:
        return f"{self.settings.prefix}{gen}:{pool}:{block_hash}"

    # ---- the breaker ---------------------------------------------------------------------

    def _failed(self, exc: BaseException) -> None:
        self.stats.errors += 1
        self.failures += 1
        self.last_error = _why(exc)
        if self.up and self.failures >= self.settings.failures:
            self._open(self.last_error)

    def _open(self, why: str) -> None:
        if self.up:
            log.warning("cache tier: off (%s); answers come from the nodes", why)
        self.up = False
        if self.down_since is None:
            self.down_since = time.monotonic()
        if self._breaker_closed.is_set():
            self.stats.breaker_opens += 1
            self._breaker_closed.clear()

    async def _probe(self) -> None:
        """Wait until Redis answers a PING (one every `cache_tier_retry` seconds)."""
        while True:
            try:
                async with asyncio.timeout(max(self.timeout, 0.5)):
                    await self.redis.ping()
                return
            except Exception as exc:
                self.last_error = _why(exc)
            await asyncio.sleep(self.settings.retry)

    # ---- writes, flushes and drops (one task) --------------------------------------------

    async def _write_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._control or self._writes:
                if not self._breaker_closed.is_set():
                    await self._breaker_closed.wait()
                try:
                    if self._control:
                        await self._send_control(*self._control[0])
                        self._control.popleft()
                    else:
                        await self._send_writes()
                except Exception as exc:
                    self._failed(exc)
                    if self.failures < self.settings.failures:
                        await asyncio.sleep(self.settings.retry / 10)
                    else:
                        self._open(self.last_error)

    async def _send_writes(self) -> None:
        writes = self._writes
        n = min(len(writes), WRITE_BATCH)
        batch = [writes.popleft() for _ in range(n)]
        pipe = self.redis.pipeline(transaction=False)
        ttl = self.settings.ttl
        for key, field, value in batch:
            pipe.hset(key, field, value)
            pipe.expire(key, ttl)
        async with asyncio.timeout(self.timeout * WRITE_TIMEOUT_FACTOR):
            await pipe.execute()
        self.stats.writes += n
        self.failures = 0

    async def _send_control(self, kind: str, pool: str, hashes: list[str]) -> None:
        timeout = self.timeout * WRITE_TIMEOUT_FACTOR
        if kind == "flush":
            async with asyncio.timeout(timeout):
                gen = int(await self.redis.incr(self._gen_key))
                message = {"o": self.id, "p": pool, "g": gen}
                await self.redis.publish(self.channel, orjson.dumps(message))
            self._flushing -= 1
            self._seen_gen = max(self._seen_gen, gen)
            if self._flushing == 0:
                self.gen = self._seen_gen
            self.stats.flushes_published += 1
            return
        gen = self.gen
        async with asyncio.timeout(timeout):
            if gen is not None:
                await self.redis.delete(*(self._key(pool, gen, h) for h in hashes))
            message = {"o": self.id, "p": pool, "d": hashes}
            await self.redis.publish(self.channel, orjson.dumps(message))
        self.stats.drops_published += 1

    @property
    def _gen_key(self) -> str:
        return f"{self.settings.prefix}gen"

    async def _read_gen(self) -> None:
        """The fleet's generation, read when the subscription begins: one that changed
        while this proxy was away (a flush it missed) empties its own cache."""
        async with asyncio.timeout(self.timeout * WRITE_TIMEOUT_FACTOR):
            raw = await self.redis.get(self._gen_key)
        gen = int(raw or 0)
        if self._seen_gen >= 0 and gen != self._seen_gen:
            self.on_flush(None)
            self.stats.flushes_received += 1
        self._seen_gen = max(self._seen_gen, gen)
        if self._flushing == 0:
            self.gen = self._seen_gen

    # ---- the fleet's announcements -------------------------------------------------------

    async def _subscribe_loop(self) -> None:
        """Follow the channel; while it is lost (or the breaker is open) the tier is off."""
        while True:
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                await self._probe()
                async with asyncio.timeout(max(self.timeout, 0.5) * 4):
                    await pubsub.subscribe(self.channel)
                    await self._read_gen()
                self._up()
                while True:
                    message = await pubsub.get_message(timeout=self.settings.retry)
                    if message is not None:
                        self._received(message.get("data"))
                    if not self._breaker_closed.is_set():
                        # lookups or writes failed: on again once Redis answers a PING and
                        # what was announced meanwhile is read
                        await asyncio.sleep(self.settings.retry)
                        await self._probe()
                        while (message := await pubsub.get_message(timeout=0)) is not None:
                            self._received(message.get("data"))
                        self._up()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.last_error = _why(exc)
                self._open(self.last_error)
            finally:
                self.subscribed = False
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
            self._open(self.last_error or "subscription lost")
            await asyncio.sleep(self.settings.retry)

    def _up(self) -> None:
        self.subscribed = True
        self.failures = 0
        if self.down_since is not None and self.last_error:
            log.warning("cache tier: Redis answers again; the tier is on")
        self.down_since = None
        self.up = True
        self._breaker_closed.set()
        self._wake.set()

    def _received(self, data: Any) -> None:
        try:
            message = orjson.loads(data)
            origin, pool = message["o"], str(message["p"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return
        if origin == self.id:
            return
        if "g" in message:
            gen = int(message["g"])
            if gen > self._seen_gen:
                self._seen_gen = gen
                if self._flushing == 0:
                    self.gen = gen
            self.stats.flushes_received += 1
            self.on_flush(pool)
        elif "d" in message:
            hashes = [str(h) for h in message["d"]]
            self.stats.drops_received += 1
            self.on_drop(pool, hashes)


def _why(exc: BaseException) -> str:
    """A failure as /health and the log say it (a timeout has no message of its own)."""
    if isinstance(exc, TimeoutError) and not str(exc):
        return "TimeoutError: Redis did not answer within cache_tier_timeout"
    return f"{type(exc).__name__}: {exc}"[:200]


def shared_tier(settings: Any) -> SharedTier | None:
    """The tier a proxy's `cache_tier_*` settings describe (None: no `cache_tier_url`, or no
    cache at all)."""
    if settings.cache_tier_url is None or settings.cache_max_bytes == 0:
        return None
    return SharedTier(
        TierSettings(
            url=settings.cache_tier_url,
            prefix=settings.cache_tier_prefix,
            timeout=settings.cache_tier_timeout,
            ttl=settings.cache_tier_ttl,
            failures=settings.cache_tier_failures,
            retry=settings.cache_tier_retry,
            queue=settings.cache_tier_queue,
            connections=settings.cache_tier_connections,
        )
    )


def tier_health(tier: SharedTier | None) -> Any:
    """What /health says of the tier: "off" without one."""
    return "off" if tier is None else tier.health()


def tier_metrics(tier: SharedTier | None, pools: dict[str, Any]) -> Iterator[Any]:
    """The `chainstate_proxy_cache_tier_*` families (docs/proxy.md lists them); none without
    a tier. `pools`: the response cache's figures per pool (`CacheStats`)."""
    if tier is None:
        return
    st = tier.stats
    yield GaugeMetricFamily(
        "chainstate_proxy_cache_tier_up",
        "1 while the shared cache tier is used; 0: off (Redis down, slow or unsubscribed)",
        value=1 if tier.up else 0,
    )
    lookups = CounterMetricFamily(
        "chainstate_proxy_cache_tier_lookups",
        "local misses looked up in the shared tier, by outcome",
        labels=["pool", "outcome"],
    )
    for pool_id, cs in list(pools.items()):
        lookups.add_metric([pool_id, "hit"], cs.shared_hits)
        lookups.add_metric([pool_id, "miss"], cs.shared_misses)
    yield lookups
    for name, doc, value in (
        ("errors", "lookups and writes that failed or timed out", st.errors),
        ("skipped", "lookups not sent: the tier was off", st.skipped),
        ("writes", "answers written to the shared tier", st.writes),
        ("write_drops", "answers not written: the write queue was full", st.dropped_writes),
        ("breaker_opens", "times the tier was turned off after failures", st.breaker_opens),
    ):
        yield CounterMetricFamily(f"chainstate_proxy_cache_tier_{name}", doc, value=value)
    yield GaugeMetricFamily(
        "chainstate_proxy_cache_tier_write_queue",
        "answers waiting to be written",
        value=tier.queued(),
    )
    sent = CounterMetricFamily(
        "chainstate_proxy_cache_tier_announcements",
        "flushes and reorg drops announced to the fleet (sent) or from it (received)",
        labels=["kind", "direction"],
    )
    sent.add_metric(["flush", "sent"], st.flushes_published)
    sent.add_metric(["drop", "sent"], st.drops_published)
    sent.add_metric(["flush", "received"], st.flushes_received)
    sent.add_metric(["drop", "received"], st.drops_received)
    yield sent

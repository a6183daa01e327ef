"""The proxy's configuration store on etcd (v3 API, through aetcd).

Every proxy process (worker or host) loads `snapshot()` and then follows `watch()`, so an
admin write on any process reaches all of them. Keys are the relative keys of
`proxy/store.py` under a configurable prefix (default `/chainstate/`); docs/etcd.md shows
the full layout.

Why the extra machinery around aetcd: its watch stream dies with etcd and never resumes, so
`watch` re-creates it from the last delivered revision + 1 (etcd replays what happened in the
gap). When that history is gone (compaction, or an etcd rebuilt from scratch) the watch diffs
a fresh snapshot against the state it has delivered so far and yields the differences as
synthetic events, so a consumer never misses a change. A background probe keeps `available`
true only while etcd answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import aetcd
from aetcd import rpc

from chainstate.config import ConfigError
from proxy.store import StoreEvent, StoreUnavailable

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "/chainstate/"
DEFAULT_PORT = 2379
DEFAULT_TIMEOUT = 2.0  # seconds for one etcd call before etcd counts as unreachable
DEFAULT_PROBE_INTERVAL = 1.0  # seconds between reachability probes
DEFAULT_RETRY_INTERVAL = 0.5  # seconds between attempts to re-create a broken watch

# gRPC channel tuning: reconnect quickly after an etcd restart (gRPC's default backoff grows
# to two minutes), and notice a silently dead connection (no RST) through keepalive pings.
# etcd refuses pings more often than every 5 s (--grpc-keepalive-min-time).
_CHANNEL_OPTIONS: dict[str, Any] = {
    "grpc.initial_reconnect_backoff_ms": 200,
    "grpc.min_reconnect_backoff_ms": 200,
    "grpc.max_reconnect_backoff_ms": 1000,
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
    "grpc.keepalive_permit_without_calls": 1,
    "grpc.http2.max_pings_without_data": 0,
}

_UNREACHABLE_CODES = {
    rpc.StatusCode.UNAVAILABLE,
    rpc.StatusCode.DEADLINE_EXCEEDED,
    rpc.StatusCode.CANCELLED,
    rpc.StatusCode.INTERNAL,
    rpc.StatusCode.UNKNOWN,
}
_UNREACHABLE_ERRORS = (
    aetcd.ConnectionFailedError,
    aetcd.ConnectionTimeoutError,
    aetcd.InternalError,
    aetcd.WatchTimeoutError,
    TimeoutError,
    ConnectionError,
)


class _HistoryGone(Exception):
    """The revision a watch must resume from is no longer (or not yet) in etcd's history."""


def prefix_range_end(prefix: bytes) -> bytes:
    """etcd's `range_end` for "every key starting with prefix": the prefix with its last
    byte below 0xff incremented and the rest cut off (b"\\0" means "to the end")."""
    end = bytearray(prefix)
    while end and end[-1] == 0xFF:
        end.pop()
    if not end:
        return b"\0"
    end[-1] += 1
    return bytes(end)


def normalize_prefix(prefix: str) -> str:
    """A store prefix is absolute-looking and ends with "/" so that `/a/` never matches
    `/ab/...`; an empty prefix would share etcd's whole keyspace and is refused."""
    prefix = prefix.strip()
    if not prefix.strip("/"):
        raise ConfigError("etcd prefix must not be empty (default: /chainstate/)")
    if not prefix.startswith("/"):
        prefix = "/" + prefix
    if not prefix.endswith("/"):
        prefix += "/"
    return prefix


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """`host:port`, `host` or `http://host:port` → (host, port)."""
    text = endpoint.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "etcd") or not parts.hostname:
        raise ConfigError(f"etcd endpoint must look like host:port, got {endpoint!r}")
    if parts.username or parts.password:
        raise ConfigError("etcd endpoint: credentials in the URL are not supported")
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise ConfigError(f"etcd endpoint has an invalid port: {endpoint!r}") from None
    return parts.hostname, port


URL_OPTIONS = ("timeout", "probe_interval", "retry_interval")  # seconds, in the URL query


def parse_etcd_url(url: str) -> tuple[str, str]:
    """`etcd://host:port/some/prefix/` → ("host:port", "/some/prefix/").
    Without a path the prefix is DEFAULT_PREFIX."""
    parts = urlsplit(url.strip())
    if parts.scheme != "etcd":
        raise ConfigError(f"etcd store URL must start with etcd://, got {url!r}")
    host, port = parse_endpoint(f"http://{parts.netloc}")
    prefix = parts.path if parts.path not in ("", "/") else DEFAULT_PREFIX
    return f"{host}:{port}", normalize_prefix(prefix)


def parse_etcd_options(url: str) -> dict[str, float]:
    """Store settings from the URL query: `etcd://h:2379/p/?timeout=1&probe_interval=0.5`."""
    options: dict[str, float] = {}
    for name, raw in parse_qsl(urlsplit(url.strip()).query, keep_blank_values=True):
        if name not in URL_OPTIONS:
            raise ConfigError(
                f"etcd store URL: unknown option {name!r} (known: {', '.join(URL_OPTIONS)})"
            )
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not value > 0 or value == float("inf"):
            raise ConfigError(f"etcd store URL: {name} must be a positive number of seconds")
        options[name] = value
    return options


def _is_unreachable(exc: BaseException) -> bool:
    if isinstance(exc, _UNREACHABLE_ERRORS):
        return True
    return isinstance(exc, rpc.AioRpcError) and exc.code() in _UNREACHABLE_CODES


def describe(exc: BaseException) -> str:
    """One line saying why an etcd call failed (gRPC's own text spans several lines)."""
    if isinstance(exc, rpc.AioRpcError):
        return f"{exc.code().name}: {exc.details() or 'no details'}"
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _diff(old: dict[str, bytes], new: dict[str, bytes], revision: int) -> list[StoreEvent]:
    """Events that turn `old` into `new`, all stamped with `revision`."""
    events = [StoreEvent(k, None, revision) for k in sorted(old.keys() - new.keys())]
    events += [StoreEvent(k, v, revision) for k, v in sorted(new.items()) if old.get(k) != v]
    return events


class EtcdStore:
    """ConfigStore on one etcd endpoint. Lifecycle: `await start()` … `await close()`."""

    def __init__(
        self,
        endpoint: str,
        prefix: str = DEFAULT_PREFIX,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        probe_interval: float = DEFAULT_PROBE_INTERVAL,
        retry_interval: float = DEFAULT_RETRY_INTERVAL,
    ) -> None:
        for name, value in (
            ("timeout", timeout),
            ("probe_interval", probe_interval),
            ("retry_interval", retry_interval),
        ):
            if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
                raise ConfigError(f"etcd store {name} must be a positive number, got {value!r}")
        self._host, self._port = parse_endpoint(endpoint)
        self._prefix = normalize_prefix(prefix)
        self._prefix_bytes = self._prefix.encode()
        self._timeout = timeout
        self._probe_interval = probe_interval
        self._retry_interval = retry_interval
        self._client: aetcd.Client | None = None
        self._probe_task: asyncio.Task[None] | None = None
        self._available = False
        self._ever_available = False  # the first success is not a recovery worth a warning
        self._last_error = "not started"
        self._listeners: list[Callable[[bool], None]] = []

    @classmethod
    def from_url(cls, url: str, **options: Any) -> EtcdStore:
        """Build from `etcd://host:port/prefix/[?timeout=S&probe_interval=S&retry_interval=S]`
        (the `--store` form); keyword options override the URL's."""
        endpoint, prefix = parse_etcd_url(url)
        return cls(endpoint, prefix, **{**parse_etcd_options(url), **options})

    # -- status --------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        return f"{self._host}:{self._port}"

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def available(self) -> bool:
        return self._available

    @property
    def last_error(self) -> str:
        """Why etcd was last found unreachable (for admin responses and logs)."""
        return self._last_error

    def add_listener(self, callback: Callable[[bool], None]) -> None:
        """Call `callback(available)` on every reachability change (metrics, logs)."""
        self._listeners.append(callback)

    def _set_available(self, ok: bool, error: BaseException | None = None) -> None:
        if error is not None:
            self._last_error = describe(error)
        if ok == self._available:
            return
        self._available = ok
        if ok and not self._ever_available:
            self._ever_available = True
            log.info("etcd store connected", extra={"endpoint": self.endpoint})
        elif ok:
            log.warning("etcd store reachable again", extra={"endpoint": self.endpoint})
        else:
            log.warning(
                "etcd store unreachable; serving the last known configuration",
                extra={"endpoint": self.endpoint, "error": self._last_error},
            )
        for callback in self._listeners:
            try:
                callback(ok)
            except Exception:
                log.exception("etcd availability listener failed")

    def _unavailable(self, exc: BaseException) -> StoreUnavailable:
        self._set_available(False, exc)
        return StoreUnavailable(
            f"configuration store (etcd at {self.endpoint}) is unavailable: {self._last_error}"
        )

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Connect and probe once. Never waits for etcd: if it is down, `available` stays
        False and the background probe keeps trying."""
        if self._client is not None:
            return
        self._client = aetcd.Client(
            self._host, self._port, timeout=self._timeout, options=dict(_CHANNEL_OPTIONS)
        )
        await self._client.connect()
        await self._probe()
        self._probe_task = asyncio.create_task(self._probe_loop(), name="etcd-probe")

    async def close(self) -> None:
        if self._probe_task is not None:
            self._probe_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe_task
            self._probe_task = None
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
        self._available = False
        self._last_error = "closed"

    async def _probe(self) -> None:
        try:
            await self._require_client().get(self._prefix_bytes)
        except Exception as exc:
            if not _is_unreachable(exc):
                log.warning("etcd probe failed", extra={"error": repr(exc)})
            self._set_available(False, exc)
        else:
            self._set_available(True)

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(self._probe_interval)
            await self._probe()

    def _require_client(self) -> aetcd.Client:
        if self._client is None:
            raise StoreUnavailable("etcd store is not started")
        return self._client

    # -- key helpers ---------------------------------------------------------------------

    def _full_key(self, key: str) -> bytes:
        if not isinstance(key, str) or not key:
            raise ValueError("store key must be a non-empty string")
        return self._prefix_bytes + key.encode()

    def _relative(self, full_key: bytes) -> str:
        return full_key[len(self._prefix_bytes) :].decode(errors="surrogateescape")

    # -- reads ---------------------------------------------------------------------------

    async def _range(self, prefix: str, revision: int = 0) -> tuple[dict[str, bytes], int]:
        """Keys under prefix at `revision` (0: now) and the store revision of the answer."""
        client = self._require_client()
        start = self._prefix_bytes + prefix.encode()
        request = rpc.RangeRequest(key=start, range_end=prefix_range_end(start))
        if revision:
            request.revision = revision
        try:
            response = await client.kvstub.Range(request, timeout=self._timeout)
        except rpc.AioRpcError as exc:
            details = exc.details() or ""
            if exc.code() == rpc.StatusCode.OUT_OF_RANGE:
                raise _HistoryGone(details) from exc
            if _is_unreachable(exc):
                raise self._unavailable(exc) from exc
            raise
        except _UNREACHABLE_ERRORS as exc:
            raise self._unavailable(exc) from exc
        self._set_available(True)
        values = {self._relative(kv.key): bytes(kv.value) for kv in response.kvs}
        return values, response.header.revision

    async def snapshot(self, prefix: str = "") -> tuple[dict[str, bytes], int]:
        """All keys under `prefix` (relative to the store prefix) and their revision."""
        return await self._range(prefix)

    # -- writes --------------------------------------------------------------------------

    async def _write(self, op: Callable[[aetcd.Client], Any]) -> Any:
        client = self._require_client()
        try:
            result = await op(client)
        except Exception as exc:
            if _is_unreachable(exc):
                raise self._unavailable(exc) from exc
            if isinstance(exc, aetcd.InvalidArgumentError):
                raise ValueError(f"etcd refused the write: {exc}") from exc
            raise
        self._set_available(True)
        return result

    async def put(self, key: str, value: bytes) -> int:
        full = self._full_key(key)
        if not isinstance(value, bytes | bytearray):
            raise TypeError("store values are bytes")
        result = await self._write(lambda c: c.put(full, bytes(value)))
        return result.header.revision

    async def delete(self, key: str) -> int:
        full = self._full_key(key)
        # delete_range (not delete): aetcd's delete drops the response header on a miss.
        return await self._delete_range(full, full + b"\0")

    async def delete_prefix(self, prefix: str) -> int:
        start = self._prefix_bytes + prefix.encode()
        return await self._delete_range(start, prefix_range_end(start))

    async def replace(self, key: str, expected: bytes | None, value: bytes | None) -> int | None:
        """Compare-and-set: make `key` hold `value` (None: delete it) only if it now holds
        `expected` (None: absent), atomically in etcd. Returns the new revision, or None when
        the key no longer matches (another process changed it: re-read and retry).
        For admin read-modify-write changes made on several proxies at once."""
        full = self._full_key(key)
        if value is not None and not isinstance(value, bytes | bytearray):
            raise TypeError("store values are bytes")

        async def txn(c: aetcd.Client) -> Any:
            t = c.transactions
            compare = [t.version(full) == 0] if expected is None else [t.value(full) == expected]
            op = t.delete(full) if value is None else t.put(full, bytes(value))
            return await c.transaction(compare=compare, success=[op], failure=[])

        succeeded, responses = await self._write(txn)
        if not succeeded:
            return None
        if value is not None:
            return responses[0].response_put.header.revision
        deleted = responses[0].response_delete_range
        if deleted.deleted:
            return deleted.header.revision
        return await self._prefix_revision()  # deleting an absent key changes nothing

    async def _delete_range(self, start: bytes, end: bytes) -> int:
        result = await self._write(lambda c: c.delete_range(start, end))
        if result.deleted:
            return result.header.revision
        # Nothing changed. etcd's own revision may be ahead of every change under our prefix
        # (other prefixes share it), and a caller waiting for its watch to reach that
        # revision would wait in vain; the newest revision under the prefix is always seen.
        return await self._prefix_revision()

    async def _prefix_revision(self) -> int:
        """The mod revision of the newest key under the store prefix (0: none)."""
        request = rpc.RangeRequest(
            key=self._prefix_bytes,
            range_end=prefix_range_end(self._prefix_bytes),
            limit=1,
            keys_only=True,
            sort_order=rpc.RangeRequest.DESCEND,
            sort_target=rpc.RangeRequest.MOD,
        )
        try:
            response = await self._require_client().kvstub.Range(request, timeout=self._timeout)
        except rpc.AioRpcError as exc:
            if _is_unreachable(exc):
                raise self._unavailable(exc) from exc
            raise
        return response.kvs[0].mod_revision if response.kvs else 0

    # -- watch ---------------------------------------------------------------------------

    async def _baseline(
        self, prefix: str, start_revision: int
    ) -> tuple[dict[str, bytes], int, list[StoreEvent]]:
        """What the consumer knew just before `start_revision`, so later resyncs can diff.
        If that history is gone, replay the current state as synthetic puts."""
        if start_revision <= 1:
            return {}, max(start_revision, 1), []
        try:
            known, _ = await self._range(prefix, start_revision - 1)
            return known, start_revision, []
        except _HistoryGone as exc:
            current, revision = await self._range(prefix)
            log.warning(
                "etcd watch cannot replay from its start revision; replaying current state",
                extra={"start_revision": start_revision, "revision": revision, "why": str(exc)},
            )
            events = [StoreEvent(k, v, revision) for k, v in sorted(current.items())]
            return current, revision + 1, events

    async def _events(
        self, client: aetcd.Client, key: bytes, end: bytes, start_revision: int
    ) -> AsyncIterator[Any]:
        """Raw etcd events from one gRPC watch stream of our own.

        aetcd's shared watcher is not used: after a broken stream it can keep stale state
        (a finished stream task, a full request queue) and hang later watches. One stream per
        attempt, cancelled when done, has no such state. A stream that ends, is cancelled by
        etcd or does not confirm creation within `timeout` raises, so the caller re-watches.
        """
        create = rpc.WatchCreateRequest(key=key, range_end=end, start_revision=start_revision)

        async def requests() -> AsyncIterator[Any]:
            yield rpc.WatchRequest(create_request=create)
            await asyncio.Event().wait()  # keep our side open; ends with call.cancel()

        call = rpc.WatchStub(client.channel).Watch(requests(), metadata=client.metadata)
        try:
            responses = call.__aiter__()
            async with asyncio.timeout(self._timeout):
                response = await anext(responses)
            while True:
                if response.compact_revision:
                    raise aetcd.RevisionCompactedError(response.compact_revision)
                if response.canceled:
                    raise ConnectionError(f"etcd cancelled the watch: {response.cancel_reason}")
                for event in response.events:
                    yield event
                response = await anext(responses)
        except StopAsyncIteration:
            raise ConnectionError("etcd watch stream ended") from None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # our consumer is being cancelled
            # gRPC cancelled the call itself (its channel was closed).
            raise ConnectionError("etcd watch call cancelled") from None
        finally:
            call.cancel()

    async def watch(self, prefix: str, start_revision: int) -> AsyncIterator[StoreEvent]:
        """Every change under `prefix` from `start_revision` on, across etcd outages.

        After a broken stream the watch resumes at the last delivered revision + 1; if etcd
        lost that history (compaction, or a rebuilt cluster with lower revisions) it yields
        the difference between what it delivered and a fresh snapshot instead.
        """
        client = self._require_client()
        full = self._prefix_bytes + prefix.encode()
        end = prefix_range_end(full)
        known: dict[str, bytes] | None = None
        next_rev = start_revision
        check = False  # after a broken stream: verify etcd still holds our history
        resync = False  # history compacted: diff against a fresh snapshot
        while True:
            try:
                pending: list[StoreEvent] = []
                if known is None:
                    known, next_rev, pending = await self._baseline(prefix, next_rev)
                elif check or resync:
                    current, revision = await self._range(prefix)
                    log.debug("etcd watch resumes at %d; etcd is at %d", next_rev, revision)
                    if resync or revision < next_rev - 1:
                        pending = _diff(known, current, revision)
                        known, next_rev = current, revision + 1
                check = resync = False
                for event in pending:
                    yield event
                log.debug("etcd watch of %r (re)created from revision %d", prefix, next_rev)
                async for raw in self._events(client, full, end, next_rev):
                    key = self._relative(raw.kv.key)
                    revision = raw.kv.mod_revision
                    if raw.type == rpc.Event.PUT:
                        value: bytes | None = bytes(raw.kv.value)
                        known[key] = value
                    else:
                        value = None
                        known.pop(key, None)
                    next_rev = revision + 1
                    yield StoreEvent(key, value, revision)
            except aetcd.RevisionCompactedError as exc:
                log.warning("etcd history compacted; resyncing", extra={"why": str(exc)})
                resync = True
            except _HistoryGone:
                resync = True
            except (StoreUnavailable, *_UNREACHABLE_ERRORS, rpc.AioRpcError) as exc:
                if self._client is not client:
                    return  # the store was closed
                if not isinstance(exc, StoreUnavailable):
                    self._set_available(False, exc)
                log.debug("etcd watch of %r broken: %r", prefix, exc)
                check = True
                await asyncio.sleep(self._retry_interval)

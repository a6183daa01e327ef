"""The load generator: JSON-RPC over persistent HTTP/1.1 connections on raw asyncio (uvloop).

It must not be the bottleneck, so each connection is a bare `asyncio.Protocol` that writes
pre-built request bytes and parses only the status line, the framing headers and the JSON
body it needs to count results and errors. One request is in flight per connection (no
pipelining), like a real client pool. Latency is measured with `time.perf_counter_ns` from
just before the write to the moment the last byte of the response is parsed, into a
mergeable histogram; several worker processes (`processes`) each run their share of the
connections and their histograms and counters are merged at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import ssl
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

import orjson

from bench.bodies import BodyPlan
from bench.histogram import Histogram

DEFAULT_CONCURRENCY = 64  # connections, summed over all processes
DEFAULT_DURATION = 10.0  # seconds measured (after warm-up)
DEFAULT_WARMUP = 1.0  # seconds of traffic before measuring starts
DEFAULT_TIMEOUT = 10.0  # seconds a request may take before it counts as a timeout
RECONNECT_DELAY = 0.05  # seconds to wait after a failed connect before trying again
WATCHDOG_INTERVAL = 0.1  # seconds between timeout checks
WORKER_START_TIMEOUT = 60.0  # seconds for worker processes to connect and report ready
MAX_RESPONSE_BYTES = 256 * 1024 * 1024  # a response larger than this is a protocol error


class ResponseError(Exception):
    """The server's bytes are not a valid HTTP/1.1 response."""


@dataclass(frozen=True)
class Target:
    """Where the requests go, parsed once from the URL."""

    host: str
    port: int
    path: str
    tls: bool

    @classmethod
    def parse(cls, url: str) -> Target:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http:// or https:// URL, got {url!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        return cls(parts.hostname, port, path, tls)

    @property
    def host_header(self) -> str:
        return self.host if self.port in (80, 443) else f"{self.host}:{self.port}"


def encode_request(target: Target, body: bytes, headers: list[tuple[str, str]]) -> bytes:
    """The full HTTP/1.1 request bytes for one body."""
    head = [
        f"POST {target.path} HTTP/1.1",
        f"Host: {target.host_header}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
    ]
    head += [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def parse_response(buf: bytearray) -> tuple[int, int, bytes, bool] | None:
    """(consumed bytes, status, body, keep_alive) for the first complete response in `buf`,
    or None when more bytes are needed. Supports Content-Length and chunked bodies."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > 64 * 1024:
            raise ResponseError("response head larger than 64 KiB")
        return None
    fast = _parse_common(buf, end)
    if fast is not None:
        return fast
    head = bytes(buf[:end]).lower()
    line_end = head.find(b"\r\n")
    status_line = head if line_end < 0 else head[:line_end]
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"http/1.") or not parts[1].isdigit():
        raise ResponseError(f"bad status line {status_line[:60]!r}")
    status = int(parts[1])
    headers = b"\r\n" + head[line_end + 2 :] if line_end >= 0 else b""
    keep_alive = b"\r\nconnection: close" not in headers and parts[0] != b"http/1.0"
    start = end + 4
    if b"\r\ntransfer-encoding: chunked" in headers:
        return _parse_chunked(buf, start, status, keep_alive)
    at = headers.find(b"\r\ncontent-length:")
    if at >= 0:
        stop = headers.find(b"\r\n", at + 2)
        raw = headers[at + 17 : stop if stop >= 0 else None].strip()
        if not raw.isdigit():
            raise ResponseError("bad Content-Length")
        length = int(raw)
    elif status in (204, 304) or 100 <= status < 200:
        length = 0
    else:
        raise ResponseError("response without Content-Length or chunked framing")
    if length > MAX_RESPONSE_BYTES:
        raise ResponseError("response too large")
    if len(buf) < start + length:
        return None
    return start + length, status, bytes(buf[start : start + length]), keep_alive


def _parse_common(buf: bytearray, end: int) -> tuple[int, int, bytes, bool] | None:
    """Fast path for the usual keep-alive answer (`HTTP/1.1 NNN`, `Content-Length:`, no
    Connection or Transfer-Encoding header); None sends the head to the general parser."""
    head = bytes(buf[: end + 2])
    if not head.startswith(b"HTTP/1.1 ") or b"onnection:" in head or b"ransfer-" in head:
        return None
    at = head.find(b"\r\nContent-Length:")
    if at < 0:
        return None
    digits = head[at + 17 : head.find(b"\r\n", at + 2)].strip()
    code = head[9:12]
    if not digits.isdigit() or not code.isdigit():
        return None
    length = int(digits)
    if length > MAX_RESPONSE_BYTES:
        raise ResponseError("response too large")
    start = end + 4
    if len(buf) < start + length:
        return None
    return start + length, int(code), bytes(buf[start : start + length]), True


def _parse_chunked(
    buf: bytearray, pos: int, status: int, keep_alive: bool
) -> tuple[int, int, bytes, bool] | None:
    body = bytearray()
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size_s = bytes(buf[pos:eol]).split(b";", 1)[0].strip()
        try:
            size = int(size_s, 16)
        except ValueError:
            raise ResponseError("bad chunk size") from None
        pos = eol + 2
        if size == 0:
            trailer_end = buf.find(b"\r\n", pos)
            while trailer_end > pos:  # skip trailer lines until the empty line
                pos = trailer_end + 2
                trailer_end = buf.find(b"\r\n", pos)
            if trailer_end < 0:
                return None
            return trailer_end + 2, status, bytes(body), keep_alive
        if len(buf) < pos + size + 2:
            return None
        body += buf[pos : pos + size]
        pos += size + 2


class ClientConnection(asyncio.Protocol):
    """One keep-alive connection with at most one request in flight.

    Callback driven: when a response is complete it tells its LoadRun, which records it and
    writes the next request from inside the same callback (no future or task switch per
    request, which is what makes the generator cheap)."""

    def __init__(self, run: LoadRun, slot: int) -> None:
        self.run = run
        self.slot = slot
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.in_flight = False
        self.sent_at = 0
        self.stats: Stats | None = None  # the window the request in flight belongs to
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.transport = None
        self.fail(exc or ConnectionResetError("server closed the connection"))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.in_flight:
            return
        try:
            parsed = parse_response(self.buf)
        except ResponseError as exc:
            self.fail(exc)
            return
        if parsed is None:
            return
        done_at = time.perf_counter_ns()
        consumed, status, body, keep_alive = parsed
        del self.buf[:consumed]
        self.in_flight = False
        self.run.on_response(self, status, body, keep_alive, done_at)

    def send(self, data: bytes, stats: Stats) -> None:
        assert self.transport is not None
        self.in_flight = True
        self.stats = stats
        self.sent_at = time.perf_counter_ns()
        self.transport.write(data)

    def fail(self, exc: BaseException) -> None:
        """The request in flight failed (connection lost, timeout, bad HTTP)."""
        if self.in_flight:
            self.in_flight = False
            self.close()
            self.run.on_failure(self, exc)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def connection_error_kind(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, ConnectionRefusedError):
        return "conn:refused"
    if isinstance(exc, ConnectionResetError | BrokenPipeError):
        return "conn:reset"
    if isinstance(exc, ResponseError):
        return "bad:http"
    return f"conn:{type(exc).__name__}"


@dataclass
class Stats:
    """Counters of one measuring window (one process); merged across processes."""

    requests: int = 0  # HTTP exchanges that got a complete response
    requests_ok: int = 0  # status 2xx and every item answered with a result
    items_ok: int = 0  # JSON-RPC items answered with a result
    items_err: int = 0  # JSON-RPC items answered with an error (or missing)
    errors: Counter[str] = field(default_factory=Counter)
    hist: Histogram = field(default_factory=Histogram)

    def count_response(self, status: int, body: bytes, expected_items: int) -> None:
        """Classify one response: HTTP status, then every JSON-RPC item in the body."""
        self.requests += 1
        if not 200 <= status < 300:
            self.errors[f"http:{status}"] += 1
            return
        if not body:  # notifications only: nothing to count
            self.requests_ok += 1
            return
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            self.errors["bad:json"] += 1
            self.items_err += expected_items
            return
        items = doc if isinstance(doc, list) else [doc]
        bad = 0
        for item in items:
            if isinstance(item, dict) and "result" in item:
                continue
            bad += 1
            err = item.get("error") if isinstance(item, dict) else None
            code = err.get("code") if isinstance(err, dict) else None
            self.errors[f"rpc:{code}" if isinstance(code, int) else "bad:item"] += 1
        missing = expected_items - len(items)
        if missing > 0:
            self.errors["bad:missing-items"] += missing
            bad += missing
        self.items_ok += len(items) - (bad - max(missing, 0))
        self.items_err += bad
        if bad == 0:
            self.requests_ok += 1

    def merge(self, other: Stats) -> None:
        self.requests += other.requests
        self.requests_ok += other.requests_ok
        self.items_ok += other.items_ok
        self.items_err += other.items_err
        self.errors.update(other.errors)
        self.hist.merge(other.hist)

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "requests_ok": self.requests_ok,
            "items_ok": self.items_ok,
            "items_err": self.items_err,
            "errors": dict(self.errors),
            "hist": self.hist.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Stats:
        return cls(
            requests=data["requests"],
            requests_ok=data["requests_ok"],
            items_ok=data["items_ok"],
            items_err=data["items_err"],
            errors=Counter(data["errors"]),
            hist=Histogram.from_dict(data["hist"]),
        )


@dataclass
class LoadSettings:
    """One load run. `duration` or `requests` bounds the measured part (requests wins)."""

    url: str
    concurrency: int = DEFAULT_CONCURRENCY
    duration: float = DEFAULT_DURATION
    requests: int | None = None
    warmup: float = DEFAULT_WARMUP
    timeout: float = DEFAULT_TIMEOUT
    processes: int = 1
    headers: list[tuple[str, str]] = field(default_factory=list)
    cpus: list[int] | None = None  # pin the generator's processes to these CPUs
    seed: int = 0

    def __post_init__(self) -> None:
        Target.parse(self.url)
        if self.concurrency < 1 or self.processes < 1:
            raise ValueError("concurrency and processes must be >= 1")
        if self.processes > self.concurrency:
            raise ValueError("processes must not exceed concurrency (connections)")
        if self.duration <= 0 and self.requests is None:
            raise ValueError("duration must be > 0 (or give a request count)")
        if self.requests is not None and self.requests < 1:
            raise ValueError("requests must be >= 1")
        if self.warmup < 0 or self.timeout <= 0:
            raise ValueError("warmup must be >= 0 and timeout > 0")

    def share(self, index: int) -> tuple[int, int | None]:
        """(connections, requests) of worker process `index`."""
        conns = self.concurrency // self.processes
        conns += index < self.concurrency % self.processes
        reqs = None
        if self.requests is not None:
            reqs = self.requests // self.processes + (index < self.requests % self.processes)
        return conns, reqs


def _counted(stats: Stats) -> dict[str, Any]:
    """The fields of a `BenchResult` that come from its counters."""
    return {
        "requests": stats.requests,
        "requests_ok": stats.requests_ok,
        "items_ok": stats.items_ok,
        "items_err": stats.items_err,
        "errors": dict(sorted(stats.errors.items())),
        "latency_ns": _latency(stats.hist),
        "stats": stats,
    }


def _latency(h: Histogram) -> dict[str, float]:
    """The latency figures a result reports, from its histogram (ns)."""
    return {
        "p50": h.percentile(50),
        "p90": h.percentile(90),
        "p99": h.percentile(99),
        "max": h.max,
        "min": h.min or 0,
        "mean": round(h.mean, 1),
    }


@dataclass
class BenchResult:
    """What a run measured; `latency_ns` has p50/p90/p99/max/min/mean."""

    url: str
    tool: str
    concurrency: int
    processes: int
    items_per_request: int
    elapsed_s: float
    requests: int
    requests_ok: int
    items_ok: int
    items_err: int
    errors: dict[str, int]
    latency_ns: dict[str, float]
    stats: Stats | None = field(default=None, repr=False, compare=False)  # (to merge runs)

    @classmethod
    def from_stats(
        cls, settings: LoadSettings, items: int, stats: Stats, elapsed: float
    ) -> BenchResult:
        return cls(
            url=settings.url,
            tool="chainstate-bench",
            concurrency=settings.concurrency,
            processes=settings.processes,
            items_per_request=items,
            elapsed_s=elapsed,
            **_counted(stats),
        )

    @classmethod
    def combined(cls, runs: list[BenchResult]) -> BenchResult:
        """Several runs of one load on one target (a suite's rounds) as one: the counters and
        latency histograms merged, the measured times added."""
        total = Stats()
        for run in runs:
            if run.stats is None:
                raise ValueError("a run without its counters cannot be merged")
            total.merge(run.stats)
        return replace(runs[0], elapsed_s=sum(run.elapsed_s for run in runs), **_counted(total))

    @property
    def req_per_s(self) -> float:
        return self.requests / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def items_per_s(self) -> float:
        return self.items_ok / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "tool": self.tool,
            "concurrency": self.concurrency,
            "processes": self.processes,
            "items_per_request": self.items_per_request,
            "elapsed_s": round(self.elapsed_s, 4),
            "requests": self.requests,
            "requests_ok": self.requests_ok,
            "items_ok": self.items_ok,
            "items_err": self.items_err,
            "req_per_s": round(self.req_per_s, 1),
            "items_per_s": round(self.items_per_s, 1),
            "errors": self.errors,
            "latency_ms": {k: round(v / 1e6, 3) for k, v in self.latency_ns.items()},
        }

    def render(self) -> str:
        """Human-readable summary."""
        lat = {k: v / 1e6 for k, v in self.latency_ns.items()}
        lines = [
            f"target      {self.url}  ({self.tool}, {self.concurrency} connections, "
            f"{self.processes} process(es), {self.items_per_request} item(s)/request)",
            f"measured    {self.elapsed_s:.2f} s: {self.requests} requests "
            f"({self.requests_ok} fully ok), {self.items_ok} items ok, "
            f"{self.items_err} items failed",
            f"throughput  {self.req_per_s:,.0f} req/s   {self.items_per_s:,.0f} items/s",
            f"latency ms  p50 {lat['p50']:.3f}   p90 {lat['p90']:.3f}   p99 {lat['p99']:.3f}   "
            f"max {lat['max']:.3f}   (mean {lat['mean']:.3f})",
        ]
        if self.errors:
            kinds = ", ".join(f"{k}={v}" for k, v in self.errors.items())
            lines.append(f"errors      {self.error_count}: {kinds}")
        else:
            lines.append("errors      none")
        return "\n".join(lines)


class LoadRun:
    """One process's share of a run: `connections` slots, each a connection that sends the
    next pre-built request as soon as the previous answer is in."""

    def __init__(
        self,
        settings: LoadSettings,
        plan: BodyPlan,
        connections: int,
        requests: int | None,
        seed: int,
    ) -> None:
        self.settings = settings
        self.target = Target.parse(settings.url)
        self.ssl = ssl.create_default_context() if self.target.tls else None
        self.items = plan.items_per_body
        self.payloads = [encode_request(self.target, b, settings.headers) for b in plan.build(seed)]
        self.n_connections = connections
        self.remaining = requests
        self.stats = Stats()
        self.measuring = False
        self.stopping = False
        self.end_ns = 0
        self.conns: list[ClientConnection | None] = [None] * connections
        self.cursor = 0
        self.active = 0
        self.done: asyncio.Future[None] | None = None
        self.opening: set[asyncio.Task[None]] = set()

    async def _connect(self, slot: int) -> ClientConnection:
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(
            lambda: ClientConnection(self, slot), self.target.host, self.target.port, ssl=self.ssl
        )
        self.conns[slot] = proto
        return proto

    async def connect_all(self) -> None:
        """Open every connection before the clock starts (failures are retried in the run)."""
        await asyncio.gather(
            *(self._connect(i) for i in range(self.n_connections)), return_exceptions=True
        )

    def _take(self) -> bool:
        """May one more request be sent? Uses one unit of a request budget."""
        if self.stopping:
            return False
        if self.remaining is None:
            return time.perf_counter_ns() < self.end_ns
        if not self.measuring:
            return True  # warm-up traffic does not use the budget
        if self.remaining <= 0:
            return False
        self.remaining -= 1
        return True

    def _next(self, conn: ClientConnection) -> None:
        """Send the next request on `conn`, or retire its slot."""
        if conn.closed:
            self._reopen(conn.slot)
        elif self._take():
            self._send(conn)
        else:
            conn.close()
            self._slot_done()

    def _send(self, conn: ClientConnection) -> None:
        self.cursor += 1
        if self.cursor >= len(self.payloads):
            self.cursor = 0
        conn.send(self.payloads[self.cursor], self.stats)

    def on_response(
        self, conn: ClientConnection, status: int, body: bytes, keep_alive: bool, done_at: int
    ) -> None:
        stats = conn.stats or self.stats
        stats.hist.record(done_at - conn.sent_at)
        stats.count_response(status, body, self.items)
        if not keep_alive:
            conn.close()
        self._next(conn)

    def on_failure(self, conn: ClientConnection, exc: BaseException) -> None:
        (conn.stats or self.stats).errors[connection_error_kind(exc)] += 1
        if not self.stopping:
            self._reopen(conn.slot)

    def _reopen(self, slot: int) -> None:
        self.conns[slot] = None
        task = asyncio.ensure_future(self._open(slot))
        self.opening.add(task)
        task.add_done_callback(self.opening.discard)

    async def _open(self, slot: int) -> None:
        """(Re)connect slot `slot` and send its first request; each attempt uses a request."""
        while self._take():
            try:
                conn = await self._connect(slot)
            except OSError as exc:
                self.stats.errors[connection_error_kind(exc)] += 1
                await asyncio.sleep(RECONNECT_DELAY)
                continue
            self._send(conn)
            return
        self._slot_done()

    def _slot_done(self) -> None:
        self.active -= 1
        if self.active == 0 and self.done is not None and not self.done.done():
            self.done.set_result(None)

    async def _watchdog(self) -> None:
        """Fail requests in flight longer than the timeout (cheaper than a timer each)."""
        limit = int(self.settings.timeout * 1e9)
        while True:
            await asyncio.sleep(WATCHDOG_INTERVAL)
            now = time.perf_counter_ns()
            for conn in list(self.conns):
                if conn is not None and conn.in_flight and now - conn.sent_at > limit:
                    conn.fail(TimeoutError("request timed out"))

    async def run(self) -> tuple[Stats, float]:
        """Warm up, measure, and return (stats, measured seconds)."""
        s = self.settings
        loop = asyncio.get_running_loop()
        start = time.perf_counter_ns()
        warm_ns = int(s.warmup * 1e9)
        self.end_ns = start + warm_ns + int(s.duration * 1e9)
        self.done = loop.create_future()
        self.active = self.n_connections
        watchdog = asyncio.ensure_future(self._watchdog())
        measure_start = start
        try:
            self.measuring = not warm_ns
            for slot, conn in enumerate(self.conns):
                if conn is None or conn.closed:
                    self._reopen(slot)
                else:
                    self._next(conn)
            if warm_ns:
                await asyncio.sleep(s.warmup)
                self.stats = Stats()
                self.measuring = True
                measure_start = time.perf_counter_ns()
            await self.done
            elapsed = (time.perf_counter_ns() - measure_start) / 1e9
        finally:
            self.stopping = True
            watchdog.cancel()
            for task in list(self.opening):
                task.cancel()
            await asyncio.gather(watchdog, *self.opening, return_exceptions=True)
            for conn in self.conns:
                if conn is not None:
                    conn.close()
        return self.stats, elapsed


async def run_load(
    settings: LoadSettings, plan: BodyPlan, ready: Callable[[], None] | None = None
) -> BenchResult:
    """Run the whole load in this event loop (one process). `ready` is called once the
    connections are open, just before the clock starts."""
    if settings.processes != 1:
        raise ValueError("run_load runs one process; use run_bench for several")
    run = LoadRun(settings, plan, settings.concurrency, settings.requests, settings.seed)
    await run.connect_all()
    if ready is not None:
        ready()
    stats, elapsed = await run.run()
    return BenchResult.from_stats(settings, plan.items_per_body, stats, elapsed)


def _pin(cpus: list[int] | None) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)


def _worker_main(
    settings: LoadSettings, plan: BodyPlan, index: int, barrier: Any, pipe: Any
) -> None:
    """Entry of a worker process: connect, wait for everyone, run, send stats back."""
    import uvloop

    _pin(settings.cpus)
    conns, reqs = settings.share(index)

    async def main() -> tuple[Stats, float]:
        run = LoadRun(settings, plan, conns, reqs, settings.seed + index)
        await run.connect_all()
        barrier.wait(WORKER_START_TIMEOUT)
        return await run.run()

    try:
        stats, elapsed = uvloop.run(main())
        pipe.send({"stats": stats.to_dict(), "elapsed": elapsed})
    except BaseException as exc:
        pipe.send({"error": f"{type(exc).__name__}: {exc}"})
        raise
    finally:
        pipe.close()


def run_bench(settings: LoadSettings, plan: BodyPlan) -> BenchResult:
    """Run a load (blocking), in this process or in `settings.processes` worker processes."""
    import uvloop

    if settings.processes == 1:
        previous = os.sched_getaffinity(0)
        _pin(settings.cpus)
        try:
            return uvloop.run(run_load(settings, plan))
        finally:
            if settings.cpus:
                os.sched_setaffinity(0, previous)
    return _run_processes(settings, plan)


def _run_processes(settings: LoadSettings, plan: BodyPlan) -> BenchResult:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(settings.processes)
    pipes, procs = [], []
    try:
        for i in range(settings.processes):
            mine, theirs = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_worker_main, args=(settings, plan, i, barrier, theirs), daemon=True
            )
            proc.start()
            theirs.close()
            pipes.append(mine)
            procs.append(proc)
        total = Stats()
        elapsed = 0.0
        budget: float | None = None  # a request count has no time bound
        if settings.requests is None:
            budget = WORKER_START_TIMEOUT + settings.warmup + settings.duration + settings.timeout
        for pipe in pipes:
            if not pipe.poll(budget):
                raise RuntimeError("a load worker did not report in time")
            try:
                msg = pipe.recv()
            except EOFError:
                raise RuntimeError("a load worker exited without reporting") from None
            if "error" in msg:
                raise RuntimeError(f"load worker failed: {msg['error']}")
            total.merge(Stats.from_dict(msg["stats"]))
            elapsed = max(elapsed, msg["elapsed"])
        return BenchResult.from_stats(settings, plan.items_per_body, total, elapsed)
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for pipe in pipes:
            with contextlib.suppress(OSError):
                pipe.close()

"""`chainstate bench ws-heads`: newHeads fan-out of one proxy process to many WebSocket
subscribers.

One run: a fake state node (bench/fakenode.py, a new block every `block_time` seconds) runs in
this process; the proxy runs in its own process pinned to `proxy_cpus` and follows it; this
process, pinned to `client_cpus`, opens `subscribers` WebSocket connections to the proxy's
`ws://…/1337`, each subscribing to newHeads, and records when each head arrives on each
connection. After every block it reads from the proxy's /metrics when the chain feed
announced that block (the moment it became readable through the proxy).

Reported per target: for every (block, subscriber) pair, the delay from the announcement (and
from the block's creation on the node, which adds the feed's poll interval), the spread of
one block's arrivals (last − first subscriber), heads missing, duplicated or out of order, and
the proxy's resident memory before subscribing, with every subscriber connected, and at the
end. The reference in the same run: anvil (`--block-time`) serving newHeads to the same number
of subscribers from the same client (spread only: anvil's block time is not observable).

The subscribers are raw asyncio protocols (a handshake, one masked frame, then frames counted
and the block number read from each), so the client costs a few µs per message.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psutil

from bench.fakenode import FakeNode, FakeNodeSettings
from bench.services import free_port

DEFAULT_SUBSCRIBERS = 1000
DEFAULT_BLOCKS = 20
DEFAULT_BLOCK_TIME = 1.0
DEFAULT_POLL_INTERVAL = 0.02  # the proxy's [proxy.events] poll_interval (its default)
CONNECT_BATCH = 100  # connections opened at once
_NUMBER = b'"number":"0x'


@dataclass
class Arrivals:
    """When each subscriber saw each head (wall clock, and monotonic for creation times)."""

    wall: dict[int, list[float]] = field(default_factory=dict)  # block → arrival times
    mono: dict[int, list[float]] = field(default_factory=dict)
    order_errors: int = 0
    duplicates: int = 0


class Subscriber(asyncio.Protocol):
    """One WebSocket connection subscribed to newHeads, as lean as a client can be."""

    def __init__(self, path: str, arrivals: Arrivals, ready: asyncio.Future[None]) -> None:
        self.path = path
        self.arrivals = arrivals
        self.ready = ready
        self.buffer = b""
        self.upgraded = False
        self.subscribed = False
        self.last = -1
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport  # uvloop's transports are not asyncio.Transport subclasses
        key = base64.b64encode(os.urandom(16)).decode()
        transport.write(
            f"GET {self.path} HTTP/1.1\r\nHost: bench\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(f"closed before subscribing: {exc}"))

    def data_received(self, data: bytes) -> None:
        wall, mono = time.time(), time.monotonic()
        self.buffer += data
        if not self.upgraded:
            head, sep, rest = self.buffer.partition(b"\r\n\r\n")
            if not sep:
                return
            if not head.startswith(b"HTTP/1.1 101"):
                self.ready.set_exception(ConnectionError(head.split(b"\r\n")[0].decode()))
                return
            self.upgraded, self.buffer = True, rest
            request = {"jsonrpc": "2.0", "id": 1, "method": "eth_subscribe", "params": ["newHeads"]}
            self.send(1, orjson.dumps(request))
        self._frames(wall, mono)

    def _frames(self, wall: float, mono: float) -> None:
        buf = self.buffer
        while len(buf) >= 2:
            opcode, size, start = buf[0] & 0x0F, buf[1] & 0x7F, 2
            if size == 126:
                if len(buf) < 4:
                    break
                size, start = int.from_bytes(buf[2:4], "big"), 4
            elif size == 127:
                if len(buf) < 10:
                    break
                size, start = int.from_bytes(buf[2:10], "big"), 10
            if len(buf) < start + size:
                break
            payload, buf = buf[start : start + size], buf[start + size :]
            if opcode == 0x9:  # ping → pong
                self.send(0xA, payload)
            elif opcode == 0x1:
                self._text(payload, wall, mono)
        self.buffer = buf

    def _text(self, payload: bytes, wall: float, mono: float) -> None:
        if not self.subscribed:
            self.subscribed = True
            if b'"result"' in payload and not self.ready.done():
                self.ready.set_result(None)
            elif not self.ready.done():
                self.ready.set_exception(ConnectionError(payload.decode()[:200]))
            return
        at = payload.find(_NUMBER)
        if at < 0:
            return
        end = payload.index(b'"', at + len(_NUMBER))
        number = int(payload[at + len(_NUMBER) : end], 16)
        if number == self.last:
            self.arrivals.duplicates += 1
            return
        if number < self.last:
            self.arrivals.order_errors += 1
        self.last = number
        self.arrivals.wall.setdefault(number, []).append(wall)
        self.arrivals.mono.setdefault(number, []).append(mono)

    def send(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        size = len(payload)
        if size < 126:
            head = bytes([0x80 | opcode, 0x80 | size])
        else:
            head = bytes([0x80 | opcode, 0x80 | 126]) + size.to_bytes(2, "big")
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        assert self.transport is not None
        self.transport.write(head + mask + masked)


async def subscribe_all(host: str, port: int, path: str, count: int, arrivals: Arrivals) -> list:
    """Open `count` subscribed connections (CONNECT_BATCH at a time)."""
    loop = asyncio.get_running_loop()
    transports = []
    for start in range(0, count, CONNECT_BATCH):
        readies = []
        for _ in range(min(CONNECT_BATCH, count - start)):
            ready: asyncio.Future[None] = loop.create_future()
            transport, _ = await loop.create_connection(
                lambda r=ready: Subscriber(path, arrivals, r), host, port
            )
            transports.append(transport)
            readies.append(ready)
        await asyncio.wait_for(asyncio.gather(*readies), 30)
    return transports


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def metrics(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        return resp.read().decode()


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{name}{{[^}}]*}} (\S+)$", text, flags=re.M)
    return float(match.group(1)) if match else float("nan")


def rpc(url: str, method: str) -> Any:
    body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": []})
    request = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return orjson.loads(resp.read())


@dataclass
class Settings:
    subscribers: int = DEFAULT_SUBSCRIBERS
    blocks: int = DEFAULT_BLOCKS
    block_time: float = DEFAULT_BLOCK_TIME
    poll_interval: float = DEFAULT_POLL_INTERVAL
    proxy_cpus: str = "0"
    client_cpus: str = "1"
    reference: bool = True  # anvil, same subscribers
    keep_dir: str | None = None


async def measure(
    host: str, port: int, path: str, settings: Settings, announced: Any = None
) -> tuple[Arrivals, dict[int, float]]:
    """Subscribe, then wait for `blocks` heads; returns the arrivals and, per block, the
    announcement time when `announced(block)` can tell it."""
    arrivals = Arrivals()
    transports = await subscribe_all(host, port, path, settings.subscribers, arrivals)
    first = None
    announce: dict[int, float] = {}
    deadline = time.monotonic() + settings.blocks * settings.block_time * 3 + 30
    try:
        while time.monotonic() < deadline:
            done = [b for b, got in arrivals.wall.items() if len(got) >= settings.subscribers]
            if first is None and done:
                first = min(done) + 1  # the first block every subscriber waited for
            if first is not None:
                for block in done:
                    if block >= first and block not in announce and announced is not None:
                        announce[block] = await asyncio.to_thread(announced, block)
                if all(first + i in done for i in range(settings.blocks)):
                    break
            await asyncio.sleep(0.005)
    finally:
        for transport in transports:
            transport.close()
    keep = set(range(first, first + settings.blocks)) if first is not None else set()
    arrivals.wall = {b: t for b, t in arrivals.wall.items() if b in keep}
    arrivals.mono = {b: t for b, t in arrivals.mono.items() if b in keep}
    return arrivals, announce


def summary(arrivals: Arrivals, settings: Settings, announce: dict[int, float]) -> dict[str, Any]:
    blocks = sorted(arrivals.wall)
    spreads = [(max(t) - min(t)) * 1000 for t in arrivals.wall.values()]
    out: dict[str, Any] = {
        "blocks": len(blocks),
        "deliveries": sum(len(t) for t in arrivals.wall.values()),
        "missing": settings.blocks * settings.subscribers
        - sum(len(t) for t in arrivals.wall.values()),
        "duplicates": arrivals.duplicates,
        "out_of_order": arrivals.order_errors,
        "spread_ms_p50": round(percentile(spreads, 0.5), 2),
        "spread_ms_p99": round(percentile(spreads, 0.99), 2),
    }
    delays = [
        (t - announce[b]) * 1000
        for b, times in arrivals.wall.items()
        if b in announce and announce[b] == announce[b]  # known (not NaN)
        for t in times
    ]
    if delays:
        out |= {
            "from_announce_ms_p50": round(percentile(delays, 0.5), 2),
            "from_announce_ms_p99": round(percentile(delays, 0.99), 2),
            "from_announce_ms_max": round(max(delays), 2),
        }
    return out


def proxy_config(workdir: Path, port: int, node_url: str, settings: Settings) -> Path:
    """The benchmark proxy's config: one pool, the fake node, room for every subscriber."""
    events = {
        "poll_interval": settings.poll_interval,
        "max_connections": settings.subscribers + 100,
        "max_connections_per_client": settings.subscribers + 100,
    }
    config = workdir / "proxy.toml"
    config.write_text(
        f'data_dir = "{workdir}"\n[proxy]\nhost = "127.0.0.1"\nport = {port}\n'
        f"head_poll_interval = 0.25\n[proxy.events]\n"
        + "".join(f"{k} = {v}\n" for k, v in events.items())
        + f'[[proxy.nodes]]\nchain = "1337"\nkey = "fake"\nurl = "{node_url}"\nkind = "state"\n'
    )
    return config


async def run_proxy_target(settings: Settings, workdir: Path, log: Any) -> dict[str, Any]:
    fake = FakeNode(FakeNodeSettings(block_time=settings.block_time, head=1000))
    await fake.start()
    port = free_port()
    config = await asyncio.to_thread(proxy_config, workdir, port, fake.url, settings)
    cmd = [sys.executable, "-m", "stack.cli", "proxy", "--config", str(config)]
    cmd += ["--store", ":memory:"]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", settings.proxy_cpus, *cmd]
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        await _wait_answer(url + "/1337")
        checked_before = await asyncio.to_thread(rpc, url + "/1337", "eth_blockNumber")
        process = psutil.Process(proc.pid)
        rss_start = process.memory_info().rss

        def announced(block: int) -> float:
            """When the feed announced `block` (NaN when it had moved on already)."""
            while True:
                text = metrics(url)
                head = metric(text, "chainstate_proxy_feed_head")
                if head == block:
                    return metric(text, "chainstate_proxy_feed_announced_unixtime")
                if head > block:
                    return float("nan")
                time.sleep(0.002)

        task = asyncio.create_task(measure("127.0.0.1", port, "/1337", settings, announced))
        rss_connected = 0
        while not task.done():
            rss_connected = max(rss_connected, process.memory_info().rss)
            await asyncio.sleep(0.2)
        arrivals, announce = await task
        await asyncio.sleep(1.0)  # connections closed
        rss_end = process.memory_info().rss
        checked_after = await asyncio.to_thread(rpc, url + "/1337", "eth_blockNumber")
        created = fake.rpc.chain.started - 1000 * settings.block_time
        from_created = [
            (t - (created + b * settings.block_time)) * 1000
            for b, times in arrivals.mono.items()
            for t in times
        ]
        out = summary(arrivals, settings, announce) | {
            "from_created_ms_p50": round(percentile(from_created, 0.5), 2),
            "from_created_ms_p99": round(percentile(from_created, 0.99), 2),
            "proxy_rss_mb": {
                "start": round(rss_start / 2**20, 1),
                "peak_connected": round(rss_connected / 2**20, 1),
                "end": round(rss_end / 2**20, 1),
            },
            "answer_before": checked_before.get("result"),
            "answer_after": checked_after.get("result"),
        }
        return out
    finally:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        await fake.stop()


async def run_anvil_target(settings: Settings) -> dict[str, Any]:
    from nodes.devnet.anvil import GENESIS, AnvilProcess

    port = free_port()
    async with AnvilProcess(port=port, genesis=GENESIS, block_time=settings.block_time) as anvil:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.sched_setaffinity(anvil._proc.pid, _cpus(settings.proxy_cpus))
        arrivals, _ = await measure("127.0.0.1", port, "/", settings)
    return summary(arrivals, settings, {})


async def _wait_answer(url: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while True:
        try:
            answer = await asyncio.to_thread(rpc, url, "eth_blockNumber")
            if "result" in answer:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the proxy at {url} did not answer in {within} s")
        await asyncio.sleep(0.1)


def _cpus(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def run(settings: Settings) -> dict[str, Any]:
    """One benchmark run (this process pins itself to `client_cpus`)."""
    with contextlib.suppress(OSError, ValueError):
        os.sched_setaffinity(0, _cpus(settings.client_cpus))
    workdir = Path(settings.keep_dir or tempfile.mkdtemp(prefix="bench-wsheads-"))
    workdir.mkdir(parents=True, exist_ok=True)

    async def main() -> dict[str, Any]:
        with open(workdir / "proxy.log", "wb") as log:  # noqa: ASYNC230 - before any load
            results: dict[str, Any] = {
                "subscribers": settings.subscribers,
                "blocks": settings.blocks,
                "block_time": settings.block_time,
                "poll_interval": settings.poll_interval,
                "proxy": await run_proxy_target(settings, workdir, log),
            }
        if settings.reference:
            results["anvil"] = await run_anvil_target(settings)
        return results

    try:
        import uvloop

        return uvloop.run(main())
    finally:
        if settings.keep_dir is None:
            shutil.rmtree(workdir, ignore_errors=True)


def report(results: dict[str, Any]) -> str:
    """A Markdown table of one run."""
    rows = [
        "| target | deliveries | missing | dup | order | spread p50 ms | spread p99 ms | "
        "from announce p50/p99/max ms | from creation p50/p99 ms |",
        "| - | -: | -: | -: | -: | -: | -: | -: | -: |",
    ]
    for target in ("proxy", "anvil"):
        r = results.get(target)
        if r is None:
            continue
        announce = "–"
        if "from_announce_ms_p50" in r:
            keys = ("from_announce_ms_p50", "from_announce_ms_p99", "from_announce_ms_max")
            announce = " / ".join(str(r[k]) for k in keys)
        created = (
            f"{r['from_created_ms_p50']} / {r['from_created_ms_p99']}"
            if "from_created_ms_p50" in r
            else "–"
        )
        rows.append(
            f"| {target} | {r['deliveries']} | {r['missing']} | {r['duplicates']} | "
            f"{r['out_of_order']} | {r['spread_ms_p50']} | {r['spread_ms_p99']} | {announce} | "
            f"{created} |"
        )
    proxy = results["proxy"]
    rows.append("")
    rows.append(f"proxy RSS MB: {json.dumps(proxy['proxy_rss_mb'])}; answers before/after: "
                f"{proxy['answer_before']} / {proxy['answer_after']}")  # fmt: skip
    if "anvil" in results and results["anvil"]["spread_ms_p99"]:
        ratio = proxy["spread_ms_p99"] / results["anvil"]["spread_ms_p99"]
        rows.append(f"spread p99 ratio proxy/anvil: {ratio:.2f}")
    return "\n".join(rows)


def add_ws_heads_parser(sub: Any) -> None:
    """`chainstate bench ws-heads` under the bench subcommands."""
    p = sub.add_parser(
        "ws-heads",
        help="newHeads fan-out of one proxy process to many WebSocket subscribers (vs anvil)",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    defaults = Settings()
    p.add_argument("-n", "--subscribers", type=int, default=defaults.subscribers)
    p.add_argument("--blocks", type=int, default=defaults.blocks, help="heads measured")
    p.add_argument("--block-time", type=float, default=defaults.block_time)
    p.add_argument(
        "--poll-interval",
        type=float,
        default=defaults.poll_interval,
        help="the proxy's [proxy.events] poll_interval",
    )
    p.add_argument("--proxy-cpus", default=defaults.proxy_cpus, help="taskset CPUs of the proxy")
    p.add_argument("--client-cpus", default=defaults.client_cpus, help="CPUs of this process")
    p.add_argument("--no-reference", action="store_true", help="skip the anvil reference")
    p.add_argument("--keep-dir", help="keep the proxy's config and log here")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=cmd_ws_heads)


def cmd_ws_heads(args: Any) -> int:
    settings = Settings(
        subscribers=args.subscribers,
        blocks=args.blocks,
        block_time=args.block_time,
        poll_interval=args.poll_interval,
        proxy_cpus=args.proxy_cpus,
        client_cpus=args.client_cpus,
        reference=not args.no_reference,
        keep_dir=args.keep_dir,
    )
    print(
        f"ws-heads: {settings.subscribers} subscribers, {settings.blocks} heads every "
        f"{settings.block_time:g} s; proxy on CPU {settings.proxy_cpus}, clients on CPU "
        f"{settings.client_cpus}",
        file=sys.stderr,
        flush=True,
    )
    results = run(settings)
    print(json.dumps(results, indent=2) if args.json else report(results))
    proxy = results["proxy"]
    return 0 if proxy["missing"] == 0 and proxy["duplicates"] == 0 else 1

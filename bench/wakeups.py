"""`python -m bench.wakeups`: what a wake-up across CPUs costs on this machine.

Why: at one connection in turn a proxy's added latency is mostly waiting, and on a virtual
machine a CPU with nothing to run halts; waking it for bytes sent from another CPU can cost
more than the proxy's whole work (102 µs a round trip against 26 µs on one CPU, on the
project's 2-vCPU VM: docs/http-server.md "Busy polling"). This measures the
round trip of 100 bytes between a client and an uvloop echo server, 3 ways: the server on
another CPU than the client, on the same CPU, and on another CPU with its loop busy polling
(`chainstate.busypoll`, as `busy_poll_us` does). A large gap between the first two says the
machine's cross-CPU wake-ups are slow, and what busy polling takes back.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time
from multiprocessing import get_context
from typing import Any

import uvloop

from chainstate.busypoll import BusyPoll

PAYLOAD = b"x" * 100


class _Echo(asyncio.Protocol):
    def __init__(self, poll: BusyPoll | None) -> None:
        self.poll = poll
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)
        if self.poll is not None:
            self.poll.kick()


def _serve(cpu: int, window: float, ready: Any) -> None:
    """The echo server's process: pinned to `cpu`, polling for `window` s after each read."""
    os.sched_setaffinity(0, {cpu})
    loop = uvloop.new_event_loop()
    poll = BusyPoll(loop, window) if window > 0 else None
    server = loop.run_until_complete(loop.create_server(lambda: _Echo(poll), "127.0.0.1", 0))
    ready.send(server.sockets[0].getsockname()[1])
    loop.run_forever()


def round_trips(port: int, count: int) -> list[float]:
    """`count` round trips of PAYLOAD on one connection (seconds each)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        times = []
        for _ in range(count):
            start = time.perf_counter()
            sock.sendall(PAYLOAD)
            got = 0
            while got < len(PAYLOAD):
                got += len(sock.recv(4096))
            times.append(time.perf_counter() - start)
    return times


def measure(server_cpu: int, client_cpu: int, window: float, count: int) -> dict[str, float]:
    """p50 and p90 (µs) of round trips to a server on `server_cpu` from `client_cpu`."""
    ctx = get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(server_cpu, window, there), daemon=True)
    proc.start()
    try:
        port = here.recv()
        os.sched_setaffinity(0, {client_cpu})
        times = sorted(round_trips(port, count))
    finally:
        proc.kill()
        proc.join()
    return {
        "p50_us": round(times[len(times) // 2] * 1e6, 1),
        "p90_us": round(times[int(len(times) * 0.9)] * 1e6, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.wakeups", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("-n", "--count", type=int, default=20000, help="round trips per case")
    p.add_argument("--busy-poll-us", type=int, default=500, help="the polling case's window")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 or args.count < 1 or args.busy_poll_us <= 0:
        print("bench.wakeups: needs 2 CPUs, --count >= 1 and --busy-poll-us > 0", file=sys.stderr)
        return 2
    a, b = cpus[0], cpus[1]
    cases = {
        "other CPU": (a, 0.0),
        "same CPU": (b, 0.0),
        f"other CPU, busy polling {args.busy_poll_us} µs": (a, args.busy_poll_us / 1e6),
    }
    report = {name: measure(cpu, b, window, args.count) for name, (cpu, window) in cases.items()}
    if args.json:
        print(json.dumps(report))
    else:
        print(f"round trip of {len(PAYLOAD)} bytes, client on CPU {b}, {args.count} times:")
        for name, row in report.items():
            print(
                f"  server on {name:<40} p50 {row['p50_us']:7.1f} µs  p90 {row['p90_us']:7.1f} µs"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

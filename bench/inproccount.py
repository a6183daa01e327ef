"""`python -m bench.inproccount`: one in-process read through the proxy's port and the node's.

Why: issues 14/15 compare the proxy's port of `chainstate up` with its state node's own port,
and wall-clock runs on a shared 2-core VM move by more than the gap looked for. Here one
process holds a real state node (a synthetic chain in LMDB, as `bench.nodereads`) and
the proxy app reaching it in process (`inproc://`, entered as a state and an archive node, as
`bench suite state`'s proxy-inproc), and feeds the same requests (`--method`:
eth_getBalance or eth_getStorageAt, a random old height each, keep-alive HTTP/1.1 bytes)
into a connection of each lean server (`chainstate/httpserver.py`: the proxy's data
listener, `POST /1337`, and the node's data port, `POST /`) through a transport that keeps
what is written: the whole server-side path of a request, parse to rendered answer, with no
socket and no client. Every answer body is checked byte-equal between the two ports first.

Without valgrind it prints CPU µs per request of each port (best of `--passes`, alternating)
and node ÷ proxy. Under `valgrind --tool=callgrind --dump-before=getppid` (see
`--callgrind`, which runs itself that way) every segment ends in a dump, and the instruction
counts per request of each port and their ratio do not move with the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench.marks import MARK, segment_counts
from bench.nodereads import (
    LOG_TOKEN,
    STORAGE_CONTRACT,
    STORAGE_SLOTS,
    TRANSFER_TOPIC,
    proxy_runner,
    synthetic_node,
)
from chainstate.httpserver import HttpServer, _Connection
from chainstate.inproc import InprocRegistry
from chainstate.rpcserver import rpc_route
from nodes.state.service import StateNode

CHAIN = "1337"
METHODS = ("eth_getBalance", "eth_getStorageAt", "eth_getLogs")


class Sink(asyncio.Transport):
    """A transport that keeps the last write (the answer) and never pauses."""

    def __init__(self) -> None:
        super().__init__()
        self.last = b""
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.last = bytes(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def requests(path: bytes, bodies: list[bytes]) -> list[bytes]:
    """Keep-alive HTTP/1.1 requests of `bodies` to `path`, as a load generator writes them."""
    return [
        b"POST %b HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (path, len(body), body)
        for body in bodies
    ]


def read_bodies(method: str, n: int, head: int, accounts: list[str]) -> list[bytes]:
    """Single `method` bodies at random heights 1..head (ints for ids): eth_getBalance of
    `accounts`, or eth_getStorageAt of slots 0..16 of the chain's storage contract (as
    `bench suite state`'s `balance` and `storage` cases), or eth_getLogs of the token's
    Transfers in one block (`bench suite logs`' `logs1`)."""
    rng = random.Random(7)
    out = []
    for i in range(n):
        if method == "eth_getLogs":  # the token's Transfers in one block (`logs1`)
            start = rng.randint(0, head)
            flt = {"fromBlock": hex(start), "toBlock": hex(start)}
            params = [{**flt, "address": LOG_TOKEN, "topics": [TRANSFER_TOPIC]}]
            item = {"jsonrpc": "2.0", "id": i, "method": "eth_getLogs", "params": params}
            out.append(orjson.dumps(item))
            continue
        if method == "eth_getStorageAt":
            slot = hex(rng.randrange(STORAGE_SLOTS))
            params = [STORAGE_CONTRACT, slot, hex(rng.randint(1, head))]
        else:
            params = [rng.choice(accounts), hex(rng.randint(1, head))]
        item = {"jsonrpc": "2.0", "id": i, "method": method, "params": params}
        out.append(orjson.dumps(item))
    return out


class Port:
    """One lean server with one client connection fed request bytes."""

    def __init__(self, server: HttpServer, path: bytes, bodies: list[bytes]) -> None:
        server.loop = asyncio.get_running_loop()
        server.set_date(b"Date: Wed, 25 Nov 2026 00:00:00 GMT\r\n")
        self.sink = Sink()
        self.conn = _Connection(server)
        self.conn.connection_made(self.sink)
        self.raw = requests(path, bodies)

    def answer(self, raw: bytes) -> bytes:
        """The answer body to one request (it must be written before the call returns)."""
        self.sink.last = b""
        self.conn.data_received(raw)
        head, _, body = self.sink.last.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"no answer written at once: {self.sink.last[:200]!r}")
        return body

    def run(self, n: int) -> None:
        """`n` requests, cycling through the prepared ones."""
        feed = self.conn.data_received
        raw = self.raw
        size = len(raw)
        for i in range(n):
            feed(raw[i % size])


async def build(
    tmp: Path, blocks: int, n_bodies: int, method: str
) -> tuple[StateNode, Any, list[bytes]]:
    """(node, proxy app runner, bodies): the node holds `blocks` synthetic blocks."""
    node, accounts = await synthetic_node(
        tmp, blocks, {"map_size_mb": 256}, logs=method == "eth_getLogs"
    )
    runner = await proxy_runner(node, InprocRegistry())
    return node, runner, read_bodies(method, n_bodies, blocks - 1, accounts)


async def ready(proxy: Port, node: Port) -> None:
    """Wait until the proxy answers in process (heads known), then check every answer body
    is the same bytes on both ports."""
    for _ in range(200):
        try:
            proxy.answer(proxy.raw[0])
            break
        except RuntimeError:
            await asyncio.sleep(0.05)  # the engine's answer (in a task) while heads are polled
    for a, b in zip(proxy.raw, node.raw, strict=True):
        ours, theirs = proxy.answer(a), node.answer(b)
        if ours != theirs or b'"error"' in ours:
            raise RuntimeError(f"answers differ: {ours[:200]!r} / {theirs[:200]!r}")


def cpu_us(port: Port, n: int) -> float:
    started = time.thread_time_ns()
    port.run(n)
    return (time.thread_time_ns() - started) / n / 1000


async def main_async(args: argparse.Namespace) -> None:
    from proxy.app import create_server

    with tempfile.TemporaryDirectory() as tmp:
        node, runner, bodies = await build(Path(tmp), args.blocks, args.bodies, args.method)
        try:
            proxy = Port(create_server(runner.app), f"/{CHAIN}".encode(), bodies)
            route = rpc_route(node.handle_body, node.answer_now)
            own = HttpServer(route, name="node", kept_routes=True)  # (as `serve_rpc`'s)
            port = Port(own, b"/", bodies)
            ports = {"proxy": proxy, "node": port}
            if args.node_only:
                del ports["proxy"]
                for raw in port.raw:
                    if b'"error"' in port.answer(raw):
                        raise RuntimeError(f"the node answers an error: {port.answer(raw)[:200]!r}")
            else:
                await ready(proxy, port)
            if args.marks:  # under callgrind: one dump per segment
                MARK()
                for _ in range(args.passes):
                    for name in ports:
                        ports[name].run(args.n)
                        MARK()
                return
            best = {name: float("inf") for name in ports}
            for _ in range(args.passes):
                for name in ports:
                    best[name] = min(best[name], cpu_us(ports[name], args.n))
            if args.node_only:
                runs = f"best of {args.passes} x {args.n}"
                print(f"CPU µs per request ({runs}): node {best['node']:.2f}")
                return
            print(
                f"CPU µs per request (best of {args.passes} x {args.n}): proxy "
                f"{best['proxy']:.2f}, node {best['node']:.2f}; node / proxy "
                f"{best['node'] / best['proxy']:.3f}"
            )
        finally:
            await runner.cleanup()
            await node.close()


def callgrind(args: argparse.Namespace) -> int:
    """Run this script under callgrind, one dump per segment; print instructions per request."""
    argv = [
        "-n",
        str(args.n),
        "--passes",
        str(args.passes),
        "--blocks",
        str(args.blocks),
        "--bodies",
        str(args.bodies),
        "--method",
        args.method,
        *(["--node-only"] if args.node_only else []),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        counts = segment_counts("bench.inproccount", argv, Path(tmp))
    # dump 1: the set-up; then proxy, node, proxy, node … (the last dump: the exit)
    if args.node_only:
        node = [c / args.n for c in counts[1 : 1 + args.passes]]
        print("instructions per request, node:  " + ", ".join(f"{c:,.0f}" for c in node))
        return 0
    segments = counts[1 : 1 + 2 * args.passes]
    proxy = [c / args.n for c in segments[0::2]]
    node = [c / args.n for c in segments[1::2]]
    print("instructions per request, proxy: " + ", ".join(f"{c:,.0f}" for c in proxy))
    print("instructions per request, node:  " + ", ".join(f"{c:,.0f}" for c in node))
    print(f"node / proxy (last pass): {node[-1] / proxy[-1]:.3f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.inproccount", description=__doc__)
    p.add_argument("-n", type=int, default=20000, help="requests per segment (default 20000)")
    p.add_argument("--passes", type=int, default=5, help="segments per port (default 5)")
    p.add_argument("--blocks", type=int, default=200, help="chain length (default 200)")
    p.add_argument("--bodies", type=int, default=1000, help="distinct requests (default 1000)")
    p.add_argument("--method", choices=METHODS, default=METHODS[0], help="the reads sent")
    p.add_argument(
        "--callgrind", action="store_true", help="count instructions under valgrind instead"
    )
    p.add_argument(
        "--node-only", action="store_true", help="the node's own port alone (no proxy in front)"
    )
    p.add_argument("--marks", action="store_true", help=argparse.SUPPRESS)  # (the run inside)
    args = p.parse_args(argv)
    if args.callgrind:
        return callgrind(args)
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())

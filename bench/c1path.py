"""The single request's path through the proxy at c=1, measured in one process.

Why: at c=1 the proxy's added latency is the Python it runs before the write to the node
(the request half) and before the write to the client (the answer half). End-to-end figures on
a shared 2-vCPU VM move by ±50 µs from run to run, more than any change of that path, so this
driver measures the two halves themselves: it starts `bench fake-node` (a subprocess, as the
suite does), the proxy as `chainstate proxy` builds it (`proxy.app.create_app` +
`create_server`, the suite's proxy.toml, `--store :memory:`) in this process, and a client on
one keep-alive connection in the same loop that sends the suite's `single-c1` bodies
(eth_getBalance at random heights of the fake node's window) one at a time.

It reports per request (median, warm):
- `request half`: the server's `data_received` for the client's bytes → the node
  connection's `transport.write` (the write system call itself is not counted);
- `answer half`: the node connection's `data_received` → the server's `_write_ready` (the
  write to the client; idem);
and, with `--callgrind` (run it under `valgrind --tool=callgrind --collect-atstart=no`),
brackets exactly those two halves with callgrind's collection toggles (a tiny C helper built
with `cc` into a temp folder and called through ctypes), so the `totals` line of the output
file ÷ the requests is the instructions per request of the two halves: the same figure on
a loaded machine.

    python -m bench.c1path -n 20000
    valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file=/tmp/cg.out \\
        python -m bench.c1path -n 2000 --callgrind
    grep totals /tmp/cg.out

Run it from inside the tree it measures (`cd TREE && PYTHONPATH=$PWD python -m bench.c1path`):
`python -m` puts the current folder first on `sys.path`.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import dataclasses
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from bench.services import free_port
from bench.suite import FAKE_HEAD, FAKE_WINDOW, SUITE_CHAIN_ID, balance_mix, proxy_config
from bench.tenantkey import seed_store

_TOGGLE_C = """
#include <valgrind/callgrind.h>
void toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
"""


def _toggler() -> Any:
    """callgrind's collection toggle as a Python callable (a no-op outside valgrind)."""
    folder = Path(tempfile.mkdtemp(prefix="c1path-"))
    (folder / "t.c").write_text(_TOGGLE_C)
    lib = folder / "libtoggle.so"
    source = str(folder / "t.c")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(lib), source], check=True)
    return ctypes.CDLL(str(lib)).toggle


async def _wait_up(port: int) -> None:
    for _ in range(200):
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


class _Client(asyncio.Protocol):
    """One keep-alive connection; each answer's end is the Content-Length'd body."""

    def __init__(self) -> None:
        self.buf = b""
        self.done: asyncio.Future[bytes] | None = None
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        head, sep, rest = self.buf.partition(b"\r\n\r\n")
        if not sep:
            return
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        if len(rest) >= length and self.done is not None and not self.done.done():
            self.buf = rest[length:]
            self.done.set_result(head + b"\r\n\r\n" + rest[:length])


class _Marks:
    """Time (and, under callgrind, collection) brackets around the two halves."""

    def __init__(self, toggle: Any, halves: str = "both") -> None:
        self.toggle = toggle
        # which part callgrind collects: "req", "ans", "both", or the request half's two
        # parts: "srv" (to the engine's `start`) and "eng" (from there to the write)
        self.halves = halves
        self.on = False
        self.t0 = 0
        self.req: list[int] = []
        self.ans: list[int] = []
        self.srv: list[int] = []  # the request half's part before `Engine.start`
        self.phase = ""  # "req": between the client's bytes in and the write to the node
        self.measure = False
        self.calls: dict[str, Counter[str]] | None = None  # `--calls`: per half, per function

    def _count(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            name = f"{Path(code.co_filename).stem}.{code.co_qualname}"
        elif event == "c_call":
            name = f"C {getattr(arg, '__qualname__', '?')}"
        else:
            return
        self.calls[self.phase][name] += 1  # type: ignore[index]

    def start(self, phase: str) -> None:
        if not self.measure:
            return
        self.phase = phase
        wanted = (phase, "both", "srv" if phase == "req" else phase)
        if self.toggle is not None and not self.on and self.halves in wanted:
            self.toggle()
            self.on = True
        if self.calls is not None:
            sys.setprofile(self._count)
        self.t0 = time.perf_counter_ns()

    def engine(self) -> None:
        """`Engine.start` is called: the end of the server's part of the request half."""
        if self.phase != "req":
            return
        self.srv.append(time.perf_counter_ns() - self.t0)
        split = self.halves in ("srv", "eng")
        if self.toggle is not None and split and (self.halves == "srv") == self.on:
            self.toggle()  # off after the server's part, or on for the engine's
            self.on = not self.on

    def stop(self, phase: str) -> None:
        if self.phase != phase:
            return
        elapsed = time.perf_counter_ns() - self.t0
        if self.calls is not None:
            sys.setprofile(None)
        if self.toggle is not None and self.on:
            self.toggle()
            self.on = False
        self.phase = ""
        (self.req if phase == "req" else self.ans).append(elapsed)


class _MarkedTransport:
    """A node connection's transport whose `write` ends the request half first."""

    def __init__(self, transport: Any, marks: _Marks) -> None:
        self._transport = transport
        self._marks = marks

    def write(self, data: bytes) -> None:
        self._marks.stop("req")
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _instrument(marks: _Marks) -> None:
    """Wrap the boundary methods (in this process only; the product is unchanged)."""
    from chainstate import httpserver
    from proxy import engine, httpclient

    server_rx = httpserver._Connection.data_received
    server_write = httpserver._Connection._write_ready
    node_rx = httpclient._Connection.data_received
    node_made = httpclient._Connection.connection_made
    engine_start = engine.Engine.start

    def s_rx(self: Any, data: bytes) -> None:
        marks.start("req")
        server_rx(self, data)
        marks.stop("req")  # (when nothing was written to the node: counted to the end)

    def s_write(self: Any) -> None:
        marks.stop("ans")
        server_write(self)

    def n_rx(self: Any, data: bytes) -> None:
        marks.start("ans")
        node_rx(self, data)
        marks.stop("ans")

    def e_start(self: Any, *args: Any, **kw: Any) -> Any:
        marks.engine()
        return engine_start(self, *args, **kw)

    def n_made(self: Any, transport: Any) -> None:
        node_made(self, _MarkedTransport(transport, marks))

    httpserver._Connection.data_received = s_rx  # type: ignore[method-assign]
    httpserver._Connection._write_ready = s_write  # type: ignore[method-assign]
    httpclient._Connection.data_received = n_rx  # type: ignore[method-assign]
    httpclient._Connection.connection_made = n_made  # type: ignore[method-assign]
    engine.Engine.start = e_start  # type: ignore[method-assign]


async def _run(args: argparse.Namespace, marks: _Marks) -> dict[str, Any]:
    from proxy.app import create_app, create_server
    from proxy.cli import open_store
    from proxy.settings import ProxySettings

    fake_port, proxy_port = free_port(), free_port()
    fake = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench", "fake-node", "--port", str(fake_port),
        "--kind", "state", "--head", str(FAKE_HEAD), "--window", str(FAKE_WINDOW),
        "--chain-id", str(SUITE_CHAIN_ID),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        await _wait_up(fake_port)
        config = tomllib.loads(proxy_config(f"http://127.0.0.1:{fake_port}"))
        settings = ProxySettings.from_config(config)
        settings = dataclasses.replace(settings, port=proxy_port, store_path=":memory:")
        store = open_store(":memory:")
        key = await seed_store(store) if args.key else None
        app = create_app(settings, store=store)
        server = create_server(app)
        await server.start("127.0.0.1", proxy_port)
        try:
            return await _drive(args, marks, proxy_port, key)
        finally:
            await server.close()
    finally:
        fake.terminate()
        await fake.wait()


async def _drive(
    args: argparse.Namespace, marks: _Marks, port: int, key: str | None = None
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    bodies = balance_mix(1).build(args.seed)
    rng = random.Random(args.seed)
    transport, client = await loop.create_connection(_Client, "127.0.0.1", port)
    path, auth = f"/{SUITE_CHAIN_ID}", ""
    if args.key == "path":
        path = f"{path}/{key}"
    elif args.key == "header":
        auth = f"Authorization: Bearer {key}\r\n"
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{auth}"
    await asyncio.sleep(args.settle)  # the proxy's first head polls: the node is healthy
    results = 0
    for i in range(args.warmup + args.requests):
        marks.measure = i >= args.warmup
        body = bodies[rng.randrange(len(bodies))]
        client.done = loop.create_future()
        transport.write(b"%bContent-Length: %d\r\n\r\n%b" % (head.encode(), len(body), body))
        answer = await client.done
        if args.gap:  # idle between requests, as a client at c=1 leaves the proxy: caches cool
            await asyncio.sleep(args.gap)
        if b'"result"' not in answer:
            raise RuntimeError(f"not a result: {answer[-300:]!r}")
        results += 1
    transport.close()
    return {
        "requests": args.requests,
        "results": results,
        "request_half_ns_p50": statistics.median(marks.req),
        "server_part_ns_p50": statistics.median(marks.srv),
        "answer_half_ns_p50": statistics.median(marks.ans),
        "request_half_ns_p10": statistics.quantiles(marks.req, n=10)[0],
        "answer_half_ns_p10": statistics.quantiles(marks.ans, n=10)[0],
    }


def main(argv: list[str] | None = None) -> int:
    summary = __doc__.split("\n\n")[0]
    parser = argparse.ArgumentParser(prog="python -m bench.c1path", description=summary)
    parser.add_argument("-n", "--requests", type=int, default=20000, help="requests measured")
    parser.add_argument("--warmup", type=int, default=500, help="requests before measuring")
    parser.add_argument(
        "--settle", type=float, default=1.0, help="seconds before the first request"
    )
    parser.add_argument(
        "--gap",
        type=float,
        default=0.0,
        help="seconds idle after each answer (e.g. 0.001: the CPU caches cool as between a "
        "real c=1 client's requests; 0: back to back, warm)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the bodies and their order")
    parser.add_argument(
        "--callgrind",
        action="store_true",
        help="toggle callgrind's collection around the two halves (run under valgrind "
        "--tool=callgrind --collect-atstart=no)",
    )
    parser.add_argument(
        "--half",
        choices=("req", "ans", "both", "srv", "eng"),
        default="both",
        help="what callgrind collects: a half, both, or the request half's part up to the "
        "engine's `start` (srv) or from there to the write (eng)",
    )
    parser.add_argument(
        "--calls",
        action="store_true",
        help="count the Python and C function calls of each half (sys.setprofile; slow)",
    )
    parser.add_argument(
        "--key",
        choices=("path", "header"),
        help="send with an API key that has two limits (bench/tenantkey.py), in the path "
        "(POST /:chainId/:key) or as Authorization: Bearer; default: anonymous",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    marks = _Marks(_toggler() if args.callgrind else None, args.half)
    if args.calls:
        marks.calls = {"req": Counter(), "ans": Counter()}
    _instrument(marks)
    import uvloop

    out = uvloop.run(_run(args, marks))
    out["tree"] = os.getcwd()
    if marks.calls is not None:
        for half, counts in marks.calls.items():
            total = sum(counts.values()) / args.requests
            out[f"{half}_calls_per_request"] = round(total, 2)
            out[f"{half}_calls"] = {
                name: round(n / args.requests, 2) for name, n in counts.most_common()
            }
    if args.json:
        print(orjson.dumps(out).decode())
    else:
        for key, value in out.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

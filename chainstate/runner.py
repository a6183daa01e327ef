"""Run servers (lean JSON-RPC servers and aiohttp applications) in one uvloop event loop until
Ctrl-C / SIGTERM."""

from __future__ import annotations

import asyncio
import gc
import signal
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

import uvloop
from aiohttp import web

from chainstate.httpserver import HttpServer


async def start_site(
    stack: AsyncExitStack, app: web.Application, host: str, port: int, reuse_port: bool = False
) -> web.AppRunner:
    """Start `app` on host:port and register its cleanup on `stack`."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    site = web.TCPSite(runner, host, port, reuse_port=reuse_port or None, backlog=1024)
    await site.start()
    return runner


async def start_server(
    stack: AsyncExitStack, server: HttpServer, host: str, port: int, reuse_port: bool = False
) -> HttpServer:
    """Start a lean server on host:port and register its graceful close on `stack`."""
    await server.start(host, port, reuse_port=reuse_port)
    stack.push_async_callback(server.close)
    return server


async def wait_for_stop() -> None:
    """Block until SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


# Young-generation collections: a server parses JSON into thousands of short-lived objects
# per second, and Python's default (a collection every 700 allocations) ran one every few
# requests, a tenth of the proxy's CPU on single requests and over a quarter on 100-item
# batches (`python -m bench.gcthreshold`; docs/http-server.md has the figures). At 20000
# serving collects almost nothing and each pass stays short (a few requests' objects).
GC_YOUNG_THRESHOLD = 20_000


def run(main: Callable[[], Awaitable[None]]) -> None:
    """Run `main` on uvloop (with the collector tuned for servers, see above)."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)
    uvloop.run(main())

"""A tiny server run under proxy.workers by test_workers.py: `python -m tests.etcd.worker_app
PORT N [crash]`. GET /pid answers the worker's pid; `crash` makes every worker fail at once."""

from __future__ import annotations

import os
import sys
from contextlib import AsyncExitStack

from aiohttp import web

from chainstate.runner import run, start_site, wait_for_stop
from proxy.workers import run_workers


async def pid(_: web.Request) -> web.Response:
    return web.Response(text=f"{os.getpid()} {os.environ.get('CHAINSTATE_WORKER_INDEX')}")


def serve(port: int) -> None:
    async def main() -> None:
        app = web.Application()
        app.router.add_get("/pid", pid)
        async with AsyncExitStack() as stack:
            await start_site(stack, app, "127.0.0.1", port, reuse_port=True)
            await wait_for_stop()

    run(main)


def crash() -> None:
    raise SystemExit(3)


if __name__ == "__main__":
    port, n = int(sys.argv[1]), int(sys.argv[2])
    target = crash if sys.argv[3:] == ["crash"] else lambda: serve(port)
    sys.exit(
        run_workers(n, target, restart_delay=0.1, max_restarts=2, restart_window=30, stop_timeout=5)
    )

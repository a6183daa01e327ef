"""`chainstate checker`: run the consistency checker alone."""

from __future__ import annotations

import argparse
from contextlib import AsyncExitStack
from pathlib import Path

from chainstate.config import load_config, section
from chainstate.httpserver import ServerLimits
from chainstate.rpcserver import node_limits, serve_rpc
from chainstate.runner import run, wait_for_stop
from nodes.checker.service import CheckerNode
from nodes.checker.settings import CheckerSettings


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "checker", help="consistency checker: confirms blocks a quorum of state replicas agree on"
    )
    p.add_argument("--config", help="TOML config with a [checker] section")
    p.add_argument("--replica", action="append", default=[], help="state node URL (repeat)")
    p.add_argument("--quorum", type=int, help="replicas that must agree (default: majority)")
    p.add_argument("--listen", help="host:port to serve on (default :8663, all interfaces)")
    p.add_argument("--data-dir", default=".chainstate/checker", help="where confirmations live")
    p.set_defaults(func=cmd_checker)


def settings_from_args(args: argparse.Namespace) -> CheckerSettings:
    values = dict(section(load_config(args.config), "checker")) if args.config else {}
    if args.replica:
        values["replicas"] = args.replica
    if args.quorum is not None:
        values["quorum"] = args.quorum
    if args.listen:
        values["listen"] = args.listen
    return CheckerSettings.from_section(values)


def cmd_checker(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    limits = node_limits(load_config(args.config))
    run(lambda: serve(settings, Path(args.data_dir), limits))
    return 0


async def serve(
    settings: CheckerSettings, data_dir: Path, limits: ServerLimits | None = None
) -> None:
    async with AsyncExitStack() as stack:
        node = CheckerNode(settings, data_dir=data_dir, registry=None)
        await node.start()
        stack.push_async_callback(node.close)
        host = settings.host or "0.0.0.0"
        await serve_rpc(
            stack,
            node.handle_body,
            node.make_app(),
            host,
            settings.port,
            name="checker",
            limits=limits,
        )
        shown = settings.host or "0.0.0.0"
        print(f"checker listening on http://{shown}:{settings.port}  (metrics: /metrics)")
        print(f"  replicas: {', '.join(settings.replicas)}  quorum: {settings.effective_quorum}")
        reach = "127.0.0.1" if shown == "0.0.0.0" else shown  # all interfaces: loopback works
        print(
            f"  try: curl -s http://{reach}:{settings.port} -H 'content-type: application/json'"
            """ -d '{"jsonrpc":"2.0","id":1,"method":"getLatestBlock","params":[]}'"""
        )
        await wait_for_stop()

"""`chainstate state-node`: run one state (or archive) node alone, following a write node."""

from __future__ import annotations

import argparse
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from chainstate.config import ConfigError, load_config
from chainstate.httpserver import ServerLimits
from chainstate.rpcserver import node_limits, serve_rpc
from chainstate.runner import run, wait_for_stop
from nodes.state.service import StateNode
from nodes.state.settings import StateSettings


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "state-node",
        help="state node: ingests a write node's blocks, answers state reads at any block",
        description="Run one state node. Values from --config ([[state_nodes]] entry chosen "
        "by --key, else the first) are overridden by the other options.",
    )
    p.add_argument("--config", help="TOML config with [[state_nodes]] entries")
    p.add_argument("--key", help="node name (also selects the --config entry)")
    p.add_argument("--source", help="write node URL, e.g. http://127.0.0.1:8664")
    p.add_argument("--kind", choices=["state", "archive"], help="state (window) or archive")
    p.add_argument("--window", type=int, help="blocks of history a state node keeps (128)")
    p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port to listen on (default 8665)")
    p.add_argument("--chain-id", type=int, help="chain id (default: asked from the source)")
    p.add_argument(
        "--data-dir", default=".chainstate/state", help="where the store lives (LMDB files)"
    )
    p.set_defaults(func=cmd_state_node)


def section_from_args(args: argparse.Namespace) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if args.config:
        entries = load_config(args.config).get("state_nodes", [])
        if not isinstance(entries, list) or not entries:
            raise ConfigError(f"{args.config}: no [[state_nodes]] entries")
        chosen = [e for e in entries if args.key is None or e.get("key") == args.key]
        if not chosen:
            raise ConfigError(f"{args.config}: no [[state_nodes]] entry with key {args.key!r}")
        values.update(chosen[0])
    for name in ("key", "source", "kind", "window", "host", "port", "chain_id"):
        value = getattr(args, name)
        if value is not None:
            values[name] = value
    if not values.get("source"):
        raise ConfigError("state-node: --source (or source in --config) is required")
    if str(values["source"]).startswith("inproc://"):
        raise ConfigError("state-node: a node run alone follows its source over http://")
    return values


def cmd_state_node(args: argparse.Namespace) -> int:
    settings = StateSettings.from_section(section_from_args(args))
    limits = node_limits(load_config(args.config))
    run(lambda: serve(settings, Path(args.data_dir), limits))
    return 0


async def serve(
    settings: StateSettings, data_dir: Path, limits: ServerLimits | None = None
) -> None:
    async with AsyncExitStack() as stack:
        node = StateNode(settings, data_dir=data_dir)
        url = f"http://{settings.host}:{settings.port}"
        node.http_url = url
        # Listen first: the EVM workers read state through the node's HTTP endpoint.
        await serve_rpc(
            stack,
            node.handle_body,
            node.make_app(),
            settings.host,
            settings.port,
            name=f"{settings.kind} node {settings.key}",
            limits=limits,
            answer_now=node.answer_port,
        )
        await node.start()
        stack.push_async_callback(node.close)
        print(
            f"{settings.kind} node {settings.key} listening on {url}  "
            f"(health: /health, metrics: /metrics)",
            flush=True,
        )
        print(f"  following {settings.source}; data in {data_dir}", flush=True)
        await wait_for_stop()

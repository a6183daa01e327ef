"""`chainstate write-node`: run the write node alone, talking HTTP to its execution client."""

from __future__ import annotations

import argparse
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from chainstate.config import ConfigError, load_config, resolve_path
from chainstate.rpcserver import node_limits, serve_rpc
from chainstate.runner import run, wait_for_stop


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "write-node",
        help="follow an execution client and serve trace_vendorBlock",
        description="Follow an execution client (anvil, geth…) and serve each block as "
        "trace_vendorBlock over JSON-RPC. Use --config, or --execution-url and friends.",
    )
    p.add_argument(
        "--config", help="TOML config; its [[writers]] entry (see --key) or [writer] is used"
    )
    p.add_argument("--key", help="which [[writers]] entry of --config to run (default: first)")
    p.add_argument("--execution-url", help="JSON-RPC URL of the execution client")
    p.add_argument("--host", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="listen port (default 8664)")
    p.add_argument("--data-dir", help="where the emitted blocks are stored")
    p.add_argument("--genesis", help="genesis file of the chain (default configs/genesis.json)")
    p.add_argument("--poll-interval", type=float, help="seconds between head polls (default 0.5)")
    p.set_defaults(func=cmd_write_node)


def writer_section(args: argparse.Namespace) -> tuple[dict[str, Any], Path]:
    """The chosen writer's config section with command-line overrides, and its data dir."""
    from nodes.writer.settings import pick_writer, writer_data_dir, writer_sections

    config = load_config(args.config) if args.config else {}
    sections = writer_sections(config)
    if args.key is not None and not args.config:
        raise ConfigError("--key picks a write node of --config; give --config too")
    index, chosen = pick_writer(sections, args.key) if sections else (0, {})
    sect = dict(chosen)
    overrides = {
        "execution_url": args.execution_url,
        "host": args.host,
        "port": args.port,
        "poll_interval": args.poll_interval,
    }
    sect.update({k: v for k, v in overrides.items() if v is not None})
    if args.genesis:
        sect["genesis"] = str(Path(args.genesis).resolve())
    if "execution_url" not in sect:
        raise ConfigError("write-node needs --execution-url or a --config with [[writers]]")
    if args.data_dir:
        data_dir = Path(args.data_dir).resolve()
    elif args.config:
        root = resolve_path(config, config.get("data_dir", ".chainstate"))
        data_dir = writer_data_dir(root, sections, index)
    else:
        raise ConfigError("write-node needs --data-dir (or a --config with data_dir)")
    return sect, data_dir


def cmd_write_node(args: argparse.Namespace) -> int:
    from nodes.writer.service import WriterNode

    sect, data_dir = writer_section(args)
    limits = node_limits(load_config(args.config))
    node = WriterNode.from_config(sect, data_dir=data_dir)

    async def main() -> None:
        async with AsyncExitStack() as stack:
            await node.start()
            stack.push_async_callback(node.close)
            s = node.settings
            await serve_rpc(
                stack,
                node.handle_body,
                node.make_app(),
                s.host,
                s.port,
                name=f"write node {s.key}",
                limits=limits,
            )
            url = f"http://{s.host}:{s.port}"
            print(f"write node {s.key} listening on {url} (JSON-RPC on POST /)", flush=True)
            print(f"  following {s.execution_url}; blocks stored in {data_dir}")
            print("  health: GET /health   metrics: GET /metrics")
            print("next: fetch a block, or point a state node at it:")
            print(
                f"  curl -s {url} -H 'content-type: application/json' -d "
                """'{"jsonrpc":"2.0","id":1,"method":"trace_vendorBlock","params":["latest"]}'"""
            )
            print(f'  state nodes ingest from it with source = "{url}"', flush=True)
            await wait_for_stop()

    run(main)
    return 0

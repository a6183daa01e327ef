"""`chainstate up`: the whole stack in one event loop on the embedded devnet config.

anvil (the execution client) runs as a child process; the write nodes (`[[writers]]`, all
following the same anvil; the proxy's writers list names the Leader), the state nodes, the
consistency checker, the routing proxy and the workspace API share one uvloop event loop and
reach each other in process (`inproc://name`). Each also listens on its own port, so it can
be called directly for debugging.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from chainstate.config import DEVNET_CONFIG, ConfigError, load_config, resolve_path, section
from chainstate.httpserver import HttpServer
from chainstate.inproc import InprocRegistry
from chainstate.rpcserver import node_limits, serve_rpc
from chainstate.runner import run, start_server, start_site, wait_for_stop

ANVIL_STATE = "anvil-state.json"  # the devnet's chain, kept across restarts


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "up",
        help="start the whole stack: devnet, write nodes, state nodes, checker, proxy, workspace",
        description=__doc__,
    )
    p.add_argument("--config", default=str(DEVNET_CONFIG), help="TOML config (default: devnet)")
    p.add_argument("--data-dir", help="where every component keeps its data (overrides config)")
    p.set_defaults(func=cmd_up)


def cmd_up(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if args.data_dir:
        config["data_dir"] = str(Path(args.data_dir).resolve())
    run(lambda: Stack(config).run())
    return 0


def say(line: str = "") -> None:
    print(line, flush=True)


class Stack:
    """Starts the components in dependency order and stops them in reverse."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.registry = InprocRegistry()
        self.data_dir = resolve_path(config, config.get("data_dir", ".chainstate"))
        self.endpoints: list[tuple[str, str]] = []
        self.proxy_app: Any = None
        self.devnet: Any = None  # nodes.devnet.devnet.Devnet, once started
        self.limits = node_limits(config)  # the nodes' data ports: [http]

    async def run(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        async with AsyncExitStack() as stack:
            try:
                await self.start_all(stack)
            except ConfigError as exc:
                print(f"chainstate up: {exc}", file=sys.stderr)
                return
            self.print_banner()
            await wait_for_stop()
            say("\nstopping…")

    async def start_all(self, stack: AsyncExitStack) -> None:
        await self.start_devnet(stack)
        await self.start_writers(stack)
        await self.start_state_nodes(stack)
        await self.start_checker(stack)
        await self.start_proxy(stack)
        await self.start_workspace(stack)

    async def serve(
        self,
        stack: AsyncExitStack,
        name: str,
        app: Any,
        sect: dict,
        rpc: Any = None,
        answer_now: Any = None,
    ) -> str:
        """Listen on the section's host:port: a JSON-RPC data port (`rpc`: its handle_body,
        and `answer_now` when it has one; or an HttpServer) on the lean server with `app` for
        the rest, or `app` alone."""
        host, port = sect.get("host", "127.0.0.1"), int(sect["port"])
        if isinstance(rpc, HttpServer):
            await start_server(stack, rpc, host, port)
        elif rpc is not None:
            limits = self.limits
            await serve_rpc(
                stack, rpc, app, host, port, name=name, limits=limits, answer_now=answer_now
            )
        else:
            await start_site(stack, app, host, port)
        url = f"http://{host}:{port}"
        self.endpoints.append((name, url))
        return url

    async def start_devnet(self, stack: AsyncExitStack) -> None:
        from nodes.devnet.anvil import (
            DEFAULT_STATE_HISTORY,
            DEFAULT_STATE_INTERVAL,
            AnvilProcess,
            ensure_anvil,
        )
        from nodes.devnet.devnet import Devnet

        sect = section(self.config, "devnet")
        say("• devnet: checking for anvil (installs it with npm on first run)…")
        ensure_anvil()
        genesis = sect.get("genesis")
        anvil = AnvilProcess(
            port=int(sect.get("port", 8545)),
            chain_id=int(sect.get("chain_id", 1337)),
            block_time=sect.get("block_time", 1),
            genesis=resolve_path(self.config, genesis) if genesis else None,
            hardfork=sect.get("hardfork", "cancun"),
            host=sect.get("host", "127.0.0.1"),
            state_path=self.data_dir / ANVIL_STATE,
            state_interval=float(sect.get("state_interval", DEFAULT_STATE_INTERVAL)),
            state_history=int(sect.get("state_history", DEFAULT_STATE_HISTORY)),
        )
        # After a crash, anvil is first brought back to the write nodes' head, and so again
        # when it dies while the stack runs (nodes/devnet/devnet.py).
        self.devnet = Devnet(anvil, self.writer_stores(), lambda line: say(f"• devnet: {line}"))
        await self.devnet.start()
        stack.push_async_callback(self.devnet.stop)
        self.endpoints.append(("anvil (execution client)", anvil.url))

    def writer_stores(self) -> list[tuple[str, Path]]:
        """(key, store file) of every write node: the devnet's durable record."""
        from nodes.writer.service import STORE_FILE
        from nodes.writer.settings import DEFAULT_KEY, writer_data_dir, writer_sections

        sections = writer_sections(self.config)
        dirs = [writer_data_dir(self.data_dir, sections, i) for i in range(len(sections))]
        keys = [str(sect.get("key", DEFAULT_KEY)) for sect in sections]
        return [(key, path / STORE_FILE) for key, path in zip(keys, dirs, strict=True)]

    async def start_writers(self, stack: AsyncExitStack) -> None:
        from nodes.writer.service import WriterNode
        from nodes.writer.settings import writer_data_dir, writer_sections

        sections = writer_sections(self.config)
        dirs = [writer_data_dir(self.data_dir, sections, i) for i in range(len(sections))]
        writers = []
        for sect, data_dir in zip(sections, dirs, strict=True):
            writer = WriterNode.from_config(sect, data_dir=data_dir, registry=self.registry)
            await writer.start()
            stack.push_async_callback(writer.close)
            writers.append(writer)
            s = writer.settings
            listen = {"host": s.host, "port": s.port}
            name = f"write node {s.key}"
            await self.serve(stack, name, writer.make_app(), listen, writer.handle_body)
        self.devnet.supervise(writers)  # anvil dying from now on: restored, writers paused
        stack.push_async_callback(self.devnet.stop_watching)

    async def start_state_nodes(self, stack: AsyncExitStack) -> None:
        from nodes.state.service import StateNode

        for sect in self.config.get("state_nodes", []):
            node = StateNode.from_config(
                sect, data_dir=self.data_dir / sect["key"], registry=self.registry
            )
            node.http_url = f"http://{sect.get('host', '127.0.0.1')}:{sect['port']}"
            # Listen first: the EVM workers read state through the node's HTTP endpoint.
            name = f"{sect['kind']} node {sect['key']}"
            await self.serve(stack, name, node.make_app(), sect, node.handle_body, node.answer_now)
            await node.start()
            stack.push_async_callback(node.close)

    async def start_checker(self, stack: AsyncExitStack) -> None:
        if "checker" not in self.config:
            return
        from nodes.checker.service import CheckerNode

        sect = section(self.config, "checker")
        checker = CheckerNode.from_config(
            sect, data_dir=self.data_dir / "checker", registry=self.registry
        )
        await checker.start()
        stack.push_async_callback(checker.close)
        self.registry.register("checker", checker.handle_body)  # the proxy's [[proxy.checkers]]
        await self.serve(
            stack, "consistency checker", checker.make_app(), sect, checker.handle_body
        )

    async def start_proxy(self, stack: AsyncExitStack) -> None:
        from proxy.app import create_app, create_server
        from proxy.eventsettings import EventSettings
        from proxy.settings import ProxySettings
        from proxy.store_file import FileStore
        from proxy.tenancy.settings import TenancySettings

        settings = ProxySettings.from_config(self.config)
        events = EventSettings.from_config(self.config)
        tenancy = TenancySettings.from_config(self.config, settings.store_path)
        store = FileStore(self.data_dir / "proxy-store.json")
        app = create_app(
            settings, store=store, registry=self.registry, events=events, tenancy=tenancy
        )
        self.proxy_app = app
        proxy = section(self.config, "proxy")
        await self.serve(stack, "routing proxy", app, proxy, create_server(app))

    async def start_workspace(self, stack: AsyncExitStack) -> None:
        if "workspace" not in self.config:
            return
        from proxy.app import get_engine
        from workspace.app import create_app, ensure_local_account
        from workspace.settings import WorkspaceSettings

        settings = WorkspaceSettings.from_config(self.config)
        proxy_app = self.proxy_app

        async def forward(chain_id: str, body: bytes, headers: Any) -> tuple[int, bytes]:
            return await get_engine(proxy_app).handle(chain_id, body, headers)

        app = create_app(settings, chainstate_forward=forward)
        url = await self.serve(stack, "workspace API", app, section(self.config, "workspace"))
        account_id, token = ensure_local_account(settings)
        self.workspace = (url, account_id, token)

    def print_banner(self) -> None:
        chain_id = section(self.config, "devnet").get("chain_id", 1337)
        proxy = section(self.config, "proxy")
        proxy_url = f"http://{proxy.get('host', '127.0.0.1')}:{proxy.get('port', 8663)}"
        say("\nchainstate is up. Endpoints:")
        width = max(len(name) for name, _ in self.endpoints)
        for name, url in self.endpoints:
            say(f"  {name:<{width}}  {url}")
        say(f"\nJSON-RPC for clients: POST {proxy_url}/{chain_id}")
        say(f"WebSocket (eth_subscribe): {proxy_url.replace('http', 'ws', 1)}/{chain_id}")
        say("Try:")
        say(
            f"  curl -s {proxy_url}/{chain_id} -H 'content-type: application/json' "
            """-d '{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":[]}'"""
        )
        if getattr(self, "workspace", None):
            url, account_id, token = self.workspace
            say(f"\nWorkspace API: {url}/v1  (account {account_id})")
            say(
                f"  curl -s '{url}/v1/space/list' -H 'Authorization: Bearer {token}' "
                f"-H 'X-Account-ID: {account_id}'"
            )
        say(f"\nData: {self.data_dir}   Stop: Ctrl-C")

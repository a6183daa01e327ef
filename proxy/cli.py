"""`chainstate proxy`: the routing proxy as its own process."""

from __future__ import annotations

import argparse
import dataclasses
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from chainstate.config import ConfigError, load_config, section
from chainstate.httpserver import HttpServer
from chainstate.runner import run, start_server, start_site, wait_for_stop
from proxy.eventsettings import EventSettings
from proxy.settings import ProxySettings
from proxy.store import ConfigStore
from proxy.tenancy.settings import TenancySettings

MEMORY = ":memory:"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "proxy",
        help="run the routing proxy (POST /:chainId, admin API, /metrics)",
        description="The JSON-RPC routing proxy. Chains and nodes come from --config and the "
        "admin API; it also starts with neither.",
    )
    p.add_argument("--host", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="listen port (default 8663)")
    p.add_argument("--config", help="TOML config with a [proxy] section (default: none)")
    p.add_argument(
        "--store",
        help="config store: a JSON file path, etcd://host:port/prefix/, or :memory: "
        "(default: proxy-store.json under the config's data_dir, else ./.chainstate/)",
    )
    p.add_argument("--admin-token", help="require 'Authorization: Bearer TOKEN' on admin calls")
    p.add_argument("--admin-host", help="serve the admin API on its own address")
    p.add_argument("--admin-port", type=int, help="serve the admin API on its own port")
    p.add_argument(
        "--insecure-admin",
        action="store_true",
        default=None,
        help="allow a tokenless admin API on an address other than loopback",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="serve with N processes on the port (SO_REUSEPORT); needs an etcd:// store",
    )
    p.add_argument(
        "--trace",
        choices=("none", "console", "otlp"),
        help="where spans go (default: [proxy.tracing] exporter, else none)",
    )
    p.set_defaults(func=cmd_proxy)


def settings_from_args(args: argparse.Namespace) -> ProxySettings:
    config = load_config(args.config)
    settings = ProxySettings.from_config(config)
    changes: dict[str, Any] = {}
    for name in ("host", "port", "admin_token", "admin_host", "admin_port", "insecure_admin"):
        value = getattr(args, name, None)
        if value is not None:
            changes[name] = value
    if args.store is not None:
        changes["store_path"] = args.store
    if changes.get("admin_host") and "admin_port" not in changes and settings.admin_port is None:
        raise ConfigError("--admin-host needs --admin-port")
    settings = dataclasses.replace(settings, **changes)
    settings.validate()
    settings.check_exposure()
    return settings


def open_store(location: str | None) -> ConfigStore:
    """The store for a --store value (file path, etcd:// URL or :memory:)."""
    if location is not None and location.startswith("etcd://"):
        try:
            from proxy.store_etcd import EtcdStore
        except ImportError as exc:
            raise ConfigError(f"the etcd store is not available: {exc}") from None
        return EtcdStore.from_url(location)
    from proxy.store_file import FileStore

    if location == MEMORY:
        return FileStore(None)
    return FileStore(Path(location) if location else Path(".chainstate") / "proxy-store.json")


def build_tracer(config: dict[str, Any], exporter: str | None) -> Any:
    """The tracer from `[proxy.tracing]` (exporter, service_name, otlp_endpoint,
    sample_ratio; see proxy/tracing.py), the --trace flag overriding its exporter."""
    from proxy.tracing import build_tracer as build

    sect = dict(section(section(config, "proxy"), "tracing"))
    if exporter is not None:
        sect["exporter"] = exporter
    try:
        return build(**sect)
    except TypeError as exc:
        raise ConfigError(f"[proxy.tracing] {exc}") from None


def _check_tracing(config: dict[str, Any], exporter: str | None) -> None:
    """Refuse tracing settings that cannot work before anything starts: with --workers a
    bad exporter would otherwise only fail inside each forked worker, in a crash loop."""
    from proxy.tracing import check_settings

    sect = dict(section(section(config, "proxy"), "tracing"))
    if exporter is not None:
        sect["exporter"] = exporter
    try:
        check_settings(**sect)
    except TypeError as exc:
        raise ConfigError(f"[proxy.tracing] {exc}") from None


def cmd_proxy(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    config = load_config(args.config)
    _check_tracing(config, args.trace)  # before starting anything (and before forking)
    events = EventSettings.from_config(config)
    tenancy = TenancySettings.from_config(config, settings.store_path)
    if args.workers < 1:
        raise ConfigError("--workers must be at least 1")
    if args.workers == 1:
        store = open_store(settings.store_path)
        tracer = build_tracer(config, args.trace)
        run(lambda: serve(settings, store, tracer, events=events, tenancy=tenancy))
        return 0
    if not (settings.store_path or "").startswith("etcd://"):
        raise ConfigError(
            "--workers needs a shared store (--store etcd://host:port/prefix/): "
            "each worker applies configuration from it"
        )
    from proxy.workers import run_workers

    def serve_one() -> None:  # in each forked worker: its own loop, store client, tracer
        store = open_store(settings.store_path)
        tracer = build_tracer(config, args.trace)
        run(
            lambda: serve(
                settings,
                store,
                tracer,
                events=events,
                tenancy=tenancy,
                reuse_port=True,
                banner=False,
            )
        )

    url, admin_url = _urls(settings)
    print_banner(url, admin_url, settings, workers=args.workers)
    return run_workers(args.workers, serve_one)


def _urls(settings: ProxySettings) -> tuple[str, str]:
    url = f"http://{settings.host}:{settings.port}"
    if settings.admin_port is None:
        return url, url
    return url, f"http://{settings.admin_host or settings.host}:{settings.admin_port}"


async def serve(
    settings: ProxySettings,
    store: ConfigStore,
    tracer: Any = None,
    *,
    events: EventSettings | None = None,
    tenancy: TenancySettings | None = None,
    reuse_port: bool = False,
    banner: bool = True,
) -> None:
    from proxy.app import create_admin_app, create_app, create_server, get_proxy

    app = create_app(settings, store=store, tracer=tracer, events=events, tenancy=tenancy)
    get_proxy(app).metrics.watch_store(lambda: store.available)
    async with AsyncExitStack() as stack:
        await _listen(stack, create_server(app), settings.host, settings.port, reuse_port)
        if settings.admin_port is not None:
            admin_host = settings.admin_host or settings.host
            admin = create_admin_app(app)
            await _listen(stack, admin, admin_host, settings.admin_port, reuse_port)
        if banner:
            print_banner(*_urls(settings), settings)
        await wait_for_stop()


async def _listen(
    stack: AsyncExitStack, target: Any, host: str, port: int, reuse_port: bool
) -> None:
    """Start the data server (lean, `HttpServer`) or the admin app (aiohttp) on host:port."""
    try:
        if isinstance(target, HttpServer):
            await start_server(stack, target, host, port, reuse_port=reuse_port)
        else:
            await start_site(stack, target, host, port, reuse_port=reuse_port)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def print_banner(url: str, admin_url: str, settings: ProxySettings, workers: int = 1) -> None:
    auth = " -H 'Authorization: Bearer <token>'" if settings.admin_token else ""
    procs = f", {workers} worker processes" if workers > 1 else ""
    lines = [
        f"chainstate proxy listening on {url}  (JSON-RPC: POST {url}/<chainId>{procs};"
        f" WebSocket: {url.replace('http://', 'ws://', 1)}/<chainId>)",
        f"admin API on {admin_url}{' (token required)' if settings.admin_token else ''};"
        f" metrics on {url}/metrics",
        "Try:",
        f"  curl -s {admin_url}/getChains{auth}",
        f"  curl -s {admin_url}/1337/addNode{auth} -H 'content-type: application/json' "
        """-d '{"key":"state-1","url":"http://127.0.0.1:8665","kind":"state"}'""",
        f"  curl -s {url}/1337 -H 'content-type: application/json' "
        """-d '{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":[]}'""",
    ]
    print("\n".join(lines), flush=True)

"""`chainstate up` with the proxy's events part attached as the proxy app will attach it
(filters on the data path, WebSocket on `GET /:chainId`), for the client tests until
proxy/app.py wires it itself (it waits for issue 14's server rework; docs/events.md).

    python -m tests.e2e.events_up --config devnet.toml
"""

from __future__ import annotations

import argparse
from contextlib import AsyncExitStack

from chainstate.config import load_config, section
from chainstate.runner import run
from chainstate.up import Stack
from proxy.app import create_app
from proxy.events import attach
from proxy.eventsettings import EventSettings
from proxy.settings import ProxySettings
from proxy.store_file import FileStore


class EventsStack(Stack):
    async def start_proxy(self, stack: AsyncExitStack) -> None:
        settings = ProxySettings.from_config(self.config)
        store = FileStore(self.data_dir / "proxy-store.json")
        app = create_app(settings, store=store, registry=self.registry)
        attach(app, EventSettings.from_config(self.config), self.registry)
        self.proxy_app = app
        await self.serve(stack, "routing proxy", app, section(self.config, "proxy"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    config = load_config(parser.parse_args().config)
    run(lambda: EventsStack(config).run())


if __name__ == "__main__":
    main()

"""`python -m bench.inprocstack --config FILE`: state nodes and the proxy in one process.

The `chainstate up` shape the state and call suites measure as `proxy-inproc`: the proxy
reaches its state nodes in process (`inproc://name`, the nodes' synchronous read path), all
on one event loop, with `chainstate up`'s own start-up code (`stack.up.Stack`), but
without the devnet and the write nodes: the state nodes follow the suite's write node over
HTTP. Stops on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import AsyncExitStack

from chainstate.config import load_config
from chainstate.logs import setup_logging
from chainstate.runner import run
from stack.up import Stack


class InprocStack(Stack):
    """`chainstate up` with its `[[state_nodes]]` and `[proxy]` only."""

    async def start_all(self, stack: AsyncExitStack) -> None:
        await self.start_state_nodes(stack)
        await self.start_proxy(stack)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.inprocstack", description=__doc__)
    parser.add_argument("--config", required=True, help="TOML: [[state_nodes]] and [proxy]")
    args = parser.parse_args(argv)
    setup_logging("warning")
    config = load_config(args.config)
    run(lambda: InprocStack(config).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())

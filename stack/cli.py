"""The `chainstate` command. Each component registers its own subcommands.

A component module listed in COMMAND_MODULES exposes `register(subparsers)` which adds its
parsers with `set_defaults(func=callable(args) -> int | None)`. A module that is not installed
is left out (`bench` is a tool for load testers, not a part the stack needs).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

from chainstate import __version__
from chainstate.config import ConfigError
from chainstate.logs import setup_logging

COMMAND_MODULES = (
    "stack.up",
    "proxy.cli",
    "proxy.tenancy.cli",
    "nodes.cli",
    "workspace.cli",
    "bench.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chainstate", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"chainstate {__version__}")
    parser.add_argument(
        "--log-level", default="warning", help="debug, info, warning (default), error"
    )
    parser.add_argument("--log-text", action="store_true", help="plain text logs instead of JSON")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        if importlib.util.find_spec(name) is None:
            continue
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    setup_logging(args.log_level, json=not args.log_text)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"chainstate: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

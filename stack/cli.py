"""The `chainstate` command. Each component registers its own subcommands.

A component module listed in COMMAND_MODULES exposes `register(subparsers)` which adds its
parsers with `set_defaults(func=callable(args) -> int | None)`. A module that is not installed
is left out (`bench` is a tool for load testers, not a part the stack needs).

Only the module of the command given is imported (COMMANDS): importing every component
costs each process ~0.6 CPU s at start, and a stack starts a dozen. `--help`, no command or
an unknown one import them all.
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
# Each top-level command and the module that registers it (tests/test_cli_commands.py keeps
# this in step with what the modules register).
COMMANDS = {
    "up": "stack.up",
    "proxy": "proxy.cli",
    "keys": "proxy.tenancy.cli",
    **dict.fromkeys(("devnet", "write-node", "state-node", "checker"), "nodes.cli"),
    **dict.fromkeys(("workspace", "account", "token", "access-key"), "workspace.cli"),
    "bench": "bench.cli",
}
GLOBAL_WITH_VALUE = ("--log-level",)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser for `argv`: with only its command's module when it names one (None: all)."""
    parser = argparse.ArgumentParser(prog="chainstate", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"chainstate {__version__}")
    parser.add_argument(
        "--log-level", default="warning", help="debug, info, warning (default), error"
    )
    parser.add_argument("--log-text", action="store_true", help="plain text logs instead of JSON")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    named = COMMANDS.get(command_of(argv)) if argv is not None else None
    for name in (named,) if named is not None else COMMAND_MODULES:
        if installed(name):
            importlib.import_module(name).register(subparsers)
    return parser


def command_of(argv: list[str]) -> str:
    """The command `argv` names: its first word that is no global option or its value."""
    words = iter(argv)
    for word in words:
        if word in GLOBAL_WITH_VALUE:
            next(words, None)
        elif not word.startswith("-"):
            return word
    return ""


def installed(name: str) -> bool:
    """Whether module `name` can be imported; find_spec raises when its parent package is
    absent (an image ships without `bench`)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    parser = build_parser(argv)
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

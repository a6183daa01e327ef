"""Node subcommands: each node package that has a `cli` module registers its own commands."""

from __future__ import annotations

import argparse
import importlib
import importlib.util

NODE_CLI_MODULES = ("nodes.devnet.cli", "nodes.writer.cli", "nodes.state.cli", "nodes.checker.cli")


def register(subparsers: argparse._SubParsersAction) -> None:
    for name in NODE_CLI_MODULES:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name).register(subparsers)

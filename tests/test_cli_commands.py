"""The `chainstate` command imports only the module of the command given."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest

from stack.cli import COMMAND_MODULES, COMMANDS, build_parser, command_of


def test_every_registered_command_is_mapped_to_its_module() -> None:
    registered: dict[str, str] = {}
    for name in COMMAND_MODULES:
        subparsers = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(name).register(subparsers)
        registered.update(dict.fromkeys(subparsers.choices, name))
    assert registered == COMMANDS


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["proxy", "--config", "x.toml"], "proxy"),
        (["--log-level", "info", "state-node", "--key", "s"], "state-node"),
        (["--log-text", "bench", "run"], "bench"),
        (["--version"], ""),
        ([], ""),
    ],
)
def test_the_command_is_the_first_word_past_the_global_options(
    argv: list[str], command: str
) -> None:
    assert command_of(argv) == command


def test_a_parser_for_one_command_still_parses_it() -> None:
    args = build_parser(["--log-level", "info", "keys", "projects"]).parse_args(
        ["--log-level", "info", "keys", "projects"]
    )
    assert args.command == "keys" and args.log_level == "info" and callable(args.func)


def test_one_command_imports_no_other_component() -> None:
    code = (
        "import sys; from stack.cli import main\n"
        "try:\n    main(['keys', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'bench', 'workspace', 'nodes'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_help_and_an_unknown_command_list_every_command() -> None:
    run = [sys.executable, "-m", "stack.cli"]
    shown = subprocess.run([*run, "--help"], capture_output=True, text=True, check=True).stdout
    assert all(command in shown for command in COMMANDS)
    wrong = subprocess.run([*run, "nope"], capture_output=True, text=True)
    assert wrong.returncode == 2 and "state-node" in wrong.stderr

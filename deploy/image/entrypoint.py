"""The image's entrypoint: `podman run IMAGE proxy --port 8663` runs `chainstate proxy --port 8663`.

Configuration comes from a TOML file and the environment, so one mounted file can serve every
container of a fleet and secrets stay out of it:

- CHAINSTATE_CONFIG names the file (default /etc/chainstate/chainstate.toml, when it exists).
  It is passed as `--config` to a command that takes one and was not given one.
- `${NAME}` and `${NAME:-default}` in that file are replaced from the environment first (in a
  copy beside links to its neighbours, so paths relative to the file still resolve);
  comments are left as they are.
- CHAINSTATE_LOG_LEVEL sets `--log-level` (debug, info, warning, error).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

DEFAULT_CONFIG = Path("/etc/chainstate/chainstate.toml")
PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class EntrypointError(ValueError):
    """The environment or the config file cannot be used; the message says which and why."""


def expand(text: str, env: Mapping[str, str], source: str) -> str:
    """`text` with every `${NAME}` / `${NAME:-default}` replaced from `env`, except in
    comments (a comment may show the syntax)."""

    def value(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        raise EntrypointError(f"{source}: ${{{name}}} is not set in the environment")

    lines = []
    for line in text.splitlines(keepends=True):
        cut = comment_start(line)
        lines.append(PLACEHOLDER.sub(value, line[:cut]) + line[cut:])
    return "".join(lines)


def comment_start(line: str) -> int:
    """Where the TOML comment of `line` starts (its length when it has none): the first `#`
    outside a quoted string."""
    quote = ""
    escaped = False
    for index, char in enumerate(line):
        if escaped:
            escaped = False
        elif quote == '"' and char == "\\":
            escaped = True
        elif quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char == "#":
            return index
    return len(line)


def render_config(path: Path, env: Mapping[str, str], workdir: Path) -> Path:
    """The config to pass on: `path` itself when it has no placeholder, else its expanded copy
    in `workdir` (the mounted folder is usually read-only), beside links to everything else
    in its folder so that paths relative to the file still resolve."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise EntrypointError(f"CHAINSTATE_CONFIG: {path} does not exist") from None
    if not PLACEHOLDER.search(text):
        return path
    copy = workdir / "config"
    copy.mkdir(parents=True, exist_ok=True)
    for entry in path.parent.iterdir():
        if entry.name != path.name:
            (copy / entry.name).symlink_to(entry.resolve())
    rendered = copy / path.name
    rendered.write_text(expand(text, env, str(path)))
    return rendered


def command_parser(
    parser: argparse.ArgumentParser, argv: Sequence[str]
) -> tuple[int, argparse.ArgumentParser] | None:
    """The position of the subcommand in `argv` and its parser, or None when there is none."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for index, arg in enumerate(argv):
                if arg in action.choices:
                    return index, action.choices[arg]
    return None


def given(args: Sequence[str], option: str) -> bool:
    return any(arg == option or arg.startswith(option + "=") for arg in args)


def build_argv(
    argv: Sequence[str], env: Mapping[str, str], parser: argparse.ArgumentParser, workdir: Path
) -> list[str]:
    """The `chainstate` arguments for the container's arguments and environment."""
    args = list(argv)
    found = command_parser(parser, args)
    config = env.get("CHAINSTATE_CONFIG") or (
        str(DEFAULT_CONFIG) if DEFAULT_CONFIG.exists() else ""
    )
    if found is not None and config and not given(args, "--config"):
        index, sub = found
        if "--config" in sub._option_string_actions:
            rendered = render_config(Path(config), env, workdir)
            args[index + 1 : index + 1] = ["--config", str(rendered)]
    level = env.get("CHAINSTATE_LOG_LEVEL")
    if level and not given(args, "--log-level"):
        args[0:0] = ["--log-level", level]
    return args


def main() -> int:
    from stack.cli import build_parser
    from stack.cli import main as chainstate

    workdir = Path(tempfile.mkdtemp(prefix="chainstate-entry-"))
    try:
        argv = build_argv(sys.argv[1:], os.environ, build_parser(), workdir)
    except EntrypointError as exc:
        print(f"chainstate image: {exc}", file=sys.stderr)
        return 2
    return chainstate(argv)


if __name__ == "__main__":
    sys.exit(main())

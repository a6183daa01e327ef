"""`python -m bench …`: the same tools as `chainstate bench …` without the rest of the CLI."""

from __future__ import annotations

import argparse
import sys

from bench.cli import add_commands
from chainstate.logs import setup_logging


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--log-level", default="warning", help="debug, info, warning, error")
    add_commands(parser)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    setup_logging(args.log_level)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

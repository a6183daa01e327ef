"""`python -m tests.conformance [REPORT.md]`: one conformance run outside pytest; prints
the list of differences (and writes it to REPORT.md when given)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from tests.conformance.harness import conformance_config, conformance_run, report
from tests.e2e.stack import Stack


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="conformance-") as tmp:
        stack = Stack(*conformance_config(Path(tmp)))
        stack.start()
        try:
            text = report(conformance_run(stack))
        finally:
            stack.stop()
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

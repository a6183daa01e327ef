"""A harness run under callgrind with one dump per segment: the segments' instruction counts.

The harness calls `MARK` between its segments (a C call it makes nowhere else), and
callgrind dumps before each call, so the dumps' totals are the segments' counts, whatever
the machine's load.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

MARK = os.getppid  # callgrind dumps before each call of it (`--dump-before=getppid`)


def segment_counts(module: str, argv: list[str], tmp: Path) -> list[int]:
    """Run `python -m module --marks *argv` under callgrind (dumps in `tmp`, hash seed 0);
    the instructions of each dump in order: the set-up, each segment, the exit."""
    out = tmp / "cg.out"
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--dump-before=getppid",
        f"--callgrind-out-file={out}",
        sys.executable,
        "-m",
        module,
        "--marks",
        *argv,
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    subprocess.run(cmd, check=True, env=env, stderr=subprocess.DEVNULL)
    counts = []
    for dump in sorted(tmp.glob("cg.out.*"), key=lambda p: int(p.name.rsplit(".", 1)[1])):
        found = re.search(rb"^summary: (\d+)", dump.read_bytes(), re.M)
        counts.append(int(found.group(1)) if found else 0)
    return counts

"""`bench.realprocs gc`'s probe (`bench/gcprobe/sitecustomize.py`): in a process started with
it on PYTHONPATH, SIGUSR1 records the collector's passes per generation, and without
GCPROBE_DIR it does nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "bench" / "gcprobe"

# Two records around known passes: 2 young, 1 middle, 3 full (automatic ones off).
PASSES = """
import gc, os, signal
gc.disable()
os.kill(os.getpid(), signal.SIGUSR1)
gc.collect(0); gc.collect(0); gc.collect(1); gc.collect(2); gc.collect(2); gc.collect(2)
os.kill(os.getpid(), signal.SIGUSR1)
"""


def run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PASSES],
        env={**os.environ, "PYTHONPATH": str(PROBE), **env},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_probe_records_each_generations_passes(tmp_path: Path) -> None:
    done = run({"GCPROBE_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    (records,) = list(tmp_path.glob("gc-*.jsonl"))
    before, after = (json.loads(line) for line in records.read_text().splitlines())
    passes = {g: after["passes"][g][0] - before["passes"][g][0] for g in ("0", "1", "2")}
    assert passes == {"0": 2, "1": 1, "2": 3}
    assert all(after["passes"][g][1] > before["passes"][g][1] for g in ("0", "1", "2"))
    assert len(after["objects"]) == 3 and sum(after["objects"]) > 1000
    assert after["cpu"] >= before["cpu"] > 0


def test_probe_does_nothing_without_its_folder() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GCPROBE_DIR"}
    done = subprocess.run(
        [sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGUSR1) == 0)"],
        env={**env, "PYTHONPATH": str(PROBE)},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr  # SIG_DFL

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
    # (the process CPU clock ticks every 10 ms: a fast machine may not have used a tick yet)
    assert after["cpu"] >= before["cpu"] >= 0


def test_probe_does_nothing_without_its_folder() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GCPROBE_DIR"}
    done = subprocess.run(
        [sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGUSR1) == 0)"],
        env={**env, "PYTHONPATH": str(PROBE)},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr  # SIG_DFL


def test_http_mode_runs_each_trees_own_proxy_cli(tmp_path: Path) -> None:
    """A tree with `stack/` runs `stack.cli proxy`, an older one `chainstate.cli proxy`, from
    that tree (its directory first on the path)."""
    from bench.realprocs import tree_proxy

    config = tmp_path / "proxy.toml"
    old = tree_proxy(tmp_path, 8000, config)
    assert old[:4] == ["env", "-C", str(tmp_path), f"PYTHONPATH={tmp_path}"]
    assert old[old.index("-m") + 1] == "chainstate.cli"
    (tmp_path / "stack").mkdir()
    new = tree_proxy(tmp_path, 8000, config, ("valgrind",))
    assert new[4] == "valgrind" and new[new.index("-m") + 1] == "stack.cli"


def test_http_mode_twin_makes_the_archive_entry_another_url() -> None:
    import tomllib

    from bench.realprocs import TWIN_USER, http_config

    node = "http://127.0.0.1:8545"
    plain = tomllib.loads(http_config(node, "", twin=False))["proxy"]["nodes"]
    assert [(n["kind"], n["url"]) for n in plain] == [("state", node), ("archive", node)]
    twin = tomllib.loads(http_config(node, "", twin=True))["proxy"]["nodes"]
    other = f"http://{TWIN_USER}@127.0.0.1:8545"
    assert [(n["kind"], n["url"]) for n in twin] == [("state", node), ("archive", other)]


def test_strace_table_is_read_per_syscall(tmp_path: Path) -> None:
    from bench.realprocs import strace_counts

    table = tmp_path / "strace.txt"
    table.write_text(
        "% time     seconds  usecs/call     calls    errors syscall\n"
        "------ ----------- ----------- --------- --------- ----------------\n"
        " 41.00    0.004100           1      3000           write\n"
        " 30.00    0.003000           1      3010        12 read\n"
        "  1.00    0.000100           0      1000           getpid\n"
        "------ ----------- ----------- --------- --------- ----------------\n"
        "100.00    0.010000           1      7010        12 total\n"
    )
    assert strace_counts(table) == {"write": 3000, "read": 3010, "getpid": 1000}

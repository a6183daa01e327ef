"""State node settings and the `chainstate state-node` command line: bad values fail loudly."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chainstate.config import DEVNET_CONFIG, ConfigError
from nodes.state.cli import section_from_args
from nodes.state.service import StateNode
from nodes.state.settings import StateSettings
from nodes.state.vendor import parse_vendor_block
from tests.nodes.test_state_chain import random_chain

REPO = Path(__file__).resolve().parents[2]


def test_defaults_and_devnet_entries() -> None:
    s = StateSettings.from_section({"source": "inproc://writer-1"})
    assert (s.kind, s.window, s.port, s.verify_pre, s.verify_hash) == (
        "state",
        128,
        8665,
        True,
        True,
    )
    args = argparse.Namespace(
        config=str(DEVNET_CONFIG), key="archive-1", source="http://127.0.0.1:8664",
        kind=None, window=None, host=None, port=None, chain_id=None,
    )  # fmt: skip
    section = section_from_args(args)
    settings = StateSettings.from_section(section)
    assert (settings.key, settings.kind, settings.port) == ("archive-1", "archive", 8666)


@pytest.mark.parametrize(
    "section",
    [
        {"kind": "full"},
        {"window": 0},
        {"window": "128"},
        {"port": 70000},
        {"source": "ws://x"},
        {"chain_id": -1},
        {"chain_id": True},
        {"poll_interval": 0},
        {"fetch_concurrency": 0},
        {"verify_pre": "yes"},
        {"evm": 3},
        {"windwo": 12},
    ],
)
def test_bad_settings_are_config_errors(section: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        StateSettings.from_section(section)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "stack.cli", "state-node", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=30)


def test_cli_refuses_missing_or_in_process_sources(tmp_path: Path) -> None:
    got = run_cli("--data-dir", str(tmp_path))
    assert got.returncode == 2 and "--source" in got.stderr
    got = run_cli("--source", "inproc://writer-1", "--data-dir", str(tmp_path))
    assert got.returncode == 2 and "http://" in got.stderr
    got = run_cli("--source", "http://127.0.0.1:1", "--window", "0", "--data-dir", str(tmp_path))
    assert got.returncode == 2 and "window" in got.stderr


async def test_a_data_dir_of_another_chain_or_kind_is_refused(tmp_path: Path) -> None:
    node = StateNode.from_config({"key": "a", "chain_id": 1}, data_dir=tmp_path)
    await node.start()
    await node.close()
    other = StateNode.from_config({"key": "a", "chain_id": 2}, data_dir=tmp_path)
    with pytest.raises(ConfigError, match="holds chain 1"):
        await other.start()
    # a state store that holds blocks (so it may be pruned) cannot become an archive

    chain, _ = random_chain(seed=5, blocks=3)
    node = StateNode.from_config({"key": "a", "chain_id": 1}, data_dir=tmp_path)
    await node.start()
    node.store.apply(parse_vendor_block(chain.blocks[0]))
    await node.close()
    archive = StateNode.from_config({"key": "a", "kind": "archive"}, data_dir=tmp_path)
    with pytest.raises(ConfigError, match="cannot be reopened as `archive`"):
        await archive.start()

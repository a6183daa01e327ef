"""Shared devnet fixtures: a real anvil per test module (automine, no block time).

Used by the write node, state node and EVM tests. Automine makes one block per transaction,
so a workload produces the same chain on every run. The fixtures are synchronous, so any
test (whatever its event loop scope) can use them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from nodes.devnet.anvil import GENESIS, AnvilProcess, ensure_anvil
from tests.conftest import free_port


@pytest.fixture(scope="session")
def anvil_binary() -> Path:
    """The anvil binary (installed into the project's tool folder on first use)."""
    return ensure_anvil()


@pytest.fixture(scope="module")
def anvil(anvil_binary: Path) -> Iterator[AnvilProcess]:
    """A fresh anvil for the module: chain id 1337, configs/genesis.json, automine."""
    proc = AnvilProcess(port=free_port(), genesis=GENESIS, binary=anvil_binary)
    proc.start_blocking()
    try:
        yield proc
    finally:
        proc.stop_blocking()


@pytest.fixture(scope="module")
def anvil_url(anvil: AnvilProcess) -> str:
    return anvil.url

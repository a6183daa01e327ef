"""The fleet tests need root (network namespaces), `ip` (iproute2), etcd and anvil.

Locally a missing one skips them; under CI (the `CI` env var is set) it fails them, because
CI runs as root and `./dev test` installs iproute2, etcd and anvil.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fleet.netns import Network, sweep


def _require(ok: bool, reason: str) -> None:
    if ok:
        return
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture
def network(tmp_path: Path) -> Iterator[Network]:
    """An empty test network; every host's processes and the network go away afterwards,
    whatever the test did."""
    _require(os.geteuid() == 0, "network namespaces need root")
    for tool in ("ip", "ss", "etcd"):
        _require(shutil.which(tool) is not None, f"{tool} is not installed (./dev test does)")
    sweep()
    logs = tmp_path / "logs"
    logs.mkdir()
    net = Network(logs)
    try:
        yield net
    finally:
        net.close()

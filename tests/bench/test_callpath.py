"""`python -m bench.callpath`: eth_calls at old heights through the node's port or the proxy
in process, single calls too (the engine answers those early, from the node's future, which
the harness's connection stand-in receives)."""

from __future__ import annotations

import pytest

from bench.callpath import main as callpath


@pytest.mark.parametrize("path", ["node", "proxy"])
@pytest.mark.parametrize("batch", ["1", "10"])
def test_callpath_checks_every_answer(path: str, batch: str, capsys) -> None:
    argv = ["--path", path, "--batch", batch, "-n", "10", "--blocks", "160", "--settle", "0.3"]
    assert callpath(argv) == 0
    assert f"{path} calls x{batch}: 10 bodies" in capsys.readouterr().out

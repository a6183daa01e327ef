"""`python -m bench.upports`: `chainstate up`'s proxy port against its node's own port."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from bench.upports import devnet_copy
from proxy.settings import ProxySettings

ROOT = Path(__file__).resolve().parents[2]


def test_the_devnet_copy_moves_every_port_and_keeps_its_data_apart(tmp_path: Path) -> None:
    """The measured `up` runs beside a user's `./dev up`: no port of devnet.toml and not its
    data folder is used twice."""
    original = tomllib.loads((ROOT / "configs" / "devnet.toml").read_text())
    copy = tomllib.loads(devnet_copy(tmp_path, 1000).read_text())
    assert copy["devnet"]["port"] == original["devnet"]["port"] + 1000
    assert copy["proxy"]["port"] == original["proxy"]["port"] + 1000
    for old, new in zip(original["state_nodes"], copy["state_nodes"], strict=True):
        assert new["port"] == old["port"] + 1000
        assert str(1000 + 8663) in new["leader_from"]
    for writer in copy["writers"]:
        assert writer["execution_url"].endswith(f":{8545 + 1000}")
    assert copy["data_dir"] == str(tmp_path / "data")
    # The same state nodes behind HTTP, as a pool of their own (a config the proxy accepts).
    over_http = [n for n in copy["proxy"]["nodes"] if n["chain"] == "1337-http"]
    ports = {n["key"]: n["port"] for n in copy["state_nodes"]}
    assert {(n["url"], n["kind"]) for n in over_http} == {
        (f"http://127.0.0.1:{ports['state-1']}", "state"),
        (f"http://127.0.0.1:{ports['archive-1']}", "archive"),
    }
    assert ProxySettings.from_config(copy).cache_pools == ("1337",)
    assert (tmp_path / "configs" / "genesis.json").exists()  # relative paths still resolve


def test_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.upports", "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "--port-offset" in out.stdout and "--rounds" in out.stdout

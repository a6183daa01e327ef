"""A `chainstate up` subprocess on free ports, driven as a user drives it (for e2e tests)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from chainstate.config import DEVNET_CONFIG
from tests.conftest import free_port

DEV = "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266"
BEEF = "0x000000000000000000000000000000000000beef"
DEFAULT_PORTS = ("8545", "8663", "8664", "8665", "8666", "8667", "8668", "8669")


def write_config(tmp_path: Path) -> tuple[Path, dict[str, int]]:
    """devnet.toml with free ports and a temporary data dir."""
    ports = {p: free_port() for p in DEFAULT_PORTS}
    text = DEVNET_CONFIG.read_text()
    text = re.sub(r"\b(8545|866[3-9])\b", lambda m: str(ports[m.group(1)]), text)
    text = re.sub(r"^data_dir = .*$", f'data_dir = "{tmp_path / "data"}"', text, flags=re.M)
    text = text.replace(
        'genesis = "genesis.json"', f'genesis = "{DEVNET_CONFIG.parent}/genesis.json"'
    )
    path = tmp_path / "devnet.toml"
    path.write_text(text)
    return path, {p: ports[p] for p in DEFAULT_PORTS}


class Stack:
    COMMAND = ("-m", "stack.cli", "up")  # what runs the stack (python arguments)

    def __init__(self, config: Path, ports: dict[str, int]) -> None:
        self.config, self.ports = config, ports
        self.proc: subprocess.Popen[str] | None = None
        self.output: list[str] = []

    def start(self, timeout: float = 90) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, *self.COMMAND, "--config", str(self.config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line and self.proc.poll() is not None:
                break
            self.output.append(line)
            if line.startswith("Data:"):
                return
        self.stop()
        pytest.fail("chainstate up did not come up:\n" + "".join(self.output))

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        try:
            rest, _ = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rest, _ = self.proc.communicate()
        self.output.append(rest or "")
        return self.proc.returncode

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def rpc(self, method: str, *params: Any, url: str | None = None) -> Any:
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)}
        answer = post(url or self.url("8663") + "/1337", body)
        assert "error" not in answer, answer
        return answer["result"]


def post(url: str, body: Any) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def get(url: str) -> Any:
    """GET a JSON document (admin API, /health)."""
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def wait_for(check, timeout: float = 30, what: str = "condition"):
    """The first true value of `check()`, asked every 50 ms (the checks are single reads:
    a coarser poll only adds its interval to each wait)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")

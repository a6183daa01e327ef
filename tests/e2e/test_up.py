"""`chainstate up` as a newcomer runs it: send a transaction through the proxy, read the new
balance at the new block and the old balance at an old block, trace a block, see it
confirmed by the checker, stop with Ctrl-C, and resume from the stored data."""

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
DEFAULT_PORTS = ("8545", "8663", "8664", "8665", "8666", "8667", "8668")


def write_config(tmp_path: Path) -> tuple[Path, dict[str, int]]:
    """devnet.toml with free ports and a temporary data dir."""
    ports = {p: free_port() for p in DEFAULT_PORTS}
    text = DEVNET_CONFIG.read_text()
    text = re.sub(r"\b(8545|866[3-8])\b", lambda m: str(ports[m.group(1)]), text)
    text = re.sub(r"^data_dir = .*$", f'data_dir = "{tmp_path / "data"}"', text, flags=re.M)
    text = text.replace(
        'genesis = "genesis.json"', f'genesis = "{DEVNET_CONFIG.parent}/genesis.json"'
    )
    path = tmp_path / "devnet.toml"
    path.write_text(text)
    return path, {p: ports[p] for p in DEFAULT_PORTS}


class Stack:
    def __init__(self, config: Path, ports: dict[str, int]) -> None:
        self.config, self.ports = config, ports
        self.proc: subprocess.Popen[str] | None = None
        self.output: list[str] = []

    def start(self, timeout: float = 90) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "chainstate.cli", "up", "--config", str(self.config)],
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


def wait_for(check, timeout: float = 30, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


@pytest.mark.timeout(300)
def test_up_send_read_trace_confirm_and_resume(tmp_path):
    config, ports = write_config(tmp_path)
    stack = Stack(config, ports)
    stack.start()
    try:
        banner = "".join(stack.output)
        assert f"POST http://127.0.0.1:{ports['8663']}/1337" in banner
        assert stack.rpc("eth_chainId") == "0x539"
        tx = stack.rpc("eth_sendTransaction", {"from": DEV, "to": BEEF, "value": hex(10**18)})
        receipt = wait_for(
            lambda: stack.rpc("eth_getTransactionReceipt", tx, url=stack.url("8545")),
            what="the transaction to be mined",
        )
        mined = int(receipt["blockNumber"], 16)
        wait_for(
            lambda: stack.rpc("eth_getBalance", BEEF, "latest") == hex(10**18),
            what="the state node to ingest the block",
        )
        assert stack.rpc("eth_getBalance", BEEF, hex(mined)) == hex(10**18)
        assert stack.rpc("eth_getBalance", BEEF, hex(mined - 1)) == "0x0"
        assert stack.rpc("eth_getBalance", BEEF, "earliest") == "0x0"  # archive node

        batch = post(
            stack.url("8663") + "/1337",
            [
                {
                    "jsonrpc": "2.0",
                    "id": "new",
                    "method": "eth_getBalance",
                    "params": [BEEF, "latest"],
                },
                {
                    "jsonrpc": "2.0",
                    "id": "old",
                    "method": "getAddressBalance",
                    "params": [BEEF, {"block_id": hex(mined - 1), "type": "Equals"}],
                },
            ],
        )
        assert [item["id"] for item in batch] == ["new", "old"]

        block0 = stack.rpc("trace_vendorBlock", "0x0")
        assert set(block0) == {"BlockFile", "Header", "StateDiff", "ValidationHash"}
        traced = stack.rpc("trace_vendorBlock", hex(mined))
        assert BEEF in traced["StateDiff"]["post"]

        checker = stack.url("8667")
        confirmed = wait_for(
            lambda: (r := stack.rpc("getLatestBlock", url=checker))["num"] >= mined and r,
            what="the checker to confirm the block",
        )
        assert confirmed["is_fork"] is False
        assert stack.rpc("blockIsValid", traced["Header"]["hash"], url=checker) is True
    finally:
        assert stack.stop() == 0, "".join(stack.output)

    stack = Stack(config, ports)
    stack.start()
    try:
        assert stack.rpc("eth_getBalance", BEEF, hex(mined)) == hex(10**18)
        assert int(stack.rpc("eth_blockNumber"), 16) >= mined
    finally:
        assert stack.stop() == 0, "".join(stack.output)

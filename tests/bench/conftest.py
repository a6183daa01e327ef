"""Fake nodes for the bench tests: in the test's own event loop, or as a real subprocess."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest

from bench.fakenode import FakeNode, FakeNodeSettings
from tests.conftest import free_port

START_TIMEOUT = 15.0  # seconds for a fake node subprocess to answer


@pytest.fixture
async def fake_node() -> AsyncIterator[Callable[..., Awaitable[FakeNode]]]:
    """Start fake nodes in the test's loop: `node = await fake_node(fail_every=10)`."""
    started: list[FakeNode] = []

    async def start(**settings: object) -> FakeNode:
        node = FakeNode(FakeNodeSettings(**settings))  # type: ignore[arg-type]
        await node.start()
        started.append(node)
        return node

    yield start
    for node in started:
        await node.stop()


def wait_http(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"fake node exited: {proc.stdout.read() if proc.stdout else ''}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("fake node did not start")


@pytest.fixture(scope="module")
def fake_node_process() -> Iterator[str]:
    """`python -m bench fake-node` as a subprocess that fails every 5th HTTP request."""
    port = free_port()
    cmd = [sys.executable, "-m", "bench", "fake-node", "--port", str(port), "--head", "500"]
    cmd += ["--fail-every", "5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/", proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

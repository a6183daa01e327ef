"""podman for the deploy tests: why it cannot run here (a skip reason), and the image, built once.

The image is built by deploy/image/build.sh, whose base and wheels are cached under
~/.cache/chainstate/image, so only the first run on a machine pays for debootstrap.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "deploy" / "image" / "build.sh"
# runc and capped limits: crun refuses this kind of host (docs/image.md "Hosts")
CONTAINERS_CONF = REPO / "deploy" / "image" / "containers.conf"
TAG = "localhost/chainstate:test"
BUILD_TIMEOUT = 900.0  # seconds: a cold build runs debootstrap and builds every wheel


def env() -> dict[str, str]:
    """The environment for podman: the project's containers.conf unless one is chosen."""
    return {"CONTAINERS_CONF": str(CONTAINERS_CONF), **os.environ}


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["podman", *args], env=env(), capture_output=True, text=True, check=check, timeout=timeout
    )


@functools.cache
def unavailable() -> str | None:
    """Why podman cannot run containers here, or None when it can."""
    if shutil.which("podman") is None:
        return "podman is not installed (`apt-get install podman runc`; ./dev test does it)"
    if os.geteuid() != 0:
        return "the image's base is made by debootstrap, which needs root"
    if shutil.which("debootstrap") is None:
        return "debootstrap is not installed (`apt-get install debootstrap`)"
    info = podman("info", "--format", "json", check=False)
    if info.returncode != 0:
        return f"`podman info` fails: {info.stderr.strip()[-300:]}"
    return cold()


def cold() -> str | None:
    """Why the image is not built by the suite here: a machine without a cached base would
    spend 7-8 minutes on debootstrap and wheels, past the whole suite's time budget. Once
    `deploy/image/build.sh` has run (or with CHAINSTATE_IMAGE_BUILD=1) the tests build and run
    the image; a warm build takes seconds."""
    if os.environ.get("CHAINSTATE_IMAGE_BUILD") == "1":
        return None
    home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    cache = Path(os.environ.get("CHAINSTATE_IMAGE_CACHE") or Path(home) / "chainstate" / "image")
    if any(cache.glob("base-*.tar")):
        return None
    return (
        f"no cached image base in {cache}: a cold build takes 7-8 minutes; run "
        "deploy/image/build.sh once, or set CHAINSTATE_IMAGE_BUILD=1"
    )


@functools.cache
def image() -> str:
    """The image's tag, built (or found up to date) once per test session."""
    result = subprocess.run(
        ["bash", str(BUILD), TAG],
        env=env(),
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, f"build.sh failed:\n{result.stderr[-3000:]}"
    return TAG


def rpc(url: str, method: str, *params: Any, timeout: float = 10) -> dict[str, Any]:
    """One JSON-RPC call; the whole response object (result or error)."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)})
    req = urllib.request.Request(
        url, data=body.encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def wait_for(url: str, method: str, *params: Any, timeout: float = 60) -> dict[str, Any]:
    """The first answer carrying a result, polling until `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            answer = rpc(url, method, *params)
            if answer.get("result") is not None:
                return answer
            last = answer
        except (OSError, urllib.error.URLError, ValueError) as exc:
            last = exc
        time.sleep(0.1)
    raise AssertionError(f"{method} at {url} gave no result in {timeout}s; last: {last!r}")

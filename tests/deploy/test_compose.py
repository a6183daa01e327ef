"""deploy/compose/compose.yaml brought up with Debian's podman-compose, as an operator does.

Eleven containers of the image on one podman network: etcd x3, Redis, anvil, a write node, a
state and an archive node, the checker and two proxies. A client reads through both proxies'
published ports, and a change made through one proxy's admin API (whose store is etcd-1)
reaches the other (whose store is etcd-2) through the etcd cluster.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import free_port
from tests.deploy import podman as pm

COMPOSE = pm.REPO / "deploy" / "compose" / "compose.yaml"
DEV = "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266"
DEV_BALANCE = hex(10_000 * 10**18)


def _unavailable() -> str | None:
    if shutil.which("podman-compose") is None:
        return "podman-compose is not installed (`apt-get install podman-compose`)"
    return pm.unavailable()


pytestmark = [
    pytest.mark.skipif(_unavailable() is not None, reason=f"{_unavailable()}"),
    pytest.mark.timeout(pm.BUILD_TIMEOUT + 240),
]


class Fleet:
    """One compose project; `down` removes its containers, volumes and network."""

    def __init__(self, image: str) -> None:
        self.project = f"cs{secrets.token_hex(4)}"
        self.token = secrets.token_hex(16)
        self.ports = (free_port(), free_port())
        self.env = {
            **pm.env(),
            "CHAINSTATE_IMAGE": image,
            "CHAINSTATE_ADMIN_TOKEN": self.token,
            "PROXY_1_ADDR": f"127.0.0.1:{self.ports[0]}",
            "PROXY_2_ADDR": f"127.0.0.1:{self.ports[1]}",
        }

    def compose(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
        cmd = ["podman-compose", "-p", self.project, "-f", str(COMPOSE), *args]
        return subprocess.run(
            cmd, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}/1337" for port in self.ports]

    def admin(self, url: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self.token}", "content-type": "application/json"}
        req = urllib.request.Request(url, data=data, headers=headers)
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def text(self, url: str) -> str:
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.read().decode()

    def logs(self) -> str:
        listed = pm.podman(
            "ps", "-a", "--filter", f"label=io.podman.compose.project={self.project}",
            "--format", "{{.Names}} {{.Status}}", check=False,
        )  # fmt: skip
        out = [listed.stdout]
        for line in listed.stdout.splitlines():
            name = line.split(" ", 1)[0]
            out.append(f"--- {name}\n{pm.podman('logs', '--tail', '20', name, check=False).stderr}")
        return "\n".join(out)

    def down(self) -> None:
        label = f"label=io.podman.compose.project={self.project}"
        ids = pm.podman("ps", "-aq", "--filter", label, check=False).stdout.split()
        if ids:
            pm.podman("rm", "--force", "--time", "2", *ids, check=False)
        volumes = pm.podman("volume", "ls", "-q", "--filter", label, check=False).stdout.split()
        if volumes:
            pm.podman("volume", "rm", "--force", *volumes, check=False)
        pm.podman("network", "rm", "--force", f"{self.project}_default", check=False)


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    fleet = Fleet(pm.image())
    try:
        up = fleet.compose("up", "-d")
        assert up.returncode == 0, f"podman-compose up failed:\n{up.stderr[-3000:]}"
        try:
            for url in fleet.urls():
                pm.wait_for(url, "eth_getBalance", DEV, "latest", timeout=120)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{fleet.logs()}") from None
        yield fleet
    finally:
        fleet.down()


def test_both_proxies_serve_reads_from_the_fleet(fleet: Fleet) -> None:
    for url in fleet.urls():
        assert pm.rpc(url, "eth_getBalance", DEV, "latest")["result"] == DEV_BALANCE
        assert int(pm.rpc(url, "eth_blockNumber")["result"], 16) >= 0
        nodes = fleet.admin(url + "/getAllNodes")["nodes"]
        assert {n["key"] for n in nodes} == {"state-1", "archive-1"}


def test_both_proxies_reach_etcd_and_share_redis_limits_and_cache(fleet: Fleet) -> None:
    deadline = time.monotonic() + 30
    healths: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        healths = [fleet.admin(url.removesuffix("/1337") + "/health") for url in fleet.urls()]
        tenancy = [h["tenancy"] for h in healths]
        if all(t["redis"] == "up" and t.get("fleet") == 2 for t in tenancy):
            break
        time.sleep(0.1)
    for health in healths:
        assert health["config_store"] == "available", health
        assert health["tenancy"]["redis"] == "up", health
        assert health["tenancy"]["limits"] == "shared", health
        assert health["tenancy"].get("fleet") == 2, health  # both proxies, seen through Redis
    tier_up = "\nchainstate_proxy_cache_tier_up 1.0\n"  # the shared cache tier is in use
    for url in fleet.urls():
        while time.monotonic() < deadline:
            metrics = fleet.text(url.removesuffix("/1337") + "/metrics")
            if tier_up in metrics:
                break
            time.sleep(0.1)
        assert tier_up in metrics, url


def test_the_checker_confirms_blocks_both_replicas_hold(fleet: Fleet) -> None:
    deadline = time.monotonic() + 60
    report: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        report = fleet.admin(fleet.urls()[1] + "/getAllNodes")["checker"]
        if report and report["error"] is None and (report["confirmed"] or 0) > 0:
            break
        time.sleep(0.1)
    assert report and report["error"] is None and (report["confirmed"] or 0) > 0, report


def test_a_change_through_one_proxy_reaches_the_other_through_etcd(fleet: Fleet) -> None:
    first, second = fleet.urls()
    fleet.admin(first + "/updateNode/archive-1", {"weight": 7})
    deadline = time.monotonic() + 15
    weights: dict[str, int] = {}
    while time.monotonic() < deadline:
        nodes = fleet.admin(second + "/getAllNodes")["nodes"]
        weights = {n["key"]: n["weight"] for n in nodes}
        if weights.get("archive-1") == 7:
            break
        time.sleep(0.25)
    assert weights.get("archive-1") == 7, weights


def test_compose_refuses_to_start_without_an_admin_token() -> None:
    fleet = Fleet(pm.TAG)
    del fleet.env["CHAINSTATE_ADMIN_TOKEN"]
    try:
        result = fleet.compose("--dry-run", "up", "-d", timeout=60)
    finally:
        fleet.down()
    assert result.returncode != 0
    assert "set CHAINSTATE_ADMIN_TOKEN" in result.stderr


def test_reads_and_changes_go_on_without_an_etcd_member_and_a_replica(fleet: Fleet) -> None:
    """Last: it stops containers. etcd keeps its quorum with two members of three, and the
    archive node answers what the stopped state node did."""
    for service in ("etcd-3", "state-1"):
        pm.podman("stop", "--time", "2", f"{fleet.project}_{service}_1")
    first, second = fleet.urls()
    for url in (first, second):
        for _ in range(5):
            assert pm.rpc(url, "eth_getBalance", DEV, "latest")["result"] == DEV_BALANCE
    fleet.admin(second + "/updateNode/archive-1", {"weight": 3})
    deadline = time.monotonic() + 15
    weight = None
    while time.monotonic() < deadline and weight != 3:
        nodes = fleet.admin(first + "/getAllNodes")["nodes"]
        weight = {n["key"]: n["weight"] for n in nodes}.get("archive-1")
        time.sleep(0.25)
    assert weight == 3

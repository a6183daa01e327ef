"""The image, built with podman and run as a user runs it.

A pod (its containers share one network namespace) runs anvil, a write node, a state node and
the proxy, each a container of the image started by its argument, configured by one mounted
TOML file whose `${...}` come from each container's environment. A client outside the pod
reads chain state through the proxy's published port.
"""

from __future__ import annotations

import secrets
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.deploy import podman as pm

POD_CONFIG = Path(__file__).parent / "pod"
DEV = "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266"  # a genesis account of configs/genesis.json
DEV_BALANCE = hex(10_000 * 10**18)

pytestmark = [
    pytest.mark.skipif(pm.unavailable() is not None, reason=f"{pm.unavailable()}"),
    pytest.mark.timeout(pm.BUILD_TIMEOUT + 120),
]


class Pod:
    """A podman pod of image containers, removed with everything in it at the end."""

    def __init__(self, image: str, port: int) -> None:
        self.image, self.port = image, port
        self.name = f"chainstate-test-{secrets.token_hex(4)}"

    def create(self) -> None:
        pm.podman("pod", "create", "--name", self.name, "-p", f"127.0.0.1:{self.port}:8663")

    def run(self, name: str, *args: str, env: dict[str, str]) -> None:
        env_args = [f"--env={k}={v}" for k, v in env.items()]
        pm.podman(
            "run", "-d", "--pod", self.name, "--name", f"{self.name}-{name}",
            f"--volume={POD_CONFIG}:/etc/chainstate:ro", *env_args, self.image, *args,
        )  # fmt: skip

    def logs(self) -> str:
        listed = pm.podman("ps", "-a", "--pod", "--format", "{{.Names}} {{.PodName}}", check=False)
        names = [n for n, _, pod in (line.partition(" ") for line in listed.stdout.splitlines())
                 if pod == self.name]  # fmt: skip
        return "\n".join(
            f"--- {n}\n{pm.podman('logs', '--tail', '30', n, check=False).stderr}" for n in names
        )

    def remove(self) -> None:
        pm.podman("pod", "rm", "--force", "--time", "2", self.name, check=False)


@pytest.fixture(scope="module")
def image() -> str:
    return pm.image()


@pytest.fixture(scope="module")
def devnet_pod(image: str) -> Iterator[tuple[str, str]]:
    """The pod's proxy URL and admin token, once its state node answers through the proxy."""
    token = secrets.token_hex(16)
    pod = Pod(image, free_port())
    env = {"ANVIL_PORT": "8545", "ADMIN_TOKEN": token, "CHAINSTATE_LOG_LEVEL": "info"}
    pod.create()
    try:
        pod.run("anvil", "devnet", "anvil", "--port", "8545", "--block-time", "1", env=env)
        pod.run("writer", "write-node", env=env)
        pod.run("state", "state-node", "--key", "state-1", env=env)
        pod.run("proxy", "proxy", "--store", ":memory:", env=env)
        url = f"http://127.0.0.1:{pod.port}/1337"
        try:
            pm.wait_for(url, "eth_getBalance", DEV, "latest", timeout=90)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{pod.logs()}") from None
        yield url, token
    finally:
        pod.remove()


def test_proxy_serves_state_from_the_state_node_container(devnet_pod: tuple[str, str]) -> None:
    url, _ = devnet_pod
    assert pm.rpc(url, "eth_chainId")["result"] == "0x539"
    head = int(pm.rpc(url, "eth_blockNumber")["result"], 16)
    assert head >= 0
    # the genesis allocation, read by the state node from what the write node emitted
    assert pm.rpc(url, "eth_getBalance", DEV, "latest")["result"] == DEV_BALANCE
    answer = pm.rpc(url, "eth_getBalance", "0xnot-an-address", "latest")
    assert answer["error"]["code"] == -32602


def test_admin_token_comes_from_the_environment(devnet_pod: tuple[str, str]) -> None:
    url, token = devnet_pod
    nodes = url + "/getAllNodes"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(nodes, timeout=10)
    assert refused.value.code == 401
    req = urllib.request.Request(nodes, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert b"state-1" in resp.read()


def test_unset_variable_in_the_config_stops_the_container(image: str) -> None:
    result = pm.podman(
        "run", "--rm", f"--volume={POD_CONFIG}:/etc/chainstate:ro", "--env=ADMIN_TOKEN=x",
        image, "write-node", check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "${ANVIL_PORT} is not set in the environment" in result.stderr


def test_commands_without_config_run_by_argument(image: str) -> None:
    result = pm.podman("run", "--rm", image, "checker", "--help")
    assert "--replica" in result.stdout
    result = pm.podman("run", "--rm", image, "state-node", check=False)
    assert result.returncode == 2
    assert "--source" in result.stderr

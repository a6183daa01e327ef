"""The fleet of docs/deploy.md on test hosts: every component on its own host, started with the
same `chainstate` commands an operator runs, talking over the hosts' 10.x addresses."""

from __future__ import annotations

import json
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.fleet.netns import Host, Network

ROOT = Path(__file__).resolve().parents[2]
CHAINSTATE = [sys.executable, "-m", "stack.cli"]
ETCD_NAME = "etcd"  # the name every proxy resolves to the three etcd members
TOKEN = "fleet-admin-token"
CHAIN = "1337"
PORTS = {"etcd": 2379, "peer": 2380, "writer": 8664, "state": 8665, "checker": 8667}
PROXY_PORT = 8663


def http(
    url: str,
    body: Any = None,
    *,
    admin: bool = False,
    timeout: float = 3.0,
) -> tuple[int, Any]:
    """(status, JSON answer) of a GET, or of a POST when `body` is given."""
    headers = {"content-type": "application/json"}
    if admin:
        headers["authorization"] = f"Bearer {TOKEN}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def wait_for(what: str, check: Any, within: float, logs: Path | None = None) -> Any:
    """Poll `check()` until it returns something true; its last error is in the failure."""
    deadline = time.monotonic() + within
    last: Any = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
            last = value
        except (OSError, ValueError, KeyError, TypeError) as exc:
            last = exc
        time.sleep(0.2)
    where = f"; logs in {logs}" if logs else ""
    raise AssertionError(f"{what} not within {within} s (last: {last!r}){where}")


class Fleet:
    """Hosts: etcd-1..3, writer (anvil and the write node), state, archive, checker,
    proxy-1, proxy-2, client."""

    def __init__(self, net: Network, data: Path) -> None:
        self.net = net
        self.data = data
        self.etcd = [net.add_host(f"etcd-{i}") for i in (1, 2, 3)]
        members = {ETCD_NAME: [h.address for h in self.etcd]}
        self.writer = net.add_host("writer")
        self.state = net.add_host("state")
        self.archive = net.add_host("archive")
        self.checker = net.add_host("checker")
        self.proxies = [net.add_host(f"proxy-{i}", etc_hosts=members) for i in (1, 2)]
        self.client = net.add_host("client")
        self.etcd_procs: dict[str, Any] = {}

    # -- addresses ---------------------------------------------------------------------

    def url(self, host: Host, port: int) -> str:
        return f"http://{host.address}:{port}"

    def rpc_url(self, proxy: Host) -> str:
        return f"{self.url(proxy, PROXY_PORT)}/{CHAIN}"

    def admin(self, proxy: Host, path: str, body: Any = None) -> tuple[int, Any]:
        return http(f"{self.url(proxy, PROXY_PORT)}/{path}", body, admin=True)

    # -- starting ----------------------------------------------------------------------

    def start(self) -> None:
        for host in self.etcd:
            self.start_etcd(host)
        self.start_writer()
        self.start_state(self.state, "state-1", "state")
        self.start_state(self.archive, "archive-1", "archive")
        self.start_checker()
        for proxy in self.proxies:
            self.start_proxy(proxy)

    def start_etcd(self, host: Host) -> None:
        cluster = ",".join(f"{h.name}={self.url(h, PORTS['peer'])}" for h in self.etcd)
        client, peer = self.url(host, PORTS["etcd"]), self.url(host, PORTS["peer"])
        cmd = [
            "etcd",
            f"--name={host.name}",
            f"--data-dir={self.data / host.name}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={cluster}",
            f"--initial-cluster-token={self.net.tag}",
            "--initial-cluster-state=new",
            "--logger=zap",
            "--log-level=warn",
        ]
        # SIGKILL at the end: a leader stopped gracefully first hands its leadership to a
        # member, which waits out etcd's timeout while the other members stop too (the
        # cluster's data is thrown away with the test's)
        self.etcd_procs[host.name] = self.net.start(host, "etcd", cmd, stop_signal=signal.SIGKILL)

    def start_writer(self) -> None:
        anvil = ["devnet", "anvil", "--host", "127.0.0.1", "--port", "8545", "--block-time", "1"]
        self.net.start(self.writer, "anvil", [*CHAINSTATE, *anvil])
        writer = [
            "write-node",
            "--execution-url", "http://127.0.0.1:8545",
            "--host", self.writer.address,
            "--port", str(PORTS["writer"]),
            "--data-dir", str(self.data / "writer"),
            "--poll-interval", "0.25",
        ]  # fmt: skip
        self.net.start(self.writer, "write-node", [*CHAINSTATE, *writer])

    def start_state(self, host: Host, key: str, kind: str) -> None:
        cmd = [
            "state-node",
            "--key", key,
            "--kind", kind,
            "--source", self.url(self.writer, PORTS["writer"]),
            "--host", host.address,
            "--port", str(PORTS["state"]),
            "--data-dir", str(self.data / key),
        ]  # fmt: skip
        self.net.start(host, "state-node", [*CHAINSTATE, *cmd])

    def start_checker(self) -> None:
        replicas = [self.url(h, PORTS["state"]) for h in (self.state, self.archive)]
        cmd = ["checker", "--listen", f"{self.checker.address}:{PORTS['checker']}"]
        for replica in replicas:
            cmd += ["--replica", replica]
        cmd += ["--data-dir", str(self.data / "checker")]
        self.net.start(self.checker, "checker", [*CHAINSTATE, *cmd])

    def proxy_config(self) -> Path:
        """The one config file every proxy runs with: it seeds etcd with the nodes, the
        writer and the checker (the first proxy to start writes them)."""
        path = self.data / "proxy.toml"
        state = self.url(self.state, PORTS["state"])
        archive = self.url(self.archive, PORTS["state"])
        path.write_text(
            f"""[proxy]
head_poll_interval = 0.5
poll_timeout = 2.0

[[proxy.nodes]]
chain = "{CHAIN}"
key = "state-1"
url = "{state}"
kind = "state"

[[proxy.nodes]]
chain = "{CHAIN}"
key = "archive-1"
url = "{archive}"
kind = "archive"

[[proxy.writers]]
chain = "{CHAIN}"
key = "writer-1"
url = "{self.url(self.writer, PORTS["writer"])}"
leader = true

[[proxy.checkers]]
chain = "{CHAIN}"
url = "{self.url(self.checker, PORTS["checker"])}"
"""
        )
        return path

    def start_proxy(self, host: Host) -> None:
        cmd = [
            "proxy",
            "--host", host.address,
            "--port", str(PROXY_PORT),
            "--config", str(self.proxy_config()),
            "--store", f"etcd://{ETCD_NAME}:{PORTS['etcd']}/chainstate/",
            "--admin-token", TOKEN,
        ]  # fmt: skip
        self.net.start(host, "proxy", [*CHAINSTATE, *cmd])

    def start_client(self, out: Path) -> Any:
        urls = [self.rpc_url(p) for p in self.proxies]
        return self.net.start(
            self.client, "client", [sys.executable, "-m", "tests.fleet.client", str(out), *urls]
        )

    # -- readiness ---------------------------------------------------------------------

    def wait_ready(self, within: float) -> None:
        """Both proxies route to both nodes, both nodes have blocks, and the checker has
        confirmed one."""
        deadline = time.monotonic() + within

        def nodes_ready(proxy: Host) -> bool:
            status, answer = self.admin(proxy, f"{CHAIN}/getAllNodes")
            nodes = answer.get("nodes", []) if status == 200 else []
            return len(nodes) == 2 and all(n["healthy"] and n.get("head") for n in nodes)

        def confirmed() -> bool:
            body = {"jsonrpc": "2.0", "id": 1, "method": "getLatestBlock", "params": []}
            _, answer = http(self.url(self.checker, PORTS["checker"]), body)
            return (answer.get("result") or {}).get("num", 0) > 0

        for proxy in self.proxies:
            what, left = f"{proxy.name} routing to both nodes", deadline - time.monotonic()
            wait_for(what, lambda p=proxy: nodes_ready(p), left, self.net.logs)
        wait_for("a confirmed block", confirmed, deadline - time.monotonic(), self.net.logs)

    def etcd_leader(self) -> str:
        """The name of the member that leads the etcd cluster now."""
        for host in self.etcd:
            if self.etcd_procs[host.name].poll() is not None:
                continue
            try:
                _, status = http(f"{self.url(host, PORTS['etcd'])}/v3/maintenance/status", {})
            except OSError:
                continue
            if status.get("leader") == status.get("header", {}).get("member_id"):
                return host.name
        return ""

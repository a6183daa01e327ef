"""Hosts as Linux network namespaces on one bridge, for tests of a fleet on several hosts.

Each host is a namespace with its own 10.x address on a veth pair whose other end is a port
of a bridge in the root namespace. The root namespace holds the bridge's own address: it is
the operator's machine (admin calls, readiness probes). Cutting a host off is setting its
bridge port down, as a pulled cable: packets are dropped, nothing answers with a reset.

Names carry the test process's pid, so parallel runs never collide and a later run can
remove what a killed run left behind (`sweep`).
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "csf"  # every namespace and link this module makes starts with it
NETNS_ETC = Path("/etc/netns")  # `ip netns exec NS` mounts /etc/netns/NS/hosts on /etc/hosts


def ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace_processes(ns: str) -> None:
    """SIGKILL every process in the namespace (ours: the namespace is ours)."""
    for _ in range(20):
        pids = [int(p) for p in ip("netns", "pids", ns, check=False).split()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def _delete_namespace(ns: str) -> None:
    _kill_namespace_processes(ns)
    ip("netns", "del", ns, check=False)
    shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)


def sweep() -> None:
    """Remove namespaces, bridges and bridge ports left by runs whose process is gone (a
    killed pytest)."""
    owned = re.compile(rf"^{PREFIX}(\d+)")
    for line in ip("netns", "list", check=False).splitlines():
        name = line.split()[0] if line.strip() else ""
        m = owned.match(name)
        if m and not _alive(int(m.group(1))):
            _delete_namespace(name)
    for line in ip("-o", "link", "show", check=False).splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        m = owned.match(name)
        if m and not _alive(int(m.group(1))):
            ip("link", "del", name, check=False)


def free_subnet() -> str:
    """A 10.a.b.0/24 (as `10.a.b`) that no route of the root namespace uses."""
    routes = ip("-4", "route", "show", "table", "all", check=False)
    for _ in range(200):
        net = f"10.{random.randint(100, 199)}.{random.randint(0, 255)}"
        if f"{net}." not in routes:
            return net
    raise RuntimeError("no free 10.x.y.0/24 for the test network")


@dataclass
class Host:
    name: str
    ns: str
    address: str
    port_link: str  # the bridge port (root namespace side of the veth pair)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)


class Network:
    """A bridge and its hosts. `close()` kills every process in every host and removes it all."""

    def __init__(self, logs: Path) -> None:
        self.tag = f"{PREFIX}{os.getpid()}"
        self.logs = logs
        self.net = free_subnet()
        self.bridge = f"{self.tag}b"
        self.operator = f"{self.net}.1"  # this process, in the root namespace
        self.hosts: dict[str, Host] = {}
        self.stop_signals: dict[int, int] = {}  # pid -> the signal `close()` stops it with
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.operator}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")

    def add_host(self, name: str, etc_hosts: dict[str, list[str]] | None = None) -> Host:
        """A namespace with one address; `etc_hosts` maps names to addresses in its
        /etc/hosts (a name with several addresses, as a DNS name with several A records)."""
        index = len(self.hosts) + 2
        ns = f"{self.tag}-{name}"
        link = f"{self.tag}p{index}"
        address = f"{self.net}.{index}"
        ip("netns", "add", ns)
        host = Host(name, ns, address, link)
        self.hosts[name] = host
        ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip("link", "set", link, "master", self.bridge)
        ip("link", "set", link, "up")
        ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        ip("-n", ns, "link", "set", "lo", "up")
        lines = ["127.0.0.1 localhost", f"{address} {name}"]
        for hostname, addresses in (etc_hosts or {}).items():
            lines += [f"{a} {hostname}" for a in addresses]
        (NETNS_ETC / ns).mkdir(parents=True, exist_ok=True)
        (NETNS_ETC / ns / "hosts").write_text("\n".join(lines) + "\n")
        return host

    def start(
        self,
        host: Host,
        name: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        stop_signal: int = signal.SIGTERM,
    ) -> subprocess.Popen[bytes]:
        """Run argv inside the host; output goes to logs/<host>-<name>.log. `close()` stops
        it with `stop_signal`."""
        log = (self.logs / f"{host.name}-{name}.log").open("ab")
        proc = subprocess.Popen(
            ["ip", "netns", "exec", host.ns, *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        log.close()
        host.procs.append(proc)
        self.stop_signals[proc.pid] = stop_signal
        return proc

    def cut(self, host: Host) -> None:
        """The host's cable pulled: its bridge port goes down."""
        ip("link", "set", host.port_link, "down")

    def reconnect(self, host: Host) -> None:
        ip("link", "set", host.port_link, "up")

    def connections(self, host: Host, port: int) -> set[str]:
        """Peer addresses of the host's established TCP connections to `port`."""
        out = subprocess.run(
            ["ip", "netns", "exec", host.ns, "ss", "-Htn", "state", "established"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        peers = set()
        for line in out.splitlines():
            cols = line.split()
            if len(cols) >= 4 and cols[-1].endswith(f":{port}"):
                peer = cols[-1].rsplit(":", 1)[0].strip("[]")
                peers.add(peer.removeprefix("::ffff:"))  # IPv4 as seen by a dual-stack socket
        return peers

    def close(self) -> None:
        for host in self.hosts.values():
            for proc in host.procs:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, self.stop_signals.get(proc.pid, signal.SIGTERM))
        deadline = time.monotonic() + 5
        for host in self.hosts.values():
            for proc in host.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(max(0.1, deadline - time.monotonic()))
        for host in self.hosts.values():
            _delete_namespace(host.ns)
            # the kernel frees a deleted namespace's links later; ours go now
            ip("link", "del", host.port_link, check=False)
            for proc in host.procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(5)
        ip("link", "del", self.bridge, check=False)

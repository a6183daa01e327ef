"""Benchmark suites: start the services under test, load them, print each figure as a ratio.

`suite proxy` starts a fake node, `chainstate proxy` in front of it and, as a compiled
reference, Go's standard-library reverse proxy (bench/goproxy, built with the machine's `go`;
skipped, and said so, without it) as subprocesses on free loopback ports, then measures the
same requests against the fake node directly and through each proxy (single requests,
batches of 10 and of 100, and single requests on one connection for the added latency), so
the ratios are the cost of a proxy. On a machine with two or more cores both proxies are
pinned to one core and the load generator and fake node share another, as in TRIED.md's
anchors; each proxy's CPU time per request is measured too, since the load core can cap
the throughput of the faster one.

`suite state` starts anvil (with the devnet workload), a write node, an archive state node
and the proxy, and compares eth_getBalance/eth_getStorageAt at random heights on the state
node, through the proxy and on anvil. `suite call` does the same set-up plus a storage-heavy
view contract and compares eth_call (ERC20 balanceOf, the view) at latest and old heights,
single and batched, against anvil.

A suite is a class with `name`, `start(services, opts)` → {label: url} (the first label is
the baseline) and `cases()`; adding one is a new class in SUITES. Everything started is
stopped on exit, error, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Protocol

import psutil

from bench.bodies import BlockRange, BodyPlan, balance_of, fake_addresses
from bench.contracts import view_init_code, write_data
from bench.loadgen import BenchResult, LoadSettings, run_bench
from bench.services import (
    READY_TIMEOUT,
    Services,
    cpu_seconds,
    free_port,
    python_cmd,
    rpc_call,
    running,
    split_cpus,
)
from nodes.devnet.workload import erc20_transfer_data

FAKE_HEAD = 1_000_000  # the fake node's head; cases read random heights just below it
FAKE_WINDOW = 128  # the fake node's state window (blocks)
SUITE_CHAIN_ID = 1337
STATE_EXTRA_BLOCKS = 200  # blocks mined after the devnet workload for `suite state`
STATE_SLOTS = 17  # storage slots 0..16 of the workload's storage contract
SYNC_TIMEOUT = 180.0  # seconds for the state node to ingest up to anvil's head
LOG_TRANSFERS = 256  # ERC20 transfers (one block each) mined for `suite logs`
LOG_SPAN = 100  # blocks per eth_getLogs range in `suite logs`
LOG_WIDE = 1000  # blocks per eth_getLogs range of the wide case of `suite logs`
LOG_GAP = 3  # empty blocks mined after each transfer of `suite logs` (the chain outgrows LOG_WIDE)
TRANSFER_TOPIC = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"
VIEW_WRITES = 64  # blocks after the view's deployment that each rewrite one of its slots
CALL_BATCH = 10  # eth_calls per batched request in `suite call`
PROXY_STATE_WINDOW = 128  # the proxy's default state_window: older heights are "old"
GO_PROXY_SOURCE = Path(__file__).parent / "goproxy" / "main.go"
GO_BUILD_TIMEOUT = 300.0  # seconds for `go build` of the reference proxy (first build: slow)
# A case's duration is split into rounds, each measuring every target in turn (the order
# reversed every other round), so a slow spell of this shared machine falls on every target
# alike; per-core ratios are the median of each round's (bench/README.md "Rounds").
ROUNDS = 3
MIN_ROUND_S = 0.5  # fewer rounds when a round would be shorter
ROUND_WARMUP_S = 0.3  # warm-up of each target in the rounds after the first (capped by --warmup)


@dataclass(frozen=True)
class Launch:
    """How a state suite starts its state-node processes (the state node, proxy-inproc):
    as they are, or under a tool (`bench.realprocs callgrind`: valgrind, an LMDB map it can
    reserve, and the longer waits its slowness needs)."""

    tool: tuple[str, ...] = ()  # the command they run under
    map_size_mb: int | None = None  # their stores' LMDB map (None: the node's default)
    ready_timeout: float = READY_TIMEOUT
    sync_timeout: float = SYNC_TIMEOUT

    def command(self, *args: str) -> list[str]:
        return [*self.tool, *python_cmd(*args)]


@dataclass(frozen=True)
class Case:
    """One measured load: a body plan sent to every target of the suite (on `concurrency`
    connections when set, else the suite's); `also`: targets measured in this case only (a
    target some case names in `also` is left out of every other case)."""

    name: str
    plan: BodyPlan
    concurrency: int | None = None
    also: tuple[str, ...] = ()


@dataclass
class SuiteOptions:
    """How long and how hard each measurement of a suite runs."""

    duration: float = 5.0
    warmup: float = 1.0
    concurrency: int = 64
    pin: bool = True
    cases: list[str] | None = None  # names to run; None = all
    keep_dir: str | None = None
    evm: dict[str, Any] = field(default_factory=dict)  # the state node's [evm] settings
    reference: bool = True  # `suite proxy`: also measure Go's reverse proxy (when go exists)
    proxy: dict[str, Any] = field(default_factory=dict)  # more [proxy] settings, every proxy
    rounds: int = ROUNDS  # each case's targets measured in turn this many times (`rounds_of`)


class Suite(Protocol):
    name: ClassVar[str]

    def start(self, services: Services, opts: SuiteOptions) -> dict[str, str]:
        """Start what is measured; {label: url}, the first label is the baseline."""
        ...

    def cases(self) -> list[Case]: ...


def serving_pids(services: Services, targets: dict[str, str]) -> dict[str, int]:
    """{target label: pid} of the started service listening where each target points (its
    CPU time per request is measured)."""
    out = {}
    for label, url in targets.items():
        where = urllib.parse.urlsplit(url).netloc
        for svc in services.started:
            if svc.proc is not None and urllib.parse.urlsplit(svc.ready_url).netloc == where:
                out[label] = svc.proc.pid
    return out


def balance_mix(batch: int) -> BodyPlan:
    """eth_getBalance at random heights inside the fake node's state window."""
    return BodyPlan(
        mix=[("eth_getBalance", 1.0)],
        batch=batch,
        blocks=BlockRange(FAKE_HEAD - FAKE_WINDOW // 2, FAKE_HEAD),
        addresses=fake_addresses(1000),
    )


C1_CASE = "single-c1"
POLL_TARGET = "proxy-busy-poll"
KEY_CASE = "single-key"
KEY_TARGET = "proxy-key"  # the same proxy, with an API key with two limits in the path
POLL_US = 250  # the busy polling window the latency option is measured with (µs)


def start_fake_node(services: Services, cpus: list[int] | None) -> str:
    """The suite's fake state node (FAKE_HEAD, FAKE_WINDOW, SUITE_CHAIN_ID); its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    services.start(
        "fake-node",
        python_cmd(
            "-m", "bench", "fake-node", "--port", str(port),
            "--kind", "state", "--head", str(FAKE_HEAD), "--window", str(FAKE_WINDOW),
            "--chain-id", str(SUITE_CHAIN_ID),
        ),
        url,
        cpus,
    )  # fmt: skip
    return url


class ProxySuite:
    """The proxy in front of a fake node vs the fake node directly, and vs Go's reverse proxy
    on the same core (the compiled reference of what one core can do)."""

    name: ClassVar[str] = "proxy"

    def __init__(self) -> None:
        self.notes: list[str] = []

    def start(self, services: Services, opts: SuiteOptions) -> dict[str, str]:
        proxy_cpus, load_cpus = split_cpus() if opts.pin else (None, None)
        fake_url, proxy_port = start_fake_node(services, load_cpus), free_port()
        config = services.workdir / "proxy.toml"
        config.write_text(proxy_config(fake_url, extra=setting_lines(opts.proxy)))
        proxy_url = f"http://127.0.0.1:{proxy_port}/{SUITE_CHAIN_ID}"
        services.start("proxy", self.proxy_command(proxy_port, config), proxy_url, proxy_cpus)
        targets = {"direct": fake_url, "proxy": proxy_url}
        if opts.cases is None or KEY_CASE in opts.cases:
            key = self.make_key(f"http://127.0.0.1:{proxy_port}")
            targets[KEY_TARGET] = f"{proxy_url}/{key}"
            self.note(
                f"{KEY_TARGET}: the same proxy, the requests with an API key in the path whose "
                "key and project each have a requests_per_second limit (never reached), "
                f"measured in {KEY_CASE} only"
            )
        if self.poll_wanted(opts):
            targets[POLL_TARGET] = self.start_poll_proxy(services, fake_url, proxy_cpus, opts)
        if opts.reference:
            go_url = self.start_go_proxy(services, fake_url, proxy_cpus)
            if go_url is not None:
                targets["go-proxy"] = go_url
        return targets

    @staticmethod
    def poll_wanted(opts: SuiteOptions) -> bool:
        """Only when the c=1 case runs and --proxy did not set busy polling itself."""
        wanted = opts.cases is None or C1_CASE in opts.cases
        return wanted and "busy_poll_us" not in opts.proxy

    def start_poll_proxy(
        self, services: Services, node_url: str, cpus: list[int] | None, opts: SuiteOptions
    ) -> str:
        """A second proxy, the same but with busy polling on, measured at c=1 only: what the
        latency option `busy_poll_us` takes off the added latency (on a VM whose idle vCPUs
        halt, most of it), beside the default (off)."""
        port = free_port()
        settings = {**opts.proxy, "busy_poll_us": POLL_US}
        config = services.workdir / f"{POLL_TARGET}.toml"
        config.write_text(proxy_config(node_url, extra=setting_lines(settings)))
        url = f"http://127.0.0.1:{port}/{SUITE_CHAIN_ID}"
        services.start(POLL_TARGET, self.proxy_command(port, config), url, cpus)
        self.note(
            f"{POLL_TARGET}: the same proxy with busy_poll_us = {POLL_US} (default 0, off), on "
            f"the proxy's core, measured in {C1_CASE} only"
        )
        return url

    def start_go_proxy(
        self, services: Services, node_url: str, cpus: list[int] | None
    ) -> str | None:
        """Build and start bench/goproxy (GOMAXPROCS=1, on the proxy's core); None, with a
        note saying why, when `go` is missing or the build fails."""
        go = shutil.which("go")
        if go is None:
            self.note("go not found: Go's reverse proxy is not measured (./dev test installs go)")
            return None
        binary = services.workdir / "goproxy"
        env = {**os.environ, "GOMAXPROCS": "1", "CGO_ENABLED": "0", "GO111MODULE": "off"}
        built = subprocess.run(
            [go, "build", "-o", str(binary), str(GO_PROXY_SOURCE)],
            capture_output=True,
            text=True,
            timeout=GO_BUILD_TIMEOUT,
            env=env,
            check=False,
        )
        if built.returncode != 0:
            self.note(f"go build of bench/goproxy failed, not measured: {built.stderr[-500:]}")
            return None
        port = free_port()
        cmd = ["env", "GOMAXPROCS=1", str(binary), "-listen", f"127.0.0.1:{port}"]
        url = f"http://127.0.0.1:{port}/{SUITE_CHAIN_ID}"
        services.start("go-proxy", [*cmd, "-upstream", node_url], url, cpus)
        self.note(
            f"go-proxy: Go {go_version(go)} net/http/httputil.ReverseProxy, GOMAXPROCS=1, "
            "MaxIdleConnsPerHost 256, on the proxy's core"
        )
        return url

    def make_key(self, admin_url: str) -> str:
        """An API key with two limits on the proxy under test (bench/tenantkey.py)."""
        from bench.tenantkey import create_over_admin

        return create_over_admin(admin_url)

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"suite proxy: {text}", file=sys.stderr, flush=True)

    def proxy_command(self, port: int, config: Path) -> list[str]:
        """How the proxy under test is started (a test may swap in another server)."""
        return python_cmd(
            "-m", "stack.cli", "proxy",
            "--host", "127.0.0.1", "--port", str(port), "--config", str(config),
            "--store", ":memory:",  # nothing persisted: each run starts from the config
        )  # fmt: skip

    def cases(self) -> list[Case]:
        return [
            Case("single", balance_mix(1)),
            Case("batch10", balance_mix(10)),
            Case("batch100", balance_mix(100)),
            # the latency a proxy adds, by default and with busy polling on
            Case(C1_CASE, balance_mix(1), concurrency=1, also=(POLL_TARGET,)),
            # what a key with two limits costs beside anonymous requests (docs/tenancy.md)
            Case(KEY_CASE, balance_mix(1), also=(KEY_TARGET,)),
        ]


def go_version(go: str) -> str:
    done = subprocess.run([go, "version"], capture_output=True, text=True, check=False)
    parts = done.stdout.split()
    return parts[2].removeprefix("go") if len(parts) > 2 else "?"


def proxy_config(node_url: str, kinds: tuple[str, ...] = ("state",), extra: str = "") -> str:
    """The proxy's TOML: one chain served by one node, entered once per kind (an archive
    state node can answer as both, so every height has a node to go to); `extra`: more
    `[proxy]` settings lines."""
    out = '[proxy]\nhost = "127.0.0.1"\n' + extra
    for kind in kinds:
        out += (
            "\n[[proxy.nodes]]\n"
            f'chain = "{SUITE_CHAIN_ID}"\n'
            f'key = "bench-{kind}"\n'
            f'url = "{node_url}"\n'
            f'kind = "{kind}"\n'
            "weight = 1\n"
        )
    return out


INPROC_NODE = "bench-inproc"  # the in-process state node's key (its URL: inproc://bench-inproc)


def inproc_config(
    data_dir: Path,
    writer: str,
    node_port: int,
    proxy_port: int,
    evm: dict[str, Any],
    extra: str = "",
    map_size_mb: int | None = None,
) -> str:
    """bench/inprocstack.py's TOML: one archive state node following `writer`, and the proxy
    with that node entered as a state and an archive node, reached in process; `extra`: more
    `[proxy]` settings lines; `map_size_mb`: the node's LMDB map (None: its default)."""
    lines = [
        f"data_dir = {json.dumps(str(data_dir))}",
        "",
        "[[state_nodes]]",
        f'key = "{INPROC_NODE}"',
        'kind = "archive"',
        'host = "127.0.0.1"',
        f"port = {node_port}",
        f'source = "{writer}"',
        f"chain_id = {SUITE_CHAIN_ID}",
    ]
    lines += [] if map_size_mb is None else [f"map_size_mb = {map_size_mb}"]
    if evm:
        lines += ["", "[state_nodes.evm]"]
        lines += [f"{name} = {json.dumps(value)}" for name, value in evm.items()]
    proxy = proxy_config(f"inproc://{INPROC_NODE}", kinds=("state", "archive"), extra=extra)
    proxy = proxy.replace("[proxy]\n", f"[proxy]\nport = {proxy_port}\n", 1)
    return "\n".join(lines) + "\n\n" + proxy


def proxy_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("proxy.cli") is not None


class StateSuite:
    """A real state node (fed by a write node following anvil) vs the proxy vs anvil.

    Set-up: anvil with the devnet genesis, the deterministic devnet workload (contracts,
    ERC20, storage) and STATE_EXTRA_BLOCKS more blocks; a write node following anvil; an
    archive state node ingesting from the write node until it holds anvil's head; and, when
    the proxy exists, `chainstate proxy` in front of the state node. Cases read balances and
    storage slots of the workload's accounts at random heights of the whole chain."""

    name: ClassVar[str] = "state"

    def __init__(self, launch: Launch | None = None) -> None:
        self.launch = launch or Launch()
        self.head = 0
        self.writer = ""  # the write node's URL (start_chain)
        self.accounts: list[str] = []
        self.storage_contract = ""

    def start(self, services: Services, opts: SuiteOptions) -> dict[str, str]:
        svc_cpus, _ = split_cpus() if opts.pin else (None, None)
        anvil, state = self.start_chain(services, opts, "archive")
        targets = {"state-node": state}
        if proxy_available():
            proxy_port = free_port()
            config = services.workdir / "proxy.toml"
            extra = setting_lines(opts.proxy)
            config.write_text(proxy_config(state, kinds=("state", "archive"), extra=extra))
            proxy = f"http://127.0.0.1:{proxy_port}/{SUITE_CHAIN_ID}"
            services.start("proxy", ProxySuite().proxy_command(proxy_port, config), proxy, svc_cpus)
            targets["proxy"] = proxy
            targets["proxy-inproc"] = self._start_inproc(services, self.writer, svc_cpus, opts)
            # a proxy learns the head by polling its nodes (head_poll_interval): `latest`
            # through it is the workload's head only once it has
            for url in (proxy, targets["proxy-inproc"]):
                self._wait_synced(url)
        targets["anvil"] = anvil
        return targets

    def start_chain(self, services: Services, opts: SuiteOptions, kind: str) -> tuple[str, str]:
        """anvil with the workload's blocks, a write node and a state node of `kind` that
        holds anvil's head: (anvil URL, state node URL)."""
        svc_cpus, _ = split_cpus() if opts.pin else (None, None)
        anvil_port, writer_port, state_port = free_port(), free_port(), free_port()
        anvil = f"http://127.0.0.1:{anvil_port}"
        services.start(
            "anvil",
            python_cmd("-m", "stack.cli", "devnet", "anvil", "--port", str(anvil_port)),
            anvil,
            svc_cpus,
        )
        self._make_blocks(anvil, services.workdir)
        writer = f"http://127.0.0.1:{writer_port}"
        services.start(
            "write-node",
            python_cmd(
                "-m", "stack.cli", "write-node", "--execution-url", anvil,
                "--port", str(writer_port), "--data-dir", str(services.workdir / "writer"),
                "--poll-interval", "0.25",
            ),
            writer + "/health",
            svc_cpus,
            probe=None,
        )  # fmt: skip
        state = f"http://127.0.0.1:{state_port}"
        launch = self.launch
        services.start(
            "state-node",
            launch.command(
                "-m", "stack.cli", "state-node", "--key", "bench-state", "--kind", kind,
                "--source", writer, "--port", str(state_port), "--chain-id", str(SUITE_CHAIN_ID),
                "--data-dir", str(services.workdir / "state"),
                *evm_config_args(services.workdir, opts.evm, launch.map_size_mb),
            ),
            state,
            svc_cpus,
            ready_timeout=launch.ready_timeout,
        )  # fmt: skip
        self._wait_synced(state)
        self.writer = writer
        return anvil, state

    def _start_inproc(
        self, services: Services, writer: str, cpus: list[int] | None, opts: SuiteOptions
    ) -> str:
        """The `chainstate up` shape: a second archive state node following the same write
        node and the proxy reaching it in process, one process (bench/inprocstack.py), with
        the suite's `--evm` and `--proxy` settings."""
        node_port, proxy_port = free_port(), free_port()
        config = services.workdir / "inproc.toml"
        workdir = services.workdir / "inproc"
        extra = setting_lines(opts.proxy)
        launch = self.launch
        text = inproc_config(
            workdir, writer, node_port, proxy_port, opts.evm, extra, launch.map_size_mb
        )
        config.write_text(text)
        proxy = f"http://127.0.0.1:{proxy_port}/{SUITE_CHAIN_ID}"
        cmd = launch.command("-m", "bench.inprocstack", "--config", str(config))
        services.start("proxy-inproc", cmd, proxy, cpus, ready_timeout=launch.ready_timeout)
        self._wait_synced(f"http://127.0.0.1:{node_port}")
        return proxy

    def _make_blocks(self, anvil: str, workdir: Path) -> None:
        cmd = python_cmd(
            "-m", "stack.cli", "devnet", "workload", "--url", anvil, "--no-reorg", "--json"
        )  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"devnet workload failed: {done.stderr[-2000:]}")
        record = json.loads(done.stdout)
        (workdir / "workload.json").write_text(done.stdout)
        self.accounts = [a for a in record["accounts"] if int(a, 16) != 0]
        self.storage_contract = record["contracts"]["storage"]
        self._before_mining(anvil, record)
        rpc_call(anvil, "anvil_mine", [hex(STATE_EXTRA_BLOCKS)])
        self.head = int(rpc_call(anvil, "eth_blockNumber", []), 16)

    def _before_mining(self, anvil: str, record: dict[str, Any]) -> None:
        """More set-up on anvil after the workload (a subclass hook)."""

    def _wait_synced(self, state: str) -> None:
        timeout = self.launch.sync_timeout
        deadline = time.monotonic() + timeout
        height = -1
        while time.monotonic() < deadline:
            height = int(rpc_call(state, "eth_blockNumber", []), 16)
            if height >= self.head:
                return
            time.sleep(0.2)
        raise RuntimeError(f"state node at {height} after {timeout:g}s, anvil at {self.head}")

    def _plan(self, method: str, batch: int, addresses: list[str]) -> BodyPlan:
        return BodyPlan(
            mix=[(method, 1.0)],
            batch=batch,
            blocks=BlockRange(1, self.head),
            addresses=addresses,
            slots=STATE_SLOTS,
        )

    def cases(self) -> list[Case]:
        return [
            Case("balance", self._plan("eth_getBalance", 1, self.accounts)),
            Case("storage", self._plan("eth_getStorageAt", 1, [self.storage_contract])),
            Case("balance10", self._plan("eth_getBalance", 10, self.accounts)),
            Case("storage10", self._plan("eth_getStorageAt", 10, [self.storage_contract])),
            Case("balance100", self._plan("eth_getBalance", 100, self.accounts)),
            Case("storage100", self._plan("eth_getStorageAt", 100, [self.storage_contract])),
        ]


def evm_config_args(
    workdir: Path, evm: dict[str, Any], map_size_mb: int | None = None
) -> list[str]:
    """`--config FILE` giving the state node these [evm] settings and its LMDB map size, or
    nothing without either."""
    if not evm and map_size_mb is None:
        return []
    lines = ["[[state_nodes]]", 'key = "bench-state"']
    lines += [] if map_size_mb is None else [f"map_size_mb = {map_size_mb}"]
    lines += ["", "[state_nodes.evm]"] if evm else []
    lines += [f"{name} = {json.dumps(value)}" for name, value in evm.items()]
    path = workdir / "state-node.toml"
    path.write_text("\n".join(lines) + "\n")
    return ["--config", str(path)]


def setting_lines(settings: dict[str, Any]) -> str:
    """TOML lines `name = value` (values as JSON: numbers, strings, true/false, lists)."""
    return "".join(f"{name} = {json.dumps(value)}\n" for name, value in settings.items())


def parse_toml_setting(text: str) -> tuple[str, Any]:
    """`name=value` of --proxy: the value as TOML (`[]`, `false`, `0`), else a string."""
    name, sep, raw = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:
        return name, tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return name, raw


def parse_setting(text: str) -> tuple[str, Any]:
    """`name=value` of --evm: an int, a float, else a string."""
    name, sep, raw = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    for kind in (int, float):
        try:
            return name, kind(raw)
        except ValueError:
            pass
    return name, raw


def send_tx(anvil: str, tx: dict[str, Any]) -> dict[str, Any]:
    """Send from an unlocked dev account (anvil automines) and return the receipt."""
    tx_hash = rpc_call(anvil, "eth_sendTransaction", [tx])
    deadline = time.monotonic() + 30
    receipt = None
    while receipt is None and time.monotonic() < deadline:
        receipt = rpc_call(anvil, "eth_getTransactionReceipt", [tx_hash])
        if receipt is None:
            time.sleep(0.01)
    if not receipt or receipt.get("status") != "0x1":
        raise RuntimeError(f"set-up transaction {tx_hash} failed: {receipt}")
    return receipt


class CallSuite(StateSuite):
    """eth_call on a real state node, through the proxy and on anvil (the baseline): the
    workload's ERC20 `balanceOf` and a storage-heavy view (bench/contracts.py: 64 SLOADs),
    at latest and at random old heights (older than the proxy's state window), single and
    in batches of 10. The view's slots are rewritten block after block, so old heights
    differ."""

    name: ClassVar[str] = "call"

    def __init__(self) -> None:
        super().__init__()
        self.erc20 = ""
        self.holders: list[str] = []
        self.view = ""
        self.view_block = 0
        self.notes: list[str] = []

    def _before_mining(self, anvil: str, record: dict[str, Any]) -> None:
        self.erc20 = record["erc20"]
        self.holders = record["erc20_holders"]
        sender = rpc_call(anvil, "eth_accounts", [])[0]
        receipt = send_tx(anvil, {"from": sender, "data": "0x" + view_init_code().hex()})
        self.view = receipt["contractAddress"]
        self.view_block = int(receipt["blockNumber"], 16)
        for i in range(VIEW_WRITES):  # one block each: the view's sum changes with the height
            send_tx(anvil, {"from": sender, "to": self.view, "data": write_data(i, 1000 + i)})

    def start(self, services: Services, opts: SuiteOptions) -> dict[str, str]:
        targets = super().start(services, opts)
        # The state node starts its EVM workers on the first eth_call: not in a measurement.
        call = {"to": self.erc20, "data": "0x70a08231" + self.holders[0][2:].rjust(64, "0")}
        for label in ("state-node", "proxy-inproc"):
            if label in targets:
                rpc_call(targets[label], "eth_call", [call, "latest"], timeout=120)
        old = f"{self.view_block + 1}..{self.head - PROXY_STATE_WINDOW - 1}"
        for label in ("proxy", "proxy-inproc"):
            if label in targets:
                self.notes.append(f"{label}: {known_blocks(targets[label])}; old heights {old}")
        return {"anvil": targets.pop("anvil"), **targets}  # anvil first: the baseline

    def _call_plan(self, to: str, data: str | None, batch: int, old: bool) -> BodyPlan:
        blocks = BlockRange(self.view_block + 1, self.head - PROXY_STATE_WINDOW - 1)
        return BodyPlan(
            mix=[("eth_call", 1.0)],
            batch=batch,
            blocks=blocks if old else BlockRange(),
            addresses=self.holders,
            call_to=to,
            call_data=data,
        )

    def cases(self) -> list[Case]:
        out = []
        for name, to, data in (("erc20", self.erc20, None), ("view", self.view, "0x")):
            for batch, tag in ((1, ""), (CALL_BATCH, f"x{CALL_BATCH}")):
                out.append(Case(f"{name}{tag}", self._call_plan(to, data, batch, old=False)))
                out.append(Case(f"{name}{tag}-old", self._call_plan(to, data, batch, old=True)))
        return out


def known_blocks(proxy: str) -> str:
    """Which blocks a proxy knows the hash of (its read path pins reads at those heights to
    the hash, caches and coalesces them; older ones go as they are): from its admin API."""
    try:
        with urllib.request.urlopen(proxy + "/cache", timeout=10) as resp:
            chain = json.loads(resp.read())["chain"] or {}
    except (OSError, ValueError, KeyError) as exc:
        return f"known blocks not read ({exc})"
    return f"knows the hashes of blocks {chain.get('lowest_known')}..{chain.get('tip')}"


DAPP_ACCOUNTS = 200  # accounts the dapp's batches read (the workload's, then generated ones)
DAPP_CALLS = 50  # ERC20 balanceOf eth_calls per batch
DAPP_BALANCES = 50  # eth_getBalance per batch
DAPP_CONCURRENCY = 256  # connections, each repeating such batches
DAPP_BLOCK_TIME = 1  # seconds between anvil's blocks while measuring


class DappSuite(StateSuite):
    """A dapp's polling load at `latest` while blocks arrive every second: on `DAPP_CONCURRENCY`
    connections, batches of `DAPP_CALLS` ERC20 balanceOf eth_calls and `DAPP_BALANCES`
    eth_getBalance of `DAPP_ACCOUNTS` accounts. anvil (the baseline) answers it directly; a
    real state node (`state` kind) behind the proxy with its response cache on
    (`proxy`), off (`proxy-nocache`: pinned heads and coalescing only), and with neither cache
    nor coalescing (`proxy-plain`)."""

    name: ClassVar[str] = "dapp"

    def __init__(self) -> None:
        super().__init__()
        self.erc20 = ""
        self.readers: list[str] = []
        self.notes: list[str] = []

    def _before_mining(self, anvil: str, record: dict[str, Any]) -> None:
        self.erc20 = record["erc20"]
        known = list(dict.fromkeys(record["erc20_holders"] + self.accounts))
        self.readers = (known + fake_addresses(DAPP_ACCOUNTS))[:DAPP_ACCOUNTS]

    def start(self, services: Services, opts: SuiteOptions) -> dict[str, str]:
        svc_cpus, _ = split_cpus() if opts.pin else (None, None)
        anvil, state = self.start_chain(services, opts, "state")
        rpc_call(anvil, "evm_setIntervalMining", [DAPP_BLOCK_TIME])  # blocks keep coming
        targets = {"anvil": anvil}
        variants = {
            "proxy": "",
            "proxy-nocache": "cache_pools = []\n",
            "proxy-plain": "cache_pools = []\ncoalesce = false\n",
        }
        for label, extra in variants.items():
            port = free_port()
            config = services.workdir / f"{label}.toml"
            config.write_text(proxy_config(state, extra=extra + setting_lines(opts.proxy)))
            url = f"http://127.0.0.1:{port}/{SUITE_CHAIN_ID}"
            services.start(label, ProxySuite().proxy_command(port, config), url, svc_cpus)
            targets[label] = url
        self.check_answers(targets)
        return targets

    def check_answers(self, targets: dict[str, str]) -> None:
        """Every target answers the dapp's reads as anvil does (at a block they all hold)."""
        anvil = targets["anvil"]
        height = hex(self.head)
        for address in self.readers[:3]:
            for method, params in (
                ("eth_call", [{"to": self.erc20, "data": balance_of(address)}, height]),
                ("eth_getBalance", [address, height]),
            ):
                want = rpc_call(anvil, method, params)
                for label, url in targets.items():
                    got = rpc_call(url, method, params)
                    if got != want:
                        raise RuntimeError(f"{label} answers {method} {got}, anvil {want}")
        self.notes.append(f"dapp: every target answered as anvil at block {self.head} (checked)")

    def plan(self) -> BodyPlan:
        return BodyPlan(
            mix=[("eth_call", DAPP_CALLS), ("eth_getBalance", DAPP_BALANCES)],
            batch=DAPP_CALLS + DAPP_BALANCES,
            addresses=self.readers,
            call_to=self.erc20,
            exact_mix=True,
            pool_size=DAPP_CONCURRENCY,
        )

    def cases(self) -> list[Case]:
        return [Case("dapp", self.plan(), concurrency=DAPP_CONCURRENCY)]


class LogsSuite(StateSuite):
    """eth_getLogs on a real state node (its log index), through the proxy and on anvil (the
    baseline): the workload's ERC20 and LOG_TRANSFERS more Transfers, each in its own block
    followed by LOG_GAP empty ones; ranges of one block, of LOG_SPAN and of LOG_WIDE blocks at
    random heights, by the ERC20's address and the Transfer topic, and LOG_SPAN-block ranges
    for one holder's incoming Transfers (a topic in position 2: an index lookup, few
    matches)."""

    name: ClassVar[str] = "logs"

    def __init__(self) -> None:
        super().__init__()
        self.erc20 = ""
        self.holders: list[str] = []

    def _before_mining(self, anvil: str, record: dict[str, Any]) -> None:
        self.erc20 = record["erc20"]
        self.holders = record["erc20_holders"][:4]
        for i in range(LOG_TRANSFERS):  # 1 token around the ring: every sender holds it
            sender, to = self.holders[i % 4], self.holders[(i + 1) % 4]
            data = erc20_transfer_data(to, 1)
            send_tx(anvil, {"from": sender, "to": self.erc20, "data": data})
            rpc_call(anvil, "anvil_mine", [hex(LOG_GAP)])

    def start(self, services: Services, opts: SuiteOptions) -> dict[str, str]:
        targets = super().start(services, opts)
        self._check_answers(targets)
        return {"anvil": targets.pop("anvil"), **targets}  # anvil first: the baseline

    def _check_answers(self, targets: dict[str, str]) -> None:
        """A fast wrong answer is worth nothing: the first bodies of every case must get
        anvil's answer, item for item, from every target (and some logs at all)."""
        found = 0
        for case in self.cases():
            for body in case.plan.build()[:5]:
                params = json.loads(body)["params"]
                want = rpc_call(targets["anvil"], "eth_getLogs", params)
                found += len(want)
                for label, url in targets.items():
                    if rpc_call(url, "eth_getLogs", params) != want:
                        raise RuntimeError(f"{label} differs from anvil on eth_getLogs {params}")
        if not found:
            raise RuntimeError("the checked eth_getLogs ranges hold no logs: nothing measured")

    def _logs_plan(self, span: int, topics: list[Any]) -> BodyPlan:
        return BodyPlan(
            mix=[("eth_getLogs", 1.0)],
            blocks=BlockRange(1, self.head - span + 1),
            addresses=[self.erc20],
            log_span=span,
            log_topics=topics,
        )

    def cases(self) -> list[Case]:
        holder = "0x" + self.holders[0][2:].rjust(64, "0")
        return [
            Case("logs1", self._logs_plan(1, [TRANSFER_TOPIC])),
            Case(f"logs{LOG_SPAN}", self._logs_plan(LOG_SPAN, [TRANSFER_TOPIC])),
            Case(f"logs{LOG_SPAN}-to", self._logs_plan(LOG_SPAN, [TRANSFER_TOPIC, None, holder])),
            Case(f"logs{LOG_WIDE}", self._logs_plan(LOG_WIDE, [TRANSFER_TOPIC])),
        ]


SUITES: dict[str, type[Suite]] = {
    "proxy": ProxySuite,
    "state": StateSuite,
    "call": CallSuite,
    "dapp": DappSuite,
    "logs": LogsSuite,
}


def run_suite(suite: Suite, opts: SuiteOptions) -> dict[str, Any]:
    """Start, measure every case on every target, stop; the report as a dict."""
    _, load_cpus = split_cpus() if opts.pin else (None, None)
    report: dict[str, Any] = {
        "suite": suite.name,
        "date": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "load_avg_start": round(os.getloadavg()[0], 2),  # other work on the machine skews it
        "pinned": bool(load_cpus),
        "concurrency": opts.concurrency,
        "duration_s": opts.duration,
        "evm": opts.evm,
        "cases": [],
    }
    with running(opts.keep_dir) as services:
        targets = suite.start(services, opts)
        pids = serving_pids(services, targets)
        baseline = next(iter(targets))
        cases = suite.cases()
        optional = {label for case in cases for label in case.also}
        report["rounds"] = rounds_of(opts)
        for case in cases:
            if opts.cases and case.name not in opts.cases:
                continue
            labels = [t for t in targets if t not in optional or t in case.also]
            runs = measure_rounds(case, {t: targets[t] for t in labels}, pids, opts, load_cpus)
            report["cases"].append(_case_report(case, runs, baseline))
    report["load_avg_end"] = round(os.getloadavg()[0], 2)
    report["notes"] = list(getattr(suite, "notes", []))
    return report


# One round of a case: {target label: (what it measured, CPU seconds its process used)}
Round = dict[str, tuple[BenchResult, float | None]]


def rounds_of(opts: SuiteOptions) -> int:
    """How many rounds each case takes: `opts.rounds`, fewer when a round would be shorter
    than MIN_ROUND_S."""
    return max(1, min(opts.rounds, int(opts.duration / MIN_ROUND_S)))


def measure_rounds(
    case: Case,
    targets: dict[str, str],
    pids: dict[str, int],
    opts: SuiteOptions,
    load_cpus: list[int] | None,
) -> list[Round]:
    """Every target of a case measured in turn, round after round (the order reversed in
    every other round), each round for its share of the case's duration; the full warm-up
    before a target's first round, a short one before the others."""
    count = rounds_of(opts)
    rounds: list[Round] = []
    for i in range(count):
        labels = list(targets) if i % 2 == 0 else list(reversed(targets))
        one: Round = {}
        for label in labels:
            settings = LoadSettings(
                url=targets[label],
                concurrency=case.concurrency or opts.concurrency,
                duration=opts.duration / count,
                warmup=opts.warmup if i == 0 else min(opts.warmup, ROUND_WARMUP_S),
                cpus=load_cpus,
            )
            one[label] = measure(settings, case.plan, pids.get(label))
        rounds.append({label: one[label] for label in targets})  # (the targets' order)
    return rounds


def measure(
    settings: LoadSettings, plan: BodyPlan, pid: int | None
) -> tuple[BenchResult, float | None]:
    """One target: the warm-up as a run of its own, then the measured run, with the CPU
    seconds the serving process (when known) used during the measured run alone."""
    if settings.warmup > 0:
        run_bench(replace(settings, duration=settings.warmup, warmup=0), plan)
    proc = None
    if pid is not None:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
    before = cpu_seconds(proc)
    result = run_bench(replace(settings, warmup=0), plan)
    after = cpu_seconds(proc)
    used = None if before is None or after is None else after - before
    return result, used


def _merged(rounds: list[Round]) -> tuple[dict[str, BenchResult], dict[str, float]]:
    """Each target's rounds as one result, and its CPU seconds in all (when every round
    knew them)."""
    results: dict[str, BenchResult] = {}
    cpu: dict[str, float] = {}
    for label in rounds[0]:
        results[label] = BenchResult.combined([one[label][0] for one in rounds])
        used = [one[label][1] for one in rounds]
        if None not in used:
            cpu[label] = sum(used)  # type: ignore[arg-type]
    return results, cpu


def _per_core(one: Round, label: str) -> float | None:
    """Items answered per CPU second of `label`'s process in one round."""
    result, used = one[label]
    return result.items_ok / used if used else None


def round_ratios(rounds: list[Round], label: str, base: str) -> list[float] | None:
    """Per round, `label`'s items per CPU second ÷ `base`'s (two targets measured minutes
    apart on a shared VM differ more than two measured in one round)."""
    out = []
    for one in rounds:
        a, b = _per_core(one, label), _per_core(one, base)
        if a is None or not b:
            return None
        out.append(round(a / b, 3))
    return out


def _case_report(case: Case, rounds: list[Round], baseline: str) -> dict[str, Any]:
    results, cpu = _merged(rounds)
    base = results[baseline]
    out: dict[str, Any] = {
        "case": case.name,
        "batch": case.plan.items_per_body,
        "concurrency": case.concurrency,
        "targets": {},
    }
    for label, res in results.items():
        entry = res.to_json()
        entry["ratio_req_per_s"] = round(res.req_per_s / base.req_per_s, 3) if base.req_per_s else 0
        p50 = base.latency_ns["p50"]
        entry["ratio_p50"] = round(res.latency_ns["p50"] / p50, 3) if p50 else 0
        entry["added_p50_us"] = round((res.latency_ns["p50"] - p50) / 1000, 1)
        used = cpu.get(label)
        if used is not None and res.requests and res.elapsed_s:
            # CPU of the serving process tree during the measured run: per request, as
            # cores in use, and the items/s one whole core would give at that cost
            entry["cpu_us_per_req"] = round(used * 1e6 / res.requests, 1)
            entry["cores"] = round(used / res.elapsed_s, 3)
            entry["items_per_core_s"] = round(res.items_ok / used, 1) if used > 0 else 0.0
        ratios = round_ratios(rounds, label, baseline) if label != baseline else None
        if ratios is not None:  # (÷ the baseline's items per core: the median, each round's)
            entry["per_core_ratio"] = statistics.median(ratios)
            entry["per_core_rounds"] = ratios
        out["targets"][label] = entry
    proxy = out["targets"].get("proxy")
    for other, name in (("proxy-nocache", "cache_on_vs_off"), ("proxy-plain", "cache_on_vs_plain")):
        off = out["targets"].get(other)
        if proxy and off and off["items_per_s"]:
            out[name] = round(proxy["items_per_s"] / off["items_per_s"], 2)
    proxy, go = out["targets"].get("proxy"), out["targets"].get("go-proxy")
    if proxy and go:
        # per core: Go's CPU per request ÷ ours, the median of the rounds' (the same as
        # ours ÷ Go's items per CPU second: one item per request)
        ratios = round_ratios(rounds, "proxy", "go-proxy")
        out["proxy_vs_go"] = {
            "req_per_s": round(proxy["req_per_s"] / go["req_per_s"], 3) if go["req_per_s"] else 0,
            "per_core": statistics.median(ratios) if ratios else None,
            "per_core_rounds": ratios,
        }
    return out


def render(report: dict[str, Any]) -> str:
    """The report as a table: one row per case and target, ratios against the baseline."""
    lines = [
        f"suite {report['suite']}  {report['date']}  cpus={report['cpus']} "
        f"pinned={report['pinned']}  c={report['concurrency']}  {report['duration_s']:g}s/case  "
        f"load avg {report['load_avg_start']} → {report.get('load_avg_end', '?')}"
        + "".join(f"  evm.{k}={v}" for k, v in report.get("evm", {}).items()),
        *(f"note: {n}" for n in report.get("notes", [])),
        f"{'case':<13} {'target':<15} {'req/s':>10} {'items/s':>11} {'ratio':>6} "
        f"{'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8} {'errors':>7} "
        f"{'cores':>5} {'items/s/core':>12} {'cpu µs/req':>10}",
    ]
    for case in report["cases"]:
        name = case["case"] + (f" c={case['concurrency']}" if case.get("concurrency") else "")
        for label, t in case["targets"].items():
            lat = t["latency_ms"]
            errors = sum(t["errors"].values())
            cpu = (
                f"{t['cores']:>5.2f} {t['items_per_core_s']:>12,.0f} {t['cpu_us_per_req']:>10.1f}"
                if "cpu_us_per_req" in t
                else f"{'-':>5} {'-':>12} {'-':>10}"
            )
            lines.append(
                f"{case['case']:<13} {label:<15} {t['req_per_s']:>10,.0f} "
                f"{t['items_per_s']:>11,.0f} "
                f"{t['ratio_req_per_s']:>6.3f} {lat['p50']:>8.3f} {lat['p90']:>8.3f} "
                f"{lat['p99']:>8.3f} {lat['max']:>8.3f} {errors:>7} {cpu}"
            )
        if case.get("concurrency") == 1:
            added = [
                f"{label} +{t['added_p50_us']:.0f} µs"
                for label, t in case["targets"].items()
                if label != next(iter(case["targets"]))
            ]
            lines.append(f"  {name}: p50 added over direct: {', '.join(added)}")
        if "cache_on_vs_off" in case:
            lines.append(
                f"  {name}: items/s of the proxy with its cache ÷ without: "
                f"{case['cache_on_vs_off']:.2f}× (coalescing on), "
                f"{case.get('cache_on_vs_plain', 0):.2f}× (coalescing off too)"
            )
        per_round = [
            f"{label} {t['per_core_ratio']:.2f} ({_listed(t['per_core_rounds'])})"
            for label, t in case["targets"].items()
            if "per_core_ratio" in t
        ]
        if per_round:
            lines.append(
                f"  {name}: items/s per core ÷ {next(iter(case['targets']))}'s, median of "
                f"{report.get('rounds', 1)} round(s): {'; '.join(per_round)}"
            )
        versus = case.get("proxy_vs_go")
        if versus:
            per_core = versus["per_core"]
            shown = "?" if per_core is None else f"{per_core:.2f}"
            lines.append(
                f"  {name}: proxy ÷ go-proxy: {versus['req_per_s']:.2f}× req/s, "
                f"{shown}× per core (go's CPU per request ÷ ours)"
            )
    return "\n".join(lines)


def _listed(ratios: list[float]) -> str:
    return ", ".join(f"{r:.2f}" for r in ratios)

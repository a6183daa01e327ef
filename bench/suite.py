"""Benchmark suites: start the services under test, load them, print each figure as a ratio.

`suite proxy` starts a fake node and `chainstate proxy` in front of it as subprocesses on
free loopback ports, then measures the same requests against the fake node directly and
through the proxy (single requests, batches of 10 and of 100), so the ratio is the cost of
the proxy. On a machine with two or more cores the proxy is pinned to one core and the load
generator and fake node share another, as in TRIED.md's anchors.

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
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from bench.bodies import BlockRange, BodyPlan, fake_addresses
from bench.contracts import view_init_code, write_data
from bench.loadgen import BenchResult, LoadSettings, run_bench

READY_TIMEOUT = 30.0  # seconds a started service has to answer its first request
STOP_GRACE = 5.0  # seconds between SIGTERM and SIGKILL when stopping a service
FAKE_HEAD = 1_000_000  # the fake node's head; cases read random heights just below it
FAKE_WINDOW = 128  # the fake node's state window (blocks)
SUITE_CHAIN_ID = 1337
STATE_EXTRA_BLOCKS = 200  # blocks mined after the devnet workload for `suite state`
STATE_SLOTS = 17  # storage slots 0..16 of the workload's storage contract
SYNC_TIMEOUT = 180.0  # seconds for the state node to ingest up to anvil's head
VIEW_WRITES = 64  # blocks after the view's deployment that each rewrite one of its slots
CALL_BATCH = 10  # eth_calls per batched request in `suite call`
PROXY_STATE_WINDOW = 128  # the proxy's default state_window: older heights are "old"
PROBE = b'{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":[]}'
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def free_port() -> int:
    """A loopback TCP port that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def split_cpus() -> tuple[list[int] | None, list[int] | None]:
    """(service core, load core) when at least two CPUs are usable, else no pinning."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None
    return [cpus[0]], [cpus[1]]


@dataclass
class Service:
    """A subprocess under test, its log file and readiness URL."""

    name: str
    cmd: list[str]
    ready_url: str
    cpus: list[int] | None
    log_path: Path
    probe: bytes | None = PROBE  # JSON-RPC body that must get a result; None: GET → 200
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C reaches us; we stop it in order
            )
        if self.cpus:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(self.proc.pid, self.cpus)

    def log_tail(self, limit: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Poll until the probe is answered; fail fast if the process died."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            req = urllib.request.Request(
                self.ready_url, data=self.probe, headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(req, timeout=2) as resp:
                    body = resp.read()
                    if resp.status == 200 and (self.probe is None or b'"result"' in body):
                        return
            except (OSError, urllib.error.URLError) as exc:
                last = str(exc)
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} not ready after {timeout:g}s ({last}):\n{self.log_tail()}")

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(STOP_GRACE)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@dataclass
class Services:
    """Every service a suite started, stopped in reverse order (see `running`)."""

    workdir: Path
    started: list[Service] = field(default_factory=list)

    def start(
        self,
        name: str,
        cmd: list[str],
        ready_url: str,
        cpus: list[int] | None,
        probe: bytes | None = PROBE,
    ) -> Service:
        svc = Service(name, cmd, ready_url, cpus, self.workdir / f"{name}.log", probe)
        self.started.append(svc)
        svc.start()
        svc.wait_ready()
        return svc

    def stop_all(self) -> None:
        for svc in reversed(self.started):
            svc.stop()
        self.started.clear()


@contextlib.contextmanager
def running(keep_dir: str | None = None) -> Iterator[Services]:
    """Services that are stopped on exit, on error, on Ctrl-C and on SIGTERM."""

    def on_term(signum: int, frame: Any) -> None:
        # Re-raised as SIGINT: inside an event loop (uvloop.run) only SIGINT is turned into
        # a clean cancellation; an exception raised here would be swallowed by the loop.
        os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGTERM, on_term)
    tmp = None if keep_dir else tempfile.TemporaryDirectory(prefix="chainstate-bench-")
    workdir = Path(keep_dir or tmp.name)  # type: ignore[union-attr]
    workdir.mkdir(parents=True, exist_ok=True)
    services = Services(workdir)
    try:
        yield services
    finally:
        services.stop_all()
        signal.signal(signal.SIGTERM, previous)
        if tmp is not None:
            tmp.cleanup()


def python_cmd(*args: str) -> list[str]:
    """Run a module of this project with the current interpreter (same venv)."""
    return [sys.executable, *args]


def tree_cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of a process and all its descendants (Linux /proc): the
    state node with its EVM workers and feed process. 0 where /proc is not there."""
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))  # field 4: ppid
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += times.get(current, 0.0)
        todo += children.get(current, [])
    return total


@dataclass(frozen=True)
class Case:
    """One measured load: a body plan sent to every target of the suite."""

    name: str
    plan: BodyPlan


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


class Suite(Protocol):
    name: ClassVar[str]

    def start(self, services: Services, opts: SuiteOptions) -> dict[str, str]:
        """Start what is measured; {label: url}, the first label is the baseline."""
        ...

    def cases(self) -> list[Case]: ...


def balance_mix(batch: int) -> BodyPlan:
    """eth_getBalance at random heights inside the fake node's state window."""
    return BodyPlan(
        mix=[("eth_getBalance", 1.0)],
        batch=batch,
        blocks=BlockRange(FAKE_HEAD - FAKE_WINDOW // 2, FAKE_HEAD),
        addresses=fake_addresses(1000),
    )


class ProxySuite:
    """The proxy in front of a fake node vs the fake node directly."""

    name: ClassVar[str] = "proxy"

    def start(self, services: Services, opts: SuiteOptions) -> dict[str, str]:
        proxy_cpus, load_cpus = split_cpus() if opts.pin else (None, None)
        fake_port, proxy_port = free_port(), free_port()
        fake_url = f"http://127.0.0.1:{fake_port}"
        services.start(
            "fake-node",
            python_cmd(
                "-m", "bench", "fake-node", "--port", str(fake_port),
                "--kind", "state", "--head", str(FAKE_HEAD), "--window", str(FAKE_WINDOW),
                "--chain-id", str(SUITE_CHAIN_ID),
            ),
            fake_url,
            load_cpus,
        )  # fmt: skip
        config = services.workdir / "proxy.toml"
        config.write_text(proxy_config(fake_url))
        proxy_url = f"http://127.0.0.1:{proxy_port}/{SUITE_CHAIN_ID}"
        services.start("proxy", self.proxy_command(proxy_port, config), proxy_url, proxy_cpus)
        return {"direct": fake_url, "proxy": proxy_url}

    def proxy_command(self, port: int, config: Path) -> list[str]:
        """How the proxy under test is started (a test may swap in another server)."""
        return python_cmd(
            "-m", "chainstate.cli", "proxy",
            "--host", "127.0.0.1", "--port", str(port), "--config", str(config),
            "--store", ":memory:",  # nothing persisted: each run starts from the config
        )  # fmt: skip

    def cases(self) -> list[Case]:
        return [
            Case("single", balance_mix(1)),
            Case("batch10", balance_mix(10)),
            Case("batch100", balance_mix(100)),
        ]


def proxy_config(node_url: str, kinds: tuple[str, ...] = ("state",)) -> str:
    """The proxy's TOML: one chain served by one node, entered once per kind (an archive
    state node can answer as both, so every height has a node to go to)."""
    out = '[proxy]\nhost = "127.0.0.1"\n'
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


def rpc_call(url: str, method: str, params: list[Any], timeout: float = 10.0) -> Any:
    """One JSON-RPC call (set-up only, not measured); raises RuntimeError on an error."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        answer = json.loads(resp.read())
    if "error" in answer:
        raise RuntimeError(f"{method} on {url}: {answer['error']}")
    return answer["result"]


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

    def __init__(self) -> None:
        self.head = 0
        self.accounts: list[str] = []
        self.storage_contract = ""
        self.pids: dict[str, int] = {}

    def cpu_probe(self, label: str) -> int | None:
        """The process whose CPU (with its children) is measured per case: the state node
        and anvil, so items/s per core can be compared when the machine is busy."""
        return self.pids.get(label)

    def start(self, services: Services, opts: SuiteOptions) -> dict[str, str]:
        svc_cpus, _ = split_cpus() if opts.pin else (None, None)
        anvil_port, writer_port, state_port = free_port(), free_port(), free_port()
        anvil = f"http://127.0.0.1:{anvil_port}"
        anvil_svc = services.start(
            "anvil",
            python_cmd("-m", "chainstate.cli", "devnet", "anvil", "--port", str(anvil_port)),
            anvil,
            svc_cpus,
        )
        self._make_blocks(anvil, services.workdir)
        writer = f"http://127.0.0.1:{writer_port}"
        services.start(
            "write-node",
            python_cmd(
                "-m", "chainstate.cli", "write-node", "--execution-url", anvil,
                "--port", str(writer_port), "--data-dir", str(services.workdir / "writer"),
            ),
            writer + "/health",
            svc_cpus,
            probe=None,
        )  # fmt: skip
        state = f"http://127.0.0.1:{state_port}"
        state_svc = services.start(
            "state-node",
            python_cmd(
                "-m", "chainstate.cli", "state-node", "--key", "bench-state", "--kind", "archive",
                "--source", writer, "--port", str(state_port), "--chain-id", str(SUITE_CHAIN_ID),
                "--data-dir", str(services.workdir / "state"),
                *evm_config_args(services.workdir, opts.evm),
            ),
            state,
            svc_cpus,
        )  # fmt: skip
        for label, svc in (("state-node", state_svc), ("anvil", anvil_svc)):
            if svc.proc is not None:
                self.pids[label] = svc.proc.pid
        self._wait_synced(state)
        targets = {"state-node": state}
        if proxy_available():
            proxy_port = free_port()
            config = services.workdir / "proxy.toml"
            config.write_text(proxy_config(state, kinds=("state", "archive")))
            proxy = f"http://127.0.0.1:{proxy_port}/{SUITE_CHAIN_ID}"
            services.start("proxy", ProxySuite().proxy_command(proxy_port, config), proxy, svc_cpus)
            targets["proxy"] = proxy
        targets["anvil"] = anvil
        return targets

    def _make_blocks(self, anvil: str, workdir: Path) -> None:
        cmd = python_cmd(
            "-m", "chainstate.cli", "devnet", "workload", "--url", anvil, "--no-reorg", "--json"
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
        deadline = time.monotonic() + SYNC_TIMEOUT
        height = -1
        while time.monotonic() < deadline:
            height = int(rpc_call(state, "eth_blockNumber", []), 16)
            if height >= self.head:
                return
            time.sleep(0.2)
        raise RuntimeError(f"state node at {height} after {SYNC_TIMEOUT:g}s, anvil at {self.head}")

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


def evm_config_args(workdir: Path, evm: dict[str, Any]) -> list[str]:
    """`--config FILE` giving the state node these [evm] settings, or nothing without any."""
    if not evm:
        return []
    lines = ["[[state_nodes]]", 'key = "bench-state"', "", "[state_nodes.evm]"]
    lines += [f"{name} = {json.dumps(value)}" for name, value in evm.items()]
    path = workdir / "state-node.toml"
    path.write_text("\n".join(lines) + "\n")
    return ["--config", str(path)]


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
        rpc_call(targets["state-node"], "eth_call", [call, "latest"], timeout=120)
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


SUITES: dict[str, type[Suite]] = {"proxy": ProxySuite, "state": StateSuite, "call": CallSuite}


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
        baseline = next(iter(targets))
        for case in suite.cases():
            if opts.cases and case.name not in opts.cases:
                continue
            results: dict[str, BenchResult] = {}
            cores: dict[str, float] = {}
            for label, url in targets.items():
                settings = LoadSettings(
                    url=url,
                    concurrency=opts.concurrency,
                    duration=opts.duration,
                    warmup=opts.warmup,
                    cpus=load_cpus,
                )
                pid = getattr(suite, "cpu_probe", lambda _label: None)(label)
                cpu = tree_cpu_seconds(pid) if pid else 0.0
                results[label] = run_bench(settings, case.plan)
                if pid:  # the CPU of warm-up and measurement over their wall time
                    wall = opts.warmup + results[label].elapsed_s
                    cores[label] = (tree_cpu_seconds(pid) - cpu) / wall if wall else 0.0
            report["cases"].append(_case_report(case, results, baseline, cores))
    report["load_avg_end"] = round(os.getloadavg()[0], 2)
    return report


def _case_report(
    case: Case, results: dict[str, BenchResult], baseline: str, cores: dict[str, float]
) -> dict[str, Any]:
    base = results[baseline]
    out: dict[str, Any] = {"case": case.name, "batch": case.plan.items_per_body, "targets": {}}
    for label, res in results.items():
        entry = res.to_json()
        entry["ratio_req_per_s"] = round(res.req_per_s / base.req_per_s, 3) if base.req_per_s else 0
        p50 = base.latency_ns["p50"]
        entry["ratio_p50"] = round(res.latency_ns["p50"] / p50, 3) if p50 else 0
        if label in cores:  # cores the process tree used; items/s for one whole core
            entry["cores"] = round(cores[label], 3)
            per_core = res.items_per_s / cores[label] if cores[label] > 0 else 0.0
            entry["items_per_core_s"] = round(per_core, 1)
        out["targets"][label] = entry
    return out


def render(report: dict[str, Any]) -> str:
    """The report as a table: one row per case and target, ratios against the baseline."""
    lines = [
        f"suite {report['suite']}  {report['date']}  cpus={report['cpus']} "
        f"pinned={report['pinned']}  c={report['concurrency']}  {report['duration_s']:g}s/case  "
        f"load avg {report['load_avg_start']} → {report.get('load_avg_end', '?')}"
        + "".join(f"  evm.{k}={v}" for k, v in report.get("evm", {}).items()),
        f"{'case':<13} {'target':<10} {'req/s':>10} {'items/s':>11} {'ratio':>6} "
        f"{'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8} {'errors':>7} "
        f"{'cores':>5} {'items/s/core':>12}",
    ]
    for case in report["cases"]:
        for label, t in case["targets"].items():
            lat = t["latency_ms"]
            errors = sum(t["errors"].values())
            lines.append(
                f"{case['case']:<13} {label:<10} {t['req_per_s']:>10,.0f} "
                f"{t['items_per_s']:>11,.0f} "
                f"{t['ratio_req_per_s']:>6.3f} {lat['p50']:>8.3f} {lat['p90']:>8.3f} "
                f"{lat['p99']:>8.3f} {lat['max']:>8.3f} {errors:>7}"
                + (f" {t['cores']:>5.2f} {t['items_per_core_s']:>12,.0f}" if "cores" in t else "")
            )
    return "\n".join(lines)


def add_suite_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("suite", choices=sorted(SUITES), help="which suite to run")
    p.add_argument("-d", "--duration", type=float, default=5.0, help="seconds per measurement")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds of warm-up per measurement")
    p.add_argument("-c", "--concurrency", type=int, default=64, help="connections (default 64)")
    p.add_argument("--case", action="append", help="run only this case (repeatable)")
    p.add_argument("--no-pin", action="store_true", help="do not pin processes to cores")
    p.add_argument("--keep-dir", help="keep configs and service logs in this folder")
    p.add_argument(
        "--evm",
        action="append",
        type=parse_setting,
        metavar="NAME=VALUE",
        help="an [evm] setting of the state node (state and call suites), e.g. warm_blocks=4",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def cmd_suite(args: argparse.Namespace) -> int:
    if args.duration <= 0 or args.concurrency < 1:
        print("chainstate bench suite: duration must be > 0, concurrency >= 1", file=sys.stderr)
        return 2
    opts = SuiteOptions(
        duration=args.duration,
        warmup=args.warmup,
        concurrency=args.concurrency,
        pin=not args.no_pin,
        cases=args.case,
        keep_dir=args.keep_dir,
        evm=dict(args.evm or []),
    )
    try:
        report = run_suite(SUITES[args.suite](), opts)
    except RuntimeError as exc:
        print(f"chainstate bench suite: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2) if args.json else render(report), flush=True)
    return 0


def add_suite_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "suite",
        help="start services and compare them under the same load (e.g. proxy vs direct)",
        description=__doc__.splitlines()[0],
    )
    add_suite_options(p)
    p.set_defaults(func=cmd_suite)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.suite", description=__doc__)
    add_suite_options(parser)
    args = parser.parse_args(argv)
    try:
        return cmd_suite(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

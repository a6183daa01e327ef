"""`chainstate bench suite faults`: what a killed, hung, failing, slow or lying node costs.

For each fault, a fresh set of services is started as a user would run them: three
`chainstate bench fake-node --kind state` nodes and one `--kind archive` node sharing one
advancing head (a block a second), `chainstate checker` over the four, and `chainstate proxy
--store :memory:` in front of them following the checker. After a warm-up, the load generator
sends `eth_getBalance` at `latest` on `concurrency` connections for `duration` seconds while
the fault happens to the third state node:

| fault | what happens to state-3 |
| - | - |
| `baseline` | nothing (the reference of the same run) |
| `kill` | `kill -9` 2 s into the run, started again 5 s later |
| `hang` | `SIGSTOP` 2 s into the run, `SIGCONT` 10 s later |
| `503` | every 2nd request answered with HTTP 503 |
| `slow` | every answer 200 ms late |
| `wrong` | from 2 s into the run: wrong balances and validation hashes (a lying replica) |
| `overload` | (own set-up) one node answering after 1.5 s; 10,000 clients send a request at once |

(The times are for a 20 s run, `-d 20`, as the issue measured them; they scale with
`--duration`, default 5 s: the fault begins at a tenth of the run, a killed node is down for
a quarter of it and a hung one for half.)

Each row shows the failed client requests, p50/p99/max latency and throughput, as ratios to
the baseline, and what the proxy did: upstream attempts per client request (hedges included),
hedges, breaker openings; for `wrong`, how many blocks after the lie began the proxy took the
node out and how many wrong answers it served before and after. One answer is checked through
the proxy before and after every run.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from prometheus_client.parser import text_string_to_metric_families

from bench.bodies import BodyPlan, fake_addresses
from bench.loadgen import BenchResult, LoadSettings, run_bench
from bench.services import (
    Service,
    Services,
    free_port,
    python_cmd,
    rpc_call,
    running,
    split_cpus,
)
from bench.suite import FAKE_HEAD, FAKE_WINDOW, SUITE_CHAIN_ID, SuiteOptions

FAULTS = ("baseline", "kill", "hang", "503", "slow", "wrong", "overload")
BLOCK_TIME = 1.0  # seconds per block of the fake chain
FAULT_AT = 0.1  # of the measured run: when the fault begins
KILL_FOR = 0.25  # of the run: a killed node is down this long
HANG_FOR = 0.5  # of the run: a hung node stays stopped this long
SLOW_MS = 200.0
FAULTY = "state-3"
ADDRESS = fake_addresses(1)[0]


@dataclass
class FaultRun:
    """What happened during one fault's run (filled by the fault's thread)."""

    name: str
    events: list[tuple[float, str]] = field(default_factory=list)
    flagged_after_s: float | None = None  # wrong: the proxy took the liar out after
    wrong_at_flag: int | None = None  # wrong answers the liar had served by then


class FaultSuite:
    """The proxy in front of 3 state + 1 archive fake nodes and a checker, one fault a run."""

    name: ClassVar[str] = "faults"

    def __init__(self) -> None:
        self.notes: list[str] = []

    def run(self, opts: SuiteOptions) -> dict[str, Any]:
        proxy_cpus, load_cpus = split_cpus() if opts.pin else (None, None)
        faults = [f for f in FAULTS if not opts.cases or f in opts.cases]
        if "baseline" not in faults:
            faults.insert(0, "baseline")  # every figure is a ratio to it
        report: dict[str, Any] = {
            "suite": self.name,
            "date": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()),
            "cpus": os.cpu_count(),
            "load_avg_start": round(os.getloadavg()[0], 2),
            "pinned": bool(load_cpus),
            "concurrency": opts.concurrency,
            "duration_s": opts.duration,
            "cases": [],
        }
        for fault in faults:
            print(f"suite faults: {fault} …", file=sys.stderr, flush=True)
            with running(opts.keep_dir and os.path.join(opts.keep_dir, fault)) as services:
                if fault == "overload":
                    report["overload"] = overload(services, proxy_cpus, load_cpus)
                    continue
                case = self._one(services, fault, opts, proxy_cpus, load_cpus)
            report["cases"].append(case)
        base = report["cases"][0]
        for case in report["cases"]:
            case["vs_baseline"] = _ratios(case, base)
        report["load_avg_end"] = round(os.getloadavg()[0], 2)
        report["notes"] = self.notes
        return report

    # ---- one fault -----------------------------------------------------------------------

    def _one(
        self,
        services: Services,
        fault: str,
        opts: SuiteOptions,
        proxy_cpus: list[int] | None,
        load_cpus: list[int] | None,
    ) -> dict[str, Any]:
        nodes = self._start_nodes(services, fault, load_cpus)
        checker = self._start_checker(services, nodes, load_cpus)
        proxy = self._start_proxy(services, nodes, checker, proxy_cpus)
        settings = LoadSettings(
            url=f"{proxy}/{SUITE_CHAIN_ID}",
            concurrency=opts.concurrency,
            duration=opts.duration,
            warmup=0,
            cpus=load_cpus,
        )
        plan = BodyPlan(mix=[("eth_getBalance", 1.0)], addresses=fake_addresses(1000))
        if opts.warmup > 0:  # latency windows filled, connections open
            run_bench(replace(settings, duration=opts.warmup), plan)
        check_answer(settings.url)
        before = scrape(proxy)
        run = FaultRun(fault)
        worker = threading.Thread(
            target=self._inject,
            args=(run, services.started, nodes, proxy, opts.duration),
            daemon=True,
        )
        worker.start()
        result = run_bench(settings, plan)
        worker.join(timeout=opts.duration)
        check_answer(settings.url)
        after = scrape(proxy)
        case = _case(run, result, before, after)
        if fault == "wrong":
            status = node_status(nodes[FAULTY])
            case["wrong_answers"] = {
                "lie_from": status.get("lie_from"),
                "flagged_after_s": run.flagged_after_s,
                "flagged_after_blocks": (
                    None
                    if run.flagged_after_s is None
                    else math.ceil(run.flagged_after_s / BLOCK_TIME)
                ),
                "before_flag": run.wrong_at_flag,
                "after_flag": (
                    None
                    if run.wrong_at_flag is None
                    else status["wrong_answers"] - run.wrong_at_flag
                ),
            }
        return case

    def _start_nodes(
        self, services: Services, fault: str, cpus: list[int] | None
    ) -> dict[str, str]:
        start = time.time()
        nodes = {}
        for name, kind in (
            ("state-1", "state"),
            ("state-2", "state"),
            (FAULTY, "state"),
            ("archive-1", "archive"),
        ):
            port = free_port()
            cmd = python_cmd(
                "-m", "bench", "fake-node", "--port", str(port), "--kind", kind,
                "--head", str(FAKE_HEAD), "--window", str(FAKE_WINDOW),
                "--chain-id", str(SUITE_CHAIN_ID), "--block-time", str(BLOCK_TIME),
                "--start-time", repr(start),
            )  # fmt: skip
            if name == FAULTY and fault == "503":
                cmd += ["--fail-every", "2"]
            if name == FAULTY and fault == "slow":
                cmd += ["--latency-ms", str(SLOW_MS)]
            url = f"http://127.0.0.1:{port}"
            services.start(name, cmd, url, cpus)
            nodes[name] = url
        return nodes

    def _start_checker(
        self, services: Services, nodes: dict[str, str], cpus: list[int] | None
    ) -> str:
        port = free_port()
        config = services.workdir / "checker.toml"
        replicas = ", ".join(json.dumps(url) for url in nodes.values())
        config.write_text(
            f"[checker]\nreplicas = [{replicas}]\npoll_interval = 0.25\n"
            f'listen = "127.0.0.1:{port}"\n'
        )
        url = f"http://127.0.0.1:{port}"
        cmd = python_cmd(
            "-m", "stack.cli", "checker", "--config", str(config),
            "--data-dir", str(services.workdir / "checker"),
        )  # fmt: skip
        probe = b'{"jsonrpc":"2.0","id":1,"method":"checker_status","params":[]}'
        services.start("checker", cmd, url, cpus, probe=probe)
        return url

    def _start_proxy(
        self,
        services: Services,
        nodes: dict[str, str],
        checker: str,
        cpus: list[int] | None,
    ) -> str:
        port = free_port()
        lines = ['[proxy]\nhost = "127.0.0.1"\n']
        for name, url in nodes.items():
            kind = "archive" if name.startswith("archive") else "state"
            lines.append(
                f'[[proxy.nodes]]\nchain = "{SUITE_CHAIN_ID}"\nkey = "{name}"\n'
                f'url = "{url}"\nkind = "{kind}"\n'
            )
        lines.append(f'[[proxy.checkers]]\nchain = "{SUITE_CHAIN_ID}"\nurl = "{checker}"\n')
        config = services.workdir / "proxy.toml"
        config.write_text("\n".join(lines))
        url = f"http://127.0.0.1:{port}"
        cmd = python_cmd(
            "-m", "stack.cli", "proxy", "--host", "127.0.0.1", "--port", str(port),
            "--config", str(config), "--store", ":memory:",
        )  # fmt: skip
        services.start("proxy", cmd, f"{url}/{SUITE_CHAIN_ID}", cpus)
        wait_for(lambda: _all_polled(url), 10.0, "the proxy to see every node's head")
        return url

    # ---- the fault -----------------------------------------------------------------------

    def _inject(
        self,
        run: FaultRun,
        started: list[Service],
        nodes: dict[str, str],
        proxy: str,
        duration: float,
    ) -> None:
        """The fault's schedule, on a thread beside the load."""
        service = next(s for s in started if s.name == FAULTY)
        t0 = time.monotonic()

        def at(fraction: float) -> None:
            time.sleep(max(0.0, t0 + fraction * duration - time.monotonic()))

        def event(what: str) -> None:
            run.events.append((round(time.monotonic() - t0, 3), what))

        pid = service.proc.pid if service.proc is not None else None
        if run.name == "kill" and pid is not None:
            at(FAULT_AT)
            os.kill(pid, signal.SIGKILL)
            event("kill -9")
            at(FAULT_AT + KILL_FOR)
            service.start()
            event("started again")
        elif run.name == "hang" and pid is not None:
            at(FAULT_AT)
            os.kill(pid, signal.SIGSTOP)
            event("SIGSTOP")
            at(FAULT_AT + HANG_FOR)
            os.kill(pid, signal.SIGCONT)
            event("SIGCONT")
        elif run.name == "wrong" and pid is not None:
            at(FAULT_AT)
            os.kill(pid, signal.SIGUSR1)
            event("lying from the next block")
            started_lying = time.monotonic()
            deadline = t0 + duration
            while time.monotonic() < deadline:
                node = _node(proxy, FAULTY)
                if node is not None and node.get("diverged"):
                    run.flagged_after_s = round(time.monotonic() - started_lying, 3)
                    run.wrong_at_flag = node_status(nodes[FAULTY])["wrong_answers"]
                    event("taken out by the checker's verdict")
                    break
                time.sleep(0.05)

    def note(self, text: str) -> None:
        self.notes.append(text)


# ---- overload ------------------------------------------------------------------------------

OVERLOAD_CLIENTS = 10_000
OVERLOAD_LATENCY_MS = 1500.0
OVERLOAD_TIMEOUT = 10.0  # a client's patience (the load generator's default)


def overload(
    services: Services, proxy_cpus: list[int] | None, load_cpus: list[int] | None
) -> dict[str, Any]:
    """One slow node behind the proxy, 10,000 clients each sending one request at once:
    how many were answered, refused (503 + Retry-After, how fast) or left waiting, and the
    proxy's memory."""
    port = free_port()
    node = f"http://127.0.0.1:{port}"
    cmd = python_cmd(
        "-m", "bench", "fake-node", "--port", str(port), "--kind", "state",
        "--head", str(FAKE_HEAD), "--chain-id", str(SUITE_CHAIN_ID),
        "--latency-ms", str(OVERLOAD_LATENCY_MS),
    )  # fmt: skip
    services.start("slow-node", cmd, node, load_cpus)
    proxy_port = free_port()
    config = services.workdir / "proxy.toml"
    config.write_text(
        f'[proxy]\nhost = "127.0.0.1"\n\n[[proxy.nodes]]\nchain = "{SUITE_CHAIN_ID}"\n'
        f'key = "slow"\nurl = "{node}"\nkind = "state"\n'
    )
    url = f"http://127.0.0.1:{proxy_port}"
    cmd = python_cmd(
        "-m", "stack.cli", "proxy", "--host", "127.0.0.1", "--port", str(proxy_port),
        "--config", str(config), "--store", ":memory:",
    )  # fmt: skip
    proxy = services.start("proxy", cmd, f"{url}/{SUITE_CHAIN_ID}", proxy_cpus)
    check_answer(f"{url}/{SUITE_CHAIN_ID}")
    pid = proxy.proc.pid if proxy.proc is not None else 0
    idle = _rss_mb(pid)
    import uvloop

    previous = os.sched_getaffinity(0)
    if load_cpus:
        os.sched_setaffinity(0, load_cpus)
    try:
        results = uvloop.run(_clients(proxy_port, OVERLOAD_CLIENTS))
    finally:
        os.sched_setaffinity(0, previous)
    check_answer(f"{url}/{SUITE_CHAIN_ID}")
    return _overload_report(results, idle, _peak_mb(pid), _rss_mb(pid))


class _Client:
    """One overload client: a connection that sends one request and notes its answer (a
    bare protocol: the clients' own work must not be what is measured)."""

    def __init__(self, done: Callable[[_Client], None]) -> None:
        self.done = done
        self.transport: Any = None
        self.buf = b""
        self.sent = 0.0
        self.result: tuple[str, float, str | None] = ("timeout", OVERLOAD_TIMEOUT, None)
        self.finished = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def send(self, request: bytes) -> None:
        self.sent = time.monotonic()
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        head, sep, rest = self.buf.partition(b"\r\n\r\n")
        if not sep:
            return
        length = int(_header(head, b"content-length") or b"0")
        if len(rest) < length:
            return
        elapsed = time.monotonic() - self.sent
        status = head.split(b" ", 2)[1]
        if status == b"200" and b'"result"' in rest:
            self.result = ("answered", elapsed, None)
        elif status == b"503" and b"-32005" in rest:
            retry_after = _header(head, b"retry-after")
            self.result = ("refused", elapsed, retry_after.decode() if retry_after else None)
        else:
            self.result = (f"http:{status.decode()}", elapsed, None)
        self.finish()

    def finish(self) -> None:
        if not self.finished:
            self.finished = True
            self.transport.close()
            self.done(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.finished:
            self.result = ("closed", time.monotonic() - self.sent, None)
            self.finish()

    def eof_received(self) -> bool:
        return False


async def _clients(port: int, n: int) -> list[tuple[str, float, str | None]]:
    """Open `n` connections (in steps, so the listen backlog is not what is measured), then
    send one request on each at once: (outcome, seconds, Retry-After) per client; a client
    without an answer after OVERLOAD_TIMEOUT counts as a timeout."""
    import asyncio

    loop = asyncio.get_running_loop()
    body = json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "eth_getBalance", "params": [ADDRESS, "latest"]}
    ).encode()
    request = (
        f"POST /{SUITE_CHAIN_ID} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    left = asyncio.Event()
    pending = n

    def done(_client: _Client) -> None:
        nonlocal pending
        pending -= 1
        if pending == 0:
            left.set()

    clients: list[_Client] = []
    for start in range(0, n, 500):
        batch = [
            loop.create_connection(lambda: _Client(done), "127.0.0.1", port)
            for _ in range(min(500, n - start))
        ]
        clients += [proto for _, proto in await asyncio.gather(*batch)]
    for client in clients:
        client.send(request)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(left.wait(), OVERLOAD_TIMEOUT)
    for client in clients:
        if not client.finished:
            client.finish()  # (no answer within the client's patience: a timeout)
    return [client.result for client in clients]


def _header(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    return None


def _overload_report(
    results: list[tuple[str, float, str | None]], idle: float, peak: float, after: float
) -> dict[str, Any]:
    by: dict[str, list[float]] = {}
    for outcome, seconds, _ in results:
        by.setdefault(outcome, []).append(seconds)
    refused_with_retry_after = sum(1 for o, _, ra in results if o == "refused" and ra)
    return {
        "clients": len(results),
        "node_latency_ms": OVERLOAD_LATENCY_MS,
        "outcomes": {k: len(v) for k, v in sorted(by.items())},
        "refused_with_retry_after": refused_with_retry_after,
        "refused_max_s": round(max(by.get("refused", [0.0])), 3),
        "answered_max_s": round(max(by.get("answered", [0.0])), 3),
        "rss_mb": {"idle": idle, "peak": peak, "after": after},
    }


def _rss_mb(pid: int) -> float:
    return _status_kb(pid, "VmRSS") / 1024


def _peak_mb(pid: int) -> float:
    return _status_kb(pid, "VmHWM") / 1024


def _status_kb(pid: int, field_name: str) -> float:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field_name + ":"):
                return float(line.split()[1])
    return 0.0


# ---- helpers -------------------------------------------------------------------------------


def check_answer(url: str) -> None:
    """One real answer through the proxy (a wrong set-up makes a proxy look fast)."""
    result = rpc_call(url, "eth_getBalance", [ADDRESS, "latest"])
    if not (isinstance(result, str) and result.startswith("0x")):
        raise RuntimeError(f"unexpected answer through the proxy: {result!r}")


def wait_for(check: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            if check():
                return
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def _all_polled(proxy: str) -> bool:
    nodes = _get_json(f"{proxy}/{SUITE_CHAIN_ID}/getAllNodes")["nodes"]
    return all(n["head"] is not None for n in nodes)


def _node(proxy: str, key: str) -> dict[str, Any] | None:
    with contextlib.suppress(OSError, ValueError):
        for node in _get_json(f"{proxy}/{SUITE_CHAIN_ID}/getAllNodes")["nodes"]:
            if node["key"] == key:
                return node
    return None


def node_status(url: str) -> dict[str, Any]:
    return _get_json(url)


def scrape(proxy: str) -> dict[str, float]:
    """The proxy's counters the report needs, summed over their labels."""
    with urllib.request.urlopen(f"{proxy}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    wanted = {
        "chainstate_proxy_upstream_attempts": "attempts",
        "chainstate_proxy_request_seconds": "client_requests",
        "chainstate_proxy_hedges": "hedges",
        "chainstate_proxy_node_breaker_transitions": "breaker_opens",
        "chainstate_proxy_refused": "refused",
    }
    out = dict.fromkeys(wanted.values(), 0.0)
    for family in text_string_to_metric_families(text):
        key = wanted.get(family.name)
        if key is None:
            continue
        for sample in family.samples:
            if key == "client_requests" and not sample.name.endswith("_count"):
                continue
            if key == "breaker_opens" and sample.labels.get("state") != "open":
                continue
            if sample.name.endswith("_created"):
                continue
            out[key] += sample.value
    return out


def _case(
    run: FaultRun, result: BenchResult, before: dict[str, float], after: dict[str, float]
) -> dict[str, Any]:
    delta = {k: after[k] - before[k] for k in after}
    clients = delta["client_requests"] or 1
    entry = result.to_json()
    return {
        "fault": run.name,
        "requests": result.requests,
        "failed": result.requests - result.requests_ok,
        "errors": result.errors,
        "req_per_s": entry["req_per_s"],
        "latency_ms": entry["latency_ms"],
        "upstream_per_request": round(delta["attempts"] / clients, 4),
        "extra_upstream_pct": round(100 * (delta["attempts"] - clients) / clients, 2),
        "hedges": int(delta["hedges"]),
        "breaker_opens": int(delta["breaker_opens"]),
        "refused": int(delta["refused"]),
        "events": run.events,
    }


def _ratios(case: dict[str, Any], base: dict[str, Any]) -> dict[str, float]:
    def ratio(a: float, b: float) -> float:
        return round(a / b, 3) if b else 0.0

    lat, blat = case["latency_ms"], base["latency_ms"]
    return {
        "req_per_s": ratio(case["req_per_s"], base["req_per_s"]),
        "p50": ratio(lat["p50"], blat["p50"]),
        "p99": ratio(lat["p99"], blat["p99"]),
    }


def render(report: dict[str, Any]) -> str:
    lines = [
        f"suite faults  {report['date']}  cpus={report['cpus']} pinned={report['pinned']}  "
        f"c={report['concurrency']}  {report['duration_s']:g}s/fault  "
        f"load avg {report['load_avg_start']} → {report.get('load_avg_end', '?')}",
        *(f"note: {n}" for n in report.get("notes", [])),
        f"{'fault':<9} {'requests':>9} {'failed':>7} {'req/s':>8} {'×base':>6} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'×base':>6} {'max ms':>9} {'upstream/req':>12} "
        f"{'hedges':>7} {'opens':>6}",
    ]
    for c in report["cases"]:
        lat, vs = c["latency_ms"], c["vs_baseline"]
        lines.append(
            f"{c['fault']:<9} {c['requests']:>9,} {c['failed']:>7} {c['req_per_s']:>8,.0f} "
            f"{vs['req_per_s']:>6.2f} {lat['p50']:>8.3f} {lat['p99']:>8.3f} {vs['p99']:>6.2f} "
            f"{lat['max']:>9.3f} {c['upstream_per_request']:>12.3f} {c['hedges']:>7} "
            f"{c['breaker_opens']:>6}"
        )
        if c["errors"]:
            lines.append(f"  {c['fault']}: errors {c['errors']}")
        wrong = c.get("wrong_answers")
        if wrong:
            lines.append(
                f"  wrong: lying from block {wrong['lie_from']}; taken out after "
                f"{wrong['flagged_after_s']} s (≤ {wrong['flagged_after_blocks']} blocks); "
                f"wrong answers served before: {wrong['before_flag']}, after: "
                f"{wrong['after_flag']}"
            )
    base = report["cases"][0]
    lines.append(
        f"  baseline: hedging added {base['extra_upstream_pct']:.2f} % upstream requests "
        f"({base['hedges']} hedges)"
    )
    over = report.get("overload")
    if over:
        rss = over["rss_mb"]
        lines.append(
            f"overload: {over['clients']:,} clients at once, one node answering after "
            f"{over['node_latency_ms']:g} ms: {over['outcomes']}; refused within "
            f"{over['refused_max_s']} s ({over['refused_with_retry_after']} with Retry-After), "
            f"answered within {over['answered_max_s']} s; proxy RSS idle {rss['idle']:.0f} MB, "
            f"peak {rss['peak']:.0f} MB, after {rss['after']:.0f} MB"
        )
    return "\n".join(lines)

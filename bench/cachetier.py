"""`chainstate bench suite cache-tier`: a cold proxy joining a warm fleet, with the shared tier.

Set-up: Debian's `redis-server`, two `chainstate bench fake-node --kind state` nodes sharing
one advancing head (a block a second), `chainstate checker` over them, and `chainstate proxy`
processes in front of them following the checker, on free loopback ports. The load is a
repeated-read mix: the load generator's pool of 4,096 distinct bodies (`eth_getBalance`,
`eth_getTransactionCount`, `eth_getStorageAt`, `eth_getCode` of 200 accounts at heights
between 100 and 5 blocks below the checker's confirmed head), cycled on `concurrency`
connections.

1. **warm**: proxy W (the tier on) gets the mix for WARM_S seconds (its cache and the tier
   fill), then for WINDOW_S seconds more: W's hit ratio in that window.
2. **cold, tier**: proxy C starts cold with the tier on (the same Redis) and gets the mix for
   WINDOW_S seconds from its first request: its hit ratio and the requests it sent the nodes.
3. **cold, empty tier**: proxy E starts cold with the tier on an empty namespace
   (`cache_tier_prefix` of its own: the same code path, nothing shared to find) and gets the
   same: the requests the nodes would see without the fleet's entries.

A hit is a request item answered without a node (`chainstate_proxy_requests_total` with node
`cache` or `coalesced`: an answer found in the tier reaches its reads as a shared flight);
node requests are the proxy's upstream attempts (`chainstate_proxy_upstream_attempts_total`;
head polls and the headers read at start are not counted). The figures: C's hit ratio over
W's (done when ≥ 0.8) and C's node requests over E's (done when ≤ 0.2).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import sys
import time
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.bodies import BlockRange, BodyPlan, fake_addresses
from bench.loadgen import BenchResult, LoadSettings, run_bench
from bench.services import Service, Services, free_port, python_cmd, running, split_cpus
from bench.suite import FAKE_HEAD, SUITE_CHAIN_ID, SuiteOptions, setting_lines

BLOCK_TIME = 1.0  # seconds per block of the fake chain
WARM_S = 20.0  # seconds of load that fill W's cache and the tier
WINDOW_S = 10.0  # seconds of each measured window (the cold proxy's from its start)
MIX = [
    ("eth_getBalance", 0.4),
    ("eth_getTransactionCount", 0.2),
    ("eth_getStorageAt", 0.2),
    ("eth_getCode", 0.2),
]
ACCOUNTS = 200
DEEP, SHALLOW = 100, 5  # the heights read: this many blocks below the confirmed head
NODE_LABELS_HIT = ("cache", "coalesced")
REDIS_START_S = 10.0
# The state window of the fake nodes and the proxies: the heights read stay in it for the
# whole run (about a minute at a block a second).
WINDOW_BLOCKS = 4096


class CacheTierSuite:
    name = "cache-tier"

    def __init__(self, warm_s: float = WARM_S, window_s: float = WINDOW_S) -> None:
        self.warm_s = warm_s
        self.window_s = window_s

    def run(self, opts: SuiteOptions) -> dict[str, Any]:
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        proxy_cpus, load_cpus = split_cpus() if opts.pin else (None, None)
        report: dict[str, Any] = {
            "suite": self.name,
            "date": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()),
            "cpus": os.cpu_count(),
            "load_avg_start": round(os.getloadavg()[0], 2),
            "pinned": bool(load_cpus),
            "concurrency": opts.concurrency,
            "warm_s": self.warm_s,
            "window_s": self.window_s,
        }
        with running(opts.keep_dir) as services:
            redis = start_redis(services, None)  # (either core: a Redis starved by the
            # load generator's core answers late, which a fleet's own Redis host would not)
            nodes = start_nodes(services, load_cpus)
            checker = start_checker(services, nodes, load_cpus)
            extra = opts.proxy

            def proxy(name: str, prefix: str) -> str:
                return start_proxy(services, name, nodes, checker, redis, prefix, extra, proxy_cpus)

            warm = proxy("warm", "chainstate:cache:")
            confirmed = wait_confirmed(warm)
            plan = BodyPlan(
                mix=MIX,
                addresses=fake_addresses(ACCOUNTS),
                blocks=BlockRange(confirmed - DEEP, confirmed - SHALLOW),
            )
            report["heights"] = [confirmed - DEEP, confirmed - SHALLOW]

            def load(url: str, seconds: float) -> BenchResult:
                settings = LoadSettings(
                    url=f"{url}/{SUITE_CHAIN_ID}",
                    concurrency=opts.concurrency,
                    duration=seconds,
                    warmup=0,
                    cpus=load_cpus,
                )
                return run_bench(settings, plan)

            print("suite cache-tier: warming W …", file=sys.stderr, flush=True)
            window = self.window_s
            load(warm, self.warm_s)
            report["warm"] = measured(warm, lambda: load(warm, window))
            print("suite cache-tier: cold C, the tier shared …", file=sys.stderr, flush=True)
            cold = proxy("cold", "chainstate:cache:")
            report["cold"] = measured(cold, lambda: load(cold, window))
            print("suite cache-tier: cold E, an empty tier …", file=sys.stderr, flush=True)
            empty = proxy("empty", "chainstate:empty:")
            report["empty"] = measured(empty, lambda: load(empty, window))
        w, c, e = report["warm"], report["cold"], report["empty"]
        report["cold_vs_warm_hit_ratio"] = round(c["hit_ratio"] / w["hit_ratio"], 3)
        # per item: the two loads serve as many items as the machine lets them in a window
        per_item = "node_requests_per_1000_items"
        report["node_requests_cold_vs_empty"] = round(c[per_item] / max(0.1, e[per_item]), 3)
        report["load_avg_end"] = round(os.getloadavg()[0], 2)
        return report


def measured(proxy: str, run: Any) -> dict[str, Any]:
    """A load's figures on one proxy: its items, the share answered without a node, the
    requests it sent the nodes, what the tier did (deltas over the run)."""
    before = figures(proxy)
    result: BenchResult = run()
    after = figures(proxy)
    delta = {k: after[k] - before[k] for k in after}
    items = delta["items"]
    return {
        "requests": result.requests,
        "failed": result.requests - result.requests_ok + result.items_err,
        "req_per_s": round(result.requests / result.elapsed_s, 1),
        "items": items,
        "hits": delta["hits"],
        "hit_ratio": round(delta["hits"] / items, 4) if items else 0.0,
        "node_requests": delta["attempts"],
        "node_requests_per_1000_items": round(1000 * delta["attempts"] / items, 1) if items else 0,
        "tier_hits": delta["tier_hits"],
        "tier_misses": delta["tier_misses"],
        "tier_errors": delta["tier_errors"],
    }


def figures(proxy: str) -> dict[str, float]:
    """The proxy's counters this suite reads, from its /metrics."""
    with urllib.request.urlopen(f"{proxy}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = dict.fromkeys(
        ("items", "hits", "attempts", "tier_hits", "tier_misses", "tier_errors"), 0.0
    )
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if name == "chainstate_proxy_requests_total":
                out["items"] += value
                if labels.get("node") in NODE_LABELS_HIT:
                    out["hits"] += value
            elif name == "chainstate_proxy_upstream_attempts_total":
                out["attempts"] += value
            elif name == "chainstate_proxy_cache_tier_lookups_total":
                out["tier_hits" if labels.get("outcome") == "hit" else "tier_misses"] += value
            elif name == "chainstate_proxy_cache_tier_errors_total":
                out["tier_errors"] += value
    return out


def start_redis(services: Services, cpus: list[int] | None) -> str:
    port = free_port()
    workdir = services.workdir / "redis"
    workdir.mkdir(exist_ok=True)
    cmd = [
        shutil.which("redis-server") or "redis-server", "--port", str(port),
        "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir),
        "--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru",
    ]  # fmt: skip
    svc = Service("redis", cmd, "", cpus, services.workdir / "redis.log", None)
    services.started.append(svc)
    svc.start()
    deadline = time.monotonic() + REDIS_START_S
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5) as s:
            s.sendall(b"PING\r\n")
            if s.recv(16).startswith(b"+PONG"):
                return f"redis://127.0.0.1:{port}/0"
        time.sleep(0.05)
    raise RuntimeError(f"redis-server did not answer PING:\n{svc.log_tail()}")


def start_nodes(services: Services, cpus: list[int] | None) -> dict[str, str]:
    start = time.time()
    nodes = {}
    for name in ("state-1", "state-2"):
        port = free_port()
        cmd = python_cmd(
            "-m", "bench", "fake-node", "--port", str(port), "--kind", "state",
            "--head", str(FAKE_HEAD), "--window", str(WINDOW_BLOCKS),
            "--chain-id", str(SUITE_CHAIN_ID), "--block-time", str(BLOCK_TIME),
            "--start-time", repr(start),
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        services.start(name, cmd, url, cpus)
        nodes[name] = url
    return nodes


def start_checker(services: Services, nodes: dict[str, str], cpus: list[int] | None) -> str:
    port = free_port()
    config = services.workdir / "checker.toml"
    replicas = ", ".join(json.dumps(url) for url in nodes.values())
    config.write_text(
        f'[checker]\nreplicas = [{replicas}]\npoll_interval = 0.25\nlisten = "127.0.0.1:{port}"\n'
    )
    url = f"http://127.0.0.1:{port}"
    cmd = python_cmd(
        "-m", "stack.cli", "checker", "--config", str(config),
        "--data-dir", str(services.workdir / "checker"),
    )  # fmt: skip
    probe = b'{"jsonrpc":"2.0","id":1,"method":"checker_status","params":[]}'
    services.start("checker", cmd, url, cpus, probe=probe)
    return url


def start_proxy(
    services: Services,
    name: str,
    nodes: dict[str, str],
    checker: str,
    redis: str,
    prefix: str,
    extra: dict[str, Any],
    cpus: list[int] | None,
) -> str:
    port = free_port()
    lines = [
        '[proxy]\nhost = "127.0.0.1"\n'
        f'cache_tier_url = "{redis}"\ncache_tier_prefix = "{prefix}"\n'
        f"state_window = {WINDOW_BLOCKS}\n" + setting_lines(extra)
    ]
    for key, url in nodes.items():
        lines.append(
            f'[[proxy.nodes]]\nchain = "{SUITE_CHAIN_ID}"\nkey = "{key}"\n'
            f'url = "{url}"\nkind = "state"\n'
        )
    lines.append(f'[[proxy.checkers]]\nchain = "{SUITE_CHAIN_ID}"\nurl = "{checker}"\n')
    config = services.workdir / f"proxy-{name}.toml"
    config.write_text("\n".join(lines))
    url = f"http://127.0.0.1:{port}"
    cmd = python_cmd(
        "-m", "stack.cli", "proxy", "--host", "127.0.0.1", "--port", str(port),
        "--config", str(config), "--store", ":memory:",
    )  # fmt: skip
    services.start(f"proxy-{name}", cmd, f"{url}/{SUITE_CHAIN_ID}", cpus)
    wait_for(lambda: tier_up(url) and known_below(url, DEEP + 10), 20.0, f"proxy {name}")
    return url


def wait_for(check: Any, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            if check():
                return
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def tier_up(proxy: str) -> bool:
    return get_json(f"{proxy}/health")["cache_tier"] == {"state": "up"}


def known_below(proxy: str, depth: int) -> bool:
    """The proxy knows the blocks `depth` below the checker's confirmed head."""
    chain = get_json(f"{proxy}/{SUITE_CHAIN_ID}/cache")["chain"]
    return chain["confirmed"] is not None and chain["lowest_known"] <= chain["confirmed"] - depth


def wait_confirmed(proxy: str) -> int:
    return int(get_json(f"{proxy}/{SUITE_CHAIN_ID}/cache")["chain"]["confirmed"])


def render(report: dict[str, Any]) -> str:
    lines = [
        f"suite cache-tier  {report['date']}  cpus={report['cpus']} pinned={report['pinned']}  "
        f"c={report['concurrency']}  warm {report['warm_s']:g}s, windows {report['window_s']:g}s  "
        f"heights {report['heights'][0]}-{report['heights'][1]}  "
        f"load avg {report['load_avg_start']} → {report.get('load_avg_end', '?')}",
        f"{'proxy':<22} {'items':>8} {'failed':>6} {'req/s':>8} {'hit ratio':>9} "
        f"{'node reqs':>9} {'/1000':>6} {'tier hits':>9} {'tier miss':>9} {'tier err':>8}",
    ]
    for key, label in (
        ("warm", "W warm"),
        ("cold", "C cold, tier shared"),
        ("empty", "E cold, tier empty"),
    ):
        c = report[key]
        lines.append(
            f"{label:<22} {c['items']:>8,.0f} {c['failed']:>6} {c['req_per_s']:>8,.0f} "
            f"{c['hit_ratio']:>9.3f} {c['node_requests']:>9,.0f} "
            f"{c['node_requests_per_1000_items']:>6.1f} {c['tier_hits']:>9,.0f} "
            f"{c['tier_misses']:>9,.0f} {c['tier_errors']:>8,.0f}"
        )
    lines.append(
        f"C's hit ratio / W's: {report['cold_vs_warm_hit_ratio']:.3f} (done when >= 0.8); "
        f"node requests per item C / E: {report['node_requests_cold_vs_empty']:.3f} "
        "(done when <= 0.2)"
    )
    return "\n".join(lines)

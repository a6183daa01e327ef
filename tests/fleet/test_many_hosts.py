"""A fleet on ten hosts (network namespaces on a bridge) through three faults.

etcd ×3, the write node with anvil, a state node, an archive node, the checker and two
proxies each run on a host of their own; a client on a further host sends reads and
transactions through both proxies and retries on the other proxy, as a load balancer would.
Then one proxy's host is cut off, the etcd leader is killed, and the state node's host is
cut off. Reads must keep being answered, admin changes made on either
proxy must reach the other while etcd has a quorum, and every transaction whose hash was
returned must be in a block at the end. What each fault cost the client is printed (run with
`-s`) and recorded in docs/deploy.md.
"""

from __future__ import annotations

import itertools
import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.fleet.fleet import CHAIN, PORTS, Fleet, http, wait_for
from tests.fleet.netns import Host, Network

STARTUP = 45.0  # seconds for ten hosts' processes to start on a loaded 2-core machine
SPREAD = 5.0  # seconds an admin change may take to show on the other proxy
SLOW = 1.0  # seconds: a read answered later than this counts as slow
ATTEMPT_WINDOW = 6.0  # seconds a client request may take: two attempts of 3 s
# seconds both proxies' health polls may take to eject a node whose host is gone: 3 polls
# (unhealthy_after) of the fleet's poll_timeout (2 s, a LAN's) each, and room for a loaded
# machine
EJECT = 30.0
ETCD_FAILOVER = 10.0  # seconds a proxy may refuse admin changes after an etcd member dies


class Phases:
    """Named time spans of the run, to cut the client's records by."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, float, float]] = []
        self.name = ""
        self.began = 0.0

    def begin(self, name: str) -> None:
        now = time.time()
        if self.name:
            self.spans.append((self.name, self.began, now))
        self.name, self.began = name, now

    def end(self) -> None:
        self.begin("")


def stats(records: list[dict[str, Any]], began: float, ended: float) -> dict[str, Any]:
    """What a span cost the client, by the requests that ended in it (one in flight when a
    fault struck is that fault's cost). Reads: answered (at once or on the other proxy:
    `retried`), `failed` (neither proxy answered), `slow` (answered after more than SLOW
    seconds), the longest time without any answer, and `disrupted_s`: from the span's start
    to the end of its last failed, retried or slow read. Transactions: acknowledged (a hash
    returned; `tx_retried` of them on the other proxy) and sends not acknowledged."""
    mine = [r for r in records if began <= r["t1"] < ended]
    reads = [r for r in mine if r["op"] == "read"]
    txs = [r for r in mine if r["op"] == "tx"]
    answered = sorted(r["t1"] for r in reads if r["ok"])
    marks = [began, *answered, max(ended, answered[-1] if answered else ended)]
    bad = [r for r in reads if not r["ok"] or r["tries"] > 1 or r["t1"] - r["t0"] > SLOW]
    return {
        "seconds": round(ended - began, 1),
        "reads": len(reads),
        "answered": len(answered),
        "retried": sum(1 for r in reads if r["ok"] and r["tries"] > 1),
        "failed": sum(1 for r in reads if not r["ok"]),
        "slow": sum(1 for r in reads if r["ok"] and r["t1"] - r["t0"] > SLOW),
        "longest_gap_s": round(max(b - a for a, b in itertools.pairwise(marks)), 2),
        "disrupted_s": round(max((r["t1"] - began for r in bad), default=0.0), 2),
        "tx_acked": sum(1 for r in txs if r.get("hash")),
        "tx_retried": sum(1 for r in txs if r.get("hash") and r["tries"] > 1),
        "tx_unacked": sum(1 for r in txs if not r.get("hash")),
    }


def shown(fleet: Fleet, proxy: Host, key: str) -> dict[str, Any]:
    """Node `key` as `proxy` shows it (getAllNodes: healthy, routable, breaker...), or {}."""
    status, answer = fleet.admin(proxy, f"{CHAIN}/getAllNodes")
    nodes = {n["key"]: n for n in answer.get("nodes", [])} if status == 200 else {}
    return nodes.get(key, {})


def set_weight(fleet: Fleet, proxy: Host, weight: int) -> None:
    body = {"key": "archive-1", "weight": weight}
    status, answer = fleet.admin(proxy, f"{CHAIN}/setWeight", body)
    assert status == 200, (proxy.name, status, answer)


def set_weight_once_possible(fleet: Fleet, proxy: Host, weight: int, within: float) -> float:
    """Seconds until `proxy` accepts an admin change (503 while its etcd client finds a
    member that answers: nothing changed, the operator tries again)."""
    began = time.monotonic()
    body = {"key": "archive-1", "weight": weight}
    answer: Any = None
    while time.monotonic() - began < within:
        status, answer = fleet.admin(proxy, f"{CHAIN}/setWeight", body)
        if status == 200:
            return time.monotonic() - began
        assert status == 503, (proxy.name, status, answer)
        time.sleep(0.2)
    raise AssertionError(f"{proxy.name} refused admin changes for {within} s: {answer}")


def weight_on(fleet: Fleet, proxy: Host) -> int | None:
    status, answer = fleet.admin(proxy, f"{CHAIN}/getWeight?key=archive-1")
    return answer["weight"] if status == 200 else None


def spreads(fleet: Fleet, source: Host, target: Host, weight: int) -> None:
    """An admin change on `source` is applied by `target` within SPREAD seconds."""
    set_weight(fleet, source, weight)
    wait_for(
        f"weight {weight} set on {source.name} seen on {target.name}",
        lambda: weight_on(fleet, target) == weight,
        SPREAD,
    )


def read_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def receipts(fleet: Fleet, proxy: Host, hashes: list[str]) -> dict[str, Any]:
    batch = [
        {"jsonrpc": "2.0", "id": i, "method": "eth_getTransactionReceipt", "params": [h]}
        for i, h in enumerate(hashes)
    ]
    status, answers = http(fleet.rpc_url(proxy), batch, timeout=10)
    assert status == 200, answers
    return {hashes[a["id"]]: a.get("result") for a in answers}


def run_for(seconds: float, check: Callable[[], None] | None = None) -> None:
    ends = time.monotonic() + seconds
    if check is not None:
        check()
    time.sleep(max(0.0, ends - time.monotonic()))


def cut_a_proxy_host(fleet: Fleet, phases: Phases) -> None:
    """proxy-1's host is cut off for 6 s; a change made on proxy-2 meanwhile reaches it once
    it is back."""
    p1, p2 = fleet.proxies
    phases.begin("proxy-1 host cut off")
    fleet.net.cut(p1)
    run_for(6, lambda: set_weight(fleet, p2, 4))
    fleet.net.reconnect(p1)
    phases.begin("proxy-1 back")
    wait_for("the change made during the cut on proxy-1", lambda: weight_on(fleet, p1) == 4, SPREAD)
    run_for(3)


def kill_the_etcd_leader(fleet: Fleet, phases: Phases) -> dict[str, Any]:
    """SIGKILL the etcd leader; admin changes on either proxy reach the other once accepted.
    What happened: the victim, the members the proxies used, seconds each proxy refused."""
    p1, p2 = fleet.proxies
    phases.begin("etcd leader killed")
    talked_to = fleet.net.connections(p1, PORTS["etcd"]) | fleet.net.connections(p2, PORTS["etcd"])
    leader = wait_for("an etcd leader", fleet.etcd_leader, SPREAD)
    fleet.etcd_procs[leader].send_signal(signal.SIGKILL)
    refused: dict[str, float] = {}

    def admin_after_kill() -> None:
        for weight, (source, target) in enumerate([(p1, p2), (p2, p1)], start=5):
            refused[source.name] = set_weight_once_possible(fleet, source, weight, ETCD_FAILOVER)
            wait_for(
                f"weight {weight} set on {source.name} seen on {target.name}",
                lambda t=target, w=weight: weight_on(fleet, t) == w,
                SPREAD,
            )

    run_for(6, admin_after_kill)
    connected = sorted(h.name for h in fleet.etcd if h.address in talked_to)
    return {"killed": leader, "proxies_used": connected, "refused_s": refused}


def cut_the_state_node_host(fleet: Fleet, phases: Phases) -> tuple[float, dict[str, Any]]:
    """The state node's host is cut off until both proxies' health polls have ejected it,
    and ATTEMPT_WINDOW more. (when it was cut; per proxy, seconds until it first routed
    around the node — its breaker open, or ejected — and until its health poll ejected it)"""
    p1, p2 = fleet.proxies
    phases.begin("state node host cut off")
    cut_at = phases.began
    fleet.net.cut(fleet.state)
    spreads(fleet, p1, p2, 7)
    spreads(fleet, p2, p1, 8)
    seen: dict[str, dict[str, float]] = {p.name: {} for p in (p1, p2)}

    def ejected() -> bool:
        for proxy in (p1, p2):
            node, when = shown(fleet, proxy, "state-1"), seen[proxy.name]
            if node.get("routable") is False and "routed_around_s" not in when:
                when["routed_around_s"] = round(time.time() - cut_at, 1)
            if node.get("healthy") is False and "ejected_s" not in when:
                when["ejected_s"] = round(time.time() - cut_at, 1)
        return all("ejected_s" in when for when in seen.values())

    wait_for("both proxies' health polls taking the cut-off state node out", ejected, EJECT)
    run_for(ATTEMPT_WINDOW)  # the requests in flight at the ejection end in the span
    return cut_at, seen


def check_acknowledged_mined(fleet: Fleet, records: list[dict[str, Any]]) -> int:
    """Every transaction whose hash was returned has a successful receipt (through
    proxy-2); how many there were."""
    acked = [r["hash"] for r in records if r.get("hash")]
    seen: dict[str, Any] = {}

    def all_mined() -> bool:
        missing = [h for h in acked if not seen.get(h)]
        seen.update(receipts(fleet, fleet.proxies[1], missing) if missing else {})
        return all(seen.get(h) for h in acked)

    wait_for(f"receipts of all {len(acked)} acknowledged transactions", all_mined, 15)
    assert all(seen[h]["status"] == "0x1" for h in acked)
    return len(acked)


def test_fleet_survives_a_cut_proxy_a_dead_etcd_member_and_a_cut_state_node(
    network: Network, tmp_path: Path
) -> None:
    fleet = Fleet(network, tmp_path / "data")
    (tmp_path / "data").mkdir()
    p1, p2 = fleet.proxies
    starting = time.monotonic()
    fleet.start()
    fleet.wait_ready(STARTUP)
    print(f"\nten hosts started and ready in {time.monotonic() - starting:.1f} s")
    out = tmp_path / "client.jsonl"
    client = fleet.start_client(out)
    wait_for("the client's first acknowledged transaction", lambda: '"hash"' in out.read_text(), 20)

    phases = Phases()
    phases.begin("steady")
    run_for(4, lambda: (spreads(fleet, p1, p2, 2), spreads(fleet, p2, p1, 3)))
    cut_a_proxy_host(fleet, phases)
    print(f"etcd: {kill_the_etcd_leader(fleet, phases)}")
    cut_at, seen = cut_the_state_node_host(fleet, phases)
    print(f"state node cut off: {seen}")
    ejected = max(when["ejected_s"] for when in seen.values())
    phases.end()
    client.send_signal(signal.SIGTERM)
    client.wait(15)

    records = read_records(out)
    table = {name: stats(records, began, ended) for name, began, ended in phases.spans}
    for name, row in table.items():
        print(f"{name:<26} {json.dumps(row)}")
    for name, row in table.items():
        assert row["answered"] > 0 and row["tx_acked"] > 0, (name, row)
    for name in table:  # the other proxy, or another node, answered
        assert table[name]["failed"] == 0, (name, table[name])
    # once the state node is out of rotation, it costs nothing more
    after = [r for r in records if r["op"] == "read" and r["t0"] > cut_at + ejected]
    assert after and all(r["ok"] for r in after), [r for r in after if not r["ok"]][:5]
    print(f"all {check_acknowledged_mined(fleet, records)} acknowledged transactions mined")

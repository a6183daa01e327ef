"""The suite starts its services, measures every case on every target, and stops them all."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.services import python_cmd, running
from bench.suite import ProxySuite, SuiteOptions, proxy_config, render, run_suite


class StandInSuite(ProxySuite):
    """The proxy suite with a second fake node standing in for the proxy (the suite's
    mechanics are under test here, not the proxy)."""

    def __init__(self) -> None:
        super().__init__()
        self.pids: list[int] = []

    def proxy_command(self, port: int, config: Path) -> list[str]:
        assert 'url = "http://127.0.0.1:' in config.read_text()
        return python_cmd("-m", "bench", "fake-node", "--port", str(port), "--head", "1000000")

    def make_key(self, admin_url: str) -> str:
        return "csk_standin"  # (a fake node answers any path)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie is as good as gone
        return fh.read().split()[2] != "Z"


def test_suite_measures_every_case_and_stops_everything(tmp_path: Path) -> None:
    suite = StandInSuite()
    opts = SuiteOptions(
        duration=0.1, warmup=0, concurrency=4, keep_dir=str(tmp_path), reference=False
    )
    seen: list[int] = []
    original = suite.start

    def start(services, opts):  # remember the pids to check they are gone afterwards
        targets = original(services, opts)
        seen.extend(svc.proc.pid for svc in services.started)
        return targets

    suite.start = start  # type: ignore[method-assign]
    report = run_suite(suite, opts)
    names = ["single", "batch10", "batch100", "single-c1", "single-key"]
    assert [c["case"] for c in report["cases"]] == names
    for case in report["cases"]:
        direct, proxy = case["targets"]["direct"], case["targets"]["proxy"]
        assert direct["ratio_req_per_s"] == 1.0
        assert proxy["ratio_req_per_s"] == pytest.approx(  # (reported to 3 decimals)
            proxy["req_per_s"] / direct["req_per_s"], rel=0.01, abs=5e-4
        )
        assert direct["requests"] > 0 and not direct["errors"] and not proxy["errors"]
        assert direct["items_ok"] == direct["requests"] * case["batch"]
        # pids known: every target's CPU was read. A 0.1 s run may read 0: the kernel counts
        # CPU in clock ticks (10 ms), and a loaded machine may give a process less than one.
        assert direct["cpu_us_per_req"] >= 0 and proxy["cpu_us_per_req"] >= 0
    cpu = [t["cpu_us_per_req"] for c in report["cases"] for t in c["targets"].values()]
    assert sum(cpu) > 0  # (read from the processes, not a constant)
    assert "batch100" in render(report)
    # the proxy with busy polling is started too, and measured in the c=1 case alone
    measured = {c["case"]: "proxy-busy-poll" in c["targets"] for c in report["cases"]}
    assert measured == {**dict.fromkeys(names, False), "single-c1": True}
    assert [c["case"] for c in report["cases"] if "proxy-key" in c["targets"]] == ["single-key"]
    assert len(seen) == 3 and not any(alive(pid) for pid in seen)
    assert (tmp_path / "fake-node.log").read_text().startswith("fake node (FAKE DATA")


@pytest.mark.parametrize(
    ("cases", "proxy", "wanted"),
    [
        (None, {}, True),
        (["single-c1"], {}, True),
        (["single", "batch10"], {}, False),  # no c=1 case: no second proxy to start
        (None, {"busy_poll_us": 100}, False),  # --proxy set it: one proxy, as asked
    ],
)
def test_busy_poll_proxy_only_when_the_c1_case_runs_without_the_setting(
    cases: list[str] | None, proxy: dict[str, int], wanted: bool
) -> None:
    opts = SuiteOptions(cases=cases, proxy=proxy)
    assert ProxySuite.poll_wanted(opts) is wanted


def test_suite_stops_what_it_started_when_a_service_fails(tmp_path: Path) -> None:
    class Broken(StandInSuite):
        def proxy_command(self, port: int, config: Path) -> list[str]:
            return python_cmd("-c", "import sys; sys.exit('proxy refused to start')")

    suite = Broken()
    seen: list[int] = []
    original = suite.start

    def start(services, opts):
        try:
            return original(services, opts)
        finally:
            seen.extend(svc.proc.pid for svc in services.started)

    suite.start = start  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="proxy refused to start"):
        opts = SuiteOptions(duration=0.1, warmup=0, keep_dir=str(tmp_path), reference=False)
        run_suite(suite, opts)
    assert len(seen) == 2 and not any(alive(pid) for pid in seen)


def test_proxy_config_names_the_node() -> None:
    import tomllib

    cfg = tomllib.loads(proxy_config("http://127.0.0.1:9"))
    node = {"chain": "1337", "key": "bench-state", "url": "http://127.0.0.1:9", "kind": "state"}
    assert cfg["proxy"]["nodes"] == [{**node, "weight": 1}]
    both = tomllib.loads(proxy_config("http://127.0.0.1:9", kinds=("state", "archive")))
    assert [(n["key"], n["kind"]) for n in both["proxy"]["nodes"]] == [
        ("bench-state", "state"),
        ("bench-archive", "archive"),
    ]


def test_without_go_the_reference_is_skipped_and_said(tmp_path: Path, monkeypatch) -> None:
    import bench.suite as suite_module

    monkeypatch.setattr(suite_module.shutil, "which", lambda name: None)
    suite = ProxySuite()
    with running(str(tmp_path)) as services:
        assert suite.start_go_proxy(services, "http://127.0.0.1:1", None) is None
        assert not services.started
    assert suite.notes and "go not found" in suite.notes[0]


def test_proxy_settings_of_the_suites_are_toml() -> None:
    import tomllib

    from bench.suite import parse_toml_setting, setting_lines

    settings = dict(
        parse_toml_setting(t) for t in ("cache_pools=[]", "coalesce=false", "head_history=64")
    )
    assert settings == {"cache_pools": [], "coalesce": False, "head_history": 64}
    cfg = tomllib.loads(proxy_config("http://127.0.0.1:9", extra=setting_lines(settings)))
    assert cfg["proxy"]["cache_pools"] == [] and cfg["proxy"]["coalesce"] is False
    assert parse_toml_setting("store=x.json") == ("store", "x.json")  # not TOML: a string
    with pytest.raises(Exception, match="NAME=VALUE"):
        parse_toml_setting("cache_pools")


def test_a_launch_reaches_the_state_node_processes(tmp_path: Path) -> None:
    """`bench.realprocs callgrind` starts the suite's state node and proxy-inproc under a tool
    with a map the tool can reserve (`Launch`): both configs carry the map, both commands the
    tool; the default launch changes neither."""
    import sys
    import tomllib

    from bench.suite import Launch, evm_config_args, inproc_config

    launch = Launch(("valgrind", "--tool=callgrind"), map_size_mb=1024)
    assert launch.command("-m", "x") == ["valgrind", "--tool=callgrind", sys.executable, "-m", "x"]
    assert Launch().command("-m", "x") == [sys.executable, "-m", "x"]
    args = evm_config_args(tmp_path, {"warm_blocks": 4}, 1024)
    node = tomllib.loads(Path(args[1]).read_text())["state_nodes"][0]
    assert (node["map_size_mb"], node["evm"]) == (1024, {"warm_blocks": 4})
    args = evm_config_args(tmp_path, {}, 1024)
    assert tomllib.loads(Path(args[1]).read_text())["state_nodes"][0]["map_size_mb"] == 1024
    assert evm_config_args(tmp_path, {}) == []
    text = inproc_config(tmp_path, "http://127.0.0.1:1", 1, 2, {}, map_size_mb=1024)
    (node,) = tomllib.loads(text)["state_nodes"]
    assert node["map_size_mb"] == 1024 and node["kind"] == "archive"
    plain = tomllib.loads(inproc_config(tmp_path, "http://127.0.0.1:1", 1, 2, {}))
    assert "map_size_mb" not in plain["state_nodes"][0]


def test_an_exact_mix_holds_each_method_its_count_of_times() -> None:
    import orjson

    from bench.bodies import BodyError, BodyPlan, fake_addresses

    accounts = fake_addresses(80)
    plan = BodyPlan(
        mix=[("eth_call", 50), ("eth_getBalance", 50)],
        batch=100,
        addresses=accounts,
        call_to="0x" + "11" * 20,
        exact_mix=True,
        pool_size=8,
    )
    bodies = [orjson.loads(b) for b in plan.build()]
    assert len(bodies) == 8
    for body in bodies:
        assert [i["id"] for i in body] == list(range(100))
        calls = [i for i in body if i["method"] == "eth_call"]
        balances = [i["params"][0] for i in body if i["method"] == "eth_getBalance"]
        assert len(calls) == 50 and len(set(balances)) == 50  # no account twice
        assert all(c["params"][0]["to"] == "0x" + "11" * 20 for c in calls)
        assert all(i["params"][-1] == "latest" for i in body)
    with pytest.raises(BodyError):
        BodyPlan(mix=[("eth_call", 50), ("eth_getBalance", 49)], batch=100, exact_mix=True)


def test_rounds_take_the_targets_in_turn_and_ratios_are_each_rounds(monkeypatch) -> None:
    """A case's duration is split into rounds that measure every target in turn, the order
    reversed every other round, the full warm-up only in a target's first round; the results
    are merged, and the per-core ratio is the median of each round's own ratio."""
    import bench.suite as suite_module
    from bench.bodies import BlockRange, BodyPlan
    from bench.loadgen import BenchResult, LoadSettings, Stats

    calls: list[tuple[str, float, float]] = []
    # items per CPU second of each target in each round: "b" is 0.5, 0.9, 0.8 of "a"
    speed = {"a": [100.0, 100.0, 50.0], "b": [50.0, 90.0, 40.0]}

    def fake_measure(settings: LoadSettings, plan: BodyPlan, pid: int | None):
        label = settings.url.rsplit("/", 1)[1]
        i = sum(1 for url, _, _ in calls if url == label)
        calls.append((label, settings.duration, settings.warmup))
        stats = Stats(requests=1000, requests_ok=1000, items_ok=1000)
        stats.hist.record_many([1_000_000] * 10)
        result = BenchResult.from_stats(settings, 1, stats, settings.duration)
        return result, 1000 / speed[label][i]

    monkeypatch.setattr(suite_module, "measure", fake_measure)
    opts = SuiteOptions(duration=3.0, warmup=1.0, rounds=3)
    plan = BodyPlan(mix=[("eth_getBalance", 1.0)], blocks=BlockRange(1, 10))
    case = suite_module.Case("single", plan)
    targets = {"a": "http://127.0.0.1:9/a", "b": "http://127.0.0.1:9/b"}
    rounds = suite_module.measure_rounds(case, targets, {}, opts, None)
    assert [c[0] for c in calls] == ["a", "b", "b", "a", "a", "b"]
    assert {c[1] for c in calls} == {1.0}  # each round its share of the duration
    assert [c[2] for c in calls] == [1.0, 1.0, 0.3, 0.3, 0.3, 0.3]
    report = suite_module._case_report(case, rounds, "a")
    b = report["targets"]["b"]
    assert b["per_core_rounds"] == [0.5, 0.9, 0.8] and b["per_core_ratio"] == 0.8
    assert b["requests"] == 3000 and b["elapsed_s"] == 3.0  # the rounds merged
    assert "per_core_ratio" not in report["targets"]["a"]  # (the baseline)
    assert "b 0.80 (0.50, 0.90, 0.80)" in render({**_header(), "cases": [report], "rounds": 3})
    # a round shorter than MIN_ROUND_S: fewer rounds
    assert suite_module.rounds_of(SuiteOptions(duration=1.0, rounds=3)) == 2
    assert suite_module.rounds_of(SuiteOptions(duration=0.2, rounds=3)) == 1


def _header() -> dict[str, object]:
    return {
        "suite": "x", "date": "now", "cpus": 2, "pinned": True, "concurrency": 64,
        "duration_s": 3.0, "load_avg_start": 0.0,
    }  # fmt: skip

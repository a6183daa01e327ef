"""`chainstate bench …` parses its options; `python -m bench run` and `--wrk` work end to end."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from bench.bodies import BodyError
from bench.cli import plan_from_args, settings_from_args
from bench.wrkdriver import lua_script
from stack.cli import build_parser


def parse(*argv: str):
    return build_parser().parse_args(["bench", *argv])


def test_run_options() -> None:
    args = parse(
        "run", "http://127.0.0.1:8663/1337", "-c", "8", "-n", "100", "-P", "2",
        "--mix", "eth_getBalance=2,eth_call", "--blocks", "10-20", "--batch", "10",
        "-H", "client-id: bench", "--cpus", "0-1", "--json",
    )  # fmt: skip
    settings = settings_from_args(args)
    assert (settings.concurrency, settings.requests, settings.processes) == (8, 100, 2)
    assert settings.headers == [("client-id", "bench")] and settings.cpus == [0, 1]
    plan = plan_from_args(args)
    assert plan.items_per_body == 10 and plan.mix == [("eth_getBalance", 2.0), ("eth_call", 1.0)]
    batch = json.loads(plan.build(0)[0])
    assert len(batch) == 10 and all(10 <= int(i["params"][-1], 16) <= 20 for i in batch)
    assert args.json and not args.wrk


def test_fixed_body_options(tmp_path) -> None:
    args = parse("run", "http://x/", "--method", "eth_getBalance", "--params", '["0xab", "latest"]')
    plan = plan_from_args(args)
    body = json.loads(plan.build()[0])
    assert body == {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "eth_getBalance",
        "params": ["0xab", "latest"],
    }
    file = tmp_path / "batch.json"
    file.write_text('[{"jsonrpc":"2.0","id":1,"method":"eth_chainId"}]')
    assert plan_from_args(parse("run", "http://x/", "--body-file", str(file))).items_per_body == 1
    assert json.loads(plan_from_args(parse("run", "http://x/")).build()[0])["method"] == (
        "eth_blockNumber"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["--mix", "eth_getBalance", "--method", "eth_call"],
        ["--mix", "eth_sendTransaction"],
        ["--mix", "eth_getBalance=-1"],
        ["--mix", "eth_getBalance", "--blocks", "20-10"],
        ["--params", "[1,"],
        ["--params", "5"],
        ["--body-file", "/nonexistent/body.json"],
        ["--mix", "eth_getBalance", "--call-to", "0x" + "11" * 20],
        ["--mix", "eth_call", "--call-to", "0x1234"],
        ["--mix", "eth_call", "--call-data", "0xabc"],
        ["--method", "eth_call", "--call-to", "0x" + "11" * 20],
    ],
)
def test_bad_body_options(argv: list[str]) -> None:
    with pytest.raises(BodyError):
        plan_from_args(parse("run", "http://x/", *argv))


def test_eth_call_of_a_mix_can_target_a_contract() -> None:
    token, holder = "0x" + "ee" * 20, "0x" + "ab" * 20
    args = parse("run", "http://x/", "--mix", "eth_call", "--call-to", token, "--address", holder)
    body = json.loads(plan_from_args(args).build()[0])
    assert body["params"] == [{"to": token, "data": "0x70a08231" + "00" * 12 + "ab" * 20}, "latest"]
    args = parse("run", "http://x/", "--mix", "eth_call", "--call-to", token, "--call-data", "0x")
    assert json.loads(plan_from_args(args).build()[0])["params"][0] == {"to": token, "data": "0x"}


def test_bad_numbers_exit(capsys) -> None:
    for argv in (["-c", "0"], ["--cpus", "a-b"], ["-H", "no-colon"]):
        with pytest.raises(SystemExit):
            parse("run", "http://x/", *argv)


def test_fake_node_and_suite_options() -> None:
    args = parse("fake-node", "--kind", "archive", "--head", "5", "--latency-ms", "2")
    assert (args.kind, args.head, args.latency_ms, args.port) == ("archive", 5, 2.0, 8700)
    args = parse("suite", "proxy", "-d", "2", "--case", "single", "--no-pin")
    assert (args.suite, args.duration, args.case, args.no_pin) == ("proxy", 2.0, ["single"], True)


def test_run_command_prints_json(fake_node_process: str) -> None:
    cmd = [sys.executable, "-m", "bench", "run", fake_node_process, "-n", "50", "-c", "2"]
    cmd += ["--warmup", "0", "--json", "--method", "eth_chainId"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True)
    report = json.loads(out.stdout)
    assert report["requests"] == 50 and report["errors"] == {"http:503": 10}
    assert report["items_ok"] == 40 and report["latency_ms"]["p50"] > 0
    bad = subprocess.run(
        [sys.executable, "-m", "bench", "run", "ftp://x/"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "http://" in bad.stderr


def test_lua_script_quotes_bodies() -> None:
    from bench.bodies import BodyPlan

    plan = BodyPlan(fixed={"jsonrpc": "2.0", "method": "x", "params": ["]]", "]=]"]})
    script = lua_script(plan, [("client-id", "b")])
    assert "wrk.body = [==[" in script and "wrk.headers[[[client-id]]] = [[b]]" in script
    assert "done = function" in script


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")
def test_wrk_cross_check(fake_node_process: str) -> None:
    cmd = [sys.executable, "-m", "bench", "run", fake_node_process, "--wrk", "-d", "1"]
    cmd += ["--warmup", "0", "-c", "2", "--json", "--mix", "eth_getBalance", "--blocks", "450-500"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True)
    report = json.loads(out.stdout)
    assert report["tool"] == "wrk" and report["requests"] > 100
    assert report["errors"]["http:4xx-5xx"] == pytest.approx(report["requests"] / 5, abs=3)


def test_run_against_nothing_exits_1() -> None:
    from tests.conftest import free_port

    cmd = [sys.executable, "-m", "bench", "run", f"http://127.0.0.1:{free_port()}/"]
    cmd += ["-n", "2", "-c", "1", "--warmup", "0"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "conn:refused=2" in out.stdout

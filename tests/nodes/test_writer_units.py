"""Write node parts that need no execution client: store, settings, encodings, CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest

from chainstate.config import ConfigError
from nodes.writer import blockdiff as bd
from nodes.writer.service import WriterNode
from nodes.writer.store import BlockStore, StoreError
from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]


def test_store_refuses_a_block_that_does_not_extend_the_head(tmp_path: Path) -> None:
    store = BlockStore(tmp_path / "w.sqlite3")
    try:
        store.append(0, "0xa", "0x0", b"{}", [])
        with pytest.raises(StoreError):
            store.append(2, "0xc", "0xb", b"{}", [])
        with pytest.raises(StoreError):
            store.append(1, "0xb", "0xwrong", b"{}", [])
        store.append(1, "0xb", "0xa", b"{}", [])
        assert store.rewind(0) == 1
        assert store.head() is not None and store.head().number == 0  # type: ignore[union-attr]
    finally:
        store.close()


def _output(post: dict) -> bytes:
    return orjson.dumps({"StateDiff": {"pre": {}, "post": post}})


def test_store_keeps_the_state_after_each_block_and_rewinds_it(tmp_path: Path) -> None:
    """The values each block's StateDiff wrote, by height: what a new block's pre-state is
    checked against; a rewind forgets the blocks' values, a store without them gets them at
    open."""
    a, b = "0x" + "aa" * 20, "0x" + "bb" * 20
    slot = "0x" + "00" * 31 + "01"
    outputs = [
        _output({a: {"balance": "0x10", "nonce": "0x0", "code": "0x"}}),
        _output({a: {"balance": "0xf", "nonce": "0x1"}, b: {"balance": "0x1"}}),
        _output({b: {"storage": {slot: "0x" + "00" * 31 + "07"}}}),
    ]
    path = tmp_path / "w.sqlite3"
    store = BlockStore(path)
    try:
        for n, raw in enumerate(outputs):
            store.append(n, f"0x{n + 10:x}", f"0x{n + 9:x}" if n else "0x0", raw)
        keys = [f"{a}:balance", f"{a}:nonce", f"{b}:balance", f"{b}:storage:{slot}"]
        assert store.values_at(keys, 0) == {f"{a}:balance": "0x10", f"{a}:nonce": "0x0"}
        at_two = {
            f"{a}:balance": "0xf",
            f"{a}:nonce": "0x1",
            f"{b}:balance": "0x1",
            f"{b}:storage:{slot}": "0x" + "00" * 31 + "07",
        }
        assert store.values_at(keys, 2) == at_two
        assert store.state_at(2) == {**at_two, f"{a}:code": "0x"}
        assert store.rewind(1) == 1
        assert f"{b}:storage:{slot}" not in store.values_at(keys, 2)
        # a store written before the values were kept: they are read from its blocks at open
        store._writer.execute("DELETE FROM vals")
        store._writer.execute("DELETE FROM meta")
    finally:
        store.close()
    again = BlockStore(path)
    try:
        assert again.values_at(keys, 5) == {k: v for k, v in at_two.items() if ":storage:" not in k}
    finally:
        again.close()


@pytest.mark.parametrize(
    "section",
    [
        {},
        {"execution_url": "ftp://x"},
        {"execution_url": "http://x", "poll_interval": -1},
        {"execution_url": "http://x", "read_batch": 1.5},
        {"execution_url": "http://x", "genesis": "/nonexistent/genesis.json"},
        {"execution_url": "http://x", "tracer": "callTracer"},
    ],
)
def test_bad_settings_are_config_errors(section: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        WriterNode.from_config(section, data_dir=tmp_path)


def test_encodings_are_canonical() -> None:
    assert (
        bd.quantity("0x00ff") == "0xff" and bd.quantity(0) == "0x0" and bd.quantity("10") == "0xa"
    )
    assert bd.word("0x1") == "0x" + "00" * 31 + "01"
    assert bd.data("0xABcd") == "0xabcd"
    assert bd.address("F39FD6E51AAD88F6F4CE6AB8827279CFFFB92266") == (
        "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266"
    )
    for bad in ["0xzz", "", None, -1, True]:
        with pytest.raises(bd.BlockDataError):
            bd.quantity(bad)
    for bad in ["0x" + "1" * 65, "12", "0x", 2**256]:
        with pytest.raises(bd.BlockDataError):
            bd.word(bad)
    with pytest.raises(bd.BlockDataError):
        bd.data("0xabc")


def test_state_diff_keeps_only_changed_values() -> None:
    reads = [
        ("balance", "0xaa", None),
        ("nonce", "0xaa", None),
        ("code", "0xaa", None),
        ("storage", "0xaa", bd.word(1)),
        ("storage", "0xaa", bd.word(2)),
        ("balance", "0xbb", None),
    ]
    before = ["0x10", "0x1", "0x", "0x5", "0x0", "0x7"]
    after = ["0x0f", "0x1", "0x", "0x0", "0x0", "0x7"]
    diff = bd.make_state_diff(reads, before, after)
    assert diff == {
        "pre": {"0xaa": {"balance": "0x10", "storage": {bd.word(1): bd.word(5)}}},
        "post": {"0xaa": {"balance": "0xf", "storage": {bd.word(1): bd.word(0)}}},
    }


def test_failed_transaction_trace_is_an_error() -> None:
    with pytest.raises(bd.BlockDataError, match="trace failed"):
        bd.touched_from_traces([{"error": "boom", "txHash": "0x1"}])


def test_genesis_alloc_is_normalized() -> None:
    alloc = bd.parse_alloc(
        {
            "alloc": {
                "0xBB00000000000000000000000000000000000000": {"balance": "1000"},
                "aa00000000000000000000000000000000000000": {
                    "balance": "0x0",
                    "code": "0x6000",
                    "nonce": "0x1",
                    "storage": {"0x01": "0x02", "0x03": "0x00"},
                },
            }
        }
    )
    assert [a.address for a in alloc] == [
        "0xaa00000000000000000000000000000000000000",
        "0xbb00000000000000000000000000000000000000",
    ]
    out = bd.assemble_genesis(
        {
            "hash": "0x" + "11" * 32,
            "parentHash": "0x" + "00" * 32,
            "number": "0x0",
            "transactions": [],
        },
        alloc,
    )
    post = out["StateDiff"]["post"]
    assert post["0xaa00000000000000000000000000000000000000"] == {
        "code": "0x6000",
        "nonce": "0x1",
        "storage": {bd.word(1): bd.word(2)},
    }
    assert post["0xbb00000000000000000000000000000000000000"] == {"balance": "0x3e8"}
    assert out["BlockFile"]["receipts"] == []
    with pytest.raises(bd.BlockDataError):
        bd.parse_alloc({"config": {}})


def test_cli_runs_the_write_node(anvil_url: str, tmp_path: Path) -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "stack.cli", "write-node", "--execution-url", anvil_url]
    cmd += ["--port", str(port), "--data-dir", str(tmp_path), "--poll-interval", "0.05"]
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert f"listening on http://127.0.0.1:{port}" in first, proc.stderr and proc.stderr.read()
        body = json.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": "trace_vendorBlock", "params": ["0x0"]}
        )
        deadline = time.monotonic() + 10
        while True:
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/", body.encode(), {"content-type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=5) as resp:
                answer = json.loads(resp.read())
            if "result" in answer or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert answer["result"]["Header"]["number"] == "0x0"
    finally:
        proc.terminate()
        proc.wait(10)
    assert (tmp_path / "writer.sqlite3").exists()


def test_cli_without_execution_url_is_a_usage_error(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "stack.cli", "write-node", "--data-dir", str(tmp_path)]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--execution-url" in out.stderr


def test_parity_state_diffs_merge_into_one_block_diff() -> None:
    a, b, c = "0x" + "aa" * 20, "0x" + "bb" * 20, "0x" + "cc" * 20
    s1, s2 = bd.word(1), bd.word(2)
    items = [
        {  # tx 1: a pays b, a's slot 1 set, c created with code and a slot
            "stateDiff": {
                a: {
                    "balance": {"*": {"from": "0x10", "to": "0x8"}},
                    "nonce": {"*": {"from": "0x0", "to": "0x1"}},
                    "code": "=",
                    "storage": {s1: {"*": {"from": bd.word(0), "to": bd.word(9)}}},
                },
                b: {"balance": {"*": {"from": "0x0", "to": "0x8"}}, "code": "=", "nonce": "="},
                c: {
                    "balance": {"+": "0x0"},
                    "nonce": {"+": "0x1"},
                    "code": {"+": "0x6000"},
                    "storage": {s2: {"+": bd.word(5)}},
                },
            }
        },
        {  # tx 2: a's slot 1 restored, b removed
            "stateDiff": {
                a: {
                    "balance": "=",
                    "nonce": {"*": {"from": "0x1", "to": "0x2"}},
                    "code": "=",
                    "storage": {s1: {"*": {"from": bd.word(9), "to": bd.word(0)}}},
                },
                b: {"balance": {"-": "0x8"}, "nonce": "=", "code": "="},
            }
        },
    ]
    diff = bd.state_diff_from_parity(items)
    assert diff["pre"] == {
        a: {"balance": "0x10", "nonce": "0x0"},
        c: {"nonce": "0x0", "code": "0x", "storage": {s2: bd.word(0)}},
    }
    assert diff["post"] == {
        a: {"balance": "0x8", "nonce": "0x2"},
        c: {"nonce": "0x1", "code": "0x6000", "storage": {s2: bd.word(5)}},
    }
    with pytest.raises(bd.BlockDataError):
        bd.state_diff_from_parity([{"stateDiff": {a: {"balance": {"~": "0x1"}}}}])
    with pytest.raises(bd.BlockDataError):
        bd.state_diff_from_parity([{"output": "0x"}])

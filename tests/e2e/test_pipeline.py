"""The write pipeline as an operator drives it through a real `chainstate up`: the checker
confirms blocks a block or two behind the head, both write nodes are health-checked, and
`switchLeader` moves ingestion to the other write node while transactions keep coming,
with no gap, no block applied twice and the same validation hashes everywhere. Then, fast:
which write nodes a config declares and where each keeps its blocks."""

from __future__ import annotations

import shutil
import threading
import time
import urllib.request
from argparse import Namespace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from chainstate.config import REPO_CONFIGS, ConfigError
from nodes.writer.cli import writer_section
from nodes.writer.settings import WriterSettings, pick_writer, writer_data_dir, writer_sections
from tests.e2e.stack import BEEF, DEV, Stack, get, post, wait_for, write_config

STATE_NODES = {"state-1": "8665", "archive-1": "8666"}
WRITERS = {"writer-1": "8664", "writer-2": "8669"}
VENDOR = "chainstate_writer_requests_total"


class Sender(threading.Thread):
    """Sends a transfer through the proxy (so to the Leader) every `every` seconds."""

    def __init__(self, stack: Stack, every: float = 0.3) -> None:
        super().__init__(daemon=True)
        self.stack, self.every = stack, every
        self.sent: list[str] = []
        self.errors: list[Any] = []
        self.stop = threading.Event()

    def run(self) -> None:
        tx = {"from": DEV, "to": BEEF, "value": "0x1"}
        while not self.stop.wait(self.every):
            body = {"jsonrpc": "2.0", "id": 1, "method": "eth_sendTransaction", "params": [tx]}
            try:
                answer = post(self.stack.url("8663") + "/1337", body)
            except OSError as exc:
                self.errors.append(repr(exc))
                continue
            if "result" in answer:
                self.sent.append(answer["result"])
            else:
                self.errors.append(answer)


def validations(stack: Stack, port: str) -> dict[int, dict[str, Any]]:
    """Every block a state node holds, as the checker reads it (height → id, parent, hash)."""
    url = stack.url(port)
    rng = stack.rpc("blockx_range", url=url)
    out: dict[int, dict[str, Any]] = {}
    for start in range(rng["earliest"], rng["latest"] + 1, 100):
        count = min(100, rng["latest"] + 1 - start)
        for item in stack.rpc("blockx_getValidation", start, count, url=url):
            assert item["height"] not in out, f"height {item['height']} listed twice"
            out[item["height"]] = item
    assert sorted(out) == list(range(rng["earliest"], rng["latest"] + 1)), "a gap"
    return out


def metric(stack: Stack, port: str, name: str, **labels: str) -> float:
    """One sample of a component's `GET /metrics`."""
    with urllib.request.urlopen(stack.url(port) + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                return sample.value
    raise AssertionError(f"{name}{labels} not in the /metrics of port {port}")


def ingested(stack: Stack, height: int) -> bool:
    """Both state nodes hold `height`."""
    return all(get(stack.url(p) + "/health")["head"] >= height for p in STATE_NODES.values())


def confirmed_lag(stack: Stack) -> int | None:
    """Proxy head minus the checker's latest confirmed height (None: nothing confirmed)."""
    head = int(stack.rpc("eth_blockNumber"), 16)
    body = {"jsonrpc": "2.0", "id": 1, "method": "getLatestBlock", "params": []}
    answer = post(stack.url("8667"), body)
    return head - answer["result"]["num"] if "result" in answer else None


@pytest.mark.timeout(300)
def test_confirmations_and_a_leader_switch_under_traffic(tmp_path):
    config, ports = write_config(tmp_path)
    stack = Stack(config, ports)
    stack.start()
    sender = Sender(stack)
    try:
        admin = stack.url("8663") + "/1337"
        # Both write nodes are up, polled, and writer-1 leads.
        writers = wait_for(
            lambda: (w := get(admin + "/writers"))["writers"][1]["head"] is not None and w,
            what="both writers to be polled",
        )
        assert writers["leader"] == "writer-1"
        assert [w["key"] for w in writers["writers"]] == ["writer-1", "writer-2"]
        for w in writers["writers"]:
            assert w["healthy"] is True and w["last_error"] is None and w["behind"] <= 2
        assert get(admin + "/writers/leader")["leader"]["key"] == "writer-1"

        # The checker trails the head by a block or two once caught up.
        wait_for(lambda: (confirmed_lag(stack) or 99) <= 2, what="the checker to catch up")
        lags = []
        for _ in range(5):
            lags.append(confirmed_lag(stack))
            time.sleep(0.7)
        assert sorted(lags)[2] <= 2 and max(lags) <= 4, lags  # median; a busy CI machine

        sender.start()
        wait_for(lambda: len(sender.sent) >= 5, what="transactions to flow")
        switched_at = int(stack.rpc("eth_blockNumber"), 16)
        answer = post(admin + "/writers/switchLeader", {"key": "writer-2"})
        assert answer["leader"]["key"] == "writer-2" and answer["previous"] == "writer-1"
        assert answer["forced"] is False

        for port in STATE_NODES.values():
            wait_for(
                lambda p=port: get(stack.url(p) + "/health")["source"] == "inproc://writer-2",
                what="the state nodes to follow writer-2",
            )
        before = metric(stack, "8669", VENDOR, method="trace_vendorBlock")
        target = switched_at + 6
        wait_for(lambda: ingested(stack, target), 60, "the state nodes to ingest from writer-2")
        after = metric(stack, "8669", VENDOR, method="trace_vendorBlock")
        assert after > before  # the blocks came from writer-2
        sender.stop.set()
        sender.join()
        assert not sender.errors, sender.errors[:3]

        # Every transaction sent before and after the switch was mined and ingested.
        last = sender.sent[-1]
        receipt = wait_for(
            lambda: stack.rpc("eth_getTransactionReceipt", last, url=stack.url("8545")),
            what="the last transaction to be mined",
        )
        mined = int(receipt["blockNumber"], 16)
        wait_for(lambda: ingested(stack, mined), what="the state nodes to ingest the last tx")
        balance = int(stack.rpc("eth_getBalance", BEEF, hex(mined)), 16)
        assert balance == len(sender.sent)

        # No gap, no duplicate: contiguous heights chained by parent hashes, the execution
        # client's own blocks, and the archive applied each block exactly once.
        held = {name: validations(stack, port) for name, port in STATE_NODES.items()}
        archive = held["archive-1"]
        assert min(archive) == 0
        for height in range(1, max(archive) + 1):
            assert archive[height]["parent_id"] == archive[height - 1]["id"], height
        for name, blocks in held.items():
            for height, item in blocks.items():
                assert archive.get(height, item) == item, (name, height)
        for height in range(switched_at - 3, switched_at + 6):
            block = stack.rpc("eth_getBlockByNumber", hex(height), False, url=stack.url("8545"))
            assert archive[height]["id"] == block["hash"], height
        assert metric(stack, "8666", "chainstate_state_blocks_rolled_back_total") == 0
        assert metric(stack, "8666", "chainstate_state_blocks_applied_total") == max(archive) + 1

        # The checker confirmed the blocks around the switch with the hash both writers emit.
        checker = stack.url("8667")
        wait_for(
            lambda: stack.rpc("getLatestBlock", url=checker)["num"] >= switched_at + 5,
            what="the checker to confirm past the switch",
        )
        for height in range(switched_at - 3, switched_at + 6):
            record = stack.rpc("getBlockByHeight", height, url=checker)
            assert record["id"] == archive[height]["id"] and record["is_fork"] is False
            assert record["validation_hash"] == int(archive[height]["validation_hash"][2:18], 16)
            for port in WRITERS.values():
                out = stack.rpc("trace_vendorBlock", hex(height), url=stack.url(port))
                assert out["ValidationHash"] == archive[height]["validation_hash"], (port, height)
        assert metric(stack, "8667", "checker_disagreements_total") == 0

        # The writers list shows the new Leader, both still healthy.
        writers = get(admin + "/writers")
        assert writers["leader"] == "writer-2"
        assert [(w["key"], w["leader"], w["healthy"]) for w in writers["writers"]] == [
            ("writer-1", False, True),
            ("writer-2", True, True),
        ]
    finally:
        sender.stop.set()
        assert stack.stop() == 0, "".join(stack.output)


@pytest.mark.timeout(300)
def test_a_writer_added_to_an_existing_chain_can_lead(tmp_path):
    """anvil restored from its state file cannot replay old blocks, so a write node new to a
    chain with transactions starts from a copy of another writer's blocks and can lead."""
    config, ports = write_config(tmp_path)
    stack = Stack(config, ports)
    stack.start()
    try:
        tx = stack.rpc("eth_sendTransaction", {"from": DEV, "to": BEEF, "value": hex(10**18)})
        receipt = wait_for(
            lambda: stack.rpc("eth_getTransactionReceipt", tx, url=stack.url("8545")),
            what="the transaction to be mined",
        )
        mined = int(receipt["blockNumber"], 16)
        wait_for(lambda: ingested(stack, mined), what="the state nodes to ingest it")
    finally:
        assert stack.stop() == 0, "".join(stack.output)
    shutil.rmtree(tmp_path / "data" / "writer-2")  # as if writer-2 was added to the config now

    stack = Stack(config, ports)
    stack.start()
    try:
        admin = stack.url("8663") + "/1337"
        wait_for(
            lambda: all(w["behind"] == 0 for w in get(admin + "/writers")["writers"]),
            what="writer-2 to reach writer-1",
        )
        emitted = [
            stack.rpc("trace_vendorBlock", hex(mined), url=stack.url(port))
            for port in WRITERS.values()
        ]
        assert emitted[0] == emitted[1] and BEEF in emitted[0]["StateDiff"]["post"]
        answer = post(admin + "/writers/switchLeader", {"key": "writer-2"})
        assert answer["leader"]["key"] == "writer-2" and answer["forced"] is False
        for port in STATE_NODES.values():  # (each looks the Leader up every second)
            wait_for(
                lambda p=port: get(stack.url(p) + "/health")["source"] == "inproc://writer-2",
                what="the state nodes to follow writer-2",
            )
        before = metric(stack, "8669", VENDOR, method="trace_vendorBlock")
        head = int(stack.rpc("eth_blockNumber"), 16)
        wait_for(lambda: ingested(stack, head + 3), what="ingest from writer-2")
        assert metric(stack, "8669", VENDOR, method="trace_vendorBlock") > before
        assert "write node writer-2: new on an existing chain" in "".join(stack.output)
    finally:
        assert stack.stop() == 0, "".join(stack.output)


# ---- which write nodes a config declares, and where each keeps its blocks ------------------


def test_writer_sections_new_and_old_layouts(tmp_path):
    new = {"__dir__": "/cfg", "writers": [{"key": "w1", "port": 1}, {"key": "w2", "port": 2}]}
    assert [(s["key"], s["__dir__"]) for s in writer_sections(new)] == [
        ("w1", "/cfg"),
        ("w2", "/cfg"),
    ]
    old = {"writer": {"key": "writer-1", "execution_url": "http://x"}}
    (only,) = writer_sections(old)
    assert only["key"] == "writer-1" and only["__dir__"] == str(REPO_CONFIGS)
    assert writer_sections({}) == []
    for bad, fragment in [
        ({**new, **old}, "not both"),
        ({"writers": {"key": "w1"}}, "list of tables"),
        ({"writers": [{"key": "w1", "port": 1}, {"key": "w1", "port": 2}]}, "key = 'w1'"),
        ({"writers": [{"key": "w1"}, {"key": "w2"}]}, "port = 8664"),
    ]:
        with pytest.raises(ConfigError, match=fragment):
            writer_sections(bad)
    assert pick_writer(writer_sections(new), "w2")[0] == 1
    with pytest.raises(ConfigError, match="it has: w1, w2"):
        pick_writer(writer_sections(new), "w3")


def test_writer_data_dirs_keep_an_existing_single_writer_store(tmp_path):
    two = writer_sections({"writers": [{"key": "writer-1", "port": 1}, {"key": "w2", "port": 2}]})
    assert writer_data_dir(tmp_path, two, 0) == tmp_path / "writer-1"
    assert writer_data_dir(tmp_path, two, 1) == tmp_path / "w2"
    one = writer_sections({"writer": {"key": "writer-1"}})
    assert writer_data_dir(tmp_path, one, 0) == tmp_path / "writer"  # as before
    (tmp_path / "writer").mkdir()  # a data dir made with one write node: keep its chain
    assert writer_data_dir(tmp_path, two, 0) == tmp_path / "writer"
    assert writer_data_dir(tmp_path, two, 1) == tmp_path / "w2"


def test_write_node_cli_picks_a_writer_of_the_config(tmp_path):
    config, ports = write_config(tmp_path)
    args = Namespace(
        config=str(config),
        key="writer-2",
        execution_url=None,
        host=None,
        port=None,
        poll_interval=None,
        genesis=None,
        data_dir=None,
    )
    sect, data_dir = writer_section(args)
    assert sect["port"] == ports["8669"] and data_dir == tmp_path / "data" / "writer-2"
    assert WriterSettings.from_section(sect).execution_url.endswith(str(ports["8545"]))
    with pytest.raises(ConfigError, match="no write node 'writer-9'"):
        writer_section(Namespace(**{**vars(args), "key": "writer-9"}))

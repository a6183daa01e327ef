"""`chainstate up` killed with SIGKILL at random moments while transactions flow, restarted
on the same data dir, again and again; and anvil killed alone while the stack runs.

After every restart: the stack follows the execution client again within 10 s of starting
(the proxy's head reaches anvil's), every answer a client read through the proxy before a
kill (block hashes, balances at those blocks, receipts of mined transactions) reads the same,
the checker reports none of those blocks as a fork, parent links hold from block 0 to the
head, both state nodes follow the Leader write node and say "ok" on /health, and each write
node said in one log line where it stands. The first start, on a fresh data dir, is killed
0-3 s after it began (the devnet's first seconds); every fifth restart is also killed once
while it is still starting (restoring, starting anvil, …). Of the kills while the stack runs,
every fourth kills anvil with SIGKILL too (a whole-machine crash: its state file misses its
last seconds, or is cut short), which `chainstate up` repairs from the write nodes' stores,
and every fourth (another one) kills anvil alone: the running stack restores it from the
write nodes' stores and follows it again within 10 s of the kill, without a restart.

CHAINSTATE_CRASH_KILLS sets the number of kills (12 in the suite: each kind of kill three
times or more, each run with its own seed; the 100-kill run of docs/write-node.md uses 100),
CHAINSTATE_CRASH_SEED the random seed (printed on failure), CHAINSTATE_CRASH_LOG a file that
keeps the output of every run.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.stack import DEV, get, post, write_config

KILLS = int(os.environ.get("CHAINSTATE_CRASH_KILLS", "12"))
SEED = int(os.environ.get("CHAINSTATE_CRASH_SEED", str(random.randrange(1 << 32))))
FOLLOW_WITHIN = 10.0  # seconds from starting `chainstate up` until the proxy reaches anvil's head
RECIPIENTS = [f"0x{0xC0FFEE00 + i:040x}" for i in range(8)]


HEAD_POLL = 0.1  # the proxy's head polls (default 1 s): each restart waits for the next one


def crash_config(folder: Path) -> tuple[Path, dict[str, int]]:
    """devnet.toml on free ports, the proxy polling its nodes' heads every HEAD_POLL s."""
    config, ports = write_config(folder)
    text = config.read_text().replace("[proxy]\n", f"[proxy]\nhead_poll_interval = {HEAD_POLL}\n")
    config.write_text(text)
    return config, ports


def _group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` is still running (zombies hold no sockets)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


class Crashable:
    """One `chainstate up` process group at a time on one config and data dir."""

    def __init__(self, config: Path, ports: dict[str, int], log: Path) -> None:
        self.config, self.ports, self.log = config, ports, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.offset = 0  # where this run's output starts in the log

    def spawn(self) -> None:
        self.offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as out:
            self.started = time.monotonic()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "stack.cli", "up", "--config", str(self.config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, killed as a whole
            )

    def start(self) -> None:
        self.spawn()
        assert self.proc is not None
        deadline = self.started + 60
        while "\nData: " not in self.output():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"chainstate up did not come up (seed {SEED}):\n{self.output()}")
            time.sleep(0.05)

    def output(self) -> str:
        with open(self.log, "rb") as f:
            f.seek(self.offset)
            return f.read().decode(errors="replace")

    def kill(self, anvil_too: bool) -> None:
        """SIGKILL the whole process group (anvil, in its own group, then gets SIGTERM from
        the kernel and writes its state), or anvil too with SIGKILL."""
        assert self.proc is not None
        anvil_pid = self.anvil_pid()
        os.killpg(self.proc.pid, signal.SIGKILL)
        if anvil_too and anvil_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(anvil_pid, signal.SIGKILL)
        self.proc.wait()
        self._wait_group_gone()

    def _wait_group_gone(self) -> None:
        """The group's other processes (proxy workers holding the listening sockets) die a
        moment after its leader: a start before they are gone finds its ports taken."""
        assert self.proc is not None
        deadline = time.monotonic() + 10
        while _group_alive(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.01)

    def kill_anvil(self) -> None:
        """SIGKILL anvil alone; the stack keeps running."""
        pid = self.anvil_pid()
        assert pid is not None, "anvil's pid file is missing"
        self.started = time.monotonic()  # following again is timed from the kill
        os.kill(pid, signal.SIGKILL)

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait()

    def anvil_pid(self) -> int | None:
        pid_file = self.config.parent / "data" / "anvil-state.pid"
        try:
            return int(pid_file.read_text().split()[0])  # "pid start-time"
        except (OSError, ValueError, IndexError):
            return None

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def rpc(self, method: str, *params: Any, url: str | None = None) -> Any:
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)}
        answer = post(url or self.url("8663") + "/1337", body)
        assert "error" not in answer, (method, params, answer)
        return answer["result"]

    def batch(self, calls: list[tuple[str, list[Any]]], size: int = 200) -> list[Any]:
        """Results of `calls` through the proxy, in batches of `size` (its limit is 1000)."""
        results: list[Any] = []
        for start in range(0, len(calls), size):
            body = [
                {"jsonrpc": "2.0", "id": i, "method": m, "params": p}
                for i, (m, p) in enumerate(calls[start : start + size])
            ]
            answers = post(self.url("8663") + "/1337", body)
            assert isinstance(answers, list), answers
            errors = [a for a in answers if "error" in a]
            assert not errors, errors[:3]
            results += [a["result"] for a in sorted(answers, key=lambda a: a["id"])]
        return results


class Sender(threading.Thread):
    """Value transfers through the proxy, all the time (failures while the stack is down)."""

    def __init__(self, stack: Crashable) -> None:
        super().__init__(daemon=True)
        self.stack = stack
        self.sent: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        rng = random.Random(SEED)
        while not self.halt.wait(0.05):
            tx = {"from": DEV, "to": rng.choice(RECIPIENTS), "value": hex(rng.randrange(1, 999))}
            body = {"jsonrpc": "2.0", "id": 1, "method": "eth_sendTransaction", "params": [tx]}
            try:
                answer = post(self.stack.url("8663") + "/1337", body)
            except OSError:
                continue  # the stack is down (killed) or restarting
            if "result" in answer:
                self.sent.append(answer["result"])


class Seen:
    """Answers read through the proxy, at heights the proxy's head had reached."""

    def __init__(self) -> None:
        self.hashes: dict[int, str] = {}
        self.balances: dict[tuple[str, int], str] = {}
        self.receipts: dict[str, dict[str, Any]] = {}

    def record(self, stack: Crashable, sent: list[str], rng: random.Random) -> None:
        head = int(stack.rpc("eth_blockNumber"), 16)
        new = [h for h in range(head + 1) if h not in self.hashes]
        if new:
            blocks = stack.batch([("eth_getBlockByNumber", [hex(h), False]) for h in new])
            self.hashes.update({h: b["hash"] for h, b in zip(new, blocks, strict=True)})
        at = rng.randrange(head + 1)
        for addr in rng.sample(RECIPIENTS, 2):
            self.balances[(addr, at)] = stack.rpc("eth_getBalance", addr, hex(at))
        unread = [t for t in sent[-20:] if t not in self.receipts]
        if unread:
            receipts = stack.batch([("eth_getTransactionReceipt", [t]) for t in unread])
            committed = int(stack.rpc("eth_blockNumber"), 16)
            for tx, receipt in zip(unread, receipts, strict=True):
                if receipt is not None and int(receipt["blockNumber"], 16) <= committed:
                    self.receipts[tx] = receipt

    def check(self, stack: Crashable) -> int:
        """Everything seen reads the same; returns the proxy's head."""
        head = int(stack.rpc("eth_blockNumber"), 16)
        blocks = stack.batch([("eth_getBlockByNumber", [hex(h), False]) for h in range(head + 1)])
        for h, block in enumerate(blocks):
            assert block["number"] == hex(h)
            if h in self.hashes:
                assert block["hash"] == self.hashes[h], f"block {h} changed (seed {SEED})"
            if h:
                assert block["parentHash"] == blocks[h - 1]["hash"], f"parent link at {h}"
        assert max(self.hashes, default=-1) <= head, "the proxy's head went back"
        balances = list(self.balances.items())
        got = stack.batch([("eth_getBalance", [a, hex(h)]) for (a, h), _ in balances])
        assert got == [v for _, v in balances], f"a balance changed (seed {SEED})"
        receipts = list(self.receipts.items())
        got = stack.batch([("eth_getTransactionReceipt", [t]) for t, _ in receipts])
        assert got == [r for _, r in receipts], f"a receipt changed (seed {SEED})"
        return head

    def check_confirmations(self, stack: Crashable) -> None:
        """The checker reports none of the blocks seen as a fork (those it has confirmed)."""
        checker = stack.url("8667")
        answer = post(checker, {"jsonrpc": "2.0", "id": 1, "method": "getLatestBlock"})
        if "error" in answer:
            assert "no block has been confirmed yet" in answer["error"]["message"]
            return
        latest = answer["result"]["num"]
        for h in [h for h in self.hashes if h <= latest][-30:]:
            assert stack.rpc("blockIsValid", self.hashes[h], url=checker) is True, h


def follow_again(stack: Crashable, beyond: int = 0) -> float:
    """Seconds from starting `chainstate up` (or from killing anvil alone) until the proxy's
    head reached anvil's head as it was when anvil answered again, plus `beyond` blocks
    (mined after that); fails after FOLLOW_WITHIN."""
    target: int | None = None
    while True:
        took = time.monotonic() - stack.started
        try:
            if target is None:
                target = int(stack.rpc("eth_blockNumber", url=stack.url("8545")), 16) + beyond
            if int(stack.rpc("eth_blockNumber"), 16) >= target:
                return took
        except (OSError, AssertionError):
            pass
        if took > FOLLOW_WITHIN:
            pytest.fail(
                f"the proxy did not reach anvil's head {target} within {FOLLOW_WITHIN}s of "
                f"starting (seed {SEED}):\n{stack.output()[-4000:]}"
            )
        time.sleep(0.05)


def said_where_it_stands(stack: Crashable, since: int = 0) -> None:
    """Each write node logged one line saying whether it continues, waits or reorgs (in the
    run's output after `since` characters)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        out = stack.output()[since:]
        if all(f"write node {key}: " in out for key in ("writer-1", "writer-2")):
            return
        time.sleep(0.05)
    pytest.fail(f"no write node situation line (seed {SEED}):\n{stack.output()[-3000:]}")


def writers_healthy(stack: Crashable) -> None:
    deadline = time.monotonic() + 5
    while True:
        writers = get(stack.url("8663") + "/1337/writers")["writers"]
        if all(w["healthy"] and w["lag"] is not None and w["lag"] <= 3 for w in writers):
            return
        if time.monotonic() > deadline:
            pytest.fail(f"writers not healthy after a restart (seed {SEED}): {writers}")
        time.sleep(0.1)


def state_nodes_follow(stack: Crashable) -> None:
    """Both state nodes reach the Leader write node's head and say "ok" on /health. (The
    proxy's head alone did not show it: in CI a state node stuck on a block the write nodes
    built on a torn anvil dump left the proxy at the head it had, issue 24.)"""
    target = get(stack.url("8664") + "/health")["head"]
    deadline = time.monotonic() + 5
    while True:
        docs = []
        for port in ("8665", "8666"):
            try:
                docs.append(get(stack.url(port) + "/health"))
            except urllib.error.HTTPError as exc:  # 503: stalled
                docs.append(json.loads(exc.read() or b"{}"))
        if all(d.get("status") == "ok" and (d.get("head") or 0) >= target for d in docs):
            return
        if time.monotonic() > deadline:
            pytest.fail(f"state nodes not following after a restart (seed {SEED}): {docs}")
        time.sleep(0.1)


@pytest.mark.timeout(120 + 20 * KILLS)
def test_sigkill_at_random_moments_loses_no_answer(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    config, ports = crash_config(tmp_path)
    stack = Crashable(config, ports, tmp_path / "up.log")
    seen = Seen()
    sender = Sender(stack)
    sender.start()
    follow_times: list[float] = []
    anvil_alone = False  # the last kill took anvil down, not the stack
    try:
        for kill in range(KILLS + 1):
            since = len(stack.output()) if anvil_alone else 0
            if not anvil_alone:
                if kill == 0 or kill % 5 == 4:  # a kill while the stack is still starting
                    stack.spawn()
                    time.sleep(rng.uniform(0.0, 3.0 if kill == 0 else 1.5))
                    stack.kill(anvil_too=rng.random() < 0.5)
                stack.start()
            follow_times.append(follow_again(stack, beyond=1 if anvil_alone else 0))
            if kill:  # (the first start's kill may come before any block is stored)
                said_where_it_stands(stack, since)
            seen.check(stack)
            writers_healthy(stack)
            state_nodes_follow(stack)
            seen.check_confirmations(stack)
            if kill == KILLS:
                break
            kill_at = time.monotonic() + rng.uniform(0.3, 2.5)
            while time.monotonic() < kill_at:
                seen.record(stack, sender.sent, rng)
                time.sleep(0.05)
            anvil_alone = kill % 4 == 1
            if anvil_alone:
                stack.kill_anvil()
            else:
                stack.kill(anvil_too=kill % 4 == 3)
        head = seen.check(stack)
        assert head >= KILLS, "the chain hardly moved"
        assert len(seen.receipts) >= KILLS, "too few transactions went through"
        log = stack.log.read_text(errors="replace")
        restored = log.count("anvil: restored to the write nodes' head")
        assert restored >= KILLS // 4 // 2, "anvil killed too, yet hardly anything restored"
        restarted = log.count("anvil runs again")
        assert restarted == KILLS // 4 + (KILLS % 4 > 1), "anvil killed alone, not restarted"
        print(
            f"{KILLS} kills (seed {SEED}): head {head}, {len(seen.receipts)} receipts, "
            f"follow again after {max(follow_times):.1f} s at most; anvil restored from the "
            f"write nodes' blocks {restored} times ({restarted} times by the running stack), "
            f"its own file kept {log.count('its state file holds the write nodes')} times, "
            f"{log.count('reorg')} reorg lines"
        )
    except BaseException:
        print(f"seed {SEED}; the output of the last run:\n{stack.output()[-8000:]}")
        raise
    finally:
        sender.halt.set()
        if stack.proc is not None and stack.proc.poll() is None:
            assert stack.stop() == 0, stack.output()[-3000:]
        if os.environ.get("CHAINSTATE_CRASH_LOG"):  # keep every run's output (manual runs)
            shutil.copyfile(stack.log, os.environ["CHAINSTATE_CRASH_LOG"])


FIRST_START_KILLS = ((0.2, 1.6), (1.6, 3.0))  # seconds after the first start: early, late


@pytest.mark.timeout(120)
def test_a_first_start_killed_early_follows_again_within_10_s(tmp_path: Path) -> None:
    """`chainstate up` killed with SIGKILL 0.2-3 s after its first start on a fresh data dir
    (anvil starting from the genesis file and reloading its first dump, the write nodes
    storing block 0) and started again follows anvil within 10 s: once early in that window
    and once late. A kill while the stores held only block 0 used to brick the data dir
    (anvil reloaded took a genesis of its own as block 0: "another chain" for good)."""
    rng = random.Random(SEED)
    for i, (low, high) in enumerate(FIRST_START_KILLS):
        folder = tmp_path / f"devnet-{i}"
        folder.mkdir()
        config, ports = crash_config(folder)
        stack = Crashable(config, ports, folder / "up.log")
        stack.spawn()
        time.sleep(rng.uniform(low, high))
        stack.kill(anvil_too=False)  # anvil gets SIGTERM from the kernel and dumps its state
        try:
            stack.start()
            took = follow_again(stack, beyond=1)
            writers_healthy(stack)
            state_nodes_follow(stack)
            print(f"killed {low}-{high} s after the first start: following after {took:.1f} s")
        except BaseException:
            print(f"seed {SEED}; the output of both runs:\n{stack.log.read_text()[-8000:]}")
            raise
        finally:
            if stack.proc is not None and stack.proc.poll() is None:
                assert stack.stop() == 0, stack.output()[-3000:]

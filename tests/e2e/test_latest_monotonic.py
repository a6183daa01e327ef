"""`latest` never goes backwards: once the proxy has answered head N, no later request is
answered from below N, whichever of `eth_blockNumber` and `eth_getBlockByNumber("latest")`
asks, over one connection or two.

The chain moves fast (a block every 0.25 s) while 10,000 requests alternate the two methods:
on one connection; on two connections taking turns; and on two connections at once, where a
request counts as "later" only if it was sent after the other's answer arrived.
"""

from __future__ import annotations

import bisect
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from tests.conformance.rpc import Rpc
from tests.e2e.stack import Stack, wait_for, write_config

REQUESTS = 10_000
BLOCK_TIME = 0.25
METHODS = ("eth_blockNumber", "eth_getBlockByNumber")

pytestmark = pytest.mark.timeout(300)


@dataclass(frozen=True)
class Answer:
    sent: float
    received: float
    height: int
    method: str


def ask(rpc: Rpc, method: str) -> Answer:
    sent = time.monotonic()
    if method == "eth_blockNumber":
        height = int(rpc.call("eth_blockNumber"), 16)
    else:
        height = int(rpc.call("eth_getBlockByNumber", "latest", False)["number"], 16)
    return Answer(sent, time.monotonic(), height, method)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    config, ports = write_config(tmp_path_factory.mktemp("latest"))
    text = re.sub(
        r"^block_time = .*$", f"block_time = {BLOCK_TIME}", config.read_text(), flags=re.M
    )
    config.write_text(text)
    running = Stack(config, ports)
    running.start()
    # the nodes past their start (a few blocks ingested), so the chain moves while measured
    wait_for(lambda: int(running.rpc("eth_blockNumber") or "0x0", 16) >= 3, what="block 3")
    yield running
    assert running.stop() == 0, "".join(running.output[-50:])


def proxy(stack: Stack) -> Rpc:
    return Rpc(stack.url("8663") + "/1337")


def backwards(answers: list[Answer]) -> list[str]:
    """Every answer lower than one received before it was sent."""
    by_received = sorted(answers, key=lambda a: a.received)
    times = [a.received for a in by_received]
    highest, best = [], (-1, None)
    for a in by_received:
        if a.height > best[0]:
            best = (a.height, a)
        highest.append(best)
    found = []
    for a in answers:
        i = bisect.bisect_left(times, a.sent) - 1
        if i >= 0 and highest[i][0] > a.height:
            before = highest[i][1]
            found.append(
                f"{a.method} answered {a.height} after {before.method} answered {before.height}"
            )
    return found


def moved(answers: list[Answer]) -> int:
    heights = [a.height for a in answers]
    return max(heights) - min(heights)


def asked(one: Callable[[int], Answer], n: int = REQUESTS) -> list[Answer]:
    """`one(i)` for `n` requests, and on (up to a minute) until the chain has moved 5
    blocks while they were asked: a fast machine sends them all within a few blocks."""
    answers = [one(i) for i in range(n)]
    deadline = time.monotonic() + 60
    while moved(answers) < 5 and time.monotonic() < deadline:
        answers.append(one(len(answers)))
    return answers


def test_one_connection_alternating(stack: Stack) -> None:
    rpc = proxy(stack)
    answers = asked(lambda i: ask(rpc, METHODS[i % 2]))
    assert moved(answers) >= 5, "the chain hardly moved: the test proves nothing"
    wrong = backwards(answers)
    assert not wrong, f"{len(wrong)} of {len(answers)} went backwards: {wrong[:5]}"


def test_two_connections_taking_turns(stack: Stack) -> None:
    rpcs = (proxy(stack), proxy(stack))
    answers = asked(lambda i: ask(rpcs[i % 2], METHODS[(i // 2) % 2]))
    assert moved(answers) >= 5, "the chain hardly moved: the test proves nothing"
    wrong = backwards(answers)
    assert not wrong, f"{len(wrong)} of {len(answers)} went backwards: {wrong[:5]}"


def test_two_connections_at_once(stack: Stack) -> None:
    answers: list[Answer] = []
    lock = threading.Lock()

    def client(first: int) -> None:
        rpc = proxy(stack)
        mine = asked(lambda i: ask(rpc, METHODS[(first + i) % 2]), REQUESTS // 2)
        with lock:
            answers.extend(mine)

    threads = [threading.Thread(target=client, args=(n,)) for n in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(answers) >= REQUESTS
    assert moved(answers) >= 5, "the chain hardly moved: the test proves nothing"
    wrong = backwards(answers)
    assert not wrong, f"{len(wrong)} of {len(answers)} went backwards: {wrong[:5]}"


def test_backwards_counts_only_answers_sent_after_a_higher_one_arrived() -> None:
    def a(sent: float, received: float, height: int) -> Answer:
        return Answer(sent, received, height, "eth_blockNumber")

    assert backwards([a(0, 1, 5), a(2, 3, 5), a(4, 5, 6)]) == []
    assert len(backwards([a(0, 1, 5), a(2, 3, 4)])) == 1
    # in flight together: the lower one was sent before the higher one arrived
    assert backwards([a(0, 3, 5), a(1, 2, 6), a(1.5, 4, 5)]) == []
    assert len(backwards([a(0, 1, 6), a(0.5, 2, 5), a(1.5, 3, 5)])) == 1

"""`latest` never goes backwards through `chainstate up` (blocks every second, a state and an
archive node ingesting at their own pace): alternating `eth_blockNumber` and
`eth_getBlockByNumber("latest")`, on one connection and on two at once, never answer a
block lower than one already answered before the request was sent, and the two methods
agree. Each run of requests lasts until the chain moved by at least two blocks (and at least
`LATEST_REQUESTS` requests were sent, the issue's check: 10,000), whatever the machine's
speed: a fixed count sent on a fast machine, or before the stack made its first blocks, may
see no block arrive at all."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.e2e.stack import Stack, write_config

REQUESTS = int(os.environ.get("LATEST_REQUESTS", "600"))
NEW_BLOCKS = 2  # blocks that arrive while each run of requests goes on
# The longest a run waits for them: the devnet makes a block a second, so this is only hit
# when the chain stopped (then the test says so instead of running on).
BLOCKS_WITHIN_S = 60.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    config, ports = write_config(Path(tmp_path_factory.mktemp("latest")))
    up = Stack(config, ports)
    up.start()
    try:
        yield up
    finally:
        up.stop()


def height(answer: dict[str, Any]) -> int:
    result = answer["result"]
    return int(result if isinstance(result, str) else result["number"], 16)


class Seen:
    """The highest block answered so far (by any connection), and every violation."""

    def __init__(self) -> None:
        self.highest = -1
        self.answers = 0
        self.lower: list[tuple[int, int]] = []  # (answered, highest answered before it)
        self.first: int | None = None

    def answered(self, got: int, before: int) -> None:
        if got < before:
            self.lower.append((got, before))
        self.highest = max(self.highest, got)
        self.answers += 1
        if self.first is None:
            self.first = got


class Run:
    """When a run of requests (on one connection or several) is done: at least `minimum`
    answers and NEW_BLOCKS blocks above the first one answered, or BLOCKS_WITHIN_S passed."""

    def __init__(self, seen: Seen, minimum: int) -> None:
        self.seen = seen
        self.minimum = minimum
        self.deadline = time.monotonic() + BLOCKS_WITHIN_S

    def moved(self) -> bool:
        first = self.seen.first
        return first is not None and self.seen.highest >= first + NEW_BLOCKS

    def done(self) -> bool:
        if self.seen.answers >= self.minimum and self.moved():
            return True
        return time.monotonic() > self.deadline


async def alternate(url: str, run: Run, batch_every: int = 0) -> None:
    """Requests on one keep-alive connection until `run` is done, alternating the two
    methods (every `batch_every`-th a batch of both, whose two answers must name the same
    block)."""
    seen = run.seen
    number = {"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber", "params": []}
    block = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "eth_getBlockByNumber",
        "params": ["latest", False],
    }
    bodies = [orjson.dumps(number), orjson.dumps(block), orjson.dumps([number, block])]
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector) as session:
        i = 0
        while not run.done():
            which = 2 if batch_every and i % batch_every == 0 else i % 2
            i += 1
            before = seen.highest  # answered before this request was sent
            async with session.post(url, data=bodies[which]) as resp:
                answer = orjson.loads(await resp.read())
            if which == 2:
                got = [height(a) for a in answer]
                assert got[0] == got[1], answer  # eth_blockNumber and the block agree
                seen.answered(min(got), before)
            else:
                seen.answered(height(answer), before)


async def serving_blocks(url: str) -> int:
    """The proxy's head once it is above block 0: the stack has made its first blocks and
    its nodes ingested them (under load that takes a while after `chainstate up` is up)."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber", "params": []}
    deadline = time.monotonic() + BLOCKS_WITHIN_S
    async with aiohttp.ClientSession() as session:
        while True:
            async with session.post(url, json=body) as resp:
                answer = await resp.json()
            head = int(answer["result"], 16) if "result" in answer else 0
            if head > 0:
                return head
            assert time.monotonic() < deadline, f"the proxy still serves block 0: {answer}"
            await asyncio.sleep(0.2)


@pytest.mark.timeout(600)
async def test_latest_never_goes_backwards_through_chainstate_up(stack) -> None:
    url = stack.url("8663") + "/1337"
    await serving_blocks(url)
    one = Seen()
    started = time.monotonic()
    run_one = Run(one, REQUESTS)
    await alternate(url, run_one, batch_every=7)
    two = Seen()
    run_two = Run(two, 2 * (REQUESTS // 2))
    await asyncio.gather(alternate(url, run_two, batch_every=5), alternate(url, run_two))
    took = time.monotonic() - started
    print(
        f"{one.answers} requests on one connection, blocks {one.first}..{one.highest}; "
        f"{two.answers} on two, blocks {two.first}..{two.highest}; {took:.1f} s; "
        f"lower answers: {len(one.lower)} and {len(two.lower)}"
    )
    assert not one.lower, one.lower[:10]
    assert not two.lower, two.lower[:10]
    for run in (run_one, run_two):  # (else the deadline ended it: the chain stopped)
        assert run.moved(), f"fewer than {NEW_BLOCKS} blocks arrived in {BLOCKS_WITHIN_S} s"
    assert one.answers >= REQUESTS and two.answers >= 2 * (REQUESTS // 2)

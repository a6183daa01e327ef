"""`latest` never goes backwards through `chainstate up` (blocks every second, a state and an
archive node ingesting at their own pace): alternating `eth_blockNumber` and
`eth_getBlockByNumber("latest")`, on one connection and on two at once, never answer a
block lower than one already answered before the request was sent, and the two methods
agree. `LATEST_REQUESTS` sets the number of requests (the issue's check: 10,000)."""

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


async def alternate(url: str, n: int, seen: Seen, batch_every: int = 0) -> None:
    """`n` requests on one keep-alive connection, alternating the two methods (every
    `batch_every`-th a batch of both, whose two answers must name the same block)."""
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
        for i in range(n):
            which = 2 if batch_every and i % batch_every == 0 else i % 2
            before = seen.highest  # answered before this request was sent
            async with session.post(url, data=bodies[which]) as resp:
                answer = orjson.loads(await resp.read())
            if which == 2:
                got = [height(a) for a in answer]
                assert got[0] == got[1], answer  # eth_blockNumber and the block agree
                seen.answered(min(got), before)
            else:
                seen.answered(height(answer), before)


@pytest.mark.timeout(600)
async def test_latest_never_goes_backwards_through_chainstate_up(stack) -> None:
    url = stack.url("8663") + "/1337"
    one = Seen()
    started = time.monotonic()
    await alternate(url, REQUESTS, one, batch_every=7)
    two = Seen()
    # The requests take well under a second here and anvil mines one block a second: the
    # two connections go on (REQUESTS more each round) until a block has arrived meanwhile.
    deadline = time.monotonic() + 10
    while True:
        await asyncio.gather(
            alternate(url, REQUESTS // 2, two, batch_every=5),
            alternate(url, REQUESTS // 2, two),
        )
        if two.highest > (one.first or 0) or time.monotonic() > deadline:
            break
    took = time.monotonic() - started
    print(
        f"{REQUESTS} requests on one connection, blocks {one.first}..{one.highest}; "
        f"{two.answers} on two, blocks {two.first}..{two.highest}; {took:.1f} s; "
        f"lower answers: {len(one.lower)} and {len(two.lower)}"
    )
    assert one.answers == REQUESTS and two.answers % (2 * (REQUESTS // 2)) == 0
    assert not one.lower, one.lower[:10]
    assert not two.lower, two.lower[:10]
    assert two.highest > one.first, "no block arrived while the requests ran"

"""Two proxies' syncs (`Shared`) against one real Redis: buckets of a limit that differ come
level with each other instead of one staying behind, and the fleet's tokens are kept."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from proxy.tenancy.limits import Bucket
from proxy.tenancy.shared import Active, Shared
from tests.tenancy.redisserver import RedisServer, redis_binary

RATE = 100.0  # tokens per second; one second of burst


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(redis_binary(), tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest_asyncio.fixture
async def two(redis: RedisServer) -> AsyncIterator[tuple[Shared, Shared]]:
    a = Shared(redis.url, "t:", timeout=1.0, interval=0.05)
    b = Shared(redis.url, "t:", timeout=1.0, interval=0.05)
    yield a, b
    await a.close()
    await b.close()


def proxy_bucket() -> tuple[Bucket, Active]:
    bucket = Bucket("key:k:rps", "requests_per_second=100", RATE, 1.0, time.monotonic())
    active = Active()
    active.buckets.append(bucket)
    return bucket, active


def level(bucket: Bucket) -> float:
    bucket.take(0, time.monotonic())  # (refilled to now)
    return bucket.tokens


async def test_a_bucket_behind_catches_up_and_the_total_is_kept(
    two: tuple[Shared, Shared],
) -> None:
    (a, b), (ba, act_a), (bb, act_b) = two, proxy_bucket(), proxy_bucket()
    await a.sync(act_a)
    await b.sync(act_b)
    assert ba.take(100, time.monotonic()) == 0.0  # a spends its burst alone
    bb.tokens = 0.0  # (b's bucket below: from now on each refills as much as the other)
    await a.sync(act_a)  # reports what it admitted, and its level
    await b.sync(act_b)  # takes a's 100 off, then the fleet's mean
    await a.sync(act_a)
    la, lb = level(ba), level(bb)
    assert abs(la - lb) < 5, (la, lb)
    # a at 0, b at 0 - 100 (a's admissions): the mean of -50 each, as much refilled since
    assert -60 < la < -40 and -60 < lb < -40, (la, lb)


async def test_a_proxy_starting_late_takes_the_fleets_level_not_a_full_burst(
    two: tuple[Shared, Shared],
) -> None:
    (a, b), (ba, act_a) = two, proxy_bucket()
    await a.sync(act_a)
    assert ba.take(100, time.monotonic()) == 0.0
    await a.sync(act_a)
    bb, act_b = proxy_bucket()  # b's first request of the key: its bucket full
    await b.sync(act_b)
    la, lb = level(ba), level(bb)
    assert abs(la - lb) < 5 and lb < 10, (la, lb)


async def test_a_stopped_proxys_level_is_ignored(two: tuple[Shared, Shared]) -> None:
    (a, b), (ba, act_a) = two, proxy_bucket()
    await a.sync(act_a)
    assert ba.take(100, time.monotonic()) == 0.0
    await a.sync(act_a)  # a's last report, then a stops
    await asyncio.sleep(1.1)  # (older than the reports read)
    bb, act_b = proxy_bucket()
    await b.sync(act_b)
    assert level(bb) == pytest.approx(100.0), "a full bucket: no live proxy to level with"

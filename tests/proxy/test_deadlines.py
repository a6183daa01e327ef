"""One deadline timer for every upstream attempt (proxy/deadlines.py)."""

from __future__ import annotations

import asyncio
import time

import pytest

from chainstate.inproc import InprocRegistry
from proxy.deadlines import Deadlines
from proxy.upstream import Upstream, UpstreamError


async def test_attempts_time_out_on_their_own_limits() -> None:
    registry = InprocRegistry()

    async def slow(body: bytes) -> bytes:
        await asyncio.sleep(float(body))
        return body

    url = registry.register("slow", slow)
    upstream = Upstream(registry)
    await upstream.start()
    started = time.monotonic()

    async def attempt(wait: bytes, limit: float) -> tuple[str, float]:
        try:
            answer = await upstream.send(url, wait, limit)
        except UpstreamError as exc:
            return exc.kind, time.monotonic() - started
        return answer.decode(), time.monotonic() - started

    results = await asyncio.gather(
        attempt(b"5", 0.2), attempt(b"0.05", 1.0), attempt(b"5", 0.4), attempt(b"5", 0.2)
    )
    await upstream.close()
    assert [kind for kind, _ in results] == ["timeout", "0.05", "timeout", "timeout"]
    assert 0.2 <= results[0][1] < 0.6 and 0.4 <= results[2][1] < 0.8


async def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    registry = InprocRegistry()

    async def hang(body: bytes) -> bytes:
        await asyncio.sleep(10)
        return body

    upstream = Upstream(registry)
    await upstream.start()
    task = asyncio.create_task(upstream.send(registry.register("hang", hang), b"x", 5.0))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await upstream.close()


async def test_an_expired_deadline_cancels_only_its_own_task() -> None:
    deadlines = Deadlines()

    async def wait(seconds: float, limit: float) -> str:
        token = deadlines.start(limit)
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            if token.expired():
                return "expired"
            raise
        finally:
            deadlines.stop(token)
        return "done"

    # the tasks that finish have limits far past their sleeps: a loop stalled by a loaded
    # machine must not let their own deadlines expire first
    assert await asyncio.gather(wait(10, 0.05), wait(0.1, 10), wait(0.01, 10)) == [
        "expired",
        "done",
        "done",
    ]
    assert len(deadlines) == 0
    deadlines.close()

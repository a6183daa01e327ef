"""Identical reads in flight share one upstream call.

The first read of a key (the pool's cache epoch, then pool, block, method, params as sent) is
the **leader**: it goes to a node as usual, and `land` hands its final answer to every read
of the same key that arrived meanwhile (the **followers**); each follower answers its own
client with its own `id`. A leader that ends without an answer (cancelled, or it failed
before asking) lands `None` and its followers go to a node themselves. Only reads are keyed
(proxy/reads.py): writes and the transaction lifecycle never are.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Any

_NOT_YET: Any = object()


class Flight:
    """One leader's call; followers wait for its answer."""

    __slots__ = ("answer", "future")

    def __init__(self) -> None:
        self.answer: Any = _NOT_YET  # the leader's answer once it landed (None: gave up)
        self.future: asyncio.Future[Any] | None = None  # made by the first follower waiting

    async def wait(self) -> Any:
        """The leader's answer (a JSON-RPC answer object or its bytes), or None."""
        if self.answer is not _NOT_YET:
            return self.answer
        if self.future is None:
            self.future = asyncio.get_running_loop().create_future()
        # shield: a follower cancelled by its own client must not cancel the others' wait
        return await asyncio.shield(self.future)


class Coalescer:
    """The flights in progress of one proxy process."""

    def __init__(self) -> None:
        # key → its flight; None while the leader is alone (most reads: no object made)
        self.flights: dict[Hashable, Flight | None] = {}

    def join(self, key: Hashable) -> Flight | None:
        """The flight to follow for `key`, or None: the caller leads it and must `land`."""
        flights = self.flights
        flight = flights.get(key, _NOT_YET)
        if flight is _NOT_YET:
            flights[key] = None
            return None
        if flight is None:
            flight = flights[key] = Flight()
        return flight

    def land(self, key: Hashable, answer: Any) -> None:
        """The leader of `key` is done: its answer (None: followers must ask themselves)."""
        flight = self.flights.pop(key, None)
        if flight is None:
            return
        flight.answer = answer
        if flight.future is not None and not flight.future.done():
            flight.future.set_result(answer)

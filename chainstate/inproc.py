"""In-process transport: `inproc://name` URLs resolve to handlers registered in one registry.

`chainstate up` runs nodes and the proxy in one event loop; the proxy then calls a node's
JSON-RPC handler directly instead of making an HTTP hop. The registry is an explicit object
passed to the components that share it (no module-level state).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

# Takes a raw JSON-RPC body, returns the raw response body (b"" when nothing to answer).
BodyHandler = Callable[[bytes], Awaitable[bytes]]
# The same answer computed without awaiting, or None when the body needs the BodyHandler.
AnswerNow = Callable[[bytes], bytes | None]
# The answers of request objects already parsed, in their order (None for a notification),
# without awaiting; None when any of them needs the BodyHandler. The proxy in the same process
# calls it with the items it parsed and routed (no bytes in between) and a list to which the
# positions of the error answers are appended (the proxy then looks at those only).
AnswerItems = Callable[[list[Any], list[int]], list[Any] | None]
# The answers of request objects already parsed, in their order (None for a notification), as
# a future: for items some of which the node answers only after awaiting (eth_call on its EVM
# workers); None when any of them needs the BodyHandler. The proxy in the same process calls it
# with the items it parsed and sends the answers on from the future's callback: no task, no
# bytes in between, and its own deadline on the future (the node keeps its own limits).
AnswerLater = Callable[[list[Any]], "asyncio.Future[list[Any]] | None"]
# AnswerItems for request objects the caller checked already: every item a dict of the one
# method given, with an int or string id. The proxy in the same process looked at every item
# of a batch to route it, so the node looks the method up once instead of once per item and
# skips its own checks of what the proxy checked; the answers and error positions are the ones
# AnswerItems gives for those items, and None when any of them needs the BodyHandler.
AnswerChecked = Callable[[str, list[Any], list[int]], list[Any] | None]
# AnswerChecked for items the caller has not checked: (method, size, keys, items, errors,
# found); the node checks in its own loop that each item is a request object of the method
# with an int or string id and a list of `size` params whose last is a key of `keys`, and
# appends `keys[last]` of each to `found` (the proxy's route per block text); None when one is
# not, as when one needs the BodyHandler.
AnswerKeyed = Callable[
    [str, int, dict[str, Any], list[Any], list[int], list[Any]], list[Any] | None
]
# Told the seconds AnswerItems calls took once the caller keeps their answers: the caller may
# instead send the body again the usual way (BodyHandler), and the node must count it once.
# One or more calls at once, in any order: the proxy folds its in-process singles' counts in per
# 64 answers or 50 ms (proxy/inprocbooks.py), not one Python call per answer.
ItemsAnswered = Callable[[list[float]], None]

SCHEME = "inproc://"


class InprocRegistry:
    def __init__(self) -> None:
        self._handlers: dict[str, BodyHandler] = {}
        self._now: dict[str, AnswerNow] = {}
        self._items: dict[str, AnswerItems] = {}
        self._answered: dict[str, ItemsAnswered] = {}
        self._later: dict[str, AnswerLater] = {}
        self._checked: dict[str, AnswerChecked] = {}
        self._keyed: dict[str, AnswerKeyed] = {}
        self.version = 0  # bumped on every change: callers may keep what they resolved

    def register(
        self,
        name: str,
        handler: BodyHandler,
        answer_now: AnswerNow | None = None,
        answer_items: AnswerItems | None = None,
        items_answered: ItemsAnswered | None = None,
        answer_later: AnswerLater | None = None,
        answer_checked: AnswerChecked | None = None,
        answer_keyed: AnswerKeyed | None = None,
    ) -> str:
        """Register a handler under `name` (and its fast paths, if it has them: synchronous
        for raw bodies, and for parsed items with what counts their answers, also for items
        the caller checked or has the node check; a future for parsed items it answers after
        awaiting); returns its URL."""
        self._handlers[name] = handler
        self.version += 1
        fast_paths = (
            (self._now, answer_now),
            (self._items, answer_items),
            (self._answered, items_answered),
            (self._later, answer_later),
            (self._checked, answer_checked),
            (self._keyed, answer_keyed),
        )
        for table, fast in fast_paths:
            if fast is not None:
                table[name] = fast  # type: ignore[index]
            else:
                table.pop(name, None)
        return SCHEME + name

    def unregister(self, name: str) -> None:
        self.version += 1
        self._handlers.pop(name, None)
        self._now.pop(name, None)
        self._items.pop(name, None)
        self._answered.pop(name, None)
        self._later.pop(name, None)
        self._checked.pop(name, None)
        self._keyed.pop(name, None)

    def resolve(self, url: str) -> BodyHandler | None:
        if not url.startswith(SCHEME):
            return None
        return self._handlers.get(url[len(SCHEME) :])

    def resolve_now(self, url: str) -> AnswerNow | None:
        """The synchronous fast path registered for `url`, if any."""
        return self._now.get(url[len(SCHEME) :]) if url.startswith(SCHEME) else None

    def resolve_items(self, url: str) -> AnswerItems | None:
        """The synchronous path for parsed items registered for `url`, if any."""
        return self._items.get(url[len(SCHEME) :]) if url.startswith(SCHEME) else None

    def resolve_answered(self, url: str) -> ItemsAnswered | None:
        """What counts the answers of `url`'s path for parsed items, if it counts them."""
        return self._answered.get(url[len(SCHEME) :]) if url.startswith(SCHEME) else None

    def resolve_checked(self, url: str) -> AnswerChecked | None:
        """The synchronous path for checked items of one method registered for `url`, if
        any."""
        return self._checked.get(url[len(SCHEME) :]) if url.startswith(SCHEME) else None

    def resolve_keyed(self, url: str) -> AnswerKeyed | None:
        """The synchronous path for items of one method that the node checks for its caller
        and keys by their last param, registered for `url`, if any."""
        return self._keyed.get(url[len(SCHEME) :]) if url.startswith(SCHEME) else None

    def resolve_later(self, url: str) -> AnswerLater | None:
        """The path for parsed items answered as a future registered for `url`, if any."""
        return self._later.get(url[len(SCHEME) :]) if url.startswith(SCHEME) else None

    def names(self) -> list[str]:
        return sorted(self._handlers)


def is_inproc(url: str) -> bool:
    return url.startswith(SCHEME)

"""Polling filters, kept by the proxy: eth_newFilter, eth_newBlockFilter,
eth_newPendingTransactionFilter, eth_getFilterChanges, eth_getFilterLogs, eth_uninstallFilter.

As in geth, a filter collects what happens after it is installed: a log filter the matching
logs of each new block (and, after a reorg, the logs of the dropped blocks again with
`removed: true`), a block filter the hashes of the new blocks. `eth_getFilterChanges` hands
over what was collected since the last call. The chain comes from the pool's chain feed
(proxy/chainfeed.py), so a filter never reports a block the pool cannot answer for yet.

Pending transactions are known only to the mempool of the pool's Leader (its execution client),
so a pending-transaction filter is a filter made there through the Leader write node, under an
id of the proxy's own; each `eth_getFilterChanges` asks the Leader for its changes. When the
Leader changes, or loses the filter (a restart), the filter is gone, as on a restarted node.

Filters live in the memory of the proxy process that installed them (ids are random 16-byte
hex). A filter not polled for `filter_timeout` seconds (geth: 5 minutes) is removed; so is
one that collected more than `max_filter_changes` unpolled entries. Polling a removed filter
answers geth's "filter not found", with why when this process knows.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from cachetools import LRUCache

from chainstate.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    SERVER_BUSY,
    JsonRpcError,
    params_list,
)
from chainstate.logfilter import LogFilter, parse_filter
from chainstate.rpcclient import RpcUnavailable
from chainstate.tasks import stop_task
from proxy.chainfeed import ChainFeed, FeedBlock, follow
from proxy.eventsettings import EventSettings
from proxy.listeners import ListenerQuota, criteria_bytes

log = logging.getLogger(__name__)

FILTER_NOT_FOUND = -32000  # geth's code for "filter not found"
REMEMBERED_REMOVALS = 4096  # ids whose removal reason is kept for the error message
CLEANUP_WAIT = 1.0  # seconds a closing proxy waits for the Leader to drop its pending filters
NO_MEMPOOL = (
    "eth_newPendingTransactionFilter: this pool has no Leader write node, whose execution "
    "client holds the pending transactions"
)


def new_id() -> str:
    """A filter or subscription id: 16 random bytes as 0x hex (geth's rpc.NewID)."""
    return "0x" + secrets.token_hex(16)


class Filter:
    """One installed filter; fed by the chain feed, drained by eth_getFilterChanges."""

    wants_logs = False

    def __init__(self, registry: Filters, pool_id: str, client: str = "") -> None:
        self.id = new_id()
        self.registry = registry
        self.pool_id = pool_id
        self.client = client  # who installed it (proxy/listeners.py quotas)
        self.size = criteria_bytes(None)
        self.since = -1
        self.polled = time.monotonic()
        self.changes: list[Any] = []

    def on_blocks(self, removed: list[FeedBlock], added: list[FeedBlock]) -> None:
        self.collect(removed, added)
        self._check()

    def _check(self) -> None:
        if len(self.changes) > self.registry.settings.max_filter_changes:
            limit = self.registry.settings.max_filter_changes
            self.registry.drop(
                self, f"more than {limit} changes were not polled (max_filter_changes)"
            )

    def collect(self, removed: list[FeedBlock], added: list[FeedBlock]) -> None:
        raise NotImplementedError

    def take(self) -> list[Any]:
        self.polled = time.monotonic()
        out, self.changes = self.changes, []
        return out


class BlockFilter(Filter):
    """eth_newBlockFilter: the hashes of the new blocks (after a reorg, the new chain's)."""

    def collect(self, removed: list[FeedBlock], added: list[FeedBlock]) -> None:
        self.changes.extend(block.hash for block in added)


class LogsFilter(Filter):
    """eth_newFilter: matching logs of new blocks; removed ones again with removed: true."""

    wants_logs = True

    def __init__(
        self,
        registry: Filters,
        pool_id: str,
        raw: dict[str, Any],
        flt: LogFilter,
        client: str = "",
    ):
        super().__init__(registry, pool_id, client)
        self.raw = raw  # the filter as the client gave it, for eth_getFilterLogs
        self.flt = flt
        self.size = criteria_bytes(flt) * 2  # the parsed criteria and the raw object

    def on_logs(self, entries: list[dict[str, Any]]) -> None:
        """The matching logs of one feed step (the chain feed's index found them)."""
        self.changes.extend(entries)
        self._check()


class PendingFilter(Filter):
    """eth_newPendingTransactionFilter: a filter made in the Leader's execution client, under
    this proxy's id; its changes are the Leader's (the hashes of new pending transactions)."""

    def __init__(self, registry: Filters, pool_id: str, leader: str, client: str = "") -> None:
        super().__init__(registry, pool_id, client)
        self.leader = leader  # the write node's key: a new Leader does not have this filter
        self.upstream = ""  # the filter id in the Leader's execution client

    def collect(self, removed: list[FeedBlock], added: list[FeedBlock]) -> None:
        """(Not fed by the chain feed.)"""


Forward = Callable[[str, dict[str, Any]], Awaitable[Any]]
# (pool id, method, params) -> (the Leader's key, its result); JsonRpcError when it refuses.
LeaderCall = Callable[[str, str, list[Any]], Awaitable[tuple[str, Any]]]


class Filters:
    """The filters of one proxy process. `feed(pool_id)` gives a pool's chain feed;
    `forward(pool_id, filter)` runs eth_getLogs through the proxy's routing."""

    def __init__(
        self,
        settings: EventSettings,
        feed: Callable[[str], ChainFeed],
        forward: Forward,
        quota: ListenerQuota | None = None,
        leader: LeaderCall | None = None,
    ) -> None:
        self.settings = settings
        self._feed = feed
        self._forward = forward
        self._leader = leader
        self.installed: dict[str, Filter] = {}
        self.quota = quota if quota is not None else ListenerQuota(settings)
        self.gone: LRUCache[str, str] = LRUCache(maxsize=REMEMBERED_REMOVALS)
        self._task: asyncio.Task[None] | None = None
        self._cleanups: set[asyncio.Task[Any]] = set()

    # lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        self._task = asyncio.create_task(self._expire_loop(), name="filters-expiry")

    async def close(self) -> None:
        await stop_task(self._task)
        self._task = None
        for entry in list(self.installed.values()):
            self.drop(entry, "the proxy stopped")
        if self._cleanups:  # the Leader's filters removed, within a moment
            await asyncio.wait(list(self._cleanups), timeout=CLEANUP_WAIT)

    async def _expire_loop(self) -> None:
        every = min(max(self.settings.filter_timeout / 10, 0.05), 30.0)
        while True:
            await asyncio.sleep(every)
            self.expire(time.monotonic())

    def expire(self, now: float) -> int:
        """Remove the filters not polled for filter_timeout; how many."""
        timeout = self.settings.filter_timeout
        idle = [f for f in self.installed.values() if now - f.polled > timeout]
        for entry in idle:
            self.drop(entry, f"not polled for {timeout:g} s (filter_timeout)")
        return len(idle)

    # the methods -----------------------------------------------------------------------

    async def new_filter(self, pool_id: str, params: Any, client: str = "") -> str:
        (raw,) = params_list(params, ["filter"])
        if raw is None:
            raw = {}
        flt = parse_filter(raw, max_list=self.settings.max_log_query_list)
        return await self._install(LogsFilter(self, pool_id, raw, flt, client))

    async def new_block_filter(self, pool_id: str, params: Any, client: str = "") -> str:
        params_list(params, [])
        return await self._install(BlockFilter(self, pool_id, client))

    async def new_pending_transaction_filter(
        self, pool_id: str, params: Any, client: str = ""
    ) -> str:
        params_list(params, [])
        if self._leader is None:
            raise JsonRpcError(METHOD_NOT_FOUND, NO_MEMPOOL)
        entry = PendingFilter(self, pool_id, "", client)
        entry.leader, entry.upstream = await self._leader(
            pool_id, "eth_newPendingTransactionFilter", []
        )
        try:
            return await self._install(entry)
        except BaseException:
            self._uninstall_upstream(entry)
            raise

    async def get_filter_changes(self, pool_id: str, params: Any) -> list[Any]:
        entry = self._find(params)
        if isinstance(entry, PendingFilter):
            return await self._pending_changes(entry)
        return entry.take()

    async def _pending_changes(self, entry: PendingFilter) -> list[Any]:
        entry.polled = time.monotonic()
        try:
            leader, changes = await self._leader(  # type: ignore[misc]
                entry.pool_id, "eth_getFilterChanges", [entry.upstream]
            )
        except RpcUnavailable as exc:  # kept: the next poll may reach the Leader again
            raise JsonRpcError(INTERNAL_ERROR, f"the Leader did not answer: {exc}") from None
        except JsonRpcError as exc:
            self.drop(entry, f"the Leader's execution client lost it ({exc.message})")
            raise JsonRpcError(
                FILTER_NOT_FOUND, "filter not found: " + self.gone[entry.id]
            ) from None
        if leader != entry.leader:  # asked a new Leader: the old one's filter is not there
            self.drop(entry, "the pool's Leader changed")
            raise JsonRpcError(FILTER_NOT_FOUND, "filter not found: " + self.gone[entry.id])
        return changes if isinstance(changes, list) else []

    async def get_filter_logs(self, pool_id: str, params: Any) -> Any:
        entry = self._find(params)
        if not isinstance(entry, LogsFilter):
            raise JsonRpcError(FILTER_NOT_FOUND, "filter not found: it is not a log filter")
        entry.polled = time.monotonic()
        return await self._forward(entry.pool_id, entry.raw)

    async def uninstall_filter(self, pool_id: str, params: Any) -> bool:
        (fid,) = params_list(params, ["id"])
        entry = self.installed.get(fid) if isinstance(fid, str) else None
        if entry is None:
            return False
        self.drop(entry, "uninstalled")
        return True

    def _gone(self, entry: PendingFilter, why: str) -> JsonRpcError:
        self.drop(entry, why)
        return JsonRpcError(FILTER_NOT_FOUND, f"filter not found: removed, {why}")

    def _uninstall_upstream(self, entry: PendingFilter) -> None:
        """The Leader's filter removed in the background (it expires there anyway)."""
        if self._leader is None or not entry.upstream:
            return
        task = asyncio.create_task(
            self._leader(entry.pool_id, "eth_uninstallFilter", [entry.upstream])
        )
        self._cleanups.add(task)
        task.add_done_callback(self._cleanup_done)

    def _cleanup_done(self, task: asyncio.Task[Any]) -> None:
        self._cleanups.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("a pending filter's removal at the Leader failed: %s", task.exception())

    # helpers ---------------------------------------------------------------------------

    async def _install(self, entry: Filter) -> str:
        limit = self.settings.max_filters
        if len(self.installed) >= limit:
            raise JsonRpcError(
                SERVER_BUSY,
                f"too many filters on this proxy ({limit}, max_filters): uninstall unused ones "
                "with eth_uninstallFilter",
            )
        self.quota.take(entry.client, entry.size)
        try:
            if not isinstance(entry, PendingFilter):
                await follow(self._feed(entry.pool_id), entry)
        except BaseException:
            self.quota.give_back(entry.client, entry.size)
            raise
        self.installed[entry.id] = entry
        return entry.id

    def _find(self, params: Any) -> Filter:
        (fid,) = params_list(params, ["id"])
        if not isinstance(fid, str):
            raise JsonRpcError(INVALID_PARAMS, "invalid filter id: expected a 0x string")
        entry = self.installed.get(fid)
        if entry is None:
            why = self.gone.get(fid)
            detail = f": removed, {why}" if why else " (filters live in the proxy that made them)"
            raise JsonRpcError(FILTER_NOT_FOUND, "filter not found" + detail)
        return entry

    def drop(self, entry: Filter, why: str) -> None:
        if self.installed.pop(entry.id, None) is None:
            return
        self.quota.give_back(entry.client, entry.size)
        if isinstance(entry, PendingFilter):
            self._uninstall_upstream(entry)
        else:
            self._feed(entry.pool_id).remove(entry)
        self.gone[entry.id] = why
        log.debug("filter %s removed: %s", entry.id, why)

"""Settings of the proxy's events: filters, WebSocket subscriptions and the chain feed.

Read from the `[proxy.events]` table; every limit is named with its default (docs/events.md).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from chainstate.config import ConfigError
from chainstate.logfilter import DEFAULT_MAX_LIST
from proxy.chainfeed import FeedSettings


@dataclass(frozen=True, slots=True)
class EventSettings:
    # the chain feed (proxy/chainfeed.py)
    poll_interval: float = 0.02  # seconds between checks of the followed node's head
    history_blocks: int = 128  # announced blocks kept: the deepest reorg delivered as removals
    feed_timeout: float = 5.0  # seconds for one read of the followed node
    # filters (eth_newFilter, eth_newBlockFilter, eth_getFilterChanges, ...)
    filter_timeout: float = 300.0  # seconds without a poll before a filter is removed (geth)
    max_filters: int = 10_000  # filters installed on one proxy process
    max_filter_changes: int = 10_000  # unpolled changes a filter keeps before it is removed
    max_log_query_list: int = DEFAULT_MAX_LIST  # addresses, or topics in one position
    # filters and subscriptions together (proxy/listeners.py): per client address, per process
    max_listeners_per_client: int = 1024  # filters + subscriptions of one client address
    max_listener_bytes_per_client: int = 8 * 1024 * 1024  # their criteria's memory, one client
    max_listener_bytes: int = 256 * 1024 * 1024  # their criteria's memory, the whole process
    max_subscriptions: int = 100_000  # subscriptions on one proxy process
    # WebSocket connections on the data port (ws://host:port/:chainId)
    max_connections: int = 10_000  # WebSocket connections on one proxy process
    max_connections_per_client: int = 256  # from one client address
    max_subscriptions_per_connection: int = 1024  # as reth's default
    max_requests_in_flight: int = 64  # requests of one connection answered at once
    # A connection whose unread bytes stay above ws_queue_bytes for ws_slow_seconds, or pass
    # ws_queue_max_bytes, is a slow consumer (closed); one message is always written whole.
    ws_queue_bytes: int = 1024 * 1024
    ws_slow_seconds: float = 5.0
    ws_queue_max_bytes: int = 8 * 1024 * 1024
    # Unread bytes of every WebSocket connection of the process together: past it, a
    # connection holding more than the average is closed when a message comes for it.
    ws_unread_max_bytes: int = 256 * 1024 * 1024
    # The largest notification sent (more than the largest log a block can hold: data costs
    # 8 gas a byte, so 60M gas holds < 7.5 MB, 15 MB as hex); a larger one closes with 1009.
    max_notification_bytes: int = 16 * 1024 * 1024
    ws_heartbeat: float = 30.0  # seconds between pings (a dead client is closed)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> EventSettings:
        """From `[proxy.events]` of a loaded config; unknown keys are an error."""
        table = (config.get("proxy") or {}).get("events") or {}
        if not isinstance(table, dict):
            raise ConfigError("[proxy.events] must be a table")
        return cls.from_table(table)

    @classmethod
    def from_table(cls, table: dict[str, Any]) -> EventSettings:
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(table) - set(known))
        if unknown:
            raise ConfigError(f"[proxy.events]: unknown settings {unknown}")
        values: dict[str, Any] = {}
        for name, value in table.items():
            default = known[name].default
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"[proxy.events] {name} must be a positive number")
            if isinstance(default, int) and not isinstance(value, int):
                raise ConfigError(f"[proxy.events] {name} must be an integer")
            values[name] = type(default)(value)
        return cls(**values)

    def feed(self) -> FeedSettings:
        return FeedSettings(poll_interval=self.poll_interval, history_blocks=self.history_blocks)

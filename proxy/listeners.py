"""Who listens to a chain feed, found by what a log names; and what each client may keep.

**Matching by index.** A block's logs reach only the log listeners (filters, `logs`
subscriptions) that can match them: listeners are indexed by each address they name, else
by each topic of their first named topic position, else kept as wildcards; a log is checked
against the listeners of its address, of the topic at each position they index, and the
wildcards. A block costs the candidates its logs find, not listeners × logs: 10,000 filters
on other contracts cost an 8,000-log block nothing but 8,000 dict lookups.

**Quotas.** Filters and subscriptions are counted per client (its address; `inproc` for
callers in this process) and per process, in items and in bytes: a filter's criteria can be
1,000 addresses and 4 × 1,000 topics (about 1.3 MB kept), so items alone do not bound
memory. `ListenerQuota.take` refuses with -32005 naming the setting.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from chainstate.jsonrpc import SERVER_BUSY, JsonRpcError
from chainstate.logfilter import LogFilter

ENTRY_BYTES = 270  # memory per address or topic a filter keeps (its text, a set slot, the raw)
BASE_BYTES = 1024  # a listener's own objects


class LogListener(Protocol):
    """A listener that wants the logs matching `flt`, delivered by `on_logs`."""

    flt: LogFilter
    since: int

    def on_logs(self, entries: list[dict[str, Any]]) -> None: ...


def criteria_bytes(flt: LogFilter | None) -> int:
    """What a listener's criteria keep in memory, roughly (its unit of quota)."""
    if flt is None:
        return BASE_BYTES
    entries = len(flt.addresses or ()) + sum(len(t or ()) for t in flt.topics)
    return BASE_BYTES + ENTRY_BYTES * entries


class LogIndex:
    """The log listeners of one feed, keyed by what their logs must name."""

    def __init__(self) -> None:
        self.by_address: dict[str, set[LogListener]] = {}
        self.by_topic: list[dict[str, set[LogListener]]] = [{}, {}, {}, {}]
        self.wildcards: set[LogListener] = set()
        self._keys: dict[int, tuple[str, Any]] = {}  # id(listener) → where it is kept

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, listener: LogListener) -> None:
        flt = listener.flt
        if flt.addresses:
            self._put(listener, "address", self.by_address, flt.addresses)
            return
        for position, topics in enumerate(flt.topics):
            if topics:
                self._put(listener, position, self.by_topic[position], topics)
                return
        self.wildcards.add(listener)
        self._keys[id(listener)] = ("*", None)

    def _put(
        self, listener: LogListener, where: Any, table: dict[str, set[Any]], keys: Iterable[str]
    ) -> None:
        for key in keys:
            table.setdefault(key, set()).add(listener)
        self._keys[id(listener)] = (where, keys)

    def remove(self, listener: LogListener) -> None:
        kept = self._keys.pop(id(listener), None)
        if kept is None:
            return
        where, keys = kept
        if where == "*":
            self.wildcards.discard(listener)
            return
        table = self.by_address if where == "address" else self.by_topic[where]
        for key in keys:
            found = table.get(key)
            if found is not None:
                found.discard(listener)
                if not found:
                    del table[key]

    def candidates(self, log: dict[str, Any]) -> set[LogListener] | list[LogListener]:
        """The listeners that may match `log` (each still checks it whole)."""
        out: set[LogListener] | None = None
        found = self.by_address.get(log.get("address"))  # type: ignore[arg-type]
        if found:
            out = set(found)
        topics = log.get("topics") or ()
        for position, table in enumerate(self.by_topic):
            if table and position < len(topics):
                found = table.get(topics[position])
                if found:
                    out = set(found) if out is None else out | found
        if out is None:
            return self.wildcards  # (read only by the caller)
        return out | self.wildcards if self.wildcards else out


class ListenerQuota:
    """Filters and subscriptions of one process, per client and in total, in items and in
    bytes (docs/events.md, Limits)."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.items: dict[str, int] = {}  # client → filters and subscriptions
        self.bytes: dict[str, int] = {}
        self.total_items = 0
        self.total_bytes = 0
        self.subscriptions = 0  # of total_items (max_subscriptions)

    def take(self, client: str, size: int, subscription: bool = False) -> None:
        """Count a new listener of `client` costing `size` bytes, or raise -32005."""
        s = self.settings
        if self.items.get(client, 0) >= s.max_listeners_per_client:
            raise _busy(
                f"too many filters and subscriptions from {client} "
                f"({s.max_listeners_per_client}, max_listeners_per_client): remove unused ones"
            )
        if self.bytes.get(client, 0) + size > s.max_listener_bytes_per_client:
            raise _busy(
                f"the filters and subscriptions of {client} would keep more than "
                f"{s.max_listener_bytes_per_client} bytes of criteria "
                "(max_listener_bytes_per_client): use fewer addresses and topics"
            )
        if self.total_bytes + size > s.max_listener_bytes:
            raise _busy(
                f"filters and subscriptions on this proxy would keep more than "
                f"{s.max_listener_bytes} bytes of criteria (max_listener_bytes)"
            )
        self.items[client] = self.items.get(client, 0) + 1
        self.bytes[client] = self.bytes.get(client, 0) + size
        self.total_items += 1
        self.total_bytes += size
        self.subscriptions += subscription

    def give_back(self, client: str, size: int, subscription: bool = False) -> None:
        left = self.items.get(client, 1) - 1
        if left > 0:
            self.items[client] = left
            self.bytes[client] = self.bytes.get(client, size) - size
        else:
            self.items.pop(client, None)
            self.bytes.pop(client, None)
        self.total_items -= 1
        self.total_bytes -= size
        self.subscriptions -= subscription


def _busy(message: str) -> JsonRpcError:
    return JsonRpcError(SERVER_BUSY, message)

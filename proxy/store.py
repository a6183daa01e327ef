"""The configuration store interface shared by the file store and the etcd store.

The proxy persists its admin state as JSON values under string keys, relative to the
store's prefix (etcd: a configurable key prefix; file store: one JSON file). Key layout
(documented for operators in docs/config-store.md):

    pools/{poolId}/nodes/{nodeKey}      node entry  {"key","url","kind","weight","enabled"}
    pools/{poolId}/weights/{nodeKey}    weight override  {"weight": int}
    pools/{poolId}/routes/{method}      method routing rules  [rule, ...]
    pools/{poolId}/mirrors/{mirrorId}   mirror target
    pools/{poolId}/writers/{writerKey}  write-node entry
    pools/{poolId}/leader               {"key": writerKey}
    {chainId}/version                   version mode: V routes chain C to pool "C-V"

A poolId is a decimal chain id ("1337") or a versioned pool ("1337-blue").
Every mutation returns the store revision it produced; `watch` yields every change after a
revision, so a process that loads a snapshot at revision R and watches from R+1 misses none.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol


class StoreUnavailable(RuntimeError):
    """The store cannot be reached; persisted writes are refused, reads use the last copy."""


@dataclass(frozen=True, slots=True)
class StoreEvent:
    key: str
    value: bytes | None  # None: the key was deleted
    revision: int


class ConfigStore(Protocol):
    """What the proxy needs from a persistent, watchable key-value store."""

    @property
    def available(self) -> bool:
        """False while the backing store is unreachable."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def snapshot(self, prefix: str = "") -> tuple[dict[str, bytes], int]:
        """All keys under `prefix` and the revision of that view."""
        ...

    async def put(self, key: str, value: bytes) -> int: ...

    async def delete(self, key: str) -> int:
        """Delete one key; returns the revision (unchanged when the key did not exist)."""
        ...

    async def delete_prefix(self, prefix: str) -> int: ...

    async def replace(self, key: str, expected: bytes | None, value: bytes | None) -> int | None:
        """Compare-and-set: `key` gets `value` (None: deleted) only if it holds `expected`
        (None: absent); the new revision, or None when the key no longer matches. Admin
        read-modify-write changes use it so proxies changing one key at once lose nothing."""
        ...

    def watch(self, prefix: str, start_revision: int) -> AsyncIterator[StoreEvent]:
        """Changes under `prefix` from `start_revision` on, resuming across outages."""
        ...

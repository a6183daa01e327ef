"""What the proxy's HTTP side needs around `Gate.admit`: the client's address, the data
paths that carry a key, the aiohttp side's headers in the lean server's form."""

from __future__ import annotations

from typing import Any

from proxy.model import normalize_pool
from proxy.tenancy.keys import KEY_PREFIX as _PREFIX

KEY_PREFIX = _PREFIX.encode()
# aiohttp's route of a data path with a key (the same shape as `key_path` takes)
KEY_ROUTE = "/{chain}/{key:" + _PREFIX + "[A-Za-z0-9_-]{1,124}}"

# The headers the gate reads, as the lean server keeps them (lower-case bytes)
GATE_HEADERS = ("authorization", "origin", "x-forwarded-for", "access-control-request-headers")


def peer_of(conn: Any) -> str:
    """The remote address of a connection (the lean server's, or an aiohttp request: both
    have the transport)."""
    transport = getattr(conn, "transport", None)
    name = transport.get_extra_info("peername") if transport is not None else None
    return str(name[0]) if isinstance(name, tuple) else "unknown"


def raw_headers(headers: Any) -> dict[bytes, bytes]:
    """The gate's headers of an aiohttp request."""
    out = {}
    for name in GATE_HEADERS:
        value = headers.get(name)
        if value is not None:
            out[name.encode()] = value.encode("latin-1", "replace")
    return out


def key_path(path: bytes) -> tuple[str, str | None] | None:
    """`/:chainId` → (chain id, None); `/:chainId/:key` → (chain id, key) when the second
    segment is shaped like a key (`csk_…`: never an admin API name such as `/1337/addNode`);
    None for any other path."""
    parts = path.split(b"/")
    if len(parts) == 2:
        return parts[1].decode("latin-1"), None
    if len(parts) != 3 or not parts[2].startswith(KEY_PREFIX):
        return None
    chain = parts[1].decode("latin-1")
    if normalize_pool(chain) is None:
        return None
    return chain, parts[2].decode("latin-1")

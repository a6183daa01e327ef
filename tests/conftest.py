"""Fixtures shared by every test area. Area-specific fixtures live in tests/<area>/conftest.py."""

from __future__ import annotations

import pytest

from bench.services import free_port

__all__ = ["free_port"]


@pytest.fixture
def unused_port() -> int:
    return free_port()


def raw_post(body: bytes, extra_headers: bytes = b"") -> bytes:
    """The bytes of one HTTP/1.1 `POST /` (for tests of our own lean HTTP servers: pipelining,
    `connection: close`, size limits); `extra_headers` are complete header lines."""
    return b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n%s" % (
        len(body),
        extra_headers,
        body,
    )

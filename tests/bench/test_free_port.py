"""The loopback ports benchmarks and tests start services on."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from bench import services
from bench.services import PORTS_FROM, free_port


def test_ports_come_from_below_the_ephemeral_range_and_are_never_repeated() -> None:
    # A port from the ephemeral range can be taken by an outgoing connection's local end
    # before the service binds it.
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(PORTS_FROM <= p < low for p in ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))


def test_a_port_someone_listens_on_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        busy = listening.getsockname()[1]
        with socket.socket() as spare:
            spare.bind(("127.0.0.1", 0))
            free = spare.getsockname()[1]
        draws = iter([busy, free])
        monkeypatch.setattr(services.random, "randrange", lambda *_: next(draws))
        monkeypatch.setattr(services, "_ephemeral_low", lambda: 65535)
        assert services.free_port() == free

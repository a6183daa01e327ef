"""Tenancy fixtures: the proxy test fixtures (a real listener, fake nodes), reused."""

from tests.proxy.conftest import fake_nodes, make_api

__all__ = ["fake_nodes", "make_api"]

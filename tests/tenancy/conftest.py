"""Tenancy fixtures: the proxy test fixtures (a real listener, fake nodes) and a real etcd."""

from tests.etcd.conftest import etcd_server
from tests.proxy.conftest import fake_nodes, make_api

__all__ = ["etcd_server", "fake_nodes", "make_api"]

"""Routing proxy: JSON-RPC engine, pools, selection, forwarding, admin API."""

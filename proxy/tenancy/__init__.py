"""Tenancy: projects and keys, their limits and rules, and who used what (docs/tenancy.md).

The request path makes one call at admission, `Gate.admit` (proxy/tenancy/gate.py); the rest
of this package feeds it: the config store's `tenancy/` keys (registry.py), local token
buckets corrected from Redis counters (limits.py, shared.py), rules (rules.py), usage
(usage.py) and the admin API (admin.py).
"""

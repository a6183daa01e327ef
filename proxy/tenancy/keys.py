"""API keys: made from 32 random bytes, stored only as their SHA-256.

A key carries 256 random bits, so it cannot be guessed and a fast hash is as safe as a slow
one (bcrypt/argon2 protect low-entropy passwords); the proxy hashes a key once per new
Authorization value or path, never per request (proxy/tenancy/gate.py keeps the answer).
"""

from __future__ import annotations

import hashlib
import secrets

KEY_PREFIX = "csk_"  # recognizable in a leaked-secret scan
PREFIX_SHOWN = 8  # characters kept (and listed) to tell keys apart
KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
MAX_KEY_LEN = 128


def new_key() -> str:
    """A fresh key: `csk_` and 43 URL-safe characters (path segments and headers carry it)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def new_id() -> str:
    """A key's public id (shown in lists, logs and refusals instead of the key)."""
    return "k" + secrets.token_hex(6)


def key_hash(key: str | bytes) -> str:
    raw = key.encode("latin-1") if isinstance(key, str) else key
    return hashlib.sha256(raw).hexdigest()


def shown_prefix(key: str) -> str:
    return key[:PREFIX_SHOWN]


def looks_like_key(text: str) -> bool:
    """A path segment or bearer value that may be a key (else it is not even looked up)."""
    return 8 <= len(text) <= MAX_KEY_LEN and KEY_CHARS.issuperset(text)

"""A project and an API key with two limits (the key's and its project's requests per second,
far above any load here), for measuring what a keyed request costs against an anonymous one."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

LIMIT = 1_000_000  # requests per second of the key and of its project: never reached
PROJECT = {"id": "bench", "limits": {"requests_per_second": LIMIT}}
KEY = {"project": "bench", "name": "bench", "limits": {"requests_per_second": LIMIT}}


async def seed_store(store: Any) -> str:
    """Writes the project and a key into a config store (before the proxy starts on it);
    returns the key."""
    import orjson

    from proxy.tenancy.keys import key_hash, new_id, new_key, shown_prefix

    key = new_key()
    record = {
        **{k: v for k, v in KEY.items() if k != "project"},
        "id": new_id(),
        "project": "bench",
        "hash": key_hash(key),
        "prefix": shown_prefix(key),
    }
    await store.start()
    await store.put("tenancy/projects/bench", orjson.dumps(PROJECT))
    await store.put(f"tenancy/keys/{record['id']}", orjson.dumps(record))
    return key


def create_over_admin(admin_url: str) -> str:
    """The same through a running proxy's admin API; returns the key."""

    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{admin_url}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            return json.loads(resp.read())

    post("/tenancy/projects", PROJECT)
    return post("/tenancy/keys", KEY)["key"]

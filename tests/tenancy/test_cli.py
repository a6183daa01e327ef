"""`chainstate keys` against a real proxy listener: create, list, rotate, revoke, usage."""

from __future__ import annotations

import asyncio
import json

import orjson

from stack.cli import main
from tests.proxy.conftest import balance


async def keys(capsys, url: str, *argv: str) -> tuple[int, dict]:
    code = await asyncio.to_thread(main, ["keys", "--admin", url, *argv])
    out = capsys.readouterr().out
    return code, json.loads(out)


async def test_keys_cli(make_api, fake_nodes, capsys) -> None:
    node = await fake_nodes("state-1")
    api = await make_api()
    await api.add("1337", node)
    await api.heads_known("1337")
    url = f"http://127.0.0.1:{api.client.server.port}"
    code, made = await keys(
        capsys, url, "add-project", "acme", "--limits", '{"requests_per_second": 9}'
    )
    assert code == 0 and made["limits"] == {"requests_per_second": 9}
    code, key = await keys(capsys, url, "create", "acme", "--name", "ci")
    assert code == 0 and key["key"].startswith("csk_")
    async with api.client.data.post(f"/1337/{key['key']}", data=orjson.dumps(balance())) as resp:
        assert resp.status == 200
    code, listed = await keys(capsys, url, "list", "--project", "acme")
    assert [k["id"] for k in listed["keys"]] == [key["id"]] and key["key"] not in json.dumps(listed)
    code, rotated = await keys(capsys, url, "rotate", key["id"])
    assert code == 0 and rotated["key"] != key["key"]
    code, usage = await keys(capsys, url, "usage", "--key", key["id"], "--by", "day")
    assert code == 0 and usage["usage"][0]["requests"] == 1
    code, revoked = await keys(capsys, url, "revoke", key["id"])
    assert code == 0 and revoked["revoked"] is True
    code, pool = await keys(capsys, url, "pool", "1337", "--anonymous", "off")
    assert code == 0 and pool["anonymous"] is False
    code, answer = await keys(capsys, url, "create", "nope")
    assert code == 1 and "unknown project" in answer["error"]

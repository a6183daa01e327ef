"""Tenancy through a real proxy listener (the lean server and its aiohttp fallback) in front
of fake nodes: keys, the admin API, limits, rules, CORS, JWTs and usage."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp
import jwt
import orjson
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from proxy.tenancy.settings import TenancySettings
from tests.proxy.conftest import ADDR, balance, req

SECRET = "jwt-test-secret-of-32-bytes-long!"


@pytest.fixture
async def make_tenant(make_api, fake_nodes):
    """A proxy with one state node on chain 1337 and the given tenancy settings."""

    async def make(**settings: Any):
        node = await fake_nodes("state-1", "state")
        api = await make_api(tenancy=TenancySettings(**settings))
        await api.add("1337", node)
        await api.heads_known("1337")
        return api, node

    return make


async def project(api, pid: str = "acme", **body: Any) -> dict:
    status, answer = await api.post("/tenancy/projects", {"id": pid, **body})
    assert status == 201, answer
    return answer


async def new_key(api, pid: str = "acme", **body: Any) -> dict:
    status, answer = await api.post("/tenancy/keys", {"project": pid, **body})
    assert status == 201, answer
    assert answer["key"].startswith("csk_") and answer["prefix"] == answer["key"][:8]
    return answer


async def post(api, path: str, body: Any, **headers: str) -> tuple[int, Any, Any]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with api.client.data.post(path, data=data, headers=headers) as resp:
        raw = await resp.read()
        is_json = resp.content_type == "application/json" and raw
        return resp.status, (orjson.loads(raw) if is_json else raw), resp.headers


async def test_without_keys_every_request_is_served_as_before(make_tenant) -> None:
    api, _ = await make_tenant()
    status, answer, headers = await post(api, "/1337", balance())
    assert status == 200 and answer["result"] and "Access-Control-Allow-Origin" not in headers


async def test_a_key_is_shown_once_and_works_in_the_path_and_as_bearer(make_tenant) -> None:
    api, _ = await make_tenant()
    await project(api)
    made = await new_key(api, name="ci")
    key = made["key"]
    status, listed = await api.get("/tenancy/keys")
    assert status == 200 and key not in orjson.dumps(listed).decode()
    assert listed["keys"][0]["id"] == made["id"] and "hash" not in listed["keys"][0]
    status, answer, _ = await post(api, f"/1337/{key}", balance())
    assert status == 200 and "result" in answer
    status, answer, _ = await post(api, "/1337", balance(), Authorization=f"Bearer {key}")
    assert status == 200 and "result" in answer
    # the admin API's own paths are never taken for a key
    status, _ = await api.post("/1337/setWeight", {"key": "state-1", "weight": 2})
    assert status == 200


async def test_bad_keys_are_refused_with_401(make_tenant) -> None:
    api, _ = await make_tenant()
    await project(api)
    key = (await new_key(api))["key"]
    for path, headers in (
        ("/1337/csk_not-a-key-at-all-000000", {}),
        ("/1337", {"Authorization": "Bearer csk_unknownunknownunknown"}),
        ("/1337", {"Authorization": f"Basic {key}"}),
    ):
        status, answer, _ = await post(api, path, balance(), **headers)
        assert status == 401, (path, status, answer)
        assert answer["error"]["code"] == -32001 and key not in answer["error"]["message"]
    for path in ("/1337/bad%20key", "/1337/garbage"):  # not a key's shape: no such path
        assert (await post(api, path, balance()))[0] == 404


async def test_a_revoked_or_rotated_key_is_refused_at_once(make_tenant) -> None:
    api, _ = await make_tenant()
    await project(api)
    made = await new_key(api)
    status, rotated = await api.post(f"/tenancy/keys/{made['id']}/rotate")
    assert status == 200 and rotated["key"] != made["key"] and rotated["id"] == made["id"]
    status, answer, _ = await post(api, f"/1337/{made['key']}", balance())
    assert status == 401, answer
    status, _, _ = await post(api, f"/1337/{rotated['key']}", balance())
    assert status == 200
    status, revoked = await api.post(f"/tenancy/keys/{made['id']}/revoke")
    assert status == 200 and revoked["revoked"] is True
    status, answer, _ = await post(api, f"/1337/{rotated['key']}", balance())
    assert status == 401 and "revoked" in answer["error"]["message"]


async def test_a_pool_without_anonymous_access_needs_a_key(make_tenant) -> None:
    api, _ = await make_tenant()
    status, answer = await api.post("/tenancy/pools/1337", {"anonymous": False})
    assert status == 200 and answer["anonymous"] is False
    status, answer, _ = await post(api, "/1337", balance())
    assert status == 401 and "needs an API key" in answer["error"]["message"]
    await project(api)
    key = (await new_key(api))["key"]
    assert (await post(api, f"/1337/{key}", balance()))[0] == 200
    status, answer = await api.post("/tenancy/pools/1337", {"reset": True})
    assert status == 200 and answer["anonymous"] is True and answer["stored"] is False
    assert (await post(api, "/1337", balance()))[0] == 200


async def test_a_key_over_its_rate_gets_429_with_retry_after_naming_the_limit(make_tenant) -> None:
    api, _ = await make_tenant()
    await project(api, limits={"requests_per_second": 1000})
    key = (await new_key(api, limits={"requests_per_second": 5, "burst_seconds": 1}))["key"]
    statuses = []
    for _ in range(8):
        status, answer, headers = await post(api, f"/1337/{key}", balance())
        statuses.append(status)
    assert statuses[:5] == [200] * 5 and statuses[-1] == 429
    assert answer["error"]["code"] == -32005
    assert "requests_per_second=5" in answer["error"]["message"]
    assert int(headers["Retry-After"]) >= 1
    async with api.client.data.post(f"/1337/{key}", data=orjson.dumps(balance())) as resp:
        assert (resp.status, resp.reason) == (429, "Too Many Requests")
    async with api.client.data.post("/1337/csk_unknownunknownunknown", data=b"{}") as resp:
        assert (resp.status, resp.reason) == (401, "Unauthorized")
    # anonymous traffic is not this key's
    assert (await post(api, "/1337", balance()))[0] == 200


async def test_a_batch_over_its_item_limit_is_refused_whole(make_tenant) -> None:
    api, node = await make_tenant()
    await project(api)
    key = (await new_key(api, limits={"items_per_second": 10}))["key"]
    before = len(node.received)
    batch = [balance(hex(900 + i), rid=i) for i in range(11)]
    status, answer, _ = await post(api, f"/1337/{key}", batch)
    assert status == 429 and isinstance(answer, dict) and answer["error"]["code"] == -32005
    assert len(node.received) == before  # nothing of it went to a node
    status, answer, _ = await post(api, f"/1337/{key}", batch[:10])
    assert status == 200 and len(answer) == 10
    status, answer, _ = await post(api, f"/1337/{key}", batch[1:])  # (10 items again at once)
    assert status == 429 and "items_per_second=10" in answer["error"]["message"]


async def test_method_rules_by_name_and_pattern(make_tenant) -> None:
    api, _ = await make_tenant()
    await project(api, rules={"methods_denied": ["debug_*"]})
    key = (
        await new_key(
            api, rules={"methods_allowed": ["eth_get*", "eth_blockNumber"], "max_batch": 3}
        )
    )["key"]
    path = f"/1337/{key}"
    assert (await post(api, path, balance()))[0] == 200
    status, answer, _ = await post(api, path, req("eth_chainId"))
    assert status == 403 and answer["error"]["code"] == -32002
    assert "eth_chainId is not allowed" in answer["error"]["message"]
    status, answer, _ = await post(api, path, req("debug_traceCall"))
    assert status == 403
    status, answer, _ = await post(api, path, [balance(), req("eth_chainId", rid=2)])
    assert status == 403  # one denied item refuses the whole batch
    status, answer, _ = await post(api, path, [balance(rid=i) for i in range(4)])
    assert status == 403 and "max_batch=3" in answer["error"]["message"]


async def test_logs_range_and_chain_rules(make_tenant) -> None:
    api, _ = await make_tenant()
    await project(api, rules={"chains": ["1"]})
    key = (await new_key(api, rules={"max_logs_range": 100}))["key"]
    status, answer, _ = await post(api, f"/1337/{key}", balance())
    assert status == 403 and "chain 1337 is not allowed" in answer["error"]["message"]
    await api.post("/tenancy/projects/acme", {"rules": {}})
    wide = req("eth_getLogs", [{"fromBlock": "0x1", "toBlock": "latest"}])
    status, answer, _ = await post(api, f"/1337/{key}", wide)
    assert status == 403 and "max_logs_range=100" in answer["error"]["message"]
    narrow = req("eth_getLogs", [{"fromBlock": "0x3e0", "toBlock": "0x3e8"}])
    status, answer, _ = await post(api, f"/1337/{key}", narrow)
    assert status == 200, answer


async def test_cors_preflight_and_origins(make_tenant) -> None:
    api, _ = await make_tenant()
    await project(api)
    key = (await new_key(api, rules={"origins": ["https://app.example"]}))["key"]
    async with aiohttp.ClientSession() as http:
        base = f"http://127.0.0.1:{api.client.server.port}"
        pre = {
            "Origin": "https://app.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        }
        async with http.options(f"{base}/1337/{key}", headers=pre) as resp:
            assert resp.status == 200
            assert resp.headers["Access-Control-Allow-Origin"] == "https://app.example"
            assert "POST" in resp.headers["Access-Control-Allow-Methods"]
        evil = {**pre, "Origin": "https://evil.example"}
        async with http.options(f"{base}/1337/{key}", headers=evil) as resp:
            assert resp.status == 403 and "Access-Control-Allow-Origin" not in resp.headers
        async with http.options(f"{base}/1337", headers=evil) as resp:  # cors_origins: *
            assert resp.status == 200
            assert resp.headers["Access-Control-Allow-Origin"] == "https://evil.example"
    status, answer, headers = await post(
        api, f"/1337/{key}", balance(), Origin="https://app.example"
    )
    assert status == 200 and headers["Access-Control-Allow-Origin"] == "https://app.example"
    status, answer, headers = await post(
        api, f"/1337/{key}", balance(), Origin="https://evil.example"
    )
    assert status == 403 and "origin" in answer["error"]["message"]
    status, answer, headers = await post(api, "/1337", balance(), Origin="https://any.example")
    assert status == 200 and headers["Access-Control-Allow-Origin"] == "https://any.example"


async def test_ip_allow_lists_and_trusted_proxies(make_tenant) -> None:
    api, _ = await make_tenant(trusted_proxies=("127.0.0.0/8",))
    await project(api)
    key = (await new_key(api, rules={"ips": ["203.0.113.0/24"]}))["key"]
    status, answer, _ = await post(api, f"/1337/{key}", balance())
    assert status == 403 and "address 127.0.0.1" in answer["error"]["message"]
    status, _, _ = await post(api, f"/1337/{key}", balance(), **{"X-Forwarded-For": "203.0.113.9"})
    assert status == 200
    # a hop the client wrote itself, left of what the trusted proxy appended, is not believed
    spoofed = {"X-Forwarded-For": "203.0.113.9, 198.51.100.7"}
    assert (await post(api, f"/1337/{key}", balance(), **spoofed))[0] == 403


async def test_anonymous_clients_are_limited_per_address(make_tenant) -> None:
    api, _ = await make_tenant(
        trusted_proxies=("127.0.0.0/8",), anonymous_limits=_limits(requests_per_second=2)
    )
    one = {"X-Forwarded-For": "198.51.100.1"}
    two = {"X-Forwarded-For": "198.51.100.2"}
    assert [(await post(api, "/1337", balance(), **one))[0] for _ in range(3)] == [200, 200, 429]
    assert (await post(api, "/1337", balance(), **two))[0] == 200


async def test_concurrent_requests_of_a_key(make_tenant) -> None:
    api, node = await make_tenant()
    await project(api)
    key = (await new_key(api, limits={"concurrent": 1}))["key"]
    node.delay = 0.3
    async with aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{api.client.server.port}/1337/{key}"
        first = asyncio.ensure_future(http.post(url, data=orjson.dumps(balance())))
        await asyncio.sleep(0.1)
        async with http.post(url, data=orjson.dumps(balance(rid=2))) as resp:
            assert resp.status == 429 and "concurrent=1" in (await resp.json())["error"]["message"]
        async with await first as resp:
            assert resp.status == 200
        node.delay = 0
        async with http.post(url, data=orjson.dumps(balance(rid=3))) as resp:
            assert resp.status == 200  # its place was given back


async def test_concurrent_requests_of_an_anonymous_address(make_tenant) -> None:
    api, node = await make_tenant(
        trusted_proxies=("127.0.0.0/8",), anonymous_limits=_limits(concurrent=1)
    )
    node.delay = 0.3
    one = {"X-Forwarded-For": "198.51.100.1"}
    first = asyncio.ensure_future(post(api, "/1337", balance(), **one))
    await asyncio.sleep(0.1)
    status, answer, _ = await post(api, "/1337", balance(rid=2), **one)
    assert status == 429 and "concurrent=1" in answer["error"]["message"], answer
    two = {"X-Forwarded-For": "198.51.100.2"}
    assert (await post(api, "/1337", balance(rid=3), **two))[0] == 200
    assert (await first)[0] == 200
    node.delay = 0
    assert (await post(api, "/1337", balance(rid=4), **one))[0] == 200  # its place given back


def _limits(**values: Any):
    from proxy.tenancy.model import Limits

    return Limits(**values)


def _es256() -> tuple[Any, bytes]:
    private = ec.generate_private_key(ec.SECP256R1())
    public = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, public


async def test_jwts_hs256_and_es256(make_tenant, tmp_path) -> None:
    private, public = _es256()
    pem = tmp_path / "jwt.pem"
    pem.write_bytes(public)
    api, _ = await make_tenant(jwt_secret=SECRET, jwt_public_key=str(pem), jwt_audience="rpc")
    await project(api, limits={"requests_per_second": 100})
    exp = int(time.time()) + 60
    good = jwt.encode({"project": "acme", "aud": "rpc", "exp": exp, "sub": "u1"}, SECRET, "HS256")
    es = jwt.encode({"project": "acme", "aud": "rpc", "exp": exp}, private, "ES256")
    for token in (good, es):
        status, answer, _ = await post(api, "/1337", balance(), Authorization=f"Bearer {token}")
        assert status == 200, answer
    bad = {
        "expired": jwt.encode({"project": "acme", "aud": "rpc", "exp": 1}, SECRET, "HS256"),
        "audience": jwt.encode({"project": "acme", "aud": "x", "exp": exp}, SECRET, "HS256"),
        "no exp": jwt.encode({"project": "acme", "aud": "rpc"}, SECRET, "HS256"),
        "project": jwt.encode({"aud": "rpc", "exp": exp}, SECRET, "HS256"),
        "unknown": jwt.encode({"project": "nope", "aud": "rpc", "exp": exp}, SECRET, "HS256"),
        "signature": jwt.encode(
            {"project": "acme", "aud": "rpc", "exp": exp}, "other" * 8, "HS256"
        ),
    }
    for why, token in bad.items():
        status, answer, _ = await post(api, "/1337", balance(), Authorization=f"Bearer {token}")
        assert status == 401 and answer["error"]["code"] == -32001, why


async def test_usage_per_key_and_metrics_name_projects_only(make_tenant, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    api, node = await make_tenant()
    await project(api)
    made = await new_key(api, limits={"requests_per_second": 3, "burst_seconds": 1})
    key = made["key"]
    node.method_errors["eth_chainId"] = -32000
    before = len(node.received)
    for _ in range(2):
        await post(api, f"/1337/{key}", balance())
    await post(api, f"/1337/{key}", req("eth_chainId"))
    await post(api, f"/1337/{key}", balance())  # over the rate
    status, usage = await api.get(f"/tenancy/usage?key={made['id']}")
    assert status == 200, usage
    [row] = usage["usage"]
    assert (row["project"], row["key"], row["requests"], row["items"]) == ("acme", made["id"], 3, 3)
    assert row["errors"] == 1 and row["refused"] == {"requests_per_second": 1}
    # a call to the node for each request it answered (not the refused one, nor one the
    # response cache answered)
    called = len(node.received) - before
    assert row["upstream"] == called and called >= 2
    status, daily = await api.get("/tenancy/usage?project=acme&by=day")
    assert daily["usage"][0]["requests"] == 3
    resp = await api.client.get("/metrics")
    text = await resp.text()
    assert 'chainstate_tenancy_requests_total{project="acme"} 3.0' in text
    assert f'chainstate_tenancy_upstream_total{{project="acme"}} {called}.0' in text
    assert (
        'chainstate_tenancy_refused_total{limit="requests_per_second",project="acme"} 1.0' in text
    )
    assert key not in text and made["id"] not in text
    assert key not in caplog.text


async def test_bad_admin_bodies_change_nothing(make_tenant) -> None:
    api, _ = await make_tenant()
    for body in (
        {"id": "Bad Id"},
        {"id": "p", "limits": {"requests_per_second": -1}},
        {"id": "p", "limits": {"rps": 1}},
        {"id": "p", "rules": {"methods_allowed": ["eth_(.*)"]}},
        {"id": "p", "rules": {"origins": ["ftp://x"]}},
        {"id": "p", "rules": {"ips": ["300.1.1.1"]}},
    ):
        status, answer = await api.post("/tenancy/projects", body)
        assert status == 400, (body, answer)
    assert (await api.get("/tenancy/projects"))[1] == {"projects": []}
    status, _ = await api.post("/tenancy/keys", {"project": "nope"})
    assert status == 404
    await project(api)
    assert (await api.post("/tenancy/projects", {"id": "acme"}))[0] == 409
    assert (await api.post("/tenancy/keys/kdoesnotexist/revoke"))[0] == 404
    status, answer = await api.get("/tenancy/usage?by=week")
    assert status == 400


async def test_a_websocket_upgrade_needs_a_key_where_requests_do(make_tenant) -> None:
    api, _ = await make_tenant()
    await project(api)
    key = (await new_key(api))["key"]
    await api.post("/tenancy/pools/1337", {"anonymous": False})
    base = f"http://127.0.0.1:{api.client.server.port}"
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(f"{base}/1337")
        assert refused.value.status == 401
        async with http.ws_connect(f"{base}/1337/{key}") as ws:
            await ws.send_bytes(orjson.dumps(req("eth_blockNumber")))
            answer = orjson.loads((await ws.receive()).data)
            assert answer["result"] == "0x3e8"


async def test_usage_is_exact_for_a_key_whose_requests_take_a_lease(make_tenant) -> None:
    """A key with a high rate takes tokens a few at a time; what it did not use goes back
    and what it used is counted before anything reads the counts."""
    api, _ = await make_tenant()
    await project(api, limits={"requests_per_second": 100_000})
    made = await new_key(api, limits={"requests_per_second": 50_000})
    for sent in (7, 30):
        for _ in range(7 if sent == 7 else 23):
            status, _, _ = await post(api, f"/1337/{made['key']}", balance())
            assert status == 200
        status, usage = await api.get(f"/tenancy/usage?key={made['id']}")
        [row] = usage["usage"]
        assert (row["requests"], row["items"]) == (sent, sent)
        text = await (await api.client.get("/metrics")).text()
        assert f'chainstate_tenancy_requests_total{{project="acme"}} {sent}.0' in text


async def test_a_daily_quota_is_exact_for_single_requests(make_tenant) -> None:
    api, _ = await make_tenant()
    await project(api, limits={"daily_items": 12})
    key = (await new_key(api, limits={"requests_per_second": 50_000}))["key"]
    statuses = [(await post(api, f"/1337/{key}", balance()))[0] for _ in range(14)]
    assert statuses == [200] * 12 + [429] * 2
    status, answer, headers = await post(api, f"/1337/{key}", balance())
    assert status == 429 and "daily_items=12" in answer["error"]["message"]
    assert int(headers["Retry-After"]) >= 1


async def test_each_websocket_message_counts_against_the_keys_limits(make_tenant) -> None:
    api, _ = await make_tenant()
    await project(api)
    made = await new_key(
        api,
        limits={"requests_per_second": 3, "burst_seconds": 1},
        rules={"methods_denied": ["eth_getCode"]},
    )
    base = f"http://127.0.0.1:{api.client.server.port}"
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{base}/1337/{made['key']}") as ws:
        for rid in range(6):
            await ws.send_bytes(orjson.dumps(req("eth_blockNumber", rid=rid)))
        answers = {}
        for _ in range(6):
            answer = orjson.loads((await ws.receive()).data)
            answers[answer["id"]] = answer
        refused = [a for a in answers.values() if "error" in a]
        assert sorted(answers) == list(range(6)) and 2 <= len(refused) <= 3, answers
        assert all(a["error"]["code"] == -32005 for a in refused)
        assert "requests_per_second=3" in refused[0]["error"]["message"]
        await ws.send_bytes(orjson.dumps(req("eth_getCode", [ADDR, "latest"], rid=7)))
        await asyncio.sleep(1.1)  # (the refusal took no token: the rate refills meanwhile)
        answer = orjson.loads((await ws.receive()).data)
        assert answer["id"] == 7 and answer["error"]["code"] == -32002
        await ws.send_bytes(orjson.dumps(req("eth_blockNumber", rid=8)))
        answer = orjson.loads((await ws.receive()).data)
        assert answer == {"jsonrpc": "2.0", "id": 8, "result": "0x3e8"}
    _, usage = await api.get(f"/tenancy/usage?key={made['id']}")
    [row] = usage["usage"]
    assert row["requests"] == 6 - len(refused) + 1
    assert row["refused"] == {"requests_per_second": len(refused), "methods": 1}

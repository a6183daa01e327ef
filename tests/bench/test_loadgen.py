"""The load generator counts requests, items and errors exactly; it parses HTTP framing."""

from __future__ import annotations

import orjson
import pytest

from bench.bodies import BlockRange, BodyPlan, fixed_request
from bench.fakenode import FakeNodeSettings, FakeRpc
from bench.loadgen import (
    LoadSettings,
    ResponseError,
    Stats,
    encode_request,
    parse_response,
    run_bench,
    run_load,
)
from tests.conftest import free_port

ADDR = "0x00000000000000000000000000000000000000aa"


def test_parse_response_framing() -> None:
    raw = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX: y\r\n\r\nhello" + b"HTTP/1.1 204"
    assert parse_response(bytearray(raw)) == (len(raw) - 12, 200, b"hello", True)
    assert parse_response(bytearray(raw[:30])) is None  # head incomplete
    assert parse_response(bytearray(raw[:-14])) is None  # body incomplete
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    )
    assert parse_response(bytearray(chunked)) == (len(chunked), 200, b"abcde", True)
    assert parse_response(bytearray(chunked[:-2])) is None
    close = b"HTTP/1.1 503 X\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    assert parse_response(bytearray(close)) == (len(close), 503, b"", False)
    with pytest.raises(ResponseError):
        parse_response(bytearray(b"SSH-2.0-OpenSSH\r\n\r\n"))
    with pytest.raises(ResponseError):
        parse_response(bytearray(b"HTTP/1.1 200 OK\r\n\r\n"))  # no framing


def test_request_bytes() -> None:
    from bench.loadgen import Target

    target = Target.parse("http://127.0.0.1:8663/1337?x=1")
    raw = encode_request(target, b"{}", [("client-id", "bench")])
    assert raw.startswith(b"POST /1337?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8663\r\n")
    assert b"Content-Length: 2\r\nclient-id: bench\r\n\r\n{}" in raw
    with pytest.raises(ValueError):
        Target.parse("ftp://host/")


def test_stats_classify_items() -> None:
    s = Stats()
    ok = b'{"jsonrpc":"2.0","id":1,"result":"0x1"}'
    err = b'{"jsonrpc":"2.0","id":1,"error":{"code":-39006,"message":"m"}}'
    s.count_response(200, ok, 1)
    s.count_response(200, err, 1)
    s.count_response(503, err, 1)
    s.count_response(200, b"[" + ok + b"," + err + b"," + ok + b"]", 4)  # one item missing
    s.count_response(200, b"<html>", 1)
    assert (s.requests, s.requests_ok, s.items_ok) == (5, 1, 3)
    assert s.items_err == 1 + 2 + 1
    assert dict(s.errors) == {
        "rpc:-39006": 2,
        "http:503": 1,
        "bad:missing-items": 1,
        "bad:json": 1,
    }


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        LoadSettings(url="http://x/", concurrency=2, processes=3)
    with pytest.raises(ValueError):
        LoadSettings(url="http://x/", requests=0)
    assert LoadSettings(url="http://x/", concurrency=5, processes=2, requests=7).share(0) == (3, 4)
    assert LoadSettings(url="http://x/", concurrency=5, processes=2, requests=7).share(1) == (2, 3)


async def test_counts_match_the_server_with_injected_failures(fake_node) -> None:
    node = await fake_node(fail_every=10)
    plan = BodyPlan(fixed=fixed_request("eth_getBalance", f'["{ADDR}", "latest"]'))
    settings = LoadSettings(url=node.url, concurrency=8, requests=500, warmup=0)
    res = await run_load(settings, plan)
    assert res.requests == 500 == node.stats.requests
    assert res.errors == {"http:503": 50}
    assert (res.requests_ok, res.items_ok, res.items_err) == (450, 450, 0)
    assert res.req_per_s > 0 and 0 < res.latency_ns["p50"] <= res.latency_ns["max"]


async def test_batch_mix_counts_every_item(fake_node) -> None:
    """Heights half outside the state window: every out-of-window item is one -39006."""
    node = await fake_node(head=1000, window=100)
    plan = BodyPlan(
        mix=[("eth_getBalance", 2), ("getStorageAt", 1)],
        batch=10,
        blocks=BlockRange(801, 1000),
        pool_size=50,
    )
    settings = LoadSettings(url=node.url, concurrency=4, requests=120, warmup=0)
    res = await run_load(settings, plan)
    # The generator walks the pool in order from index 1, whatever the connections' timing.
    pool = plan.build(0)
    sent = [pool[(i + 1) % len(pool)] for i in range(120)]
    rpc = FakeRpc(FakeNodeSettings(head=1000, window=100))
    expected_err = sum(
        "error" in item for body in sent for item in orjson.loads(rpc.answer_body(body))
    )
    assert 0 < expected_err < 1200
    assert res.requests == 120
    assert res.errors == {"rpc:-39006": expected_err}
    assert (res.items_ok, res.items_err) == (1200 - expected_err, expected_err)


async def test_duration_and_warmup(fake_node) -> None:
    node = await fake_node()
    plan = BodyPlan(fixed=fixed_request("eth_blockNumber", None))
    settings = LoadSettings(url=node.url, concurrency=4, duration=0.4, warmup=0.2)
    res = await run_load(settings, plan)
    assert 0.38 < res.elapsed_s < 3.0  # the measured window, not the warm-up (loose: shared CI)
    assert res.requests > 10 and not res.errors
    assert node.stats.requests > res.requests  # warm-up traffic reached the node, uncounted


async def test_connection_errors_and_timeouts(fake_node) -> None:
    plan = BodyPlan(fixed=fixed_request("eth_chainId", None))
    refused = LoadSettings(
        url=f"http://127.0.0.1:{free_port()}/", concurrency=1, requests=3, warmup=0
    )
    res = await run_load(refused, plan)
    assert (res.requests, res.errors) == (0, {"conn:refused": 3})
    slow = await fake_node(latency_ms=1000)
    timing_out = LoadSettings(url=slow.url, concurrency=1, requests=2, warmup=0, timeout=0.15)
    res = await run_load(timing_out, plan)
    assert (res.requests, res.errors) == (0, {"timeout": 2})


def test_processes_merge_their_counts(fake_node_process: str) -> None:
    plan = BodyPlan(fixed=fixed_request("eth_blockNumber", None), batch=3)
    settings = LoadSettings(
        url=fake_node_process, concurrency=4, processes=2, requests=400, warmup=0
    )
    res = run_bench(settings, plan)
    assert res.processes == 2
    assert res.requests == 400
    assert res.errors == {"http:503": 80}  # the node fails every 5th request
    assert res.items_ok == 320 * 3
    assert res.latency_ns["p99"] >= res.latency_ns["p50"] > 0


def test_log_bodies_cover_the_span_from_the_drawn_block() -> None:
    """`suite logs` bodies: eth_getLogs over `log_span` blocks from a drawn height, by the
    drawn address, with the plan's topics; one block when the span is 1."""
    topics = ["0x" + "ab" * 32, None]
    ranged = BodyPlan(
        mix=[("eth_getLogs", 1)], blocks=BlockRange(10, 20), addresses=[ADDR], log_span=100
    )
    one_block = BodyPlan(
        mix=[("eth_getLogs", 1)], blocks=BlockRange(10, 20), addresses=[ADDR], log_topics=topics
    )
    for body in ranged.build():
        (flt,) = orjson.loads(body)["params"]
        start = int(flt["fromBlock"], 16)
        assert 10 <= start <= 20 and int(flt["toBlock"], 16) == start + 99
        assert flt["address"] == ADDR and "topics" not in flt
    for body in one_block.build():
        (flt,) = orjson.loads(body)["params"]
        assert flt["fromBlock"] == flt["toBlock"] and flt["topics"] == topics

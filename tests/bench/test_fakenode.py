"""The fake node: deterministic answers, the -39006 window, JSON-RPC envelopes, HTTP framing."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from bench.fakenode import FakeNodeSettings, FakeRpc, block_hash
from tests.conftest import raw_post

ADDR = "0x00000000000000000000000000000000000000aa"
OTHER = "0x00000000000000000000000000000000000000bb"


def ask(rpc: FakeRpc, method: str, *params: object) -> dict:
    body = orjson.dumps({"jsonrpc": "2.0", "id": 7, "method": method, "params": list(params)})
    return orjson.loads(rpc.answer_body(body))


def result(rpc: FakeRpc, method: str, *params: object) -> object:
    answer = ask(rpc, method, *params)
    assert "result" in answer, answer
    return answer["result"]


def code(rpc: FakeRpc, method: str, *params: object) -> int:
    answer = ask(rpc, method, *params)
    assert "error" in answer, answer
    return answer["error"]["code"]


@pytest.fixture
def state() -> FakeRpc:
    return FakeRpc(FakeNodeSettings(kind="state", head=1000, window=128, chain_id=5))


@pytest.fixture
def archive() -> FakeRpc:
    return FakeRpc(FakeNodeSettings(kind="archive", head=1000))


def test_values_are_deterministic_and_depend_on_params(state: FakeRpc) -> None:
    at_900 = result(state, "eth_getBalance", ADDR, hex(900))
    assert at_900 == result(FakeRpc(state.settings), "eth_getBalance", ADDR, hex(900))
    assert at_900 != result(state, "eth_getBalance", ADDR, hex(901))
    assert at_900 != result(state, "eth_getBalance", OTHER, hex(900))
    assert result(state, "eth_getBalance", ADDR, "latest") == result(
        state, "eth_getBalance", ADDR, hex(1000)
    )
    assert result(state, "eth_blockNumber") == hex(1000)
    assert result(state, "eth_chainId") == hex(5)
    slot = result(state, "eth_getStorageAt", ADDR, "0x0", "latest")
    assert isinstance(slot, str) and len(slot) == 66
    assert slot != result(state, "eth_getStorageAt", ADDR, "0x1", "latest")
    call = {"to": ADDR, "data": "0x70a08231"}
    assert len(result(state, "eth_call", call, "latest")) == 66
    assert int(result(state, "eth_getTransactionCount", ADDR, hex(1000)), 16) >= int(
        result(state, "eth_getTransactionCount", ADDR, hex(900)), 16
    )


def test_vendor_methods_agree_with_eth(state: FakeRpc) -> None:
    ctx = {"block_id": hex(950), "type": "Equals"}
    assert result(state, "getAddressBalance", ADDR, ctx) == result(
        state, "eth_getBalance", ADDR, hex(950)
    )
    assert result(state, "getAddressCode", ADDR, ctx) == result(
        state, "eth_getCode", ADDR, "latest"
    )
    assert result(state, "getStorageAt", ADDR, "0x2", ctx) == result(
        state, "eth_getStorageAt", ADDR, "0x2", hex(950)
    )
    latest = result(state, "getLatestBlock")
    assert latest["height"] == 1000 and latest["id"] == block_hash(1000)
    assert latest["parent_id"] == block_hash(999)
    assert result(state, "blockx_range") == {"earliest": 873, "latest": 1000}


def test_state_window_and_archive_range(state: FakeRpc, archive: FakeRpc) -> None:
    assert result(state, "eth_getBalance", ADDR, hex(873))  # oldest block kept: head - 127
    assert code(state, "eth_getBalance", ADDR, hex(872)) == -39006
    assert code(state, "eth_getBalance", ADDR, hex(1001)) == -39006
    assert code(state, "eth_getBalance", ADDR, "earliest") == -39006
    assert code(state, "getAddressBalance", ADDR, {"block_id": 5, "type": "Equals"}) == -39006
    assert result(archive, "eth_getBalance", ADDR, "0x0")
    assert result(archive, "eth_getBalance", ADDR, "earliest")
    assert code(archive, "eth_getBalance", ADDR, hex(1001)) == -39006


def test_blocks_by_hash(archive: FakeRpc) -> None:
    header = result(archive, "eth_getBlockByHash", block_hash(900), False)
    assert header["number"] == hex(900) and header["transactions"] == []
    assert result(archive, "eth_getBlockByNumber", hex(900), True) == header
    unknown = "0x" + "11" * 32
    assert code(archive, "eth_getBlockByHash", unknown, False) == -39006
    assert code(archive, "eth_getBalance", ADDR, {"blockHash": unknown}) == -39006
    assert result(archive, "eth_getBalance", ADDR, {"blockHash": block_hash(900)}) == result(
        archive, "eth_getBalance", ADDR, hex(900)
    )
    assert result(archive, "blockIsValid", block_hash(10)) is True
    assert result(archive, "blockIsValid", unknown) is False


def test_bad_input_gets_the_right_codes(state: FakeRpc) -> None:
    assert code(state, "eth_getBalance", "0x1234", "latest") == -32602
    assert code(state, "eth_getBalance", ADDR, "yesterday") == -39007
    assert code(state, "eth_getStorageAt", ADDR, "zz", "latest") == -32602
    assert code(state, "eth_call", "not-an-object", "latest") == -32602
    assert code(state, "eth_getBalance", ADDR, "latest", "extra") == -32602
    assert code(state, "debug_traceTransaction") == -32601
    assert orjson.loads(state.answer_body(b"{nope"))["error"]["code"] == -32700
    assert orjson.loads(state.answer_body(b"[]"))["error"]["code"] == -32600
    assert orjson.loads(state.answer_body(b'{"id": 1}'))["error"]["code"] == -32600


def test_batch_keeps_order_and_drops_notifications(state: FakeRpc) -> None:
    batch = [
        {"jsonrpc": "2.0", "id": "a", "method": "eth_blockNumber"},
        {"jsonrpc": "2.0", "method": "eth_blockNumber"},  # notification: no answer
        {"jsonrpc": "2.0", "id": 3, "method": "eth_getBalance", "params": [ADDR, "0x1"]},
        {"jsonrpc": "2.0", "id": 4, "method": "eth_chainId"},
    ]
    out = orjson.loads(state.answer_body(orjson.dumps(batch)))
    assert [a["id"] for a in out] == ["a", 3, 4]
    assert out[1]["error"]["code"] == -39006
    assert state.answer_body(b'{"jsonrpc":"2.0","method":"eth_chainId"}') == b""


def test_head_advances_with_block_time() -> None:
    rpc = FakeRpc(FakeNodeSettings(head=10, block_time=0.05))
    first = int(result(rpc, "eth_blockNumber"), 16)
    time.sleep(0.12)
    assert int(result(rpc, "eth_blockNumber"), 16) >= first + 2


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        FakeNodeSettings(kind="full")
    with pytest.raises(ValueError):
        FakeNodeSettings(window=0)


async def http(port: int, raw: bytes, responses: int = 1) -> list[tuple[int, bytes, bytes]]:
    """Send raw bytes, read `responses` HTTP responses: (status, head, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    out = []
    for _ in range(responses):
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        out.append((int(head.split(b" ")[1]), head, await reader.readexactly(length)))
    writer.close()
    return out


async def test_http_pipelining_status_and_close(fake_node) -> None:
    node = await fake_node(head=77)
    one = b'{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber"}'
    answers = await http(node.port, raw_post(one) + raw_post(one), responses=2)
    assert [(s, orjson.loads(b)["result"]) for s, _, b in answers] == [(200, "0x4d"), (200, "0x4d")]
    [(status, head, body)] = await http(node.port, raw_post(one, b"Connection: close\r\n"))
    assert b"connection: close" in head.lower()
    [(status, _, body)] = await http(node.port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 200 and orjson.loads(body)["head"] == 77
    chunked = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    body = b"%x\r\n%b\r\n0\r\n\r\n" % (len(one), one)
    [(status, _, body)] = await http(node.port, chunked + body)
    assert status == 200 and orjson.loads(body)["result"] == "0x4d"
    [(status, _, _)] = await http(node.port, b"DELETE / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 405


async def test_http_latency_and_injected_failures(fake_node) -> None:
    node = await fake_node(latency_ms=60, fail_every=2)
    one = b'{"jsonrpc":"2.0","id":1,"method":"eth_chainId"}'
    started = time.perf_counter()
    answers = await http(node.port, raw_post(one) + raw_post(one), responses=2)
    assert time.perf_counter() - started >= 0.06
    assert [s for s, _, _ in answers] == [200, 503]
    assert orjson.loads(answers[1][2])["error"]["message"] == "fake node: injected failure"
    assert (node.stats.requests, node.stats.failed) == (2, 1)

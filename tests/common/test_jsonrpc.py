"""The shared JSON-RPC dispatcher answers like a JSON-RPC 2.0 server should."""

from __future__ import annotations

import orjson
import pytest

from chainstate.jsonrpc import Dispatcher, JsonRpcError, params_list


@pytest.fixture
def dispatcher() -> Dispatcher:
    d = Dispatcher(max_batch=3)

    async def echo(params):
        return params

    async def fail(params):
        raise JsonRpcError(-39006, "block not found")

    async def boom(params):
        raise RuntimeError("secret internals")

    d.update({"echo": echo, "fail": fail, "boom": boom})
    return d


async def ask(d: Dispatcher, body: bytes):
    out = await d.handle_body(body)
    return orjson.loads(out) if out else None


async def test_single_and_error(dispatcher):
    assert await ask(dispatcher, b'{"jsonrpc":"2.0","id":7,"method":"echo","params":[1]}') == {
        "jsonrpc": "2.0",
        "id": 7,
        "result": [1],
    }
    r = await ask(dispatcher, b'{"jsonrpc":"2.0","id":"a","method":"fail","params":[]}')
    assert r["error"] == {"code": -39006, "message": "block not found"}
    r = await ask(dispatcher, b'{"jsonrpc":"2.0","id":1,"method":"nope"}')
    assert r["error"]["code"] == -32601


async def test_internal_error_hides_details(dispatcher):
    r = await ask(dispatcher, b'{"jsonrpc":"2.0","id":1,"method":"boom"}')
    assert r["error"] == {"code": -32603, "message": "Internal error"}


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{", -32700),
        (b"[]", -32600),
        (b"[1]", -32600),
        (b'{"jsonrpc":"1.0","id":1,"method":"echo"}', -32600),
        (b'{"jsonrpc":"2.0","id":1,"method":5}', -32600),
        (b'{"jsonrpc":"2.0","id":{},"method":"echo"}', -32600),
        (b'{"jsonrpc":"2.0","id":1,"method":"echo","params":3}', -32600),
        (b"[1,2,3,4]", -32600),
    ],
)
async def test_malformed(dispatcher, body, code):
    r = await ask(dispatcher, body)
    first = r[0] if isinstance(r, list) else r
    assert first["error"]["code"] == code


async def test_batch_keeps_order_and_drops_notifications(dispatcher):
    body = (
        b'[{"jsonrpc":"2.0","id":2,"method":"echo","params":["b"]},'
        b'{"jsonrpc":"2.0","method":"echo","params":["note"]},'
        b'{"jsonrpc":"2.0","id":1,"method":"echo","params":["a"]}]'
    )
    r = await ask(dispatcher, body)
    assert [x["id"] for x in r] == [2, 1]
    assert await ask(dispatcher, b'{"jsonrpc":"2.0","method":"echo"}') is None


def test_params_list():
    assert params_list(["a"], ["x", "y"]) == ["a", None]
    assert params_list({"y": 2}, ["x", "y"]) == [None, 2]
    with pytest.raises(JsonRpcError):
        params_list([1, 2, 3], ["x"])

"""Real client libraries watch events through the proxy, as dapps do, during a 30-block run.

The whole stack runs as a user runs it (anvil with a 0.25 s block time, write nodes, state
nodes, the proxy: `chainstate up`). An OpenZeppelin ERC20 is deployed, then every
watcher starts, then 30 transfers are sent one per block. Each watcher must report every
Transfer exactly once, in chain order, as anvil lists them:

- ethers v6: WebSocketProvider + contract.on("Transfer") (eth_subscribe logs),
  JsonRpcProvider polling (its default: eth_newFilter + eth_getFilterChanges) and with
  `polling: true` (eth_getLogs per block);
- viem: watchContractEvent over http (filters) and over webSocket (eth_subscribe), and
  watchBlocks over webSocket (newHeads: every block once, in order);
- web3.py: get_logs, a contract event filter (create_filter + get_new_entries) and AsyncWeb3
  with WebSocketProvider (eth_subscribe logs).

The JS libraries are installed with npm into the project's tool folder (.tools) on first use.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from web3 import AsyncHTTPProvider, AsyncWeb3, WebSocketProvider

from nodes.devnet.anvil import TOOL_DIR, ensure_npm_package, ensure_openzeppelin
from nodes.devnet.workload import abi_encode_erc20_constructor, erc20_transfer_data
from tests.e2e.stack import DEV, Stack, post, wait_for, write_config

ETHERS_VERSION = "6.17.0"
VIEM_VERSION = "2.57.20"
WATCHER = Path(__file__).parent / "js" / "watch_events.cjs"
JS_MODES = ("ethers-ws", "ethers-filter", "viem-http", "viem-ws")
TRANSFER = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"
RUN_BLOCKS = 30
HOLDERS = [
    "0x70997970c51812dc3a010c7d01b50e0d17dc79c8",
    "0x3c44cdddb6a900fa2b585dd299e03d12fa4293bc",
    "0x90f79bf6eb2c4f870365e785982e1f101e93b906",
]

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def node_modules() -> Path:
    ensure_npm_package("ethers", ETHERS_VERSION)
    ensure_npm_package("viem", VIEM_VERSION)
    return TOOL_DIR / "node_modules"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    config, ports = write_config(tmp_path_factory.mktemp("events-clients"))
    text = re.sub(r"^block_time = .*$", "block_time = 0.25", config.read_text(), flags=re.M)
    config.write_text(text + "\n[proxy.events]\npoll_interval = 0.02\n")
    running = Stack(config, ports)
    running.start()
    yield running
    assert running.stop() == 0, "".join(running.output)


def anvil_rpc(stack: Stack, method: str, *params: Any) -> Any:
    answer = post(
        stack.url("8545"), {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    )
    assert "error" not in answer, answer
    return answer["result"]


def mined(stack: Stack, tx_hash: str) -> dict[str, Any]:
    return wait_for(
        lambda: anvil_rpc(stack, "eth_getTransactionReceipt", tx_hash), what="a receipt"
    )


@pytest.fixture(scope="module")
def token(stack: Stack) -> str:
    artifact = json.loads((ensure_openzeppelin() / "ERC20PresetFixedSupply.json").read_text())
    args = abi_encode_erc20_constructor("Events Token", "EVT", 10**24, DEV)
    code = artifact["bytecode"] + args.hex()
    receipt = mined(stack, anvil_rpc(stack, "eth_sendTransaction", {"from": DEV, "data": code}))
    # Watchers see what happens after they start *through the proxy*: wait until the
    # deployment (its mint Transfer) is readable there, so no watcher starts before it.
    height = int(receipt["blockNumber"], 16)
    wait_for(lambda: int(stack.rpc("eth_blockNumber"), 16) > height, what="the deployment")
    return receipt["contractAddress"]


class JsWatcher:
    """One `node watch_events.cjs MODE …` process and what it printed."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.lines: list[dict[str, Any]] = []
        self.proc: asyncio.subprocess.Process | None = None
        self.ready = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None

    async def start(self, node_modules: Path, http_url: str, ws_url: str, token: str) -> None:
        env = {**os.environ, "CHAINSTATE_NODE_MODULES": str(node_modules)}
        self.proc = await asyncio.create_subprocess_exec(
            "node", str(WATCHER), self.mode, http_url, ws_url, token,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env,
        )  # fmt: skip
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for raw in self.proc.stdout:
            line = orjson.loads(raw)
            self.lines.append(line)
            if line.get("ready") or "error" in line:
                self.ready.set()  # an error is reported by the test

    def events(self) -> list[Any]:
        return [x for x in self.lines if "block" in x]

    def errors(self) -> list[Any]:
        return [x for x in self.lines if "error" in x]

    async def stop(self) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 15)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        if self._reader is not None:
            await self._reader


class Web3Watchers:
    """web3.py: an AsyncWeb3 WebSocket subscription and a polled contract event filter."""

    def __init__(self, http_url: str, ws_url: str, token: str) -> None:
        self.http_url, self.ws_url, self.token = http_url, ws_url, token
        self.subscribed: list[Any] = []
        self.filtered: list[Any] = []
        self.ready = asyncio.Event()
        self.stopping = asyncio.Event()

    async def subscription(self) -> None:
        async with AsyncWeb3(WebSocketProvider(self.ws_url)) as w3:
            await w3.eth.subscribe("logs", {"address": self.token, "topics": [TRANSFER]})
            self.ready.set()
            async for message in w3.socket.process_subscriptions():
                log = message["result"]
                self.subscribed.append(_web3_event(log))
                if self.stopping.is_set():
                    break

    async def filter(self, abi: list[Any]) -> None:
        w3 = AsyncWeb3(AsyncHTTPProvider(self.http_url))
        contract = w3.eth.contract(address=w3.to_checksum_address(self.token), abi=abi)
        event_filter = await contract.events.Transfer.create_filter(from_block="latest")
        while not self.stopping.is_set():
            for entry in await event_filter.get_new_entries():
                self.filtered.append(_web3_event(entry))
            await asyncio.sleep(0.2)
        for entry in await event_filter.get_new_entries():
            self.filtered.append(_web3_event(entry))


def _web3_event(log: Any) -> dict[str, Any]:
    tx = log["transactionHash"]
    tx = tx if isinstance(tx, str) else "0x" + bytes(tx).hex()
    return {"tx": tx.lower(), "index": int(log["logIndex"]), "block": int(log["blockNumber"])}


async def eventually(value: Callable[[], Awaitable[float]], at_least: float) -> None:
    """Wait until `value()` reaches `at_least` (the caller bounds the wait)."""
    while True:
        if await value() >= at_least:
            return
        await asyncio.sleep(0.1)


async def proxy_metric(url: str, name: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as resp:
        text = await resp.text()
    match = re.search(rf"^{name} (\S+)$", text, flags=re.M)
    return float(match.group(1)) if match else 0.0


async def test_every_client_sees_every_transfer_once_in_order(
    stack: Stack, token: str, node_modules: Path
) -> None:
    proxy = stack.url("8663")
    http_url, ws_url = proxy + "/1337", proxy.replace("http://", "ws://") + "/1337"
    watchers = {mode: JsWatcher(mode) for mode in (*JS_MODES, "viem-blocks")}
    for watcher in watchers.values():
        await watcher.start(node_modules, http_url, ws_url, token)
    abi = json.loads((ensure_openzeppelin() / "ERC20PresetFixedSupply.json").read_text())["abi"]
    py = Web3Watchers(http_url, ws_url, token)
    tasks = [asyncio.create_task(py.subscription()), asyncio.create_task(py.filter(abi))]
    async with asyncio.timeout(90):
        for watcher in watchers.values():
            await watcher.ready.wait()
        await py.ready.wait()
        # ethers-ws, viem-ws, viem-blocks, web3.py: subscriptions; ethers-filter, viem-http,
        # web3.py: filters.
        await eventually(
            lambda: proxy_metric(proxy, "chainstate_proxy_ws_subscriptions"), at_least=4
        )
        await eventually(lambda: proxy_metric(proxy, "chainstate_proxy_filters"), at_least=3)
    errors = {m: w.errors() for m, w in watchers.items() if w.errors()}
    assert not errors, errors

    first = last = None
    for i in range(RUN_BLOCKS):  # one transfer per block
        data = erc20_transfer_data(HOLDERS[i % 3], i + 1)
        tx = {"from": DEV, "to": token, "data": data}
        receipt = await asyncio.to_thread(
            mined, stack, await asyncio.to_thread(anvil_rpc, stack, "eth_sendTransaction", tx)
        )
        height = int(receipt["blockNumber"], 16)
        first, last = first or height, height
    flt = {"fromBlock": hex(first), "toBlock": hex(last), "address": token, "topics": [TRANSFER]}
    logs = await asyncio.to_thread(anvil_rpc, stack, "eth_getLogs", flt)
    expected = [
        {
            "tx": lg["transactionHash"],
            "index": int(lg["logIndex"], 16),
            "block": int(lg["blockNumber"], 16),
        }
        for lg in logs
    ]
    assert len(expected) == RUN_BLOCKS and last - first + 1 >= RUN_BLOCKS

    async def received() -> float:
        counts = [len(watchers[m].events()) for m in JS_MODES]
        counts += [len(py.subscribed), len(py.filtered)]
        if not any(b["block"] >= last for b in watchers["viem-blocks"].events()):
            return 0
        return min(counts)

    async with asyncio.timeout(60):  # until every watcher has them all (then a bit more)
        await eventually(received, at_least=RUN_BLOCKS)
    await asyncio.sleep(1.0)  # a duplicate would show up now
    py.stopping.set()
    await stack_stop(watchers, tasks)

    for mode in JS_MODES:
        assert watchers[mode].events() == expected, (mode, watchers[mode].lines[-5:])
        assert not watchers[mode].errors(), (mode, watchers[mode].errors())
    assert py.subscribed[: len(expected)] == expected, ("web3 ws", py.subscribed[:3], expected[:3])
    assert len(py.subscribed) <= len(expected) + 1
    assert py.filtered == expected, ("web3 filter", py.filtered[:3], expected[:3])
    w3 = AsyncWeb3(AsyncHTTPProvider(http_url))
    got = await w3.eth.get_logs(
        {
            "fromBlock": first,
            "toBlock": last,
            "address": w3.to_checksum_address(token),
            "topics": [TRANSFER],
        }
    )
    assert [_web3_event(lg) for lg in got] == expected, ("web3 get_logs", first, last)
    blocks = watchers["viem-blocks"].events()
    numbers = [b["block"] for b in blocks]
    assert numbers == list(range(numbers[0], numbers[-1] + 1)) and numbers[-1] >= last
    hashes = await asyncio.to_thread(
        lambda: [anvil_rpc(stack, "eth_getBlockByNumber", hex(n), False)["hash"] for n in numbers]
    )
    assert [b["hash"] for b in blocks] == hashes


async def stack_stop(watchers: dict[str, JsWatcher], tasks: list[asyncio.Task[None]]) -> None:
    for watcher in watchers.values():
        await watcher.stop()
    for task in tasks:
        task.cancel()
    for task in tasks:
        try:
            await task
        except (asyncio.CancelledError, Exception) as exc:  # a closing socket
            print(f"web3.py watcher ended: {exc!r}", file=sys.stderr)

"""Differential: eth_getLogs through the proxy equals anvil's, on the devnet workload; then a
reorg made by anvil reaches WebSocket subscribers as geth delivers one.

anvil (automine) runs the workload (transfers, an OpenZeppelin ERC20 with Transfer events, a
one-block and a two-block reorg) and then more ERC20 transfers; a write node follows it; a
`state` node (window 16) and an archive node ingest from it; the proxy (state_window 16)
routes. For a grid of ranges (at the head, inside the window, across the archive boundary,
old), addresses and topic filters, the proxy's answer equals anvil's item for item, in every
field. Bad filters are refused with anvil's code wherever geth and anvil agree.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from chainstate.inproc import InprocRegistry
from nodes.devnet.anvil import GENESIS, AnvilProcess
from nodes.devnet.rpc import EthClient
from nodes.devnet.workload import WorkloadRecord, erc20_transfer_data, run_workload
from nodes.state.service import StateNode
from nodes.writer.service import WriterNode
from proxy.app import create_app, create_server
from proxy.eventsettings import EventSettings
from proxy.settings import ProxySettings, SeedNode, SeedWriter
from proxy.store_file import FileStore
from tests.conftest import free_port

TRANSFER = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"
WINDOW = 16
FAST = {"poll_interval": 0.01, "backoff_initial": 0.02, "backoff_max": 0.2}

pytestmark = [pytest.mark.timeout(240), pytest.mark.asyncio(loop_scope="module")]


def topic_of(address: str) -> str:
    return "0x" + address[2:].rjust(64, "0")


@dataclass
class Chain:
    """The running pieces: anvil, the proxy's URL, what the workload touched."""

    anvil: EthClient
    proxy: EthClient
    proxy_url: str
    record: WorkloadRecord
    head: int


async def converged(nodes: list[StateNode], eth: EthClient, within: float = 60.0) -> int:
    """Wait until every node holds anvil's head block (same hash); returns the head."""
    async with asyncio.timeout(within):
        while True:
            block = await eth.call("eth_getBlockByNumber", ["latest", False])
            head = int(block["number"], 16)
            if all(n.store.hash_at(head) == block["hash"] for n in nodes):
                return head
            await asyncio.sleep(0.05)


async def proxy_sees(url: str, head: int, within: float = 30.0) -> None:
    """Wait until the proxy's head poll shows both nodes at `head` (routing uses it)."""
    async with aiohttp.ClientSession() as http, asyncio.timeout(within):
        while True:
            async with http.get(f"{url}/1337/getAllNodes") as resp:
                nodes = (await resp.json())["nodes"]
            if len(nodes) == 2 and all(n["head"] == head and n["healthy"] for n in nodes):
                return
            await asyncio.sleep(0.05)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def chain(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Chain]:
    tmp: Path = tmp_path_factory.mktemp("events-logs")
    registry = InprocRegistry()
    async with AnvilProcess(port=free_port(), genesis=GENESIS) as anvil:
        writer = WriterNode.from_config(
            {"execution_url": anvil.url, "poll_interval": 0.01, "key": "w"},
            data_dir=tmp / "writer",
            registry=registry,
        )
        nodes = [
            StateNode.from_config(
                {"key": "state", "kind": "state", "window": WINDOW, "source": "inproc://w", **FAST},
                data_dir=tmp / "state",
                registry=registry,
            ),
            StateNode.from_config(
                {"key": "archive", "kind": "archive", "source": "inproc://w", **FAST},
                data_dir=tmp / "archive",
                registry=registry,
            ),
        ]
        settings = ProxySettings(
            state_window=WINDOW,
            head_poll_interval=0.05,
            nodes=(
                SeedNode("1337", "state", "inproc://state", "state"),
                SeedNode("1337", "archive", "inproc://archive", "archive"),
            ),
            writers=(SeedWriter("1337", "w", "inproc://w", leader=True),),
        )
        app = create_app(
            settings,
            store=FileStore(None),
            registry=registry,
            events=EventSettings(poll_interval=0.02),
        )
        server = create_server(app)  # the data port as `chainstate proxy` serves it
        eth = EthClient(anvil.url)
        await writer.start()
        for node in nodes:
            await node.start()
        await server.start("127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.port}"
        proxy = EthClient(url + "/1337")
        try:
            record = await run_workload(anvil.url)
            await more_transfers(eth, record, 24)  # enough blocks to leave the state window
            head = await converged(nodes, eth)
            await proxy_sees(url, head)
            yield Chain(eth, proxy, url, record, head)
        finally:
            await proxy.close()
            await eth.close()
            await server.close()
            for node in nodes:
                await node.close()
            await writer.close()


async def more_transfers(eth: EthClient, record: WorkloadRecord, count: int) -> None:
    """ERC20 transfers between the holders, one block each (automine)."""
    holders = record.erc20_holders
    pairs = itertools.islice(itertools.cycle(itertools.permutations(holders[:4], 2)), count)
    for i, (sender, to) in enumerate(pairs):
        data = erc20_transfer_data(to, i + 1)
        tx_hash = await eth.call(
            "eth_sendTransaction", [{"from": sender, "to": record.erc20, "data": data}]
        )
        for _ in range(200):
            if await eth.call("eth_getTransactionReceipt", [tx_hash]):
                break
            await asyncio.sleep(0.02)


def filter_grid(chain: Chain) -> list[dict[str, Any]]:
    token = chain.record.erc20
    holders = chain.record.erc20_holders
    head = chain.head
    earliest = head - WINDOW + 1  # the state node's window
    ranges = [
        {"fromBlock": "latest"},
        {"fromBlock": "latest", "toBlock": "latest"},
        {"fromBlock": hex(head - 3), "toBlock": "latest"},
        {"fromBlock": hex(earliest), "toBlock": hex(head)},  # the whole window
        {"fromBlock": hex(earliest - 5), "toBlock": hex(earliest + 5)},  # across the boundary
        {"fromBlock": hex(earliest - 1), "toBlock": hex(earliest - 1)},  # just below it
        {"fromBlock": "earliest", "toBlock": "latest"},
        {"fromBlock": "0x0", "toBlock": hex(chain.record.last_block)},  # the workload
    ]
    selections: list[dict[str, Any]] = [
        {},
        {"address": token},
        {"address": [token, holders[0]]},
        {"address": [holders[1]]},  # no logs from there
        {"topics": [TRANSFER]},
        {"address": token, "topics": [TRANSFER, topic_of(holders[0])]},
        {"topics": [None, None, topic_of(holders[1])]},
        {
            "topics": [
                [TRANSFER, "0x" + "ab" * 32],
                None,
                [topic_of(holders[2]), topic_of(holders[4])],
            ]
        },
        {"topics": [None, [topic_of(holders[1]), topic_of(holders[2])]]},
        {"address": token, "topics": [None, None, None, None]},
    ]
    return [r | s for r in ranges for s in selections]


async def test_get_logs_through_the_proxy_equals_anvil(chain: Chain) -> None:
    grid = filter_grid(chain)
    calls = [("eth_getLogs", [flt]) for flt in grid]
    want = await chain.anvil.batch(calls)
    got = await chain.proxy.batch(calls)
    assert sum(len(w) for w in want) > 100  # the grid is not trivially empty
    diffs = [(flt, w, g) for flt, w, g in zip(grid, want, got, strict=True) if w != g]
    assert not diffs, f"{len(diffs)} of {len(grid)} answers differ, e.g. {diffs[:2]}"
    # One at a time too: single requests are forwarded as raw bytes.
    for flt in grid[::7]:
        assert await chain.proxy.call("eth_getLogs", [flt]) == await chain.anvil.call(
            "eth_getLogs", [flt]
        )
    # Recent ranges were answered by the state node, older ones by the archive node.
    served = await answered_by(chain.proxy_url)
    assert served.get("state", 0) >= 40 and served.get("archive", 0) >= 30, served


async def answered_by(url: str) -> dict[str, float]:
    """eth_getLogs items answered (ok) per node, from the proxy's /metrics."""
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as resp:
        text = await resp.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if (
                sample.name == "chainstate_proxy_requests_total"
                and labels.get("outcome") == "ok"
                and labels.get("method") == "eth_getLogs"
            ):
                out[labels["node"]] = out.get(labels["node"], 0) + sample.value
    return out


async def test_a_block_by_hash_equals_anvil_and_orphans_are_unknown(chain: Chain) -> None:
    blocks = await chain.anvil.batch(
        [("eth_getBlockByNumber", [hex(h), False]) for h in range(1, chain.head + 1)]
    )
    with_logs = [b["hash"] for b in blocks if int(b["logsBloom"], 16)]
    assert len(with_logs) > 20
    for block_hash in with_logs[:3] + with_logs[-3:]:  # archive-only and window blocks
        flt = {"blockHash": block_hash}
        assert await chain.proxy.call("eth_getLogs", [flt]) == await chain.anvil.call(
            "eth_getLogs", [flt]
        )
    for reorg in chain.record.reorgs:
        for orphan in reorg["orphaned"]:
            answer = await raw(chain, {"blockHash": orphan})
            assert answer["error"]["code"] == -32000, answer  # as anvil (the nodes: -39006)


async def post_logs(url: str, *params: Any) -> dict[str, Any]:
    """The whole JSON-RPC answer (errors included) of eth_getLogs at `url`."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "eth_getLogs", "params": list(params)}
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as resp:
        return await resp.json()


async def raw(chain: Chain, *params: Any) -> dict[str, Any]:
    return await post_logs(chain.proxy_url + "/1337", *params)


async def anvil_raw(chain: Chain, *params: Any) -> dict[str, Any]:
    return await post_logs(chain.anvil.url, *params)


async def test_bad_filters_get_anvil_s_error_code(chain: Chain) -> None:
    bad = [
        {"blockHash": "0x" + "11" * 32, "fromBlock": "0x1"},
        {"topics": "0x12"},
        {"topics": [[["0x12"]]]},
        {"topics": ["0x1234"]},
        {"topics": [None] * 5},
        {"address": "0x12"},
        {"foo": 1},
    ]
    for flt in bad:
        ours, theirs = await raw(chain, flt), await anvil_raw(chain, flt)
        assert ours["error"]["code"] == theirs["error"]["code"] == -32602, (flt, ours, theirs)
    for params in ([], [{}, {}]):
        ours, theirs = await raw(chain, *params), await anvil_raw(chain, *params)
        assert ours["error"]["code"] == theirs["error"]["code"] == -32602, (params, ours)
    # Where geth and anvil differ we answer as geth: an inverted range is an error (anvil
    # answers []); a malformed block id is a bad param, as in both (the nodes: -39007).
    inverted = await raw(chain, {"fromBlock": "0x5", "toBlock": "0x2"})
    assert inverted["error"] == {
        "code": -32602,
        "message": "invalid block range params: fromBlock 0x5 is after toBlock 0x2",
    }
    assert (await raw(chain, {"fromBlock": "foo"}))["error"]["code"] == -32602


async def test_an_anvil_reorg_reaches_subscribers_as_geth_delivers_it(chain: Chain) -> None:
    """Last in the module: it reorganises the chain. Logs of the orphaned blocks come again
    with removed: true (newest first), then the new chain's logs and heads. (anvil's own
    subscriptions send no removed logs, so the expectation is built from its blocks.)"""
    token, holders = chain.record.erc20, chain.record.erc20_holders
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(chain.proxy_url.replace("http://", "ws://") + "/1337")
        subs = {}
        for i, params in enumerate((["logs", {"address": token}], ["newHeads"])):
            await ws.send_json(
                {"jsonrpc": "2.0", "id": i, "method": "eth_subscribe", "params": params}
            )
            subs[(await ws.receive_json())["result"]] = params[0]
        got: dict[str, list[Any]] = {"logs": [], "newHeads": []}

        async def receive(logs: int, heads: int) -> None:
            async with asyncio.timeout(30):
                while len(got["logs"]) < logs or len(got["newHeads"]) < heads:
                    msg = await ws.receive_json()
                    got[subs[msg["params"]["subscription"]]].append(msg["params"]["result"])

        await more_transfers(chain.anvil, chain.record, 3)
        await receive(3, 3)
        before = list(got["logs"])
        assert [lg["removed"] for lg in before] == [False] * 3
        replacement = {"from": holders[0], "to": token, "data": erc20_transfer_data(holders[3], 77)}
        await chain.anvil.call("anvil_reorg", [2, [[replacement, 0]]])
        head = int(await chain.anvil.call("eth_blockNumber"), 16)
        new_blocks = [
            await chain.anvil.call("eth_getBlockByNumber", [hex(n), False])
            for n in (head - 1, head)
        ]
        new_logs = await chain.anvil.call(
            "eth_getLogs", [{"fromBlock": hex(head - 1), "toBlock": hex(head), "address": token}]
        )
        assert len(new_logs) == 1
        await receive(3 + 2 + len(new_logs), 3 + 2)
        await ws.close()
    removed = [{**lg, "removed": True} for lg in reversed(before[1:])]
    assert got["logs"][3:] == removed + new_logs
    assert [h["hash"] for h in got["newHeads"][3:]] == [b["hash"] for b in new_blocks]

"""The state node's read handler alone, in process: `python -m bench.nodereads`.

Builds a store of synthetic blocks (accounts with balances and storage, every block writing
a few of them), then times `StateNode.handle_body` on the same bodies as
`chainstate bench suite state` sends (eth_getBalance / eth_getStorageAt at random heights,
single and batches of 10 and 100), with no HTTP server in between: what the read path costs
per item, whatever server carries it. `--dispatcher` times the generic dispatcher for the
same bodies (`Dispatcher.handle_body`: a coroutine and a read transaction per item around
the same read functions), i.e. what the read path's one loop per body saves. `--proxy`
also times the node's synchronous path as its data port calls it (`answer_now`) and the
routing proxy's data handler in front of the node in the same process (node registered
`inproc://`, as a state and an archive node, as in `chainstate up`): what the proxy adds
per body, with no HTTP either side.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import random
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import orjson

from chainstate.httpserver import Headers, Request
from chainstate.inproc import InprocRegistry
from nodes.state.blocklogs import BlockLog
from nodes.state.service import StateNode
from nodes.state.vendor import AccountDiff, VendorBlock

KINDS = ("state", "archive")
# The synthetic chain's storage contract (as the devnet workload's, which `bench suite
# state`'s storage cases read): every block writes two of its slots 0..STORAGE_SLOTS-1 with
# non-zero values, so reads at random heights find real values of varying age, not zeros.
STORAGE_CONTRACT = "0x" + "5707a9e0" * 5
STORAGE_SLOTS = 17
# With `logs`, every LOG_EVERY-th block holds one ERC20 Transfer log of LOG_TOKEN (the shape
# of `bench suite logs`' chain: a per-block poll finds one in four blocks holding a log).
LOG_TOKEN = "0x" + "70ce" * 10
TRANSFER_TOPIC = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"
LOG_EVERY = 4


def synthetic_log(height: int, block_hash: str, sender: str, to: str) -> BlockLog:
    """A Transfer log of LOG_TOKEN as anvil answers it (its key order, its fields)."""
    topics = [TRANSFER_TOPIC, "0x" + sender[2:].rjust(64, "0"), "0x" + to[2:].rjust(64, "0")]
    entry = {
        "address": LOG_TOKEN, "topics": topics,
        "data": "0x" + (height + 1).to_bytes(32, "big").hex(),
        "blockHash": block_hash, "blockNumber": hex(height),
        "blockTimestamp": hex(1_700_000_000 + height),
        "transactionHash": "0x" + (height + 7).to_bytes(32, "big").hex(),
        "transactionIndex": "0x0", "logIndex": "0x0", "removed": False,
    }  # fmt: skip
    raw_topics = tuple(bytes.fromhex(t[2:]) for t in topics)
    return BlockLog(bytes.fromhex(LOG_TOKEN[2:]), raw_topics, orjson.dumps(entry))


def synthetic_block(
    height: int, parent: str, rng: random.Random, accounts: list[str], logs: bool = False
) -> VendorBlock:
    """A block writing a balance and a storage slot of a few accounts, and two slots of the
    storage contract; with `logs`, every LOG_EVERY-th one a Transfer log."""
    post = {}
    for address in rng.sample(accounts, 8):
        post[address] = AccountDiff(
            balance=rng.randrange(1, 10**21), storage={rng.randrange(17): rng.randrange(1, 10**9)}
        )
    # (not drawn from `rng`: the balances written stay those of the chain before it)
    slots = {height % STORAGE_SLOTS: height + 1, (height * 7 + 3) % STORAGE_SLOTS: height * 31 + 5}
    post[STORAGE_CONTRACT] = AccountDiff(storage=slots)
    block_hash = "0x" + height.to_bytes(32, "big").hex()
    header = {"hash": block_hash, "parentHash": parent, "number": hex(height)}
    entries: tuple[BlockLog, ...] = ()
    if logs and height % LOG_EVERY == 0:
        entries = (synthetic_log(height, block_hash, accounts[height % 4], accounts[height % 5]),)
    return VendorBlock(height, block_hash, parent, header, "0x" + "00" * 32, {}, post, entries)


async def synthetic_node(
    data_dir: Path, blocks: int, section: dict[str, Any], logs: bool = False
) -> tuple[StateNode, list[str]]:
    """A started archive state node (chain 1337, more `[state_nodes]` settings in `section`)
    holding `blocks` synthetic blocks, and the 200 accounts they touch: the same chain on
    every run (seeded), so the drivers' instruction counts repeat. The caller closes it."""
    rng = random.Random(0)
    accounts = ["0x" + rng.randbytes(20).hex() for _ in range(200)]
    config = {"kind": "archive", "chain_id": 1337, **section}
    node = StateNode.from_config(config, data_dir=data_dir)
    await node.start()
    try:
        parent = "0x" + "00" * 32
        for height in range(blocks):
            block = synthetic_block(height, parent, rng, accounts, logs)
            await node.ingest._apply(block)
            parent = block.hash
    except BaseException:
        await node.close()
        raise
    return node, accounts


def bodies(method: str, batch: int, head: int, accounts: list[str], n: int) -> list[bytes]:
    """`n` bodies of `batch` items of `method` (single objects when `batch` is 1) at random
    heights 1..head; eth_getStorageAt reads slots 0..16 of a random one of `accounts` (the
    suite reads its storage contract: pass `[STORAGE_CONTRACT]`)."""
    rng = random.Random(1)
    out = []
    for _ in range(n):
        items = []
        for i in range(batch):
            block = hex(rng.randint(1, head))
            address = rng.choice(accounts)
            params: list[Any] = [address, block]
            if method == "eth_getStorageAt":
                params = [address, hex(rng.randrange(STORAGE_SLOTS)), block]
            items.append({"jsonrpc": "2.0", "id": i, "method": method, "params": params})
        out.append(orjson.dumps(items if batch > 1 else items[0]))
    return out


async def measure(handle: Callable[[bytes], Any], payloads: list[bytes], seconds: float) -> float:
    """Bodies per second through `handle` (a coroutine function, or a plain function
    answering bytes or (status, bytes), or an awaitable when it cannot answer at once)."""
    for body in payloads[:200]:  # warm caches; every answer checked
        answer = handle(body)
        if inspect.isawaitable(answer):
            answer = await answer
        raw = answer[1] if type(answer) is tuple else answer
        assert raw and b'"error"' not in raw, raw[:200]
    done = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        for body in payloads:
            answer = handle(body)
            if inspect.isawaitable(answer):
                await answer
        done += len(payloads)
    return done / (time.perf_counter() - started)


async def proxy_runner(node: StateNode, registry: InprocRegistry) -> Any:
    """The proxy's app for chain 1337, set up (an aiohttp `AppRunner`), with `node` entered
    in process as a state and an archive node."""
    from aiohttp import web

    from proxy.app import create_app
    from proxy.settings import ProxySettings
    from proxy.store_file import FileStore

    url = node.register_in(registry)
    nodes = [{"chain": "1337", "key": kind, "url": url, "kind": kind} for kind in KINDS]
    settings = ProxySettings.from_config({"proxy": {"nodes": nodes}})
    app = create_app(settings, store=FileStore(None), registry=registry)
    runner = web.AppRunner(app)
    await runner.setup()  # the proxy's lifecycle: store sync, head polls
    return runner


class _Sink:
    """A connection stand-in for `proxy_in_front(..., later=True)`: the answer a handler
    writes early (`Request.answer_early`) or in a task (`Request.answer_later`) lands in
    `future`, as the lean server would write it to the client."""

    transport = True  # (`answer_early` writes only on a connection that has one)

    def __init__(self, future: asyncio.Future[Any]) -> None:
        self.future = future

    def _answer(self, slot: Any, result: Any, keep_alive: bool, http10: bool) -> None:
        if not self.future.done():
            self.future.set_result(result)

    def answer_later(self, slot: Any, answer: Any) -> None:
        asyncio.get_running_loop().create_task(self._run(answer))

    async def _run(self, answer: Any) -> None:
        self._answer(None, await answer, True, False)


@asynccontextmanager
async def proxy_in_front(
    node: StateNode, registry: InprocRegistry, later: bool = False
) -> AsyncIterator[Any]:
    """The proxy's data handler for chain 1337, the node entered as state and archive.
    `later`: requests carry a connection stand-in, so an answer written early or in a task
    (the engine's single eth_calls) comes back as an awaitable; without it such an answer is
    lost, and plain reads are counted with no stand-in's cost."""
    from proxy.app import create_server

    runner = await proxy_runner(node, registry)
    app = runner.app
    try:
        data = create_server(app).route(b"POST", b"/1337")
        headers = Headers({})

        def handle(body: bytes) -> Any:
            return data(Request(b"POST", b"/1337", b"", headers, body))  # type: ignore[misc]

        async def handle_later(body: bytes) -> Any:
            sink = _Sink(asyncio.get_running_loop().create_future())
            request = Request(b"POST", b"/1337", b"", headers, body, sink)  # type: ignore[arg-type]
            got = data(request)  # type: ignore[misc]
            if inspect.isawaitable(got):
                got = await got
            return await sink.future if request.early or got is None else got

        yield handle_later if later else handle
    finally:
        await runner.cleanup()


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        section = {"map_size_mb": 1024, "hot_blocks": args.hot_blocks}
        node, accounts = await synthetic_node(Path(tmp), args.blocks, section)
        try:
            head = args.blocks - 1
            print(f"{args.blocks} blocks, hot view {args.hot_blocks} blocks; items/s in process")
            async with AsyncExitStack() as stack:
                handlers: dict[str, Callable[[bytes], Any]] = {"read path": node.handle_body}
                if args.proxy:
                    handlers["answer_now"] = node.answer_now
                    proxy = proxy_in_front(node, InprocRegistry())
                    handlers["proxy in process"] = await stack.enter_async_context(proxy)
                if args.dispatcher:
                    handlers["dispatcher"] = node.dispatcher.handle_body
                for method in ("eth_getBalance", "eth_getStorageAt"):
                    for batch in (1, 10, 100):
                        read = [STORAGE_CONTRACT] if method == "eth_getStorageAt" else accounts
                        payloads = bodies(method, batch, head, read, max(20, 2000 // batch))
                        rates = {
                            label: await measure(handle, payloads, args.duration)
                            for label, handle in handlers.items()
                        }
                        shown = "  ".join(f"{k} {v * batch:>10,.0f}" for k, v in rates.items())
                        print(f"{method:<18} batch {batch:>3}  {shown}")
        finally:
            await node.close()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.nodereads", description=__doc__)
    p.add_argument("--blocks", type=int, default=400, help="chain length (default 400)")
    p.add_argument("--hot-blocks", type=int, default=128, help="hot view blocks (default 128)")
    p.add_argument("-d", "--duration", type=float, default=2.0, help="seconds per row")
    p.add_argument("--dispatcher", action="store_true", help="also time the generic dispatcher")
    p.add_argument(
        "--proxy", action="store_true", help="also time answer_now and the proxy in process"
    )
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()

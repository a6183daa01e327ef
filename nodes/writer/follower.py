"""Following the execution client: poll its head, build each new block, store it, and
rewind to the fork point when the chain the store holds is no longer canonical."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from chainstate.jsonrpc import METHOD_NOT_FOUND, JsonRpcError
from chainstate.rpcclient import RpcUnavailable
from nodes.devnet.rpc import EthClient
from nodes.writer import blockdiff as bd
from nodes.writer.settings import WriterSettings
from nodes.writer.store import BlockStore, StoreError

log = logging.getLogger(__name__)

MAX_READ_ATTEMPTS = 5  # re-reads of a head block while new blocks keep arriving
PRESTATE_DIFF = {"tracer": "prestateTracer", "tracerConfig": {"diffMode": True}}


class FatalFollowError(RuntimeError):
    """Following cannot continue without an operator (another chain, bad genesis file)."""


@dataclass
class FollowStats:
    blocks_built: int = 0
    traces: int = 0  # trace requests made (Parity replays or prestateTracer block traces)
    reorgs: int = 0
    rewound_blocks: int = 0
    errors: int = 0
    execution_head: int | None = None
    last_error: str | None = None
    fatal: bool = False
    last_build_seconds: float = 0.0
    tracer: str | None = None  # the tracer last used: "parity" or "prestate"


class ChainFollower:
    """Builds blocks from `client` into `store`, one at a time, in height order."""

    def __init__(
        self,
        client: EthClient,
        store: BlockStore,
        settings: WriterSettings,
        alloc: list[bd.GenesisAccount],
    ) -> None:
        self.client = client
        self.store = store
        self.settings = settings
        self.alloc = alloc
        self.stats = FollowStats()
        self.chain_id: int | None = None
        self.head_changed = asyncio.Event()
        self._parity: bool | None = None  # does the client serve trace_replayBlockTransactions?

    async def run(self) -> None:
        """Poll until cancelled. Transient errors back off; fatal ones stop following."""
        backoff = self.settings.poll_interval
        while True:
            try:
                progressed = await self.sync_once()
                self.stats.last_error = None
                backoff = self.settings.poll_interval
            except FatalFollowError as exc:
                self.stats.fatal, self.stats.last_error = True, str(exc)
                log.error("write node stopped following: %s", exc)
                return
            except (RpcUnavailable, JsonRpcError, bd.BlockDataError, StoreError) as exc:
                self._note_error(exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.settings.max_backoff)
                continue
            except Exception as exc:  # an answer of unexpected shape must not end following
                if f"{type(exc).__name__}: {exc}" != self.stats.last_error:
                    log.exception("write node: unexpected error while following (will retry)")
                self._note_error(exc, logged=True)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.settings.max_backoff)
                continue
            if not progressed:
                await asyncio.sleep(self.settings.poll_interval)

    async def prime(self) -> None:
        """One first poll. Any error is left for `run`, which meets it again on its first
        poll and retries or reports it."""
        with contextlib.suppress(Exception):
            await self.sync_once()

    def _note_error(self, exc: Exception, logged: bool = False) -> None:
        """Count an error; log it once while it repeats."""
        message = f"{type(exc).__name__}: {exc}"
        self.stats.errors += 1
        if message != self.stats.last_error and not logged:
            log.warning("write node: execution client error (will retry): %s", message)
        self.stats.last_error = message

    async def sync_once(self) -> bool:
        """One poll: returns True when it stored or rewound anything."""
        await self._check_chain_id()
        client_head = int(await self.client.call("eth_blockNumber"), 16)
        self.stats.execution_head = client_head
        stored = self.store.head()
        if stored is None:
            await self._build_genesis()
            return True
        if stored.number > client_head or await self._hash_at(stored.number) != stored.hash:
            await self._rewind(min(stored.number, client_head))
            return True
        progressed = False
        for number in range(stored.number + 1, client_head + 1)[
            : self.settings.max_blocks_per_poll
        ]:
            if not await self._build(number):
                break
            progressed = True
        return progressed

    async def _check_chain_id(self) -> None:
        chain_id = int(await self.client.call("eth_chainId"), 16)
        if self.chain_id == chain_id:
            return
        stored = self.store.get_meta("chain_id")
        if stored is not None and int(stored) != chain_id:
            raise FatalFollowError(
                f"the execution client has chain id {chain_id} but this write node's store "
                f"holds chain {stored}; point it at the right client or use another data dir"
            )
        if stored is None:
            await asyncio.to_thread(self.store.set_meta, "chain_id", str(chain_id))
        self.chain_id = chain_id

    async def _hash_at(self, number: int) -> str | None:
        """The client's canonical hash at `number` (block 0: as block 1's parent)."""
        if number == 0:
            return bd.data((await self._genesis_block())["hash"])
        block = await self.client.call("eth_getBlockByNumber", [hex(number), False])
        return bd.data(block["hash"]) if block else None

    async def _rewind(self, start: int) -> None:
        """Find the highest stored block the client still has, drop everything above it."""
        number = start
        depth = 0
        while number >= 0:
            if self.store.hash_at(number) == await self._hash_at(number):
                break
            number -= 1
            depth += 1
            if depth > self.settings.max_reorg_depth:
                raise FatalFollowError(
                    f"fork deeper than max_reorg_depth={self.settings.max_reorg_depth} blocks"
                )
        if number < 0:
            raise FatalFollowError(
                "the execution client's genesis block differs from the stored one: it follows "
                "another chain; use another data dir for this chain"
            )
        dropped = await asyncio.to_thread(self.store.rewind, number)
        self.stats.reorgs += 1
        self.stats.rewound_blocks += dropped
        log.warning("write node: reorg, rewound %d blocks to %d", dropped, number)
        self.head_changed.set()

    async def _build_genesis(self) -> None:
        block = await self._genesis_block()
        try:
            actual = await self._read(bd.genesis_reads(self.alloc), bd.data(block["hash"]), 0)
        except JsonRpcError as exc:
            # e.g. anvil restarted from a state file keeps no state of old blocks.
            log.warning("write node: cannot check the genesis file against block 0: %s", exc)
        else:
            self._check_genesis(actual)
        await self._store(bd.assemble_genesis(block, self.alloc))

    async def _genesis_block(self) -> dict[str, Any]:
        """Block 0 as block 1 names it. anvil 1.7.1 restarted from a state file may answer
        block 0 by number with a fresh genesis that is not the parent of block 1."""
        block = await self.client.call("eth_getBlockByNumber", ["0x0", True])
        if block is None:
            raise RpcUnavailable("the execution client has no block 0")
        child = await self.client.call("eth_getBlockByNumber", ["0x1", False])
        if child is not None and bd.data(child["parentHash"]) != bd.data(block["hash"]):
            parent = await self.client.call("eth_getBlockByHash", [child["parentHash"], True])
            if parent is not None and bd.quantity(parent["number"]) == "0x0":
                return parent
        return block

    def _check_genesis(self, actual: list[Any]) -> None:
        reads = bd.genesis_reads(self.alloc)
        expected = bd.genesis_values(self.alloc)
        for (kind, addr, slot), want, got in zip(reads, expected, actual, strict=True):
            if bd.encode_value(kind, got) != want:
                where = f"{addr} {kind}" + (f" slot {slot}" if slot else "")
                raise FatalFollowError(
                    f"genesis file {self.settings.genesis} does not match the execution client "
                    f"at block 0: {where} is {got}, the file says {want}"
                )

    async def _build(self, number: int) -> bool:
        """Build and store block `number`; False when the client does not have it (yet)."""
        started = time.monotonic()
        block = await self.client.call("eth_getBlockByNumber", [hex(number), True])
        if block is None:
            return False
        block_hash, parent = bd.data(block["hash"]), bd.data(block["parentHash"])
        if self.store.hash_at(number - 1) != parent:
            await self._rewind(number - 1)
            return False
        txs = block.get("transactions") or []
        withdrawals = [w["address"] for w in block.get("withdrawals") or []]
        receipts = await self._receipts(block_hash, txs) if txs else []
        state_diff = await self._parity_diff(number, txs) if txs and not withdrawals else None
        if state_diff is None:
            touched = await self._prestate_touched(block_hash) if txs else bd.Touched()
            for withdrawal in withdrawals:
                touched.add_account(withdrawal)
            reads = touched.reads()
            before = await self._read(reads, parent, number - 1)
            after = await self._read(reads, block_hash, number)
            state_diff = bd.make_state_diff(reads, before, after)
        output = bd.assemble(block, receipts, state_diff)
        await self._store(output)
        self.stats.blocks_built += 1
        self.stats.last_build_seconds = time.monotonic() - started
        return True

    async def _parity_diff(self, number: int, txs: list[Any]) -> dict[str, Any] | None:
        """The StateDiff from Parity `trace_replayBlockTransactions` stateDiff replays, or
        None when the client lacks them (or the prestate tracer is configured). On anvil
        this is the fast path: ~0.4 s for 300 transactions, where the prestateTracer takes
        ~20 s and reading the values back ~2 ms per value."""
        if self.settings.tracer == "prestate" or self._parity is False:
            return None
        self.stats.traces += 1
        try:
            items = await self.client.call(
                "trace_replayBlockTransactions", [hex(number), ["stateDiff"]]
            )
        except JsonRpcError as exc:
            if exc.code != METHOD_NOT_FOUND or self.settings.tracer == "parity":
                raise
            self._parity = False
            log.info("write node: no trace_replayBlockTransactions, using the prestateTracer")
            return None
        # Traced by number: make sure it is this block, not one that replaced it meanwhile.
        traced = [str(item.get("transactionHash")).lower() for item in items or []]
        if traced != [str(tx["hash"]).lower() for tx in txs]:
            raise bd.BlockDataError(f"block {number} changed while it was traced")
        self._parity, self.stats.tracer = True, "parity"
        return bd.state_diff_from_parity(items)

    async def _prestate_touched(self, block_hash: str) -> bd.Touched:
        """Accounts and slots named by the prestateTracer in diffMode; its values have
        omissions, so the caller reads them back at the parent and at the block."""
        self.stats.traces += 1
        traces = await self.client.call("debug_traceBlockByHash", [block_hash, PRESTATE_DIFF])
        self.stats.tracer = "prestate"
        return bd.touched_from_traces(traces)

    async def _receipts(self, block_hash: str, txs: list[Any]) -> list[Any]:
        try:
            receipts = await self.client.call("eth_getBlockReceipts", [block_hash])
        except JsonRpcError as exc:
            if exc.code != METHOD_NOT_FOUND:
                raise
            calls = [("eth_getTransactionReceipt", [tx["hash"]]) for tx in txs]
            receipts = await self.client.batch(calls, self.settings.read_batch)
        if not isinstance(receipts, list) or len(receipts) != len(txs):
            raise bd.BlockDataError(f"receipts of block {block_hash} do not match its transactions")
        return receipts

    async def _read(
        self, reads: list[tuple[str, str, str | None]], block_hash: str, number: int
    ) -> list[Any]:
        """Values at block `block_hash` (height `number`).

        anvil 1.7.1 answers a read at the head block from its live state: a block mined
        while the batch runs leaks into it. Reads of the head are therefore accepted only
        when the head did not move during the batch; otherwise they are repeated, by then
        from the block's kept historical state.
        """
        calls = bd.read_calls(reads, block_hash)
        if not calls:
            return []
        for _ in range(MAX_READ_ATTEMPTS):
            head_before = int(await self.client.call("eth_blockNumber"), 16)
            values = await self.client.batch(calls, self.settings.read_batch)
            if number < head_before:
                return values
            if int(await self.client.call("eth_blockNumber"), 16) == head_before:
                return values
        raise RpcUnavailable("the execution client's head kept moving while reading a block")

    async def _store(self, output: dict[str, Any]) -> None:
        header = output["Header"]
        number = int(header["number"], 16)
        encoded = bd.canonical_json(output)
        await asyncio.to_thread(
            self.store.append, number, header["hash"], header["parentHash"], encoded
        )
        self.head_changed.set()

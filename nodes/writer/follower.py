"""Following the execution client: poll its head, build each new block, store it, and
rewind to the fork point when the chain the store holds is no longer canonical.

Whatever the client shows after a restart of either side, each poll places the stored head
against it first: the same chain (continue), the same chain but shorter (wait for the client,
drop nothing), or another block at a stored height (a reorg: roll back to the common
ancestor). Each change of that situation is one log line. Failed polls are retried with a
doubling backoff up to `max_retries` attempts in a row; then the node reports itself stalled
(unhealthy, with the reason) and checks the client every `max_backoff` seconds until it
recovers. A node whose client moves on by more than `stall_blocks` blocks without the node
storing one is unhealthy too (docs/write-node.md, "Restarts, retries and health").
"""

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


class BlockReplaced(Exception):
    """The client replaced a block while it was being built (a reorg under way): poll again."""


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
    failures: int = 0  # failed polls in a row (0 once a poll succeeds)
    # "starting", "following", "waiting" (the client is behind on the same chain),
    # "retrying", "stalled" (max_retries failed in a row) or "stopped" (fatal)
    state: str = "starting"
    # The client's head when the stored head last moved (or following began): how far the
    # client got since then is the node's lack of progress.
    progress_mark: int | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    """The node's own health: what `/health`, `writer_health` and the proxy report."""

    healthy: bool
    reason: str | None  # why not healthy; else the error being retried, if any
    lag: int | None  # blocks the stored head is behind the client's head (0 when ahead)


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
        self.name = settings.key
        self.stats = FollowStats()
        self.chain_id: int | None = None
        self.head_changed = asyncio.Event()
        self._parity: bool | None = None  # does the client serve trace_replayBlockTransactions?
        self._announce = True  # the next poll logs where the stored head stands
        self._failing_since = 0.0

    async def run(self) -> None:
        """Poll until cancelled. Failed polls back off and are retried; after `max_retries`
        in a row the node is stalled and checks every `max_backoff` s; fatal errors stop it."""
        while True:
            try:
                progressed = await self.sync_once()
            except FatalFollowError as exc:
                self.stats.fatal, self.stats.last_error = True, str(exc)
                self.stats.state = "stopped"
                log.error("write node %s stopped following: %s", self.name, exc)
                return
            except Exception as exc:  # an answer of unexpected shape must not end following
                await asyncio.sleep(self._failed(exc))
                continue
            self._recovered()
            if not progressed:
                await asyncio.sleep(self.settings.poll_interval)

    def announce(self) -> None:
        """Have the next poll log where the stored head stands (after a pause)."""
        self._announce = True

    async def prime(self) -> None:
        """One first poll. Any error is left for `run`, which meets it again on its first
        poll and retries or reports it."""
        with contextlib.suppress(Exception):
            await self.sync_once()

    def _failed(self, exc: Exception) -> float:
        """Count a failed poll, log it when it says something new; the pause before the next."""
        stats, limit = self.stats, self.settings.max_retries
        message = f"{type(exc).__name__}: {exc}"
        expected = isinstance(exc, RpcUnavailable | JsonRpcError | bd.BlockDataError | StoreError)
        stats.errors += 1
        stats.failures += 1
        if stats.failures == 1:
            self._failing_since = time.monotonic()
        changed = message != stats.last_error
        stats.last_error = message
        if stats.failures == limit:
            took = time.monotonic() - self._failing_since
            log.error(
                "write node %s stalled: %d attempts in a row failed over %.0f s, the last with "
                "%s; it reports healthy: false and checks the execution client every %g s",
                self.name, limit, took, message, self.settings.max_backoff,
            )  # fmt: skip
        elif changed and stats.failures < limit:
            log.warning(
                "write node %s: %s (attempt %d of %d, retrying)",
                self.name, message, stats.failures, limit,
                exc_info=not expected,
            )  # fmt: skip
        stats.state = "stalled" if stats.failures >= limit else "retrying"
        backoff = self.settings.poll_interval * 2 ** (stats.failures - 1)
        return min(backoff, self.settings.max_backoff)

    def _recovered(self) -> None:
        stats = self.stats
        if stats.failures:
            log.warning(
                "write node %s: the execution client answers again after %d failed attempts "
                "(the last: %s)",
                self.name, stats.failures, stats.last_error,
            )  # fmt: skip
        stats.failures, stats.last_error = 0, None

    def verdict(self, head: int | None) -> Verdict:
        """Healthy unless stopped, stalled by failures, or left behind by the client."""
        stats = self.stats
        lag = None
        if stats.execution_head is not None:
            lag = max(0, stats.execution_head - (head if head is not None else -1))
        if stats.fatal:
            return Verdict(False, stats.last_error, lag)
        if stats.failures >= self.settings.max_retries:
            reason = f"stalled after {stats.failures} failed attempts in a row: {stats.last_error}"
            return Verdict(False, reason, lag)
        idle = self.blocks_without_progress()
        if idle is not None and idle > self.settings.stall_blocks:
            reason = (
                f"no block stored while the execution client advanced {idle} blocks "
                f"(stored head {head}, client head {stats.execution_head}; "
                f"stall_blocks = {self.settings.stall_blocks})"
            )
            if stats.last_error:
                reason += f"; last error: {stats.last_error}"
            return Verdict(False, reason, lag)
        return Verdict(True, stats.last_error, lag)

    def blocks_without_progress(self) -> int | None:
        """How far the client's head moved since the stored head last moved."""
        stats = self.stats
        if stats.execution_head is None or stats.progress_mark is None:
            return None
        return max(0, stats.execution_head - stats.progress_mark)

    def _mark_progress(self) -> None:
        self.stats.progress_mark = self.stats.execution_head

    def _situation(self, state: str, line: str) -> None:
        """Enter `state`; say so in one log line when it is news."""
        if state != self.stats.state or self._announce:
            log.warning("write node %s: %s", self.name, line)
        self.stats.state, self._announce = state, False

    async def sync_once(self) -> bool:
        """One poll: returns True when it stored or rewound anything."""
        await self._check_chain_id()
        client_head = int(await self.client.call("eth_blockNumber"), 16)
        self.stats.execution_head = client_head
        if self.stats.progress_mark is None:
            self._mark_progress()
        stored = self.store.head()
        if stored is None:
            await self._build_genesis()
            # A chain this run began: nothing to recover, nothing to say.
            self.stats.state, self._announce = "following", False
            return True
        height = min(stored.number, client_head)
        if await self._hash_at(height) != self.store.hash_at(height):
            await self._rewind(height)
            return True
        if client_head < stored.number:
            self._situation(
                "waiting",
                f"the execution client's head {client_head} is behind the stored head "
                f"{stored.number} on the same chain: waiting for it (no block is dropped)",
            )
            return False
        self._situation(
            "following",
            f"stored head {stored.number}, execution client head {client_head}, same chain: "
            "continuing",
        )
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
        self._mark_progress()
        self.stats.state, self._announce = "following", False
        log.warning(
            "write node %s: reorg: the execution client's block %d is not the stored one; "
            "rolled back %d blocks to the common ancestor %d (client head %s)",
            self.name, start, dropped, number, self.stats.execution_head,
        )  # fmt: skip
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
        state_diff = None
        if txs and not withdrawals:
            try:
                state_diff = await self._parity_diff(number, block_hash, txs)
            except BlockReplaced:
                return False  # the next poll finds the new block and rewinds
        if state_diff is None:
            touched = await self._prestate_touched(block_hash) if txs else bd.Touched()
            for withdrawal in withdrawals:
                touched.add_account(withdrawal)
            reads = touched.reads()
            before = await self._read(reads, parent, number - 1)
            after = await self._read(reads, block_hash, number)
            state_diff = bd.make_state_diff(reads, before, after)
        await self._check_pre(number, state_diff["pre"])
        output = bd.assemble(block, receipts, state_diff)
        await self._store(output)
        self.stats.blocks_built += 1
        self.stats.last_build_seconds = time.monotonic() - started
        return True

    async def _check_pre(self, number: int, pre: dict[str, Any]) -> None:
        """Refuse a StateDiff whose `pre` is not the state the stored blocks left at
        `number - 1`: the client executed the block on other values (anvil loaded from a
        state file that is not its blocks' state), and every state node would reject it
        for good. The block is built again on the next poll; if it keeps failing, the node
        reports itself stalled with this reason."""
        claimed = bd.diff_values(pre)
        if not claimed:
            return
        stored = await asyncio.to_thread(self.store.values_at, [k for k, _ in claimed], number - 1)
        for key, value in claimed:
            want = stored.get(key, bd.zero_of_key(key))
            if value != want:
                raise bd.BlockDataError(
                    f"block {number} was executed on a state that the stored blocks did not "
                    f"leave: its pre-state has {key} = {value}, the stored blocks leave {want} "
                    f"after block {number - 1}; not emitted (the execution client's state "
                    "differs from its own blocks, e.g. anvil loaded from a torn state file: "
                    "a restart of the devnet restores it from the write nodes' blocks)"
                )

    async def _parity_diff(
        self, number: int, block_hash: str, txs: list[Any]
    ) -> dict[str, Any] | None:
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
        traced = [str(item.get("transactionHash")).lower() for item in items or []]
        if traced != [str(tx["hash"]).lower() for tx in txs]:
            await self._explain_trace_mismatch(number, block_hash, len(traced), len(txs))
        self._parity, self.stats.tracer = True, "parity"
        return bd.state_diff_from_parity(items)

    async def _explain_trace_mismatch(
        self, number: int, block_hash: str, traced: int, expected: int
    ) -> None:
        """Traced by number, the replay did not list the block's transactions: either the
        block was replaced meanwhile (a reorg: poll again), or the client cannot replay it
        (it lacks the state before it) — an error that repeats until the client changes."""
        current = await self.client.call("eth_getBlockByNumber", [hex(number), False])
        if current is None or bd.data(current["hash"]) != block_hash:
            raise BlockReplaced(number)
        raise bd.BlockDataError(
            f"the execution client cannot replay block {number}: "
            f"trace_replayBlockTransactions lists {traced} of its {expected} transactions "
            f"(it lacks the state before that block, e.g. anvil restarted from a state file "
            f"without its recent history)"
        )

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
        encoded = bd.output_json(output)
        values = bd.diff_values(output["StateDiff"]["post"])
        await asyncio.to_thread(
            self.store.append, number, header["hash"], header["parentHash"], encoded, values
        )
        self._mark_progress()
        self.head_changed.set()

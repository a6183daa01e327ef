"""Blocks, transactions and receipts on the state node, from the bodies it keeps at ingest.

Answers are the execution client's own JSON (nodes/state/blockbody.py), spliced without
re-encoding (`orjson.Fragment`), so they equal the client's byte for byte. Not found:

- a block outside the node's range, an unknown block hash, or a block whose body the node
  does not hold: -39006, which the proxy retries on another node (and turns into `null`
  for its client when no node has the block);
- a transaction index beyond the block's transactions, or an uncle index beyond its
  uncles: `null`, as geth answers;
- an unknown transaction hash: `null` when the node holds every body from block 0 to its
  head (the transaction is not on its chain, as far as it has followed it); -39006 when it
  does not (a `state` node whose window has moved on cannot tell an older transaction
  from none).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from chainstate.blockref import BlockRef, parse_block_number_param
from chainstate.hexcodec import parse_hash, parse_quantity, to_hex
from chainstate.jsonrpc import BLOCK_NOT_FOUND, Handler, JsonRpcError, params_list
from nodes.state.blockbody import packed_array, packed_item
from nodes.state.methods import _block_hash, _full_flag, _require
from nodes.state.store import BodyReads, StateStore

METHOD_NOT_SUPPORTED = -32004  # EIP-1474: the method exists, this node cannot answer it


def _index(value: Any) -> int:
    """A transaction or uncle index (hex quantity; leading zeros allowed, as anvil does)."""
    return parse_quantity(_require(value, "index"), "index", lenient=True)


def _not_held(height: int) -> JsonRpcError:
    return JsonRpcError(
        BLOCK_NOT_FOUND,
        f"block {height}'s body is not held by this node (kept from the blocks it ingested "
        "since it kept bodies)",
    )


class BlockMethods:
    """The block, transaction and receipt methods over one store's bodies."""

    def __init__(self, store: StateStore, resolve: Callable[[BlockRef], int]) -> None:
        self.store = store
        self.resolve = resolve

    def handlers(self) -> dict[str, Handler]:
        return {
            "eth_getBlockByNumber": self.eth_get_block_by_number,
            "eth_getBlockByHash": self.eth_get_block_by_hash,
            "eth_getBlockTransactionCountByNumber": self.tx_count_by_number,
            "eth_getBlockTransactionCountByHash": self.tx_count_by_hash,
            "eth_getTransactionByBlockNumberAndIndex": self.tx_by_number_and_index,
            "eth_getTransactionByBlockHashAndIndex": self.tx_by_hash_and_index,
            "eth_getBlockReceipts": self.eth_get_block_receipts,
            "eth_getUncleCountByBlockNumber": self.uncle_count_by_number,
            "eth_getUncleCountByBlockHash": self.uncle_count_by_hash,
            "eth_getUncleByBlockNumberAndIndex": self.uncle_by_number_and_index,
            "eth_getUncleByBlockHashAndIndex": self.uncle_by_hash_and_index,
            "eth_getTransactionByHash": self.eth_get_transaction_by_hash,
            "eth_getTransactionReceipt": self.eth_get_transaction_receipt,
        }

    # block parameters ------------------------------------------------------------------

    def _by_number(self, value: Any) -> int:
        """A `blockNumber` param (tag, hex height; a hash or EIP-1898 object is accepted)."""
        return self.resolve(parse_block_number_param(_require(value, "blockNumber"), None))

    def _by_hash(self, value: Any) -> int:
        return self.resolve(BlockRef(hash=_block_hash(value)))

    def _shell(self, bodies: BodyReads, height: int) -> bytes:
        shell = bodies.shell(height)
        if shell is None:
            raise _not_held(height)
        return shell

    def _part(self, part: bytes | None, height: int) -> bytes:
        if part is None:
            raise _not_held(height)
        return part

    # blocks ----------------------------------------------------------------------------

    def _block(self, height: int, full: Any) -> Any:
        _full_flag(full)
        with self.store.bodies() as bodies:
            shell = self._shell(bodies, height)
            if not full:
                return orjson.Fragment(shell)
            txs = self._part(bodies.transactions(height), height)
        block = orjson.loads(shell)
        block["transactions"] = orjson.Fragment(packed_array(txs))
        return block

    async def eth_get_block_by_number(self, params: Any) -> Any:
        block, full = params_list(params, ["blockNumber", "full"])
        return self._block(self._by_number(block), full)

    async def eth_get_block_by_hash(self, params: Any) -> Any:
        block_hash, full = params_list(params, ["blockHash", "full"])
        return self._block(self._by_hash(block_hash), full)

    def _tx_count(self, height: int) -> str:
        with self.store.bodies() as bodies:
            count = bodies.transaction_count(height)
        if count is None:
            raise _not_held(height)
        return to_hex(count)

    async def tx_count_by_number(self, params: Any) -> str:
        (block,) = params_list(params, ["blockNumber"])
        return self._tx_count(self._by_number(block))

    async def tx_count_by_hash(self, params: Any) -> str:
        (block_hash,) = params_list(params, ["blockHash"])
        return self._tx_count(self._by_hash(block_hash))

    def _tx_at(self, height: int, index: int) -> Any:
        with self.store.bodies() as bodies:
            raw = packed_item(self._part(bodies.transactions(height), height), index)
        return None if raw is None else orjson.Fragment(raw)

    async def tx_by_number_and_index(self, params: Any) -> Any:
        block, index = params_list(params, ["blockNumber", "index"])
        i = _index(index)
        return self._tx_at(self._by_number(block), i)

    async def tx_by_hash_and_index(self, params: Any) -> Any:
        block_hash, index = params_list(params, ["blockHash", "index"])
        i = _index(index)
        return self._tx_at(self._by_hash(block_hash), i)

    async def eth_get_block_receipts(self, params: Any) -> Any:
        (block,) = params_list(params, ["blockNumberOrHash"])
        height = self._by_number(block)
        with self.store.bodies() as bodies:
            receipts = self._part(bodies.receipts(height), height)
        return orjson.Fragment(packed_array(receipts))

    # uncles (none since the merge; their headers are not part of the body) -------------

    def _uncles(self, height: int) -> list[str]:
        with self.store.bodies() as bodies:
            shell = self._shell(bodies, height)
        uncles: list[str] = orjson.loads(shell).get("uncles") or []
        return uncles

    async def uncle_count_by_number(self, params: Any) -> str:
        (block,) = params_list(params, ["blockNumber"])
        return to_hex(len(self._uncles(self._by_number(block))))

    async def uncle_count_by_hash(self, params: Any) -> str:
        (block_hash,) = params_list(params, ["blockHash"])
        return to_hex(len(self._uncles(self._by_hash(block_hash))))

    def _uncle(self, height: int, index: int) -> None:
        uncles = self._uncles(height)
        if index < len(uncles):
            raise JsonRpcError(
                METHOD_NOT_SUPPORTED,
                f"block {height} has uncles, whose headers a state node does not keep "
                f"(uncle {uncles[index]})",
            )
        return None

    async def uncle_by_number_and_index(self, params: Any) -> None:
        block, index = params_list(params, ["blockNumber", "index"])
        i = _index(index)
        return self._uncle(self._by_number(block), i)

    async def uncle_by_hash_and_index(self, params: Any) -> None:
        block_hash, index = params_list(params, ["blockHash", "index"])
        i = _index(index)
        return self._uncle(self._by_hash(block_hash), i)

    # transactions by hash --------------------------------------------------------------

    def _by_tx_hash(self, params: Any, part: Callable[[BodyReads, int], bytes | None]) -> Any:
        (value,) = params_list(params, ["transactionHash"])
        tx_hash = parse_hash(_require(value, "transactionHash"), "transaction hash")
        with self.store.bodies() as bodies:
            where = bodies.location(tx_hash)
            if where is None:
                if bodies.whole_chain():
                    return None
                raise self._unknown_tx(tx_hash, bodies)
            height, index = where
            raw = packed_item(self._part(part(bodies, height), height), index)
        return None if raw is None else orjson.Fragment(raw)

    @staticmethod
    def _unknown_tx(tx_hash: str, bodies: BodyReads) -> JsonRpcError:
        if bodies.bounds is None:
            return JsonRpcError(BLOCK_NOT_FOUND, "this node holds no blocks yet")
        lo, hi = max(bodies.bounds[0], bodies.bodies_from), bodies.bounds[1]
        return JsonRpcError(
            BLOCK_NOT_FOUND,
            f"transaction {tx_hash} is not in blocks [{lo}, {hi}], the blocks this node holds; "
            "it may be in an older block",
        )

    async def eth_get_transaction_by_hash(self, params: Any) -> Any:
        return self._by_tx_hash(params, BodyReads.transactions)

    async def eth_get_transaction_receipt(self, params: Any) -> Any:
        return self._by_tx_hash(params, BodyReads.receipts)

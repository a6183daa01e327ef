"""The state node's methods other than the plain reads (eth_*, vendor namespace, blockx_*
for the checker), and the block resolution every read shares.

The plain reads (eth_blockNumber, balances, nonces, code, storage slots, in both namespaces)
are the read path's (nodes/state/reads.py), which answers them in one loop per body and
registers them on the dispatcher too. Result shapes the spec leaves open are decided there and
here and documented in docs/state-node.md: eth_* follow geth (hex quantities); vendor balances
are hex quantities (U256 may exceed what JSON numbers carry safely), nonces are integers, code
is 0x bytes, storage a 32-byte word.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Callable
from typing import Any

from chainstate import __version__
from chainstate.blockref import (
    BlockRef,
    parse_block_id,
    parse_block_number_param,
)
from chainstate.hexcodec import (
    UINT256_MAX,
    parse_address,
    parse_data,
    parse_quantity,
    to_data,
    to_hash32,
    to_hex,
)
from chainstate.jsonrpc import (
    BLOCK_NOT_FOUND,
    INTERNAL_ERROR,
    INVALID_BLOCK_ID,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    SERVER_BUSY,
    Handler,
    JsonRpcError,
    params_list,
)
from chainstate.txmethods import TX_LIFECYCLE
from nodes.state.store import StateStore, out_of_range
from nodes.state.vendor import keccak256

NODE_NAME = "chainstate-state-node"
# geth's web3_clientVersion layout: Name/identity/vVersion/os-arch/runtime.
_RUNTIME = f"{sys.platform}-{platform.machine()}/python{sys.version_info[0]}.{sys.version_info[1]}"


# Methods a state node does not have (the spec: no eth_estimateGas; no mempool, signing or
# fees), answered -32601 with where to go instead: clients often try them here first. The
# transactions of the blocks it holds it does answer (nodes/state/blocks.py).
_VIA_PROXY = "send it to the proxy, which routes it to the chain's Leader write node"
SERVED_HERE = frozenset({"eth_getTransactionByHash", "eth_getTransactionReceipt"})
ELSEWHERE = {
    "eth_estimateGas": f"a state node has no eth_estimateGas: use estimateGas, or {_VIA_PROXY}",
    **dict.fromkeys(
        (m for m in TX_LIFECYCLE if m != "eth_estimateGas" and m not in SERVED_HERE),
        f"a state node holds state and blocks, not the mempool, signing or fees: {_VIA_PROXY}",
    ),
}
MAX_STORAGE_VALUES = 1024  # slots per eth_getStorageValues (geth's maxGetStorageSlots)
# EIP-4844's blob base fee: MIN_BASE_FEE_PER_BLOB_GAS; the update fraction is a setting
# (Cancun's 3338477, Prague's 5007716).
MIN_BLOB_BASE_FEE = 1


def _elsewhere(method: str) -> Handler:
    message = f"Method not found: {method} ({ELSEWHERE[method]})"

    async def handler(params: Any) -> Any:
        raise JsonRpcError(METHOD_NOT_FOUND, message)

    return handler


def _require(value: Any, name: str) -> Any:
    if value is None:
        raise JsonRpcError(INVALID_PARAMS, f"missing required parameter: {name}")
    return value


def _slot(value: Any) -> int:
    slot = parse_quantity(_require(value, "position"), "storage position", lenient=True)
    if slot > UINT256_MAX:
        raise JsonRpcError(INVALID_PARAMS, "invalid storage position: more than 32 bytes")
    return slot


def _full_flag(value: Any) -> None:
    if value is not None and not isinstance(value, bool):
        raise JsonRpcError(INVALID_PARAMS, "invalid full flag: expected true or false")


def fake_exponential(factor: int, numerator: int, denominator: int) -> int:
    """factor * e ** (numerator / denominator), in integers (EIP-4844)."""
    i, output, accum = 1, 0, factor * denominator
    while accum > 0:
        output += accum
        accum = (accum * numerator) // (denominator * i)
        i += 1
    return output // denominator


def _block_hash(value: Any) -> str:
    ref = parse_block_id(_require(value, "block hash"))
    if ref.hash is None:
        raise JsonRpcError(INVALID_BLOCK_ID, f"invalid block id {value!r:.80}: expected a hash")
    return ref.hash


def vendor_block(header: dict[str, Any]) -> dict[str, Any]:
    """The spec's VendorBlock record from a stored Header."""

    def q(name: str) -> int:
        value = header.get(name)
        return int(value, 16) if value else 0

    return {
        "id": header["hash"],
        "height": q("number"),
        "timestamp": q("timestamp"),
        "parent_id": header["parentHash"],
        "base_fee_per_gas": q("baseFeePerGas"),
        "miner": header["miner"],
        "gas_limit": q("gasLimit"),
        "gas_used": q("gasUsed"),
    }


class StateMethods:
    """JSON-RPC handlers over a StateStore; `handlers()` is what the node registers (with
    the read path's `handlers()`: nodes/state/reads.py)."""

    def __init__(
        self,
        store: StateStore,
        *,
        key: str,
        kind: str,
        window: int,
        chain_id: Callable[[], int | None],
        max_validation_count: int = 1000,
        blob_fee_update_fraction: int = 3338477,
    ) -> None:
        self.store = store
        self.key = key
        self.kind = kind
        self.window = window
        self._chain_id = chain_id
        self.max_validation_count = max_validation_count
        self.blob_fee_update_fraction = blob_fee_update_fraction
        # eth_syncing: the source's head as ingest last saw it (None: not reached yet), and
        # the head this node had when it started following it
        self.source_head: Callable[[], int | None] = lambda: None
        self.starting_block = 0

    def handlers(self) -> dict[str, Handler]:
        return {
            **{method: _elsewhere(method) for method in ELSEWHERE},
            "eth_chainId": self.eth_chain_id,
            "eth_getStorageValues": self.eth_get_storage_values,
            "eth_baseFee": self.eth_base_fee,
            "eth_blobBaseFee": self.eth_blob_base_fee,
            "eth_syncing": self.eth_syncing,
            "web3_clientVersion": self.web3_client_version,
            "web3_sha3": self.web3_sha3,
            "net_version": self.net_version,
            "net_listening": self.net_listening,
            "version": self.version,
            "getLatestBlock": self.get_latest_block,
            "getBlockByHeight": self.get_block_by_height,
            "getBlockById": self.get_block_by_id,
            "blockIsValid": self.block_is_valid,
            "blockx_range": self.blockx_range,
            "blockx_getValidation": self.blockx_get_validation,
        }

    # block resolution ------------------------------------------------------------------

    def resolve(self, ref: BlockRef) -> int:
        """The height to answer at; -39006 when this node cannot answer for that block.

        Tags other than `earliest` mean the head; `earliest` means block 0 (as in geth), so
        a pruned node sends it on to an archive node. `Contains` answers at the head,
        provided the named block is known and not beyond it.
        """
        earliest, head = self.store.range()
        if ref.tag is not None:
            height = 0 if ref.tag == "earliest" else head
        elif ref.number is not None:
            height = ref.number
        else:
            known = self.store.height_of(ref.hash or "")
            if known is None:
                raise JsonRpcError(BLOCK_NOT_FOUND, f"block {ref.hash} is not known to this node")
            height = known
        if ref.contains and height <= head:
            return head
        if not earliest <= height <= head:
            raise out_of_range(height, (earliest, head))
        return height

    def _eth_block(self, value: Any) -> int:
        return self.resolve(parse_block_number_param(value))

    # eth namespace ---------------------------------------------------------------------

    def _known_chain_id(self) -> int:
        chain_id = self._chain_id()
        if chain_id is None:
            msg = "chain id not known yet: set chain_id or let the node reach its source"
            raise JsonRpcError(INTERNAL_ERROR, msg)
        return chain_id

    async def eth_chain_id(self, params: Any) -> str:
        params_list(params, [])
        return to_hex(self._known_chain_id())

    # web3 and net namespaces: what clients ask first (web3.py's is_connected) ----------

    async def web3_client_version(self, params: Any) -> str:
        params_list(params, [])
        return f"{NODE_NAME}/{self.key}/v{__version__}/{_RUNTIME}"

    async def net_version(self, params: Any) -> str:
        """The network id; as in geth on a dev chain, the chain id in decimal."""
        params_list(params, [])
        return str(self._known_chain_id())

    async def net_listening(self, params: Any) -> bool:
        """True: the node is answering. It has no peer-to-peer side to report on."""
        params_list(params, [])
        return True

    async def eth_get_storage_values(self, params: Any) -> dict[str, list[str]]:
        """Many slots of many accounts at one block, as geth answers (lowercase addresses in
        order, 32-byte values, at most MAX_STORAGE_VALUES slots)."""
        requests, block = params_list(params, ["requests", "blockNumber"])
        if not isinstance(requests, dict):
            raise JsonRpcError(INVALID_PARAMS, "requests must be an object: address -> [slot]")
        wanted: dict[str, list[int]] = {}
        total = 0
        for addr, slots in requests.items():
            address = parse_address(addr)
            if not isinstance(slots, list):
                raise JsonRpcError(INVALID_PARAMS, f"slots of {address} must be a list")
            total += len(slots)
            if total > MAX_STORAGE_VALUES:
                raise JsonRpcError(SERVER_BUSY, f"too many slots (max {MAX_STORAGE_VALUES})")
            wanted[address] = [_slot(slot) for slot in slots]
        if total == 0:
            raise JsonRpcError(INVALID_PARAMS, "empty request")
        with self.store.view(self._eth_block(block)) as view:
            return {  # by address, as geth's and anvil's maps come out
                address: [to_hash32(view.storage(address, slot)) for slot in wanted[address]]
                for address in sorted(wanted)
            }

    async def eth_base_fee(self, params: Any) -> str:
        (block,) = params_list(params, ["blockNumber"])
        return to_hex(self.store.header(self._eth_block(block)).base_fee_per_gas)

    async def eth_blob_base_fee(self, params: Any) -> str | None:
        """The blob base fee of the head block (from its excessBlobGas, as geth answers);
        null before Cancun."""
        params_list(params, [])
        excess = self.store.header(self.store.range()[1]).excess_blob_gas
        if excess is None:
            return None
        fraction = self.blob_fee_update_fraction
        return to_hex(fake_exponential(MIN_BLOB_BASE_FEE, excess, fraction))

    async def eth_syncing(self, params: Any) -> Any:
        """False when the node holds its source's head (as ingest last polled it) or has
        not reached its source; else how far it is: `startingBlock` (its head when it
        started), `currentBlock` (its head), `highestBlock` (the source's head)."""
        params_list(params, [])
        source = self.source_head()
        bounds = self.store.bounds()
        current = -1 if bounds is None else bounds[1]
        if source is None or current >= source:
            return False
        return {
            "startingBlock": to_hex(self.starting_block),
            "currentBlock": to_hex(max(current, 0)),
            "highestBlock": to_hex(source),
        }

    async def web3_sha3(self, params: Any) -> str:
        (value,) = params_list(params, ["data"])
        return to_data(keccak256(parse_data(_require(value, "data"))))

    # vendor namespace ------------------------------------------------------------------

    async def version(self, params: Any) -> dict[str, Any]:
        params_list(params, [])
        bounds = self.store.bounds()
        return {
            "name": NODE_NAME,
            "version": __version__,
            "key": self.key,
            "kind": self.kind,
            "window": self.window if self.kind == "state" else None,
            "chain_id": self._chain_id(),
            "range": None if bounds is None else {"earliest": bounds[0], "latest": bounds[1]},
        }

    async def get_latest_block(self, params: Any) -> dict[str, Any]:
        params_list(params, [])
        return vendor_block(self.store.header_fields(self.store.range()[1])["header"])

    async def get_block_by_height(self, params: Any) -> dict[str, Any]:
        (height,) = params_list(params, ["height"])
        ref = parse_block_id(_require(height, "height"))
        if ref.hash is not None:
            raise JsonRpcError(INVALID_BLOCK_ID, "invalid height: got a block hash")
        return vendor_block(self.store.header_fields(self.resolve(ref))["header"])

    async def get_block_by_id(self, params: Any) -> dict[str, Any]:
        (block_id,) = params_list(params, ["id"])
        ref = BlockRef(hash=_block_hash(block_id))
        return vendor_block(self.store.header_fields(self.resolve(ref))["header"])

    async def block_is_valid(self, params: Any) -> bool:
        (block_id,) = params_list(params, ["id"])
        return self.store.height_of(_block_hash(block_id)) is not None

    # blockx namespace (the consistency checker) ----------------------------------------

    async def blockx_range(self, params: Any) -> dict[str, int]:
        params_list(params, [])
        earliest, latest = self.store.range()
        return {"earliest": earliest, "latest": latest}

    async def blockx_get_validation(self, params: Any) -> list[dict[str, Any]]:
        start, count = params_list(params, ["fromHeight", "count"])
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise JsonRpcError(INVALID_PARAMS, "fromHeight must be a non-negative integer")
        limit = self.max_validation_count
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= limit:
            raise JsonRpcError(INVALID_PARAMS, f"count must be an integer from 1 to {limit}")
        return self.store.validations(start, count)

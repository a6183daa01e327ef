"""The read interface of a state node at a fixed height.

The state node's store implements it; the EVM executor, BSRB/1 batch reads and the
checker's `blockx` methods consume it. Heights outside the node's range raise
JsonRpcError(-39006); storage failures raise JsonRpcError(-39005).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class HeaderInfo:
    """What execution and routing need from a block header (values decoded)."""

    number: int
    hash: str
    parent_hash: str
    timestamp: int
    miner: str
    gas_limit: int
    gas_used: int
    base_fee_per_gas: int
    mix_hash: str  # prevrandao after the merge
    difficulty: int
    validation_hash: str
    excess_blob_gas: int | None = None  # Cancun headers: what BLOBBASEFEE is computed from


class StateReader(Protocol):
    """State as of the end of block `height` (all values decoded to int/bytes)."""

    def range(self) -> tuple[int, int]:
        """(earliest, latest) heights this node can answer; latest is the head."""
        ...

    def header(self, height: int) -> HeaderInfo: ...

    def height_of(self, block_hash: str) -> int | None:
        """Height of a canonical block by hash, or None when unknown."""
        ...

    def balance(self, address: str, height: int) -> int: ...

    def nonce(self, address: str, height: int) -> int: ...

    def code(self, address: str, height: int) -> bytes: ...

    def storage(self, address: str, slot: int, height: int) -> int: ...

    def block_body(self, height: int) -> dict[str, Any] | None:
        """`{"block": <the block object with full transaction objects>, "receipts": [...]}`
        exactly as the execution client gave them, or None when the node does not hold that
        block's body (outside its range, or a store from before bodies were kept)."""
        ...

    def transaction_location(self, tx_hash: str) -> tuple[int, int] | None:
        """(height, index in its block) of a transaction by its lowercase 0x hash, or None
        when no block whose body the node holds has it."""
        ...

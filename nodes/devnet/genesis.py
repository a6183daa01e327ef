"""One block 0 in anvil's state file: the genesis file's, whatever anvil dumped next to it.

anvil 1.7.1 loaded from a state file first makes a genesis block of its own (timestamp: the
time of the load), then adds the file's blocks; its dump lists every block it holds, so each
reload adds one more block 0. It lists them in hash-map order, and on the next load the last
block 0 of the list becomes block 0 by number and, while the file's head is 0, the block the
next block is mined on. On a chain that has only block 0 (the first seconds of a devnet) a
restart then picks one of them at random: the write nodes, which stored the genesis file's
block, saw "another chain" (measured: 4 of 6 reloads of such a file answered a fresh genesis).
`pin_genesis` keeps one block 0 in the file before anvil loads it: the one block 1 names as
its parent, else the one with the genesis file's timestamp (docs/write-node.md, "Crash
recovery on the devnet").
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from nodes.writer.blockdiff import keccak256

# Header fields in their RLP order; each hard fork appended its own (London: baseFeePerGas,
# Shanghai: withdrawalsRoot, Cancun: blob gas and the beacon root, Prague: requestsHash).
HEADER_FIELDS = (
    "parentHash", "sha3Uncles", "miner", "stateRoot", "transactionsRoot", "receiptsRoot",
    "logsBloom", "difficulty", "number", "gasLimit", "gasUsed", "timestamp", "extraData",
    "mixHash", "nonce", "baseFeePerGas", "withdrawalsRoot", "blobGasUsed", "excessBlobGas",
    "parentBeaconBlockRoot", "requestsHash",
)  # fmt: skip
QUANTITIES = frozenset(
    {"difficulty", "number", "gasLimit", "gasUsed", "timestamp", "baseFeePerGas"}
    | {"blobGasUsed", "excessBlobGas"}
)


def header_hash(header: dict[str, Any]) -> str:
    """The block hash of a header as anvil dumps it (keccak of its RLP list)."""
    import rlp  # here: importing it costs about half a second, and few starts need it

    items: list[int | bytes] = []
    for name in HEADER_FIELDS:
        value = header.get(name)
        if value is None:
            break  # later fields belong to later forks
        text = str(value)
        items.append(int(text, 16) if name in QUANTITIES else bytes.fromhex(text[2:]))
    return "0x" + keccak256(rlp.encode(items)).hex()


def genesis_timestamp(genesis: Path) -> int:
    """The timestamp a genesis file gives block 0 (geth's format: hex or decimal; 0 if none)."""
    value = orjson.loads(genesis.read_bytes()).get("timestamp", 0)
    if isinstance(value, str):
        return int(value, 16) if value.lower().startswith("0x") else int(value)
    return int(value)


def _number(block: dict[str, Any]) -> int:
    return int(str(block["header"]["number"]), 16)


def chosen_genesis(state: dict[str, Any], timestamp: int | None) -> dict[str, Any] | None:
    """The block 0 the file's chain is on: block 1's parent when the file has block 1, else
    the one with the genesis file's `timestamp`, else the earliest (anvil's first start)."""
    zeros = [b for b in state.get("blocks") or [] if _number(b) == 0]
    if len(zeros) <= 1:
        return zeros[0] if zeros else None
    child = next((b for b in state["blocks"] if _number(b) == 1), None)
    if child is not None:
        parent = str(child["header"]["parentHash"]).lower()
        named = [b for b in zeros if header_hash(b["header"]) == parent]
        if named:
            return named[0]
    if timestamp is not None:
        dated = [b for b in zeros if int(str(b["header"]["timestamp"]), 16) == timestamp]
        if dated:
            return dated[0]
    return min(zeros, key=lambda b: int(str(b["header"]["timestamp"]), 16))


def pin_genesis(state_path: Path, genesis: Path | None) -> bool:
    """Drop every block 0 but the chosen one from the state file (atomically); True when it
    changed the file. A missing or damaged file is left to the recovery steps."""
    try:
        state = orjson.loads(state_path.read_bytes())
        blocks = state["blocks"]
        if sum(1 for b in blocks if _number(b) == 0) <= 1:
            return False
        keep = chosen_genesis(state, genesis_timestamp(genesis) if genesis is not None else None)
    except (OSError, orjson.JSONDecodeError, TypeError, KeyError, ValueError):
        return False
    state["blocks"] = [b for b in blocks if _number(b) != 0 or b is keep]
    tmp = state_path.with_name(state_path.name + ".pin")
    with open(tmp, "wb") as out:
        out.write(orjson.dumps(state))
        out.flush()
        os.fsync(out.fileno())
    tmp.replace(state_path)
    return True

"""A hand-assembled contract for `suite call`: a storage-heavy view (no compiler needed).

`VIEW_SLOTS` slots are written by the constructor (slot i = i + 1). A call with empty
calldata sums slots 0..VIEW_SLOTS-1 and returns the sum as one word: VIEW_SLOTS cold SLOADs,
the shape of a view that reads many storage words (a pool's reserves, an order book, a
config struct). A call with exactly 64 bytes of calldata `slot ++ value` stores the value,
so a bench can change the state between heights.
"""

from __future__ import annotations

from nodes.devnet.workload import init_code

VIEW_SLOTS = 64  # storage words the view reads

# Runtime, stack shown top first. Offsets matter: the JUMP targets below are absolute.
#  0 CALLDATASIZE; PUSH1 64; EQ; PUSH1 write; JUMPI          64 bytes of calldata → write
#  7 PUSH1 0 (acc); PUSH1 0 (i)
# 11 loop: JUMPDEST; DUP1; PUSH1 N; GT; ISZERO; PUSH1 end; JUMPI    [i, acc]
# 20 DUP1; SLOAD; DUP3; ADD; SWAP2; POP                              acc += SLOAD(i)
# 26 PUSH1 1; ADD; PUSH1 loop; JUMP                                  i += 1
# 32 end: JUMPDEST; POP; PUSH1 0; MSTORE; PUSH1 32; PUSH1 0; RETURN  return acc
# 42 write: JUMPDEST; PUSH1 32; CALLDATALOAD; PUSH1 0; CALLDATALOAD; SSTORE; STOP
VIEW_RUNTIME = bytes.fromhex(
    "36604014602a57"  # 0
    "60006000"  # 7
    f"5b8060{VIEW_SLOTS:02x}1115602057"  # 11
    "805482019150"  # 20
    "600101600b56"  # 26
    "5b5060005260206000f3"  # 32
    "5b6020356000355500"  # 42
)
# Constructor: for i in 0..N-1: SSTORE(i, i + 1); then `init_code`'s copier returns the runtime.
#  0 PUSH1 0 (i)
#  2 loop: JUMPDEST; DUP1; PUSH1 N; GT; ISZERO; PUSH1 end; JUMPI
# 11 DUP1; PUSH1 1; ADD; DUP2; SSTORE                                SSTORE(i, i + 1)
# 17 PUSH1 1; ADD; PUSH1 loop; JUMP
# 23 end: JUMPDEST; POP
_CONSTRUCTOR = bytes.fromhex(
    "6000"  # 0
    f"5b8060{VIEW_SLOTS:02x}1115601757"  # 2
    "806001018155"  # 11
    "600101600256"  # 17
    "5b50"  # 23
)


def view_init_code() -> bytes:
    """Deployment code of the storage-heavy view contract."""
    return init_code(VIEW_RUNTIME, _CONSTRUCTOR)


def view_sum(values: dict[int, int] | None = None) -> int:
    """What the view returns when slot i holds values.get(i, i + 1)."""
    values = values or {}
    return sum(values.get(i, i + 1) for i in range(VIEW_SLOTS))


def write_data(slot: int, value: int) -> str:
    """Calldata that makes the contract store `value` in `slot`."""
    return "0x" + slot.to_bytes(32, "big").hex() + value.to_bytes(32, "big").hex()

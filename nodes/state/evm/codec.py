"""Validation of call requests, state overrides and block overrides (main process side).

Everything a worker receives has been checked and decoded here, so bad input is a clear
-32602 before any execution starts, and workers see only plain ints, bytes and strings.
"""

from __future__ import annotations

from typing import Any

from chainstate.hexcodec import UINT256_MAX, parse_address, parse_data, parse_quantity
from chainstate.jsonrpc import INVALID_PARAMS, JsonRpcError
from nodes.state.evm.feed import Overlay
from nodes.state.evm.wire import call_fields
from nodes.state.reader import HeaderInfo

ZERO_ADDRESS = "0x0000000000000000000000000000000000000000"
CALL_FIELDS = frozenset(
    {
        "from",
        "to",
        "gas",
        "gasPrice",
        "maxFeePerGas",
        "maxPriorityFeePerGas",
        "value",
        "data",
        "input",
        "nonce",
        "type",
        "chainId",
        "accessList",
    }
)
OVERRIDE_FIELDS = frozenset({"balance", "nonce", "code", "state", "stateDiff"})
BLOCK_OVERRIDE_FIELDS = {
    "number": "number",
    "time": "timestamp",
    "timestamp": "timestamp",
    "gasLimit": "gas_limit",
    "feeRecipient": "coinbase",
    "coinbase": "coinbase",
    "prevRandao": "prevrandao",
    "random": "prevrandao",
    "baseFee": "basefee",
    "baseFeePerGas": "basefee",
    "difficulty": "difficulty",
}


def invalid(message: str) -> JsonRpcError:
    return JsonRpcError(INVALID_PARAMS, message)


def _u256(value: Any, what: str) -> int:
    n = parse_quantity(value, what)
    if n > UINT256_MAX:
        raise invalid(f"invalid {what}: larger than 2^256-1")
    return n


def _u64(value: Any, what: str) -> int:
    n = parse_quantity(value, what)
    if n >= 2**64:
        raise invalid(f"invalid {what}: larger than 2^64-1")
    return n


def block_env(header: HeaderInfo) -> dict[str, Any]:
    """The block env of a job, from the header of the requested block."""
    return {
        "number": header.number,
        "hash": header.hash,
        "timestamp": header.timestamp,
        "coinbase": header.miner,
        "basefee": header.base_fee_per_gas,
        "gas_limit": header.gas_limit,
        "prevrandao": header.mix_hash,
        "difficulty": header.difficulty,
        "excess_blob_gas": header.excess_blob_gas,
    }


def parse_call(obj: Any, gas_limit: int, what: str = "request") -> dict[str, Any]:
    """A call object → worker call dict. `gas_limit` is the most gas a call may get.

    geth's defaults: `from` the zero address, gas the cap, no fee charged unless a price is
    given. Fees as anvil reads them: `maxFeePerGas` or `maxPriorityFeePerGas` make it an
    EIP-1559 call (a `gasPrice` beside them is ignored), else `gasPrice` is the price; the
    price the call pays (`effective_price`) depends on the block's base fee.
    """
    if not isinstance(obj, dict):
        raise invalid(f"invalid {what}: expected a call object")
    unknown = sorted(set(obj) - CALL_FIELDS)
    if unknown:
        raise invalid(f"invalid {what}: unknown fields {unknown}")
    to = None if obj.get("to") is None else parse_address(obj["to"], f"{what}.to")
    sender = ZERO_ADDRESS if obj.get("from") is None else parse_address(obj["from"], f"{what}.from")
    data = b""
    if obj.get("input") is not None:
        data = parse_data(obj["input"], f"{what}.input")
    if obj.get("data") is not None:
        d = parse_data(obj["data"], f"{what}.data")
        if obj.get("input") is not None and d != data:
            raise invalid(f"invalid {what}: both `data` and `input` given and they differ")
        data = d
    value = 0 if obj.get("value") is None else _u256(obj["value"], f"{what}.value")
    gas = gas_limit if obj.get("gas") is None else _u64(obj["gas"], f"{what}.gas")
    gas = min(gas, gas_limit)
    max_fee, tip = _fees(obj, what)
    nonce = None if obj.get("nonce") is None else _u64(obj["nonce"], f"{what}.nonce")
    if obj.get("type") is not None:
        _u64(obj["type"], f"{what}.type")
    chain_id = None if obj.get("chainId") is None else _u64(obj["chainId"], f"{what}.chainId")
    access_list = parse_access_list(obj.get("accessList"), f"{what}.accessList")
    return call_fields(sender, to, data, value, gas, max_fee, tip, nonce, chain_id, access_list)


def _fees(obj: dict[str, Any], what: str) -> tuple[int, int | None]:
    """(most a unit of gas may cost, priority fee or None for a legacy price), as anvil
    reads a call's fee fields (its `FeeDetails`)."""
    max_fee = obj.get("maxFeePerGas")
    tip = obj.get("maxPriorityFeePerGas")
    if max_fee is None and tip is None:
        price = obj.get("gasPrice")
        return (0 if price is None else _u256(price, f"{what}.gasPrice")), None
    fee = 0 if max_fee is None else _u256(max_fee, f"{what}.maxFeePerGas")
    priority = None if tip is None else _u256(tip, f"{what}.maxPriorityFeePerGas")
    if priority is not None and priority > fee:
        raise invalid(
            f"invalid {what}: maxPriorityFeePerGas ({priority}) is greater than "
            f"maxFeePerGas ({fee})"
        )
    return fee, priority


def effective_price(call: dict[str, Any], basefee: int) -> int:
    """What a unit of gas costs the call, and what GASPRICE reads: the price, or for an
    EIP-1559 call min(maxFeePerGas, base fee + maxPriorityFeePerGas) (the max fee when no
    priority fee is given), as revm computes it. Not checked against the base fee: calls
    below it run, as in anvil and geth's eth_call."""
    tip = call["tip"]
    if tip is None:
        return call["max_fee"]
    return min(call["max_fee"], basefee + tip)


def parse_access_list(value: Any, what: str) -> list[tuple[str, list[int]]]:
    """`[{address, storageKeys}]` → [(address, [slot, …])] (EIP-2930)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid(f"invalid {what}: expected an array")
    out = []
    for i, item in enumerate(value):
        where = f"{what}[{i}]"
        if not isinstance(item, dict) or set(item) - {"address", "storageKeys"}:
            raise invalid(f"invalid {where}: expected {{address, storageKeys}}")
        address = parse_address(item.get("address"), f"{where}.address")
        keys = item.get("storageKeys") or []
        if not isinstance(keys, list):
            raise invalid(f"invalid {where}.storageKeys: expected an array")
        slots = []
        for key in keys:
            if not (isinstance(key, str) and len(key) == 66):
                raise invalid(f"invalid {where}.storageKeys: expected 32-byte hashes")
            slots.append(int.from_bytes(parse_data(key, f"{where}.storageKeys"), "big"))
        out.append((address, slots))
    return out


def check_chain_id(calls: list[dict[str, Any]], chain_id: int) -> None:
    """A call naming another chain is refused, as geth and anvil refuse it."""
    for call in calls:
        have = call.get("chain_id")
        if have is not None and have != chain_id:
            raise invalid(f"chainId does not match node's (have={have}, want={chain_id})")


def parse_calls(objs: Any, gas_limit: int, max_calls: int) -> list[dict[str, Any]]:
    if not isinstance(objs, list):
        raise invalid("invalid requests: expected an array of call objects")
    if not objs:
        raise invalid("invalid requests: empty array")
    if len(objs) > max_calls:
        raise invalid(f"invalid requests: {len(objs)} calls, at most {max_calls}")
    return [parse_call(o, gas_limit, f"requests[{i}]") for i, o in enumerate(objs)]


def parse_state_override(obj: Any) -> Overlay | None:
    """`{address: {balance?, nonce?, code?, state? | stateDiff?}}` → an Overlay (geth's rules:
    `state` replaces the whole storage, `stateDiff` changes the named slots)."""
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise invalid("invalid stateOverride: expected an object keyed by address")
    overlay = Overlay()
    for raw_addr, ov in obj.items():
        address = parse_address(raw_addr, "stateOverride key")
        where = f"stateOverride[{address}]"
        if not isinstance(ov, dict):
            raise invalid(f"invalid {where}: expected an object")
        unknown = sorted(set(ov) - OVERRIDE_FIELDS)
        if unknown:
            raise invalid(f"invalid {where}: unknown fields {unknown}")
        if ov.get("state") is not None and ov.get("stateDiff") is not None:
            raise invalid(f"invalid {where}: give either state or stateDiff, not both")
        account: dict[str, Any] = {}
        if ov.get("balance") is not None:
            account["balance"] = _u256(ov["balance"], f"{where}.balance")
        if ov.get("nonce") is not None:
            account["nonce"] = _u64(ov["nonce"], f"{where}.nonce")
        if ov.get("code") is not None:
            account["code"] = parse_data(ov["code"], f"{where}.code")
        if account:
            overlay.accounts[address] = account
        for name in ("state", "stateDiff"):
            slots = ov.get(name)
            if slots is None:
                continue
            if not isinstance(slots, dict):
                raise invalid(f"invalid {where}.{name}: expected an object")
            overlay.storage[address] = {_slot(k, where): _slot(v, where) for k, v in slots.items()}
            if name == "state":
                overlay.replaced.add(address)
    return overlay


def _slot(value: Any, where: str) -> int:
    n = parse_quantity(value, f"{where} storage entry", lenient=True)
    if n > UINT256_MAX:
        raise invalid(f"invalid {where} storage entry: over 32 bytes")
    return n


def apply_block_overrides(env: dict[str, Any], obj: Any) -> dict[str, Any]:
    """A copy of the block env with the overridden fields (geth's BlockOverrides names)."""
    if obj is None:
        return env
    if not isinstance(obj, dict):
        raise invalid("invalid blockOverrides: expected an object")
    unknown = sorted(set(obj) - set(BLOCK_OVERRIDE_FIELDS))
    if unknown:
        raise invalid(f"invalid blockOverrides: unknown fields {unknown}")
    out = dict(env)
    for name, value in obj.items():
        key = BLOCK_OVERRIDE_FIELDS[name]
        if key == "coinbase":
            out[key] = parse_address(value, f"blockOverrides.{name}")
        elif key == "prevrandao":
            if not (isinstance(value, str) and len(value) == 66):
                raise invalid(f"invalid blockOverrides.{name}: expected a 32-byte hash")
            parse_data(value, f"blockOverrides.{name}")
            out[key] = value.lower()
        elif key in ("number", "timestamp", "gas_limit"):
            out[key] = _u64(value, f"blockOverrides.{name}")
        else:
            out[key] = _u256(value, f"blockOverrides.{name}")
    return out


def parse_flag(value: Any, name: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(f"invalid {name}: expected true or false")
    return value

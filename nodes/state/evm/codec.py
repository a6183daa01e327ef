"""Validation of call requests, state overrides and block overrides (main process side).

Everything a worker receives has been checked and decoded here, so bad input is a clear
-32602 before any execution starts, and workers see only plain ints, bytes and strings.
"""

from __future__ import annotations

from typing import Any

from chainstate.hexcodec import UINT256_MAX, parse_address, parse_data, parse_quantity
from chainstate.jsonrpc import INVALID_PARAMS, JsonRpcError
from nodes.state.evm.feed import Overlay
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

    geth's defaults: `from` the zero address, gas the cap, no fee charged unless a gas price
    is given (then the sender must afford gas × price + value).
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
    if obj.get("gasPrice") is not None and obj.get("maxFeePerGas") is not None:
        raise invalid(f"invalid {what}: give either gasPrice or maxFeePerGas, not both")
    price_field = obj.get("gasPrice", obj.get("maxFeePerGas"))
    gas_price = None if price_field is None else _u256(price_field, f"{what}.gasPrice")
    if gas_price == 0:
        gas_price = None
    nonce = None if obj.get("nonce") is None else _u64(obj["nonce"], f"{what}.nonce")
    return {
        "from": sender,
        "to": to,
        "data": data,
        "value": value,
        "gas": gas,
        "gas_price": gas_price,
        "nonce": nonce,
    }


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

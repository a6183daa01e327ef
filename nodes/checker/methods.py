"""The checker's JSON-RPC methods. Every error is -39005 (spec rule 2 of "Errors")."""

from __future__ import annotations

from typing import Any

from chainstate.hexcodec import is_hash
from chainstate.jsonrpc import DATABASE_FAILED, Handler, JsonRpcError, params_list
from nodes.checker.ledger import BlockRecord, Ledger


def _fail(message: str) -> JsonRpcError:
    return JsonRpcError(DATABASE_FAILED, message)


def _height(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        try:
            height = int(value, 16) if value.startswith("0x") else int(value)
        except ValueError:
            height = -1
        if height >= 0:
            return height
    raise _fail(f"invalid height {value!r}: expected a non-negative integer or hex quantity")


def _hash(value: Any) -> str:
    if is_hash(value):
        return str(value).lower()
    raise _fail(f"invalid block hash {value!r}: expected 0x + 64 hex digits")


def _params(params: Any, names: list[str]) -> list[Any]:
    try:
        return params_list(params, names)
    except JsonRpcError as exc:
        raise _fail(exc.message) from None


def checker_methods(ledger: Ledger) -> dict[str, Handler]:
    def found(record: BlockRecord | None, what: str) -> dict[str, object]:
        if record is None:
            raise _fail(f"{what} is not a confirmed block")
        return record.to_json()

    async def get_latest_block(params: Any) -> dict[str, object]:
        _params(params, [])
        record = ledger.latest()
        if record is None:
            raise _fail("no block has been confirmed yet")
        return record.to_json()

    async def get_block_by_height(params: Any) -> dict[str, object]:
        (height,) = _params(params, ["height"])
        h = _height(height)
        record = ledger.at_height(h)
        skipped = ledger.skipped_at(h) if record is None else None
        if skipped is not None:
            low, high = skipped
            raise _fail(
                f"height {h} is not a confirmed block: it was skipped (heights {low}..{high}: "
                "no replica held them any more when the checker reached them)"
            )
        return found(record, f"height {h}")

    async def get_block_by_id(params: Any) -> dict[str, object]:
        (block_hash,) = _params(params, ["hash"])
        h = _hash(block_hash)
        return found(ledger.by_id(h), f"block {h}")

    async def block_is_valid(params: Any) -> bool:
        (block_hash,) = _params(params, ["hash"])
        h = _hash(block_hash)
        record = ledger.by_id(h)
        if record is None:
            raise _fail(f"block {h} is unknown or not confirmed yet")
        return not record.is_fork

    return {
        "getLatestBlock": get_latest_block,
        "getBlockByHeight": get_block_by_height,
        "getBlockById": get_block_by_id,
        "blockIsValid": block_is_valid,
    }

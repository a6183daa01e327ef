"""What a client of the standard Ethereum API sees of a node's final answer.

State nodes answer with the spec's -39xxx codes: their direct callers and the proxy's retries
rely on them (-39006 moves an item to another node). A client library pointed at the proxy
knows geth's codes instead: web3.py and viem key a revert on code 3, every library a bad param
on -32602, and ethers/viem wait for a future block by polling `eth_getBlockByNumber` until it
is not `null`. So once no further attempt will serve an item of a standard method
(`MethodSpec.standard`), its -39xxx error becomes what geth answers (docs/proxy.md, "Errors at
the public face"):

- -39000 EvmRevert → 3 (message and revert data kept);
- -39007 InvalidBlockID → -32602;
- -39006 BlockNotFound of a block, transaction or receipt getter (`missing_null`) → a
  `null` result, or -32000 when the block exists but no node holds it;
- -39005 DataBaseFailed → -32603;
- any other -39xxx (gas, balance, nonce, EVM failure, precompile, block not held) → -32000.

Vendor methods (`getAddressBalance`, `pre_*`, `blockx_*`, `eth_multiCall`, ...) keep the
spec's codes. Answers without `-3900` in them are never decoded here: successful answers are
still forwarded as the node's bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from chainstate.blockref import BlockRef
from chainstate.jsonrpc import (
    BLOCK_NOT_FOUND,
    DATABASE_FAILED,
    EVM_REVERT,
    INTERNAL_ERROR,
    INVALID_BLOCK_ID,
    INVALID_PARAMS,
)
from proxy.methods import MethodSpec
from proxy.model import Pool
from proxy.reads import Reads
from proxy.select import Selector

REVERTED = 3  # geth's code for a revert (with the revert data)
SERVER_ERROR = -32000  # geth's code for a call or read that failed on the node
PUBLIC_CODES = {
    EVM_REVERT: REVERTED,
    INVALID_BLOCK_ID: INVALID_PARAMS,
    DATABASE_FAILED: INTERNAL_ERROR,
}
_LOWEST, _HIGHEST = -39099, -39000  # the spec's own range


def public(spec: MethodSpec, answer: Any, held: Callable[[], bool] | None = None) -> Any:
    """`answer` (an answer object: changed in place, and returned) as a client of `spec`'s
    method sees it. `held()`: whether the block the item named exists on the pool's chain (a
    final -39006 then means "no node holds it", an error, not "no such block", `null`);
    asked only for such an answer (None: it does not)."""
    if not spec.standard or type(answer) is not dict:
        return answer
    error = answer.get("error")
    if type(error) is not dict:
        return answer
    code = error.get("code")
    if type(code) is not int or not _LOWEST <= code <= _HIGHEST:
        return answer
    if code == BLOCK_NOT_FOUND and spec.missing_null and (held is None or not held()):
        del answer["error"]
        answer["result"] = None
        return answer
    answer["error"] = {**error, "code": PUBLIC_CODES.get(code, SERVER_ERROR)}
    return answer


def public_raw(spec: MethodSpec, raw: bytes, held: Callable[[], bool] | None = None) -> bytes:
    """`public` for a single answer's bytes: the same bytes unless they carry a -39xxx code
    to translate (peeked at before anything is decoded)."""
    if not spec.standard or raw.find(b"-390") < 0:
        return raw
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw
    error = answer.get("error") if type(answer) is dict else None
    if type(error) is not dict or public(spec, answer, held).get("error") is error:
        return raw
    return orjson.dumps(answer)


class Face:
    """`public` and `public_raw` for an item of a pool, with what the proxy knows of the
    pool's chain to tell a block no node holds from a block that does not exist."""

    def __init__(self, selector: Selector, reads: Reads | None) -> None:
        self.selector = selector
        self.reads = reads

    def answer(self, spec: MethodSpec, answer: Any, pool: Pool, ref: BlockRef | None) -> Any:
        """`public` of an answer object to an item of `pool` naming block `ref`."""
        return public(spec, answer, lambda: self.held(pool, ref))

    def raw(self, spec: MethodSpec, raw: bytes, pool: Pool, ref: BlockRef | None) -> bytes:
        """`public_raw` of a single answer's bytes (peeked at first: most pass untouched)."""
        if not spec.standard or raw.find(b"-390") < 0:
            return raw
        return public_raw(spec, raw, lambda: self.held(pool, ref))

    def held(self, pool: Pool, ref: BlockRef | None) -> bool:
        """Whether the block `ref` names exists on the pool's chain as far as the proxy knows
        (a height up to the known head, a hash it has seen, a tag): a -39006 for it then
        means no node holds it, not that there is no such block."""
        if ref is None:
            return False  # a transaction by hash: unknown means null
        if ref.tag is not None:
            return True
        view = None if self.reads is None else self.reads.heads.views.get(pool.id)
        if ref.hash is not None:
            if view is not None and ref.hash in view.heights:
                return True
            return self.selector.hashes.get(ref.hash) is not None
        tip = pool.head()
        if view is not None and view.tip is not None:
            tip = view.tip if tip is None else max(tip, view.tip)
        return tip is not None and ref.number is not None and ref.number <= tip

"""The read path's shortcuts: one head per request, cached answers, coalesced reads.

The engine asks `Reads.plan` about every read item of a client request before routing it:

1. **resolve heads**: `latest` (also a `blockCtx` without `block_id`), `safe` and `finalized`
   become a concrete block, the same for every item of the request (proxy/heads.py). The
   block is named by its hash where the method takes one (EIP-1898 `{"blockHash"}`, a
   `blockCtx` or `blockId` hash), so the node answers at exactly that block or says it does
   not know it (-39006); the item is then asked again by height (`Plan.fallback`), which is
   what a node answers after a reorg the proxy has not seen yet. `eth_blockNumber` is
   answered with the resolved height, `getLatestBlock` is asked as `getBlockByHeight` of it.
2. **cache**: an item of a cached method that names a block the proxy knows the hash of is
   looked up (proxy/cache.py) and, when found, answered without a node. With a shared tier
   (proxy/sharedcache.py), a local miss of an answer the fleet shares (`Plan.share`) is
   looked up there (the lookups of one event-loop turn in one round trip), and the item
   waits for it as it would for an identical read in flight (`Lookup`): the pipeline needs
   no step of its own; not found, it goes to a node.
3. **coalesce**: an identical read already in flight (proxy/coalesce.py) is waited for.

The rest goes to a node as usual; `land` stores a good answer and hands it to the waiting
reads. Writer methods (the transaction lifecycle), `pending` reads and methods not in
`cache_methods` are never cached or coalesced; `extra_methods` are passed through untouched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from chainstate.blockref import BlockRef
from proxy import nesting
from proxy.cache import Key, ResponseCache
from proxy.coalesce import Coalescer, Flight
from proxy.heads import Heads, RequestHeads
from proxy.methods import MethodSpec
from proxy.model import Node, Pool

HASH_FORMS = ("number", "ctx", "id")  # block params that can name a block by its hash
EXACT_FORMS = (*HASH_FORMS, "hash")  # sent by hash: the answer is that block's
Ready = orjson.Fragment | str  # a result answered without a node
BATCH = ""  # the method part of a whole batch's cache key (no method has this name)
# Reads whose params (as JSON) are longer are neither cached nor coalesced: hashing and
# keeping megabytes of calldata per read costs the event loop more than an identical read
# in flight would save (a 5 MB eth_call: ~20 ms). 128 KiB keeps calls as large as any
# contract's initcode (48 KiB, hex) cached.
MAX_KEYED_BYTES = 128 * 1024
# Batch bodies longer are not cached as a whole (the body is the key): 1,000 reads with
# small params take ~100-300 KB.
MAX_BATCH_KEYED_BYTES = 1024 * 1024


class Lookup(Flight):
    """A look-up in the shared tier that reads of one key wait for as for a read in flight:
    its answer when found, else None (they then go to a node, one of them leading)."""

    __slots__ = ()


class Plan:
    """What the read path decided for one item."""

    __slots__ = (
        "avoid",
        "epoch",
        "exact",
        "fallback",
        "flight",
        "key",
        "later",
        "lead",
        "missing",
        "obj",
        "ref",
        "share",
        "store",
    )

    def __init__(
        self,
        obj: Any = None,
        ref: BlockRef | None = None,
        key: Key | None = None,
        *,
        fallback: dict[str, Any] | None = None,
    ) -> None:
        self.obj = obj  # the request object to send (the client's, or with its block pinned)
        self.ref = ref  # the block to route by
        self.key = key  # cache/coalescing key (None: neither)
        self.flight: Flight | None = None  # an identical read in flight to wait for
        self.store = False  # a good answer may be cached (the block is named by its hash)
        self.fallback = fallback  # the item by height, when the node does not know the hash
        self.lead = False  # this item leads its key's flight: `land` must be called
        self.avoid: tuple[Node, ...] = ()  # nodes off the known chain: not sent there
        self.later: tuple[MethodSpec, int, str | None] | None = None  # a follower's pin
        self.epoch = 0  # the pool's cache epoch when planned (`ResponseCache.flush`)
        self.exact = False  # its answer is the block's named by the key (cacheable)
        self.missing: list[Node] | None = None  # nodes that did not know the pinned hash
        # its answer may be shared with the fleet (proxy/sharedcache.py): the block named by
        # hash by the client, or at or below the checker's confirmed head; never `latest`
        self.share = False

    def unpin(self) -> dict[str, Any] | None:
        """The request object to ask again by height after -39006 on the pinned hash (None:
        not pinned by hash). Its answer is not the pinned block's, so it is not stored."""
        fallback, self.fallback = self.fallback, None
        if fallback is not None:
            self.obj = fallback
            self.store = self.exact = False
        return fallback


class ByteRows(Protocol):
    """What `Reads.pin_rows` reads of a batch's rows read from its bytes (proxy/request.py's
    `Rows`, which imports this module): their spec and each row's height."""

    spec: MethodSpec
    heights: list[int | None] | None


@dataclass(frozen=True, slots=True)
class ReadSettings:
    methods: frozenset[str]  # cached and coalesced
    coalesce: bool = True


class Reads:
    """Heads, cache and coalescing of one proxy process."""

    def __init__(
        self,
        heads: Heads,
        cache: ResponseCache,
        settings: ReadSettings,
    ) -> None:
        self.heads = heads
        self.cache = cache
        self.methods = settings.methods
        self.coalescer = Coalescer() if settings.coalesce else None

    def request(self, pool: Pool, least: int | None = None) -> RequestHeads:
        """The heads of one client request (resolved lazily, each once); `least`: the
        lowest `latest` the client accepts (`x-min-block`)."""
        return self.heads.request(pool, least)

    def plan(
        self,
        heads: RequestHeads,
        method: str,
        spec: MethodSpec,
        ref: BlockRef | None,
        obj: dict[str, Any],
        keyed: bool = True,
    ) -> Plan | Ready | None:
        """What to do with one read item: None (send it as it is), a ready result (a cached
        answer's `orjson.Fragment`, or the pinned height as a hex string for
        `eth_blockNumber`), or a Plan. -32602 (JsonRpcError) for params nested too deep to
        be keyed or sent again (proxy/nesting.py). `keyed=False`: the item is known to be
        longer than MAX_KEYED_BYTES (neither cached nor coalesced, its params not written)."""
        found = self._plan(heads, method, spec, ref, obj, keyed)
        if heads.mixed is False and not _determined(heads, found, ref):
            heads.mixed = True  # the batch cannot be cached as a whole
        return found

    def planned_at(
        self, heads: RequestHeads, method: str, spec: MethodSpec, numbers: list[int]
    ) -> list[bool] | None:
        """For items of one method at plain heights (`numbers`), which ones `plan` may plan:
        those whose block hash the proxy knows. None when `plan` leaves every one as it is
        (then each would make `heads.mixed` True, which is done here)."""
        hashes = None if heads.view is None else heads.view.hashes
        known = None
        plain = spec.writer or spec.block == "logs" or method not in self.methods
        if hashes is not None and not plain:
            # One pass over the heights (their places are needed as soon as one is known),
            # then one over the flags: no pass asking first whether any is known.
            known = list(map(hashes.__contains__, numbers))
            if not any(known):
                known = None
        if heads.mixed is False and (known is None or False in known):
            heads.mixed = True
        return known

    def pin_rows(self, heads: RequestHeads, rows: ByteRows, picked: list[int]) -> list[str] | None:
        """The block hash of each of the items at `picked` of a batch read from its bytes
        (proxy/scan.py; plain heights whose hash `planned_at` found), each to be named by
        that hash in the bytes sent (`Rows.pin_by_hash`, no item parsed), as `plan` pins
        such an item when nothing is cached and no node is avoided; None when any of them
        would be planned otherwise (the pool's answers cached, a method asked by height, a
        node off the known chain): then `plan` plans them. These items are not coalesced:
        keying each (its params cut from the bytes, its flight joined and landed) cost about
        as much again as pinning it, for the rare identical read in flight meanwhile (as
        heights older than the known blocks are not); their batch makes its round trip
        anyway."""
        spec = rows.spec
        if spec.block != "number" or not spec.by_hash:
            return None
        if self.cache.enabled(heads.pool.id) or heads.avoid():
            return None
        hashes = heads.view.hashes  # type: ignore[union-attr]
        heights = rows.heights
        return list(map(hashes.__getitem__, map(heights.__getitem__, picked)))  # type: ignore[union-attr, arg-type]

    def _plan(
        self,
        heads: RequestHeads,
        method: str,
        spec: MethodSpec,
        ref: BlockRef | None,
        obj: dict[str, Any],
        keyed: bool = True,
    ) -> Plan | Ready | None:
        if spec.writer or spec.block == "logs":
            return None  # eth_getLogs: a range, routed by its oldest block (proxy/events.py)
        if spec.block is None or ref is None:
            return self._headless(heads, method, obj)
        cached = method in self.methods
        tag = ref.tag
        if tag is not None:
            if tag == "pending" or tag == "earliest":
                return None
            pin = heads.latest() if tag == "latest" else heads.safe()
            if pin is None:
                return None
            height, block_hash = pin
        elif ref.contains or not cached:
            return None  # Contains answers at the node's head; a height is concrete already
        elif ref.number is not None:
            height, block_hash = ref.number, heads.hash_at(ref.number)
            if block_hash is None:
                # A height older than the known blocks: sent as it is. (Coalescing it too
                # would cost every such read ~2 µs for the rare identical one in flight.)
                return None
        else:
            block_hash = ref.hash
            found = heads.height_of(block_hash or "")
            if found is None:
                return None  # a block the proxy does not know (or one a reorg dropped)
            height = found
        kind = spec.block
        key = None
        exact = block_hash is not None and kind in EXACT_FORMS and spec.by_hash
        store = share = False
        epoch = 0
        params = nesting.key(without_block(obj, spec)) if cached and keyed else b""
        if len(params) > MAX_KEYED_BYTES or not keyed:
            cached = False  # (neither cached nor coalesced: see MAX_KEYED_BYTES)
        cache = self.cache
        if cached:
            # The block (by hash where known, else by height) and the other params
            # determine the answer.
            where = block_hash if exact else height
            key = (heads.pool.id, where, method, params)
            store = exact and cache.enabled(heads.pool.id)
            epoch = cache.epochs.get(heads.pool.id, 0)
            if store:
                hit = cache.get(key)  # type: ignore[arg-type]
                if hit is not None:
                    return hit
                if cache.tier is not None:
                    share = _shared(heads, ref, height)
        coalescer = self.coalescer
        # (A flush starts a new epoch: reads then never share a call made before it.)
        flight = None if coalescer is None or key is None else coalescer.join((epoch, key))
        if flight is None and share and cache.shares(heads.pool.id):
            flight = self._look_up(key, epoch)  # type: ignore[arg-type]
        if flight is not None:  # the item is only pinned if it has to be sent after all
            plan = Plan(obj, ref, key)
            plan.flight, plan.later = flight, (spec, height, block_hash)
        else:
            plan = self._pinned(spec, ref, obj, height, block_hash, key)
            plan.lead = coalescer is not None and key is not None
            plan.store = store
        plan.epoch, plan.exact, plan.share = epoch, store, share
        plan.avoid = heads.avoid()
        return plan

    def _look_up(self, key: Key, epoch: int) -> Lookup:
        """`key` looked up in the shared tier, and the flight the reads of `key` wait for
        meanwhile (in the coalescer's place of this read, which would lead)."""
        lookup = Lookup()
        coalescer = self.coalescer
        if coalescer is not None:
            coalescer.flights[(epoch, key)] = lookup

        def done(found: orjson.Fragment | None) -> None:
            answer = None if found is None else {"jsonrpc": "2.0", "id": None, "result": found}
            if coalescer is not None:
                coalescer.land((epoch, key), answer)
                return
            lookup.answer = answer
            if lookup.future is not None and not lookup.future.done():
                lookup.future.set_result(answer)

        self.cache.fetch_shared(key, epoch, done)
        return lookup

    def batch_key(self, heads: RequestHeads, body: bytes) -> Key | None:
        """The cache key of a whole batch as the client sent it, at the request's `latest`
        (None: the pool's answers are not cached, no head is known, or the body is longer
        than MAX_BATCH_KEYED_BYTES). The head's hash
        determines every block such a batch may name when it is stored (`latest`, heights
        up to the head, hashes; see `ResponseCache.put_batch`), and the ids are in the
        body, so the answer's bytes are the same for the same key."""
        pool_id = heads.pool.id
        if len(body) > MAX_BATCH_KEYED_BYTES or not self.cache.enabled(pool_id):
            return None
        pin = heads.latest()
        if pin is None or pin[1] is None:
            return None  # (no head, or a client's `x-min-block` the proxy has not seen)
        heads.mixed = False  # (until an item's answer is not determined by the pin: `plan`)
        return (pool_id, pin[1], BATCH, body)

    def unfollow(self, plan: Plan) -> Plan:
        """A follower whose leader got no answer: the item as it is sent by itself. After a
        shared-tier look-up that found nothing, the first such read leads the key's read
        (the others are sent too), and each may store its answer."""
        if plan.later is None:
            return plan
        spec, height, block_hash = plan.later
        own = self._pinned(spec, plan.ref, plan.obj, height, block_hash, plan.key)  # type: ignore[arg-type]
        own.avoid, own.epoch, own.exact = plan.avoid, plan.epoch, plan.exact
        if type(plan.flight) is Lookup:
            coalescer = self.coalescer
            own.lead = coalescer is not None and coalescer.join((plan.epoch, plan.key)) is None
            own.store, own.share = plan.exact, plan.share
        return own

    def _headless(
        self, heads: RequestHeads, method: str, obj: dict[str, Any]
    ) -> Plan | Ready | None:
        """Methods that name no block but answer about the head."""
        if method == "eth_blockNumber":
            pin = heads.latest()
            if pin is None:
                return None
            self.cache.stats_of(heads.pool.id).local += 1
            return hex(pin[0])
        if method == "getLatestBlock":
            pin = heads.latest()
            if pin is None:
                return None
            sent = {**obj, "method": "getBlockByHeight", "params": [hex(pin[0])]}
            return Plan(sent, BlockRef(number=pin[0]))
        return None

    @staticmethod
    def _pinned(
        spec: MethodSpec,
        ref: BlockRef,
        obj: dict[str, Any],
        height: int,
        block_hash: str | None,
        key: Key | None,
    ) -> Plan:
        """The item to send: its block named by hash where it can be (with the by-height
        form to fall back to), by height for a tag otherwise."""
        kind = spec.block
        tag = ref.tag is not None
        fallback = None
        if block_hash is not None and kind in HASH_FORMS and spec.by_hash:
            sent = with_block(obj, spec, hash_form(kind, block_hash))  # type: ignore[arg-type]
            fallback = with_block(obj, spec, number_form(kind, height)) if tag else obj  # type: ignore[arg-type]
        elif tag:
            sent = with_block(obj, spec, number_form(kind, height))  # type: ignore[arg-type]
        else:
            sent = obj  # by height (hash unknown), or by hash already (kind "hash")
        return Plan(sent, BlockRef(number=height) if tag else ref, key, fallback=fallback)

    def land(self, plan: Plan, answer: Any) -> None:
        """The final answer of an item sent to a node (an answer object, its JSON bytes, or
        None when there is none): stored when good and exact, and the pool's cache was not
        flushed meanwhile (it may come from a node flushed out), handed to its followers."""
        key: Key = plan.key  # type: ignore[assignment]
        if plan.store and answer is not None and self.cache.epochs.get(key[0], 0) == plan.epoch:
            result = _result_json(answer)
            if result is not None:
                self.cache.put(key, result, plan.share)
        if plan.lead:
            plan.lead = False
            self.coalescer.land((plan.epoch, key), answer)  # type: ignore[union-attr]

    def shared(self, pool: Pool, answer: Any, rid: Any) -> dict[str, Any] | None:
        """A leader's answer for a follower with id `rid` (None: the leader has none)."""
        if type(answer) is bytes:
            try:
                answer = orjson.loads(answer)
            except orjson.JSONDecodeError:
                return None
        if type(answer) is not dict:
            return None
        self.cache.stats_of(pool.id).coalesced += 1
        return {**answer, "id": rid}


def _shared(heads: RequestHeads, ref: BlockRef, height: int) -> bool:
    """Whether the fleet may share the answer of a read at `ref` (pinned at `height`): the
    client named the block by hash, or it is at or below the checker's confirmed head
    (`safe`/`finalized` with a checker, a height); a `latest` read stays this proxy's."""
    tag = ref.tag
    if tag == "latest":
        return False
    if tag is None and ref.number is None:
        return True  # by hash
    view = heads.view
    confirmed = None if view is None else view.confirmed
    return confirmed is not None and height <= confirmed[0]


def _determined(heads: RequestHeads, found: Plan | Ready | None, ref: BlockRef | None) -> bool:
    """Whether the answer of an item planned as `found` is the one of a block the request's
    `latest` determines: that block or one of its ancestors, named by hash (so a batch of
    such items may be cached as a whole under the hash of `latest`)."""
    if found is None:
        return False
    if type(found) is str:
        return True  # eth_blockNumber: the pinned height itself
    if (type(found) is Plan and not found.exact) or ref is None:
        return False
    tag = ref.tag
    if tag is not None:
        return tag == "latest"  # (safe/finalized: the checker's head moves on its own)
    height = ref.number if ref.number is not None else heads.height_of(ref.hash or "")
    pin = heads.latest()
    return height is not None and pin is not None and height <= pin[0]


def with_block(obj: dict[str, Any], spec: MethodSpec, value: Any) -> dict[str, Any]:
    """`obj` with its block param set to `value` (positional or named params)."""
    params = obj.get("params")
    at = spec.block_at
    if type(params) is dict:
        named = dict(params)
        named[spec.params[at]] = value
        return {**obj, "params": named}
    values = list(params) if type(params) is list else []
    if len(values) <= at:
        values.extend([None] * (at + 1 - len(values)))
    values[at] = value
    return {**obj, "params": values}


def without_block(obj: dict[str, Any], spec: MethodSpec) -> Any:
    """The params of `obj` without its block param (the key names the block)."""
    params = obj.get("params")
    at = spec.block_at
    if type(params) is list:
        return params[:at] + params[at + 1 :]
    if type(params) is dict:
        return {k: v for k, v in params.items() if k != spec.params[at]}
    return params


def hash_form(kind: str, block_hash: str) -> Any:
    """A block param naming a block by its hash."""
    if kind == "number":
        return {"blockHash": block_hash}
    if kind == "ctx":
        return {"block_id": block_hash, "type": "Equals"}
    return block_hash  # "id"


def number_form(kind: str, height: int) -> Any:
    """A block param naming a block by its height."""
    if kind == "ctx":
        return {"block_id": hex(height), "type": "Equals"}
    return hex(height)


def _result_json(answer: Any) -> bytes | None:
    """The JSON of a `result` answer (None for an error or anything else)."""
    if type(answer) is bytes:
        if answer.find(b'"error"') >= 0:  # (`in` on bytes first raises and clears a TypeError)
            return None
        try:
            answer = orjson.loads(answer)
        except orjson.JSONDecodeError:
            return None
    if type(answer) is not dict or "result" not in answer or "error" in answer:
        return None
    return orjson.dumps(answer["result"])

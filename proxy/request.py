"""The pipeline's data model: one client request (`Ctx`) and its request objects (`Row`, `Item`).

A batch's items are parsed into `Row`s (a named tuple, made with C loops for the common batch);
a row becomes an `Item`, with its retry bookkeeping, only when a step needs one (the read path
planned it, or it is matched, classified or retried on its own). Every step of the pipeline
takes these types, so a single request and a batch item go the same way.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from itertools import compress, repeat
from operator import attrgetter, itemgetter, not_
from typing import Any, NamedTuple

import orjson

from chainstate.blockref import BlockRef
from proxy.methods import MethodSpec
from proxy.model import Node, Pool
from proxy.outcome import ERROR, OK, Outcome
from proxy.reads import Plan
from proxy.tenancy.nodebudget import limited
from proxy.upstream import UpstreamError

# A client's answer: (HTTP status, body) or (status, body, extra header lines).
Answer = tuple[int, bytes] | tuple[int, bytes, bytes]
BATCH = "batch"  # latency window of sub-batches (single requests use their method's)


class Admitted:
    """A client body's pool, its place among the pool's requests in flight taken."""

    __slots__ = ("chain", "pool")

    def __init__(self, chain: str, pool: Pool) -> None:
        self.chain = chain
        self.pool = pool


class Ctx:
    """One client request as it goes through the steps."""

    __slots__ = (
        "chain",
        "early",
        "heads",
        "keep",
        "least",
        "methods",
        "nodes",
        "own_ids",
        "pool",
        "reserved",
        "tally",
        "verdict",
        "written",
    )

    def __init__(
        self,
        chain: str,
        pool: Pool,
        early: Callable[[bytes], Any] | None = None,
        tally: Any = None,
    ) -> None:
        self.chain = chain
        self.pool = pool
        # The client's usage tally when tenancy follows the request (proxy/tenancy/usage.py):
        # each attempt sent to a node adds one to its `upstream`.
        self.tally = tally
        # Writes the client's answer now (the data listener's Request.answer_early); set
        # while a node's bytes, when final, are the answer exactly as the node sent them.
        self.early = early
        # The node's bytes `answer_early` wrote, and what its peek found them to be (OK or
        # ERROR, set with them): the attempt's books and step 5 take that verdict for the
        # same bytes instead of scanning them again.
        self.written: bytes | None = None
        self.verdict: Outcome
        self.methods: list[str] = []
        self.nodes: list[str] = []  # every node tried (access log)
        self.reserved = 0  # answer bytes held for it in the buffered-bytes budget
        self.heads: Any = None  # the request's resolved heads (proxy/heads.RequestHeads)
        self.least: int | None = None  # the client's lowest acceptable `latest` (x-min-block)
        self.keep: tuple[tuple[str, int], ...] | None = None  # a whole batch to cache: methods
        # Every item of the batch has its own int or string id (no two alike): sub-batches
        # go with the client's ids rather than positions.
        self.own_ids = False

    def answer_early(self, status: int, raw: bytes) -> None:
        """A node's answer, the moment it is complete (from its connection's callback): when
        it is final as it is (a 200 whose bytes ask for no retry), the client gets it now,
        and the request's books follow after the write instead of before it."""
        write = self.early
        # (An answer naming a -390xx code is never final as it is: it may be retried or, for
        # a standard method, shown with a standard code: proxy/face.py. The tests use
        # `partition`, not `find`: its one argument is not parsed as a tuple, which was most
        # of `find`'s cost on an answer this short; `in` on bytes is dearer still.)
        if write is not None and status == 200 and raw and not raw.partition(b"-390")[1]:
            erred = raw.partition(b'"error"')[1]
            if erred and limited(raw):  # a rate limit: retried elsewhere
                return
            self.early = None
            self.written, self.verdict = raw, ERROR if erred else OK
            write(raw)


class Row(NamedTuple):
    """One valid request object of a batch as parsed. `block` is the text that names its
    block (its block param, when a string; None when the item names no block, or names it
    otherwise): items with the same method and text have the same route within a request."""

    pos: int  # its place in the client's batch
    obj: dict[str, Any]
    rid: Any  # the client's id as sent (orjson.Fragment where a float would change it)
    method: str
    spec: MethodSpec
    ref: BlockRef | None
    notif: bool
    block: str | None


def maker(cls: type) -> Callable[[tuple[Any, ...]], Any]:
    """`cls` (a named tuple) from one tuple of its fields, without the named tuple's own
    constructor, which is a Python call: for records made per item or per request."""
    return partial(tuple.__new__, cls)


make_row = maker(Row)


class Rows:
    """A batch's rows as the parser makes them for the common batch (proxy/parse.py
    `uniform_rows`: request objects of one method with int or string ids, none a
    notification), kept as columns: a `Row` is made only when a step reads one (indexed or
    iterated). The steps of a batch whose items all go to one node read the columns alone
    (the ids, the objects, the heights), so such a batch makes no object per item beyond
    the parsed JSON: making and freeing 100 rows cost about as much as parsing them.

    `heights`: each row's block height where it names a plain height (None where it names
    a tag or a hash), or None for the whole batch when a row names `Contains`. `positions`:
    the rows' places in the batch (None: 0..n-1). `source`: the rows these were taken
    from (`without`), to put back together with the items the read path pinned; their
    columns are taken from it only when a step reads one (a batch whose pinned items go
    with it is put back together from the source alone)."""

    __slots__ = (
        "drop",
        "entries",
        "found",
        "heights",
        "method",
        "objs",
        "own",
        "pins",
        "positions",
        "raw",
        "refs",
        "rids",
        "size",
        "source",
        "span",
        "spec",
        "texts",
    )

    def __init__(
        self,
        objs: list[Any] | None,
        rids: list[Any],
        method: str,
        spec: MethodSpec,
        refs: list[BlockRef | None],
        texts: list[Any],
        heights: list[int | None] | None,
        positions: list[int] | None = None,
        source: Rows | None = None,
        raw: bytes | None = None,
        found: re.Match[bytes] | None = None,
        entries: Sequence[tuple[str, BlockRef | None, int | None]] | None = None,
    ) -> None:
        if objs is not None:  # (None: rows read from their bytes, `raw` and `found`)
            self.objs = objs
        self.rids = rids
        self.method = method
        self.spec = spec
        # Rows read from their bytes give each row's (text, block, height) as the method
        # table keeps them (`entries`): the texts and blocks columns are made from them only
        # when a step reads a whole column (most read the heights alone, and a row or two).
        self.entries = entries
        if entries is None:
            self.refs = refs
            self.texts = texts
        self.heights = heights
        self.positions = positions
        self.source = source
        self.size = len(rids)
        self.drop: list[bool] | None = None  # (`without`: the source's rows left out)
        # The JSON array of these rows' objects as bytes, when known (a batch read from its
        # bytes, proxy/scan.py: its body, or that body with pinned items written in), and
        # the expression's match over the body (where each item is; the pinned items'
        # objects in `own`): `objs` is then parsed only when a step reads it, one row's
        # object when a step reads that row.
        self.raw = raw
        self.found = found
        self.own: dict[int, Any] | None = None  # (pinned items' objects, by position)
        self.pins: list[int] | None = None  # (places of items pinned in the bytes: `pin_by_hash`)
        self.span: tuple[int, int] | bool | None = False  # (`bounds`; False: not found yet)

    def __len__(self) -> int:
        return self.size

    def __getattr__(self, name: str) -> Any:
        """A column not made yet, made on first use: the columns of rows made by `without`
        from the source's; the objects of rows read from their bytes by parsing them."""
        if name == "objs" and self.raw is not None:
            self.objs = orjson.loads(self.raw)
            return self.objs
        if name in _ENTRY_COLUMNS and self.entries is not None:
            column = list(map(_ENTRY_COLUMNS[name], self.entries))
            setattr(self, name, column)
            return column
        if self.drop is None or name not in _COLUMNS:
            raise AttributeError(name)
        self._take()
        return getattr(self, name)

    def __getitem__(self, i: int) -> Row:
        if i < 0:
            i += self.size
        pos = i if self.positions is None else self.positions[i]
        found = self.found
        if found is None:
            obj = self.objs[i]
        else:  # (read from its bytes: this row's object alone is parsed, unless pinned)
            own = self.own
            obj = own.get(i) if own is not None else None
            if obj is None:
                start, end = item_span(found, i)
                obj = orjson.loads(found.string[start:end])
            elif type(obj) is bytes:  # (an item pinned in the bytes: its block's, `pin_by_hash`)
                obj = orjson.loads(_pinned_item(found, i, obj))
        entries = self.entries
        if entries is None:
            ref, text = self.refs[i], self.texts[i]
        else:
            text, ref = entries[i][:2]
        return make_row((pos, obj, self.rids[i], self.method, self.spec, ref, False, text))

    def __iter__(self) -> Iterator[Row]:
        n = len(self.objs)
        return map(
            make_row,
            zip(
                range(n) if self.positions is None else self.positions,
                self.objs,
                self.rids,
                repeat(self.method, n),
                repeat(self.spec, n),
                self.refs,
                repeat(False, n),
                self.texts,
                strict=True,
            ),
        )

    def item(self, i: int) -> Item:
        """Row `i` of rows read from their bytes as an `Item` (what the read path plans),
        from the columns and that row's bytes alone: no `Row` made first."""
        found = self.found
        start, end = item_span(found, i)  # type: ignore[arg-type]
        text, ref = self.entries[i][:2]  # type: ignore[index]
        obj = orjson.loads(found.string[start:end])  # type: ignore[union-attr]
        return Item(i, obj, self.rids[i], self.method, self.spec, ref, False, text)

    def bounds(self) -> tuple[int, int] | None:
        """The lowest and the highest height of these rows when every one names a plain
        height, else None: found once (two C loops over the column; a pass asking whether
        a height is missing costs as much as one of them), for the steps that decide per
        batch, or per class of heights, what they would decide per row. (Rows `pinned`
        made may keep the heights of the rows they replaced within theirs: bounds as wide
        or wider, which hold the same class or more.)"""
        span = self.span
        if span is False:
            numbers = self.heights
            try:
                span = (min(numbers), max(numbers)) if numbers else None  # type: ignore[type-var]
            except TypeError:  # a row without a height among them
                span = None
            if span is not None and span[0] is None:  # (one row, without a height)
                span = None
            self.span = span
        return span  # type: ignore[return-value]

    def without(self, drop: list[bool], dropped: int) -> Rows:
        """These rows but the `dropped` ones at the places `drop` marks (their columns made
        from these, with C loops, when a step first reads one)."""
        rows = Rows.__new__(Rows)
        rows.method, rows.spec, rows.source = self.method, self.spec, self
        rows.size, rows.drop = self.size - dropped, drop
        rows.raw = rows.found = rows.own = rows.entries = rows.pins = None
        rows.span = False
        return rows

    def _take(self) -> None:
        """The columns of rows made by `without`, from the source's."""
        source, keep = self.source, list(map(not_, self.drop))  # type: ignore[arg-type]
        assert source is not None
        positions = range(source.size) if source.positions is None else source.positions
        heights = source.heights
        self.objs = list(compress(source.objs, keep))
        self.rids = list(compress(source.rids, keep))
        self.refs = list(compress(source.refs, keep))
        self.texts = list(compress(source.texts, keep))
        self.heights = None if heights is None else list(compress(heights, keep))
        self.positions = list(compress(positions, keep))
        self.drop = None

    def pinned(self, items: list[Item], cut: list[Item] | None = None) -> Rows:
        """These rows (all of a batch's) with the `items` the read path pinned in their
        places: their objects and blocks as pinned (a height named by hash: no height).
        Rows read from their bytes keep them: the pinned items' objects written in place
        of theirs, the rest not parsed. `cut`: items left out (they wait for an identical
        read in flight), for rows read from their bytes only (`_without`)."""
        if cut:
            return self._without(items, cut)
        found, entries = self.found, self.entries
        if found is not None and entries is not None and _same_blocks(entries, items):
            # (plain heights pinned by hash, the common case: every column as it was)
            own = {it.pos: it.obj for it in items}
            return self._rewritten(_spliced(found, items), own, None)
        heights = None if self.heights is None else list(self.heights)
        span = self.span
        if heights is not None:
            for it in items:
                ref = it.ref
                height = heights[it.pos] = None if ref is None or ref.contains else ref.number
                if height is None:
                    span = None
                elif span:  # (bounds that may be wider than these rows': still one class)
                    span = (min(span[0], height), max(span[1], height))  # type: ignore[index]
        if found is not None and entries is not None:
            entries = list(entries)
            for it in items:  # (an entry's height is not read: `heights` has it)
                entries[it.pos] = (it.block, it.ref, None)
            args = (self.rids, self.method, self.spec, [], [], heights)
            rows = Rows(None, *args, raw=_spliced(found, items), found=found, entries=entries)
            rows.own = {it.pos: it.obj for it in items}
        else:
            refs, texts, objs = list(self.refs), list(self.texts), list(self.objs)
            for it in items:
                pos = it.pos
                refs[pos], texts[pos], objs[pos] = it.ref, it.block, it.obj
            rows = Rows(objs, self.rids, self.method, self.spec, refs, texts, heights)
        rows.span = False if span is None and self.span is None else span
        return rows

    def pin_by_hash(self, picked: list[int], hashes: list[str]) -> Rows:
        """These rows (all of a batch read from its bytes) with the block text of each item
        at `picked` (in position order) replaced, in the bytes, by `{"blockHash": …}` naming
        the block by its hash in `hashes`: the bytes `pinned` writes for items the read path
        pinned so, without the items parsed. The columns stay these rows' (a plain height
        by hash keeps its row's height and entry, as in `pinned`). The client's bytes
        between them are sliced as bytes (joining views costs more than copying a hundred
        bytes twice), and each hash's form is kept for the next batch (`_FORMS`)."""
        found = self.found
        body = found.string  # type: ignore[union-attr]
        forms = _FORMS
        pieces: list[bytes] = []
        own: dict[int, Any] = {}  # (each pinned item's block as written: `__getitem__`)
        at = 0  # (the bytes of `body` up to here are in `pieces`)
        for pos, block_hash in zip(picked, hashes, strict=True):
            # (`text_group`, inline)
            text, after = found.span(2 if pos == 0 else pos + 3)  # type: ignore[union-attr]
            form = forms.get(block_hash)
            if form is None:
                form = _form(block_hash)
            own[pos] = form
            pieces += (body[at : text - 1], form)
            at = after + 1
        pieces.append(body[at:])
        return self._rewritten(b"".join(pieces), own, picked)

    def _rewritten(self, raw: bytes, own: dict[int, Any], pins: list[int] | None) -> Rows:
        """These rows (read from their bytes) sent as `raw`, their items' blocks written
        in it (`own`: their objects or blocks, by position): every column as it was. The
        slots are set here rather than by `__init__`, whose call with keywords costs more."""
        rows = Rows.__new__(Rows)
        rows.rids, rows.method, rows.spec, rows.entries = (
            self.rids,
            self.method,
            self.spec,
            self.entries,
        )
        rows.heights, rows.positions, rows.source = self.heights, self.positions, None
        rows.size, rows.drop, rows.span, rows.found = self.size, None, self.span, self.found
        rows.raw, rows.own, rows.pins = raw, own, pins
        return rows

    def plan_pins(self, items: list[Item]) -> None:
        """The Items of these rows (`items`, in their order) that `pin_by_hash` pinned given
        the Plan the read path makes for such an item, for the rounds that go on with them:
        asked by the block's hash, and by height (the client's object) when a node does not
        know it; neither cached nor coalesced (no key: `Reads.pin_rows`)."""
        found = self.found
        body = found.string  # type: ignore[union-attr]
        for pos in self.pins or ():
            it = items[pos]
            start, end = item_span(found, pos)  # type: ignore[arg-type]
            it.plan = Plan(it.obj, it.ref, None, fallback=orjson.loads(body[start:end]))

    def _without(self, items: list[Item], cut: list[Item]) -> Rows:
        """`pinned(items)` less the `cut` items, for rows read from their bytes: the body
        is the client's with the pinned items written in and the cut ones left out, and
        the columns are the rows left's (`positions`: their places in the batch)."""
        found, entries = self.found, self.entries
        assert found is not None and entries is not None and self.positions is None
        gone = {it.pos for it in cut}
        keep = [pos not in gone for pos in range(self.size)]
        heights = None if self.heights is None else list(self.heights)
        entries = list(entries)
        for it in items:
            ref = it.ref
            if heights is not None:
                heights[it.pos] = None if ref is None or ref.contains else ref.number
            entries[it.pos] = (it.block, ref, None)
        raw = _spliced_without(found, items, sorted(gone), self.size)
        kept = list(compress(entries, keep))
        args = (list(compress(self.rids, keep)), self.method, self.spec, [], [])
        heights = None if heights is None else list(compress(heights, keep))
        positions = list(compress(range(self.size), keep))
        return Rows(None, *args, heights, positions, raw=raw, entries=kept)


_COLUMNS = frozenset(("heights", "objs", "positions", "refs", "rids", "texts"))
_ENTRY_COLUMNS = {"texts": itemgetter(0), "refs": itemgetter(1)}  # (`entries`' columns)


def item_span(found: re.Match[bytes], i: int) -> tuple[int, int]:
    """Where item `i` (from 0) of a batch `Scanner.scan` matched is in its body (after
    its block text, the item's last param, come its `"]}`: `text_group`)."""
    start = 1 if i == 0 else found.end(text_group(i - 1)) + 4  # (after the previous `"]},`)
    return start, found.end(text_group(i)) + 3


# block hash → its `{"blockHash":…}` form as bytes: the known blocks' (bounded: `_form`)
_FORMS: dict[str, bytes] = {}
_MAX_FORMS = 4096


def _form(block_hash: str) -> bytes:
    """`{"blockHash":"<hash>"}` as bytes, kept for the next batch (the known blocks are the
    last `head_history` ones: started afresh past _MAX_FORMS)."""
    if len(_FORMS) >= _MAX_FORMS:
        _FORMS.clear()
    form = _FORMS[block_hash] = b'{"blockHash":"%s"}' % block_hash.encode()
    return form


def text_group(k: int) -> int:
    """The group of item `k`'s (from 0) block text in `Scanner.scan`'s match (proxy/scan.py
    `_shape`): group 1 is the method's seam, group 2 item 0's text, group 3 the seam
    between items."""
    return 2 if k == 0 else k + 3


def _pinned_item(found: re.Match[bytes], i: int, block: bytes) -> bytes:
    """Item `i` of the body `found` matched with `block` written in place of its block
    text (with its quotes): the item as `Rows.pin_by_hash` sent it."""
    body = found.string
    start, end = item_span(found, i)
    text, after = found.span(text_group(i))
    return b"".join((body[start : text - 1], block, body[after + 1 : end]))


def _same_blocks(
    entries: Sequence[tuple[str, BlockRef | None, int | None]], items: list[Item]
) -> bool:
    """Whether every one of `items` names the block its row named (the same `BlockRef`,
    which the read path keeps for a plain height it names by hash): the rows' heights
    and entries are then theirs as they are."""
    return all(entries[it.pos][1] is it.ref for it in items)


def _spliced(found: re.Match[bytes], items: list[Item]) -> bytes:
    """The body `Scanner.scan` matched (`found`) with each of `items` written in place of
    the item at its position. The client's bytes between them are joined as views: copied
    once, into the new body (slices of bytes would copy them twice)."""
    raw = memoryview(found.string)
    pieces: list[bytes | memoryview] = []
    at = 0  # (the bytes of `raw` up to here are in `pieces`)
    for it in sorted(items, key=_ITEM_POS):
        start, end = item_span(found, it.pos)
        pieces.append(raw[at:start])
        pieces.append(orjson.dumps(it.obj))
        at = end
    pieces.append(raw[at:])
    return b"".join(pieces)


def _spliced_without(found: re.Match[bytes], items: list[Item], gone: list[int], n: int) -> bytes:
    """The body `Scanner.scan` matched (`found`, `n` items) with each of `items` written in
    place of the item at its position and the items at the positions `gone` (sorted) left
    out: the runs of items kept as they are are views of the client's bytes."""
    raw = memoryview(found.string)
    written = {it.pos: it for it in items}
    pieces: list[bytes | memoryview] = []
    at = 0  # (the items before it are in `pieces`)
    for pos in sorted([*written, *gone]):
        if pos > at:
            pieces.append(raw[item_span(found, at)[0] : item_span(found, pos - 1)[1]])
        it = written.get(pos)
        if it is not None:
            pieces.append(orjson.dumps(it.obj))
        at = pos + 1
    if at < n:
        pieces.append(raw[item_span(found, at)[0] : item_span(found, n - 1)[1]])
    return b"[" + b",".join(pieces) + b"]"


class Item:
    """One request object (of a batch, or the single one) and its retry bookkeeping."""

    __slots__ = (
        "block",
        "err",
        "last",
        "method",
        "notif",
        "obj",
        "plan",
        "pos",
        "prefer_archive",
        "reason",
        "ref",
        "rid",
        "spec",
        "tried",
    )

    def __init__(
        self,
        pos: int,
        obj: dict[str, Any],
        rid: Any,
        method: str,
        spec: MethodSpec,
        ref: BlockRef | None,
        notif: bool,
        block: str | None = None,
    ) -> None:
        self.pos = pos
        self.obj = obj
        self.rid = rid
        self.method = method
        self.spec = spec
        self.ref = ref
        self.notif = notif
        self.block = block
        self.tried: list[Node] = []
        self.prefer_archive = False
        # The last answer that asked for a retry: a dict, or the node's bytes for a single
        # request (answered as they are when the attempts run out).
        self.last: dict[str, Any] | bytes | None = None
        self.err: UpstreamError | None = None  # last transport failure
        self.reason = ""  # the outcome that asked for the next attempt (retry metric label)
        self.plan: Plan | None = None  # what the read path decided (proxy/reads.py)

    def retry_later(self, node: Node, answer: dict[str, Any] | bytes, result: Outcome) -> None:
        """Keep an answer that asks for another attempt (and, for an item pinned to a block
        by hash, a node that does not know that block: `Chooser.retry`)."""
        self.last, self.reason, self.prefer_archive = answer, result.name, result.prefer_archive
        plan = self.plan
        if result.prefer_archive and plan is not None and plan.fallback is not None:
            if plan.missing is None:
                plan.missing = [node]
            else:
                plan.missing.append(node)

    def failed(self, exc: UpstreamError) -> None:
        """The attempt got no answer: `exc` says why and what it means."""
        self.err, self.reason = exc, exc.outcome.name

    def route_key(self) -> tuple[str, str | None, bool] | None:
        """What decides the item's first-attempt node within its request (None: only the
        item itself): its method, the text naming its block, and whether the read path
        keeps it off some nodes."""
        block = self.block
        if block is None and self.ref is not None:
            return None  # a block named by an object: no text to share its route by
        plan = self.plan
        return self.method, block, plan is not None and bool(plan.avoid)


_HEIGHT, _CONTAINS = attrgetter("ref.number"), attrgetter("ref.contains")
_ITEM_POS = attrgetter("pos")
_METHOD, _NOTIF = attrgetter("method"), attrgetter("notif")


def heights(rows: list[Row]) -> list[int] | None:
    """Every row's block height, when the rows are request objects (no notification) of one
    method that each name a plain height (not a tag, a hash or `Contains`); else None.
    Made with C loops: a batch's steps then decide per batch, or per class of heights,
    what they would decide per row."""
    if type(rows) is Rows:
        return None if rows.bounds() is None else rows.heights  # type: ignore[return-value]
    try:
        numbers = list(map(_HEIGHT, rows))
    except AttributeError:  # a row that names no block
        return None
    if not numbers or None in numbers or True in map(_CONTAINS, rows) or True in map(_NOTIF, rows):
        return None
    methods = list(map(_METHOD, rows))
    if methods.count(methods[0]) != len(methods):
        return None
    return numbers


def items_of(rows: list[Row], tried: list[Node] | None = None) -> list[Item]:
    """`rows` as Items (each having tried `tried`, when given)."""
    items = [Item(*row) for row in rows]
    if tried:
        for it in items:
            it.tried = list(tried)
    return items


class Group:
    """Items of one client request sent together to one node in one round."""

    __slots__ = ("cands", "items", "lkey", "node", "round")

    def __init__(
        self, node: Node, items: list[Any], cands: list[Node], lkey: str, round_: int = 1
    ) -> None:
        self.node = node
        self.items = items  # objects with a `tried` list (Items)
        self.cands = cands  # the nodes every item of the group may go to (hedging)
        self.lkey = lkey  # the latency window: the method of a single request, or BATCH
        self.round = round_  # the attempt round of the retry loop (spans)

    def add(self, item: Any, cands: list[Node]) -> None:
        self.items.append(item)
        if cands is not self.cands:  # items with other candidates: keep what all allow
            self.cands = [n for n in self.cands if n in cands]

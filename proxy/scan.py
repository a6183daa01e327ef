"""Step 1 for the most common batch, read from its bytes instead of parsed into objects.

A batch of reads of one method whose params are addresses (or params the method table does
not check, as strings) and a block text, written
compactly with the ids 0..n-1 or 1..n, as libraries write them:

    [{"jsonrpc":"2.0","id":0,"method":"eth_getBalance","params":["0x…","0x…"]},…]

Parsing such a body into objects and checking them cost about half of the proxy's CPU per
batch of 100 (an object per id, method, param and item, then freed). Here one regular
expression per method, first id and size matches the whole body, checking every item's
envelope, id, method and addresses, and gives each block text: the result is the `Rows` the
parser's checks make (proxy/request.py), each item's object made only when a step reads
it. Anything else in the body (whitespace, another key order, an escape, a bad address, a
block text that is not a block, ...) is parsed and checked as objects: this is a shortcut
of the parse step, never another answer.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from operator import itemgetter
from typing import Any

from chainstate.jsonrpc import JsonRpcError
from proxy.methods import MethodTable
from proxy.request import Rows

HEAD = b'[{"jsonrpc":"2.0","id":'  # the body's first bytes, up to the first id
OPEN = b'{"jsonrpc":"2.0","id":'  # an item's first bytes, up to its id
MAX_SCAN_ITEMS = 100  # larger batches are parsed (no expression made for them)
MAX_SHAPES = 256  # expressions kept (about 12 MB at most); then new shapes are parsed
_MAX_METHOD = 64  # longer method names are not looked up here
# A block text's bytes, up to its closing quote: its lookup among the texts the method
# table remembered (valid blocks, all printable ASCII) checks it, which a class of allowed
# bytes would repeat at ~17 instructions a byte; a text not remembered is checked by the
# method table (`Scanner._remember`), an escape or a byte it cannot read left to the parse.
# (The addresses keep their class: their 40 hex digits are not looked up anywhere else.)
_TEXT = rb'"([^"]{1,80}+)"'
_ADDRESS = rb'"0x[0-9a-fA-F]{40}+",'
_ANY_ADDRESS = "0x" + "00" * 20  # an address param the expression checked, standing in
_STRING = rb'"[\x20\x21\x23-\x5b\x5d-\x7e]*+",'  # a param with no check: any string, unescaped


class Scanner:
    """`Rows` from a batch body's bytes (`scan`), for the batches described above.

    An expression is made the first time a (method, first id, size) is seen, about 10 ms
    for 100 items, and kept: first ids 0 and 1, sizes up to MAX_SCAN_ITEMS, only the
    methods whose params are addresses or unchecked and a block, and MAX_SHAPES in all (200 of them
    took 9.5 MB); once that many are kept, a batch of another shape is parsed, so no
    client makes one per request."""

    def __init__(self, methods: MethodTable, max_items: int) -> None:
        self.methods = methods
        self.max_items = min(max_items, MAX_SCAN_ITEMS)
        # method name as written → (method, its remembered texts, its params' kinds)
        self._methods: dict[bytes, tuple[str, Any, tuple[bool, ...]]] = {}
        self._shapes: dict[tuple[bytes, int, int], re.Pattern[bytes]] = {}

    def scan(self, body: bytes) -> Rows | None:
        """The body's rows, or None when it is not such a batch (then parsed as objects)."""
        if not body.startswith(HEAD):
            return None
        comma = body.find(b",", 23, 25)  # (the first id: 0 or 1)
        start = comma + 11  # after ,"method":"
        if comma != 24 or body[comma:start] != b',"method":"':
            return None
        first = body[23] - 48
        quote = body.find(b'"', start, start + _MAX_METHOD)
        name = body[start:quote] if quote > 0 else b""
        method = self._methods.get(name) or self._method(name)
        if method is None or first > 1 or first < 0:
            return None
        at = body.rfind(OPEN) + len(OPEN)  # the last item's id
        end = body.find(b",", at, at + 4)
        last = body[at:end]
        if end < 0 or not last.isdigit():
            return None
        n = int(last) - first + 1
        if not 0 < n <= self.max_items:
            return None
        key = (name, first, n)
        shape = self._shapes.get(key)
        if shape is None:
            if len(self._shapes) >= MAX_SHAPES:
                return None
            shape = self._shapes[key] = _shape(name, method[2], first, n)
        found = shape.fullmatch(body)
        if found is None:
            return None
        known = method[1]
        groups = found.groups()
        groups = groups[1:2] + groups[3:]  # (the block texts: the seams' groups left out)
        try:  # (each text's (text, block, height), as the method table keeps them)
            entries, heights, span = _columns(known, groups)
        except KeyError:  # a text not remembered yet: checked once, as the parse would
            if not self._remember(method, groups):
                return None  # (not a block: the parse answers the item's error)
            try:
                entries, heights, span = _columns(known, groups)
            except KeyError:  # (the method table started afresh meanwhile)
                return None
        rids = list(range(first, first + n))
        args = (rids, method[0], known.spec, [], [], heights)
        rows = Rows(None, *args, raw=body, found=found, entries=entries)
        rows.span = span
        return rows

    def _remember(
        self, method: tuple[str, Any, tuple[bool, ...]], texts: tuple[bytes, ...]
    ) -> bool:
        """Whether every block text of `texts` the method table does not remember yet is a
        valid one, each checked by the method table's own `target` (which remembers it):
        its other params, which the expression checked already, stand in as a valid
        address or an unchecked string. False at the first that is not."""
        name, known, addresses = method
        stand_in = [_ANY_ADDRESS if address else "0x0" for address in addresses]
        target = self.methods.target
        for raw in set(texts).difference(known.raw):
            text = raw.decode("ascii") if raw.isascii() else "\x00"
            if not text.isprintable() or "\\" in text:  # (as Python reads it: no escape)
                return False
            try:
                target(name, [*stand_in, text])
            except JsonRpcError:
                return False
        return True

    def _method(self, name: bytes) -> tuple[str, Any, tuple[bool, ...]] | None:
        """The method named `name` (as the body writes it), its remembered texts and
        whether each param before the block is an address (else unchecked), once the method
        table remembers block texts for it (`MethodTable.address_layout`)."""
        if not name.isascii():
            return None
        method = name.decode("ascii")
        layout = self.methods.address_layout(method)
        if layout is None:
            return None
        found = self._methods[name] = (method, *layout)
        return found


def _columns(
    known: Any, texts: tuple[bytes, ...]
) -> tuple[Sequence[tuple[str, Any, int | None]], list[int | None], Any]:
    """Each of `texts`' entry in the method table's `known.raw` (KeyError: one is not
    there), each one's height, and their bounds when known here (`Rows.span`; False:
    `Rows.bounds` finds them). A batch at one block (all at `latest`, say) looks its text
    up once, and its bounds are that block's height twice (or None for a tag), not found
    by a `min` and a `max` over the column (~33k instructions per batch of 100). Else the
    heights are found in one C call (an `itemgetter` of the texts makes no call per text,
    as a `map` over `dict.__getitem__` does), and the entries only when a step reads one
    (`Entries`: most steps read the heights alone)."""
    text, n = texts[0], len(texts)
    if text == texts[-1] and texts.count(text) == n:
        entry = known.raw[text]
        height = entry[2]
        return (entry,) * n, [height] * n, None if height is None else (height, height)
    heights = list(itemgetter(*texts)(known.raw_heights))  # (n > 1 here, as texts differ)
    return Entries(known.raw, texts), heights, False


class Entries:
    """The (text, block, height) entry of each of a batch's block texts, looked up in the
    method table's `raw` (the dict the texts were found in) when a step reads one."""

    __slots__ = ("raw", "texts")

    def __init__(self, raw: dict[bytes, tuple[str, Any, int | None]], texts: tuple[bytes, ...]):
        self.raw = raw
        self.texts = texts

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i: int) -> tuple[str, Any, int | None]:
        return self.raw[self.texts[i]]

    def __iter__(self) -> Iterator[tuple[str, Any, int | None]]:
        return map(self.raw.__getitem__, self.texts)


def _shape(name: bytes, addresses: tuple[bool, ...], first: int, n: int) -> re.Pattern[bytes]:
    """The expression a batch of `n` items of method `name` (params: an address or an
    unchecked string for each of `addresses`, then a block text) with ids from `first`
    matches; item k's block text is group `text_group(k)`. The seams every item repeats
    (from `,"method":` to its first param's digits, and from one item's `]}` to the next
    one's id) are captured once and matched again by reference, which `_sre` compares in a
    tighter loop than one literal byte per step. Every repeat is possessive (`{40}+`): the
    byte after it (a quote) is one it cannot take, so giving bytes back never helps, and
    `_sre` then matches the rest in the same frame instead of a nested one per repeat."""
    head = rb',"method":"' + re.escape(name) + rb'","params":\['
    params = [_ADDRESS if address else _STRING for address in addresses]
    if addresses and addresses[0]:  # (the first address's `"0x` goes into the seam)
        head, params[0] = head + params[0][:3], params[0][3:]
    rest = b"".join(params) + _TEXT + rb"\]"
    out = [rb'\[\{"jsonrpc":"2\.0","id":%d(?P<m>' % first + head + rb")" + rest]
    for i in range(first + 1, first + n):
        seam = rb'(?P<s>\},\{"jsonrpc":"2\.0","id":)' if i == first + 1 else rb"(?P=s)"
        out.append(seam + rb"%d(?P=m)" % i + rest)
    return re.compile(b"".join(out) + rb"\}\]")

"""The head an HTTP/1.1 peer keeps sending, read without llhttp: one reader for the lean
server (chainstate/httpserver.py: a client's request heads) and the proxy's node client
(proxy/httpclient.py: a node's answer heads).

Why: a keep-alive peer sends the same head over and over but for its Content-Length digits
(and a node's Date, once a second), while llhttp's callbacks into Python (message begin, url,
one per header, head complete, body, message complete) cost about an eighth of a single
request's instructions on the server side and a tenth of an answer's on the client side.
Once llhttp has read a message that was all of one read, its head is kept as the bytes
before and after those digits (`KeptHead`); a next message that starts with the same bytes,
has only digits where they were and the rest of the head right after them is read by one
`startswith` and one `find` (`KeptHead.match`). The usual read, one such message whole with
a body under 2 KiB, is read by less: its length tells its body's size (`SIZE_BY_SPAN`), and
one `removeprefix` of the head with that size's digits checks it (`KeptHead.whole`).
Anything else goes to llhttp, which is between messages then too: what a kept head reads,
llhttp would have read the same way.
"""

from __future__ import annotations

MAX_PLAINS = 16  # heads a connection keeps (a peer whose head keeps changing: llhttp's)

# Content-Length digits → their value, for lengths under 2 KiB written without leading
# zeros: a lookup costs a third of `int` on bytes. Other digits are read by `int`.
SIZES: dict[bytes, int] = {b"%d" % n: n for n in range(2048)}

# A read that is one message whole with a kept head is `pre`, the size's digits, `post` and
# the body: its length less the head's fixed bytes is the size plus its digit count, which
# tells the size (n + len(str(n)) grows with n). That sum → the size, for sizes under 2 KiB;
# None for a sum no size gives.
SIZE_BY_SPAN: list[int | None] = [None] * (2048 + 5)
for _n in range(2048):
    SIZE_BY_SPAN[_n + len(str(_n))] = _n
del _n
MAX_SPAN = len(SIZE_BY_SPAN)
MAX_SIZED = 32  # whole heads a kept head holds (one per body size), then started afresh


def length_digits(chunk: bytes, end: int) -> tuple[int, int] | None:
    """Where the Content-Length value of the head `chunk[:end]` (it ends with CRLF CRLF) is:
    (start, stop) of its digits, right after `:` and optional spaces with nothing after them
    on their line; None when there is no such header or its value is not only digits."""
    name = chunk[:end].lower().find(b"\r\ncontent-length:")
    if name < 0:
        return None
    start = name + 17
    while chunk[start : start + 1] in (b" ", b"\t"):
        start += 1
    stop = chunk.find(b"\r\n", start, end)
    return (start, stop) if stop > start and chunk[start:stop].isdigit() else None


def head_parts(chunk: bytes, size: int, length: int | None) -> tuple[bytes, bytes] | None:
    """The head of the message llhttp just read, cut around its Content-Length digits:
    (the bytes before them, the bytes after them to the end of the head), when the message
    was all of `chunk` (a head, then a body of `size` bytes) and only those digits can differ
    in a next message without changing how llhttp reads it: their value is the `length`
    llhttp read, they follow `:` and optional spaces with nothing after them on their line,
    and there is no Transfer-Encoding. None otherwise."""
    end = chunk.find(b"\r\n\r\n") + 4
    if end < 4 or len(chunk) - end != size:
        return None  # the message was not all of the read
    span = length_digits(chunk, end)
    if span is None:
        return None
    start, stop = span
    if int(chunk[start:stop]) != length or chunk[:end].lower().find(b"\r\ntransfer-encoding:") >= 0:
        return None
    return chunk[:start], chunk[stop:end]


class KeptHead:
    """A head llhttp read on a connection, kept to read the peer's next ones without it."""

    __slots__ = ("fixed", "persistent", "post", "pre", "sized")

    def __init__(self, pre: bytes, post: bytes, persistent: bool) -> None:
        self.pre = pre  # from the first line to the Content-Length digits
        self.post = post  # from the end of the digits to the end of the head (CRLF CRLF)
        self.fixed = len(pre) + len(post)  # the head's bytes but for the digits
        self.persistent = persistent  # llhttp's should_keep_alive after it
        # body size → the whole head with its digits (no leading zeros), as `whole` reads it
        self.sized: dict[int, bytes] = {}

    def head_of(self, size: int) -> bytes:
        """This head with the digits of `size` (kept in `sized` for the next message)."""
        sized = self.sized
        if len(sized) >= MAX_SIZED:
            sized.clear()
        sized[size] = head = b"%b%d%b" % (self.pre, size, self.post)
        return head

    def whole(self, data: bytes) -> bytes | None:
        """The body of the message `data` is when it is one whole message with this head
        and a body under 2 KiB (its length written without leading zeros); else None.
        One `removeprefix` checks the head, digits included; `match` reads the others."""
        span = len(data) - self.fixed
        size = SIZE_BY_SPAN[span] if 0 < span < MAX_SPAN else None
        if size is None:
            return None
        body = data.removeprefix(self.sized.get(size) or self.head_of(size))
        return body if len(body) == size and body is not data else None

    def match(self, data: bytes, max_digits: int) -> tuple[int, int, bytes] | None:
        """The message at the start of `data`, when its head is this one but for the
        Content-Length digits (at most `max_digits` of them): (where its body starts, the
        body's size, the digits); the body may not all be in `data`. None otherwise."""
        pre = self.pre
        if not data.startswith(pre):
            return None
        at = len(pre)
        post = self.post
        # `post` starts with the CRLF ending the digits: its first place after them is where
        # they end when they are all digits (one `find`, no `startswith`)
        stop = data.find(post, at, at + max_digits + len(post))
        if stop < 0:
            return None
        digits = data[at:stop]
        if not digits.isdigit():
            return None
        size = SIZES.get(digits)
        if size is None:
            size = int(digits)
        return stop + len(post), size, digits

"""Bodies and answers mutated at random, byte by byte, for tests that compare a check made
on bytes (proxy/scan.py, `classify.results_in_order`) with the one made on decoded JSON."""

from __future__ import annotations

import random

# Bytes a mutation writes: JSON's punctuation, digits, hex and non-hex letters, whitespace,
# a control byte, a backslash and a byte of a UTF-8 sequence.
ALPHABET = b'"\\,:[]{}0123456789abcdefABCDEFxXgz.- \t\n\x01\x7f\xc3'


def mutated(raw: bytes, rng: random.Random) -> bytes:
    """`raw` with one to three random edits: a byte replaced, deleted or inserted, a piece
    repeated or dropped."""
    out = bytearray(raw)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(out)) if out else 0
        kind = rng.randrange(5)
        if kind == 0 and out:
            out[at] = rng.choice(ALPHABET)
        elif kind == 1 and out:
            del out[at]
        elif kind == 2:
            out.insert(at, rng.choice(ALPHABET))
        else:
            end = min(len(out), at + rng.randint(1, 60))
            piece = bytes(out[at:end])
            out[at:end] = piece * 2 if kind == 3 else b""
    return bytes(out)

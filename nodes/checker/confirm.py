"""Quorum decision for one height, kept pure so every case is easy to test."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Vote:
    """What one replica holds at a height."""

    replica: str
    height: int
    id: str
    parent_id: str
    validation_hash: str


@dataclass(frozen=True, slots=True)
class Decision:
    winner: Vote | None  # None: no quorum (yet)
    losers: list[Vote]  # votes for another block id at this height
    diverged: list[str]  # replicas holding the winning id with another validation hash
    final: bool  # True when every replica voted (no later vote can change the outcome)


def decide(votes: list[Vote], quorum: int, replicas: int) -> Decision:
    """Confirm the (id, validation_hash) that at least `quorum` replicas hold."""
    counts = Counter((v.id, v.validation_hash) for v in votes)
    final = len(votes) >= replicas
    if not counts:
        return Decision(None, [], [], final)
    (best_id, best_hash), n = counts.most_common(1)[0]
    if n < quorum:
        return Decision(None, [], [], final)
    winner = next(v for v in votes if v.id == best_id and v.validation_hash == best_hash)
    losers = [v for v in votes if v.id != best_id]
    diverged = [v.replica for v in votes if v.id == best_id and v.validation_hash != best_hash]
    return Decision(winner, losers, diverged, final)


def disagreement(votes: list[Vote]) -> bool:
    """Replicas hold different blocks or different validation hashes at one height."""
    return len({(v.id, v.validation_hash) for v in votes}) > 1

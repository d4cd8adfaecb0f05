"""Deterministic split assignment: the same task id and seed always land in the same split."""

from __future__ import annotations

import hashlib

from coevo.suites.models import Split

# Fractions of the suite in each split, in order.
DEFAULT_FRACTIONS: tuple[tuple[Split, float], ...] = (
    (Split.SEARCH, 0.6),
    (Split.VALIDATION, 0.2),
    (Split.HELDOUT, 0.2),
)


def split_for(task_key: str, *, seed: str) -> Split:
    """Place a task by a hash of (seed, task key) mapped to [0, 1)."""
    digest = hashlib.sha256(f"{seed}\x00{task_key}".encode()).digest()
    point = int.from_bytes(digest[:8], "big") / 2**64
    edge = 0.0
    for split, fraction in DEFAULT_FRACTIONS:
        edge += fraction
        if point < edge:
            return split
    return DEFAULT_FRACTIONS[-1][0]

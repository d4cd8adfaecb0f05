from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    passed: bool
    score: float
    detail: str
    output: str = ""

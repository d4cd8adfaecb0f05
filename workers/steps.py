"""One recorded step of a rollout (a model call, an environment step, a log line, …)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Step:
    kind: str
    payload: dict[str, Any]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: int = 0

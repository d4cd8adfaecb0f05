"""What one rollout has used of its limits, counted by the worker (never by the harness).

The manifest's limits (max_model_calls, max_tokens, max_steps, wall time: harness.toml's
``[limits]``, capped by the evaluation's wall time) and the worker's own bound on log
messages. Each check raises LimitExceeded naming the limit, which ends the rollout as a
harness_error of kind ``limit``.
"""

from __future__ import annotations

import threading
import time

from harness_store.manifest import Limits
from workers.outcomes import LimitExceeded

# A flood of tiny messages would otherwise become millions of trace rows.
MAX_LOG_MESSAGES = 1000


def wall_time_exceeded(wall_s: int) -> LimitExceeded:
    return LimitExceeded(f"limit exceeded: wall time of {wall_s}s")


class LimitMeter:
    def __init__(self, limits: Limits, *, wall_s: int) -> None:
        self.limits = limits
        self.wall_s = wall_s
        self.deadline = time.monotonic() + wall_s
        self._lock = threading.Lock()
        self.model_calls = 0
        self.tokens = 0
        self.env_steps = 0
        self.logs = 0

    def remaining_s(self) -> float:
        """Seconds left of the wall time; raises when none are."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise wall_time_exceeded(self.wall_s)
        return remaining

    def extend(self, seconds: float) -> None:
        """Move the deadline by time the harness spent waiting for the platform."""
        with self._lock:
            self.deadline += max(0.0, seconds)

    def count_log(self) -> None:
        self.logs += 1
        if self.logs > MAX_LOG_MESSAGES:
            raise LimitExceeded(f"limit exceeded: more than {MAX_LOG_MESSAGES} ctx.log messages")

    def before_model_call(self) -> None:
        if self.model_calls >= self.limits.max_model_calls:
            raise LimitExceeded(f"limit exceeded: max_model_calls = {self.limits.max_model_calls}")
        if self.tokens >= self.limits.max_tokens:
            raise LimitExceeded(
                f"limit exceeded: max_tokens = {self.limits.max_tokens} "
                f"({self.tokens} tokens used before this call)"
            )

    def count_model_call(self, *, tokens: int) -> None:
        """One answered call. The tokens are known only once it is answered: check_tokens,
        after the call is recorded, ends the rollout when it went over."""
        self.model_calls += 1
        self.tokens += tokens

    def check_tokens(self) -> None:
        if self.tokens > self.limits.max_tokens:
            raise LimitExceeded(
                f"limit exceeded: max_tokens = {self.limits.max_tokens} "
                f"({self.tokens} prompt and completion tokens used)"
            )

    def before_env_step(self) -> None:
        if self.env_steps >= self.limits.max_steps:
            raise LimitExceeded(f"limit exceeded: max_steps = {self.limits.max_steps}")

    def count_env_step(self) -> None:
        self.env_steps += 1

    @property
    def steps_exhausted(self) -> bool:
        return self.env_steps >= self.limits.max_steps

"""The contract between the rollout runner and environment adapters.

An adapter is a module registered in ``workers.environments._ADAPTERS`` by suite kind. Every
adapter has ``harness_view(inputs) -> dict``: the harness's ``task`` argument, which never
contains verifier data. Then either

- single-answer (HumanEval, JSONL): ``verify(*, inputs, verifier, answer) -> Verdict`` scores
  what ``run(task, ctx)`` returned; or
- multi-step (TextWorld): module attribute ``MULTI_STEP = True`` and
  ``open_episode(*, inputs, verifier, seed) -> Episode``; the harness acts through
  ``ctx.env.reset()`` / ``ctx.env.step(action)`` and the score is ``episode.verdict()``.

Either kind may offer helpers to the harness: ``HELPERS = {"check": fn}`` where
``fn(*, inputs, params, timeout_s) -> dict`` runs on the worker side (JSON-able result),
raises ``InvalidHelperCall`` for bad parameters, and is given the task's ``inputs`` only, never
its verifier data. The harness calls them as ``ctx.helper(name, **params)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class InvalidHelperCall(Exception):
    """A helper was called with bad parameters: the harness broke the protocol."""


@dataclass(frozen=True)
class Verdict:
    passed: bool
    score: float
    detail: str
    output: str = ""


@dataclass(frozen=True)
class StepResult:
    """One environment step: ``observation`` is a JSON-able payload shown to the harness."""

    observation: dict[str, Any]
    reward: float
    done: bool


class Episode(Protocol):
    """One play of a multi-step task; the runner opens it, the harness drives it."""

    def reset(self) -> dict[str, Any]:
        """Start (or restart) the episode; the first observation, e.g. {"observation", "objective"}."""
        ...

    def step(self, action: str) -> StepResult:
        """Act; ``done`` is True once the episode ended (won, lost, or its own step limit)."""
        ...

    def verdict(self) -> Verdict:
        """The score so far (points / max points; passed = won). Callable at any time."""
        ...

    def close(self) -> None: ...

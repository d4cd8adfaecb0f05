"""The contract between the rollout runner and a suite kind's environment.

An environment is a subclass of ``Environment`` registered for its suite kind with
``@register_environment`` in its own module (workers/environments/<kind>.py); the runner finds
it with ``environment_for(kind)``. Adding a kind is that module (plus, on the platform's side,
its ``SuiteKind`` member and its module of coevo/suites/kinds/). Every environment has
``harness_view(inputs) -> dict``: the harness's ``task`` argument, which never contains
verifier data. Then either

- single-answer (HumanEval, JSONL, workspace tasks): ``verify(*, inputs, verifier, answer)
  -> Verdict`` scores what the harness returned (with ``workspace = True``, ``verify`` takes the
  rollout's ``workspace`` too and judges what the harness left in it); or
- multi-step (TextWorld): ``multi_step = True`` and ``open_episode(*, inputs, verifier, seed)
  -> Episode``; the harness acts through ``ctx.env.reset()`` / ``ctx.env.step(action)`` and
  the score is ``episode.verdict()``.

Either kind may offer helpers to the harness: ``helpers = {"check": fn}`` where ``fn(*, inputs,
params, timeout_s) -> dict`` runs on the worker side (JSON-able result), raises
``InvalidHelperCall`` for bad parameters, and is given the task's ``inputs`` only, never its
verifier data. The harness calls them as ``ctx.helper(name, **params)``. ``wall_s(inputs)`` is a
task's own time limit for the harness, where it has one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar


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


Helper = Callable[..., dict[str, Any]]


class Environment:
    """A suite kind's environment (see the module doc). Stateless: one instance serves every
    rollout of its kind."""

    kind: ClassVar[str] = ""
    multi_step: ClassVar[bool] = False
    workspace: ClassVar[bool] = False
    helpers: ClassVar[Mapping[str, Helper]] = {}

    # Each kind's module gives its own functions as these (``staticmethod(verify)``).
    def harness_view(self, inputs: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def verify(self, *, inputs: dict[str, Any], verifier: dict[str, Any], answer: Any) -> Verdict:
        """Single-answer environments: the verdict on ``answer``; a workspace environment's
        takes the rollout's ``workspace`` too, and judges what it holds."""
        raise NotImplementedError(f"{type(self).__name__} is multi-step: it opens episodes")

    def open_episode(
        self, *, inputs: dict[str, Any], verifier: dict[str, Any], seed: int
    ) -> Episode:
        """Multi-step environments: one play of the task."""
        raise NotImplementedError(f"{type(self).__name__} is single-answer: it verifies answers")

    def wall_s(self, inputs: dict[str, Any]) -> int | None:
        """The task's own time limit for the harness, if it has one."""
        return None


_REGISTRY: dict[str, Environment] = {}
E = TypeVar("E", bound=type[Environment])


def register_environment(cls: E) -> E:
    """Class decorator: ``cls`` serves suites of ``cls.kind`` (one class a kind)."""
    if not cls.kind:
        raise TypeError(f"{cls.__name__} names no suite kind")
    if cls.kind in _REGISTRY and type(_REGISTRY[cls.kind]) is not cls:
        raise TypeError(f"suite kind {cls.kind!r} already has {type(_REGISTRY[cls.kind]).__name__}")
    _REGISTRY[cls.kind] = cls()
    return cls


def registered_kinds() -> list[str]:
    return sorted(_REGISTRY)


def registered_environment(kind: str) -> Environment | None:
    return _REGISTRY.get(kind)

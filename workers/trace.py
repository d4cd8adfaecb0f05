"""The trace's step contract: every kind of step a rollout records, and each kind's payload.

A stored step is a kind and a JSON payload (``coevo.evaluations.models.TraceStep``); this
module is the one place that names the kinds (``StepKind``) and declares each payload's keys,
as one frozen dataclass per kind. Writers build the typed step and record it as a ``Step``
(``Step.of(Answer(answer=42))``); readers parse what was stored (``parse_step(kind, payload)``
or the class's ``from_payload``).

Stored payloads are read as they are: reading never fails and never coerces. A key a class
does not declare (an open-ended part, or one a later writer added) is kept in ``extra`` and
written back after the declared ones, so ``to_payload(from_payload(p)) == p`` for every
payload these classes write; a declared key the payload lacks reads as the field's default.
Values come from the worker's trace (and old traces from older workers): a reader that needs
a type checks it.

Payload versions: each class has a ``VERSION``. Version 1 is the shape every trace has had so
far, and it is written without a ``v`` key, so that the steps written through these types are
the very payloads written before them (the same JSON a reader, a search or an export saw).
A class whose shape changes raises its ``VERSION``; its payloads then carry ``"v"``, and
``from_payload`` reads a payload without ``v`` as version 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any, ClassVar, Self


class StepKind(StrEnum):
    """The kinds of step a trace holds, as stored in ``TraceStep.kind``."""

    START = "start"
    MODEL_CALL = "model_call"
    ENV_RESET = "env_reset"
    ENV_STEP = "env_step"
    HELPER_CALL = "helper_call"
    PROGRAM_OUTPUT = "program_output"
    LOG = "log"
    HARNESS_EXCEPTION = "harness_exception"
    ANSWER = "answer"
    VERDICT = "verdict"
    WORKSPACE_DIFF = "workspace_diff"
    ENVIRONMENT = "environment"
    ERROR = "error"


class _Absent(Enum):
    ABSENT = "absent"


# The default of a key that may be stored as null: absent and null are told apart.
ABSENT = _Absent.ABSENT

VERSION_KEY = "v"
# How a program harness's model calls are marked (they reach the policy through the boundary,
# workers/program.py); a code harness's ``ctx.llm`` calls carry no ``via``.
VIA_BOUNDARY = "boundary"


def optional(default: Any = None, *, when: Callable[[Any], bool] | None = None) -> Any:
    """A key written only when its value is not ``default`` (or, with ``when``, only when
    ``when(step)`` holds: a key whose presence says something even when its value is None)."""
    return field(default=default, metadata={"optional": True, "when": when})


@dataclass(frozen=True, kw_only=True)
class TypedStep:
    """One step's payload, typed. Subclasses declare their keys as fields, in payload order."""

    kind: ClassVar[StepKind]
    VERSION: ClassVar[int] = 1

    # The payload's keys this class does not declare, as stored.
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            when = f.metadata.get("when")
            if when is not None:
                if not when(self):
                    continue
            elif f.metadata.get("optional") and value == f.default:
                continue
            payload[f.name] = value
        payload.update(self.extra)
        if self.VERSION != 1:
            payload[VERSION_KEY] = self.VERSION
        return payload

    @classmethod
    def key(cls, name: str) -> str:
        """``name``, a key this class declares: for a reader that reads the key where no
        payload is parsed (a JSON lookup in the database), so that it too reads a declared
        key."""
        if name == "extra" or name not in {f.name for f in dataclasses.fields(cls)}:
            raise KeyError(f"{cls.kind} steps declare no key {name!r}")
        return name

    @classmethod
    def from_payload(cls, payload: Any) -> Self:
        data = dict(payload) if isinstance(payload, Mapping) else {}
        data.pop(VERSION_KEY, None)
        names = {f.name for f in dataclasses.fields(cls) if f.name != "extra"}
        declared = {key: data.pop(key) for key in list(data) if key in names}
        return cls(**declared, extra=data)


@dataclass(frozen=True, kw_only=True)
class Start(TypedStep):
    """An attempt began: what ran, on which task, with what (workers/rollout.py)."""

    kind = StepKind.START

    task: str = ""
    knobs: dict[str, Any] = field(default_factory=dict)
    # A program harness's command, or a code harness's entrypoint (one of the two).
    command: list[str] | None = optional()
    entrypoint: str | None = optional()
    seed: int = 0
    policy_version: str = ""
    policy_api: str = ""
    limits: dict[str, Any] = field(default_factory=dict)
    multi_step: bool = False
    helpers: list[str] = field(default_factory=list)
    workspace: bool = optional(False)


def _answered(call: ModelCall) -> bool:
    return call.rejected is None


def _placed(call: ModelCall) -> bool:
    return call.session is not None


def _answered_at_the_boundary(call: ModelCall) -> bool:
    return call.via == VIA_BOUNDARY and call.rejected is None


@dataclass(frozen=True, kw_only=True)
class ModelCall(TypedStep):
    """One model call: a code harness's ``ctx.llm`` sample (workers/rollout.py, one step per
    sample), or a program's request through the boundary (workers/program.py, one step per
    request with every choice). The request and reply bodies are open-ended (OpenAI's shapes)."""

    kind = StepKind.MODEL_CALL

    api: str = ""  # "chat" or "completions"
    via: str | None = optional()  # VIA_BOUNDARY for a program's call
    model: str | None = optional(when=_answered)
    policy_version: str = ""
    endpoint: str | None = optional(when=_answered)
    # The request as sent: a completions prompt, or chat messages with their options.
    prompt: str | None = optional()
    messages: list[Any] | None = optional()
    tools: list[Any] | None = optional()
    tool_choice: Any = optional(ABSENT)
    response_format: Any = optional(ABSENT)
    # As sent to the endpoint's kind (its names and neutral values included).
    sampling: dict[str, Any] = field(default_factory=dict)
    # Request keys the endpoint's kind did not take.
    dropped: list[str] | None = optional()
    # The API the program spoke, when it was translated to this chat call.
    spoken: str | None = optional()
    sample: int | None = optional()  # a code harness's sample number (of ``n``)
    n: int = 1
    # A program's call: its number, and its place in the call tree (workers/program.py).
    call: int | None = optional()
    session: int | None = optional()
    parent: int | None = optional(when=_placed)
    relation: str | None = optional(when=_placed)
    # The reply: none when the policy server refused the call (``rejected``).
    completion: str | None = optional(when=_answered)
    finish_reason: str | None = optional(when=_answered)
    # Its cost and the price row that applied; None: no price.
    cost: dict[str, Any] | None = optional(when=_answered)
    tool_calls: list[dict[str, Any]] | None = optional()
    choices: list[Any] | None = optional(when=_answered_at_the_boundary)
    usage: dict[str, Any] | None = optional(when=_answered_at_the_boundary)
    # What the policy server could not honour: [{"field", "why"}].
    degraded: list[dict[str, Any]] | None = optional()
    rejected: str | None = optional()


@dataclass(frozen=True, kw_only=True)
class EnvReset(TypedStep):
    kind = StepKind.ENV_RESET

    observation: Any = None


@dataclass(frozen=True, kw_only=True)
class EnvStep(TypedStep):
    kind = StepKind.ENV_STEP

    index: int = 0  # the move's number, from 1
    action: str = ""
    observation: Any = None
    reward: float = 0.0
    done: bool = False
    truncated: bool = False  # ended by the manifest's max_steps, not by the episode


@dataclass(frozen=True, kw_only=True)
class HelperCall(TypedStep):
    """A suite helper the harness called (``ctx.helper``); a workspace task's ``exec``
    records {"command", "timeout_s"} as params and {"exit_code", "timed_out", "duration_ms",
    "stdout", "stderr"} as result."""

    kind = StepKind.HELPER_CALL

    name: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    result: Any = None


@dataclass(frozen=True, kw_only=True)
class ProgramOutput(TypedStep):
    """How a program harness's process ended, and the tail of its stdout."""

    kind = StepKind.PROGRAM_OUTPUT

    exit_code: int | None = None  # negative: killed by that signal
    stdout: str = ""


@dataclass(frozen=True, kw_only=True)
class Log(TypedStep):
    kind = StepKind.LOG

    message: str = ""
    fields: dict[str, Any] | None = optional()  # {"truncated": text} when too long


@dataclass(frozen=True, kw_only=True)
class HarnessException(TypedStep):
    """The harness raised: its error, traceback and frames ({"file", "line", "function",
    "code", "in_harness"}, the file relative to the harness's root)."""

    kind = StepKind.HARNESS_EXCEPTION

    error: str = ""
    traceback: str = ""
    frames: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class Answer(TypedStep):
    kind = StepKind.ANSWER

    answer: Any = None


@dataclass(frozen=True, kw_only=True)
class Verdict(TypedStep):
    kind = StepKind.VERDICT

    passed: bool = False
    score: float | None = None
    detail: str = ""
    output: str = ""  # the verifier's output (a workspace task's tests), its tail
    # False: where a failed harness's episode stood, shown and never scored.
    counted: bool = optional(True)


@dataclass(frozen=True, kw_only=True)
class WorkspaceDiff(TypedStep):
    """A workspace's final state against its starting files: ``files`` ({"path", "status",
    "diff"?, "note"?}) with counts by status, changes outside /app in a task's container
    ({"added", "changed", "deleted", "paths", "tampered"}); or only the ``error`` that kept it
    from being read."""

    kind = StepKind.WORKSPACE_DIFF

    files: list[dict[str, Any]] | None = optional()
    added: int | None = optional()
    modified: int | None = optional()
    deleted: int | None = optional()
    truncated: bool | None = optional()
    outside_app: dict[str, Any] | None = optional()
    error: str | None = optional()


def _ran(environment: Environment) -> bool:
    return environment.build_failed is None


@dataclass(frozen=True, kw_only=True)
class Environment(TypedStep):
    """Where a workspace task ran: its container's settings, and the image build the rollout
    ran ({"seconds", "content_hash", "log"}) or the build that failed ({"step", "line",
    "timed_out", "error", "log"}, the only other key then being ``backend``)."""

    kind = StepKind.ENVIRONMENT

    backend: str = ""  # "container"
    # Where the harness ran: "container", or "sandbox" (beside it).
    harness: str | None = optional(when=_ran)
    image: str | None = optional(when=_ran)
    image_cached: bool | None = optional(when=_ran)
    network: str | None = optional(when=_ran)  # "internet" or "none"
    cpus: float | None = optional(when=_ran)  # None: no limit
    memory_bytes: int | None = optional(when=_ran)
    ready_s: float | None = optional(when=_ran)
    build: dict[str, Any] | None = optional()
    build_failed: dict[str, Any] | None = optional()


@dataclass(frozen=True, kw_only=True)
class Error(TypedStep):
    """How the attempt ended when it was not scored (workers/outcomes.py's outcome)."""

    kind = StepKind.ERROR

    outcome: str = ""
    message: str = ""
    stderr: str | None = optional()  # the harness process's stderr, its tail


STEP_TYPES: dict[StepKind, type[TypedStep]] = {
    cls.kind: cls
    for cls in (
        Start,
        ModelCall,
        EnvReset,
        EnvStep,
        HelperCall,
        ProgramOutput,
        Log,
        HarnessException,
        Answer,
        Verdict,
        WorkspaceDiff,
        Environment,
        Error,
    )
}


@dataclass(frozen=True)
class UnknownStep:
    """A stored step of a kind this module does not name (a newer worker's), as stored."""

    kind: str
    payload: Any

    def to_payload(self) -> Any:
        return self.payload


def parse_step(kind: str, payload: Any) -> TypedStep | UnknownStep:
    """A stored step (its kind and payload) as its typed step."""
    try:
        cls = STEP_TYPES[StepKind(kind)]
    except ValueError:
        return UnknownStep(kind, payload)
    return cls.from_payload(payload)


@dataclass
class Step:
    """A recorded step: its kind and payload (what is stored) with what it cost."""

    kind: str
    payload: dict[str, Any]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: int = 0

    @classmethod
    def of(
        cls,
        step: TypedStep,
        *,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        latency_ms: int = 0,
    ) -> Step:
        return cls(
            step.kind,
            step.to_payload(),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            latency_ms=latency_ms,
        )

    def typed(self) -> TypedStep | UnknownStep:
        return parse_step(self.kind, self.payload)

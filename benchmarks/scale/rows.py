"""The bulk rows of a scale fill: evaluations with their stages, rollouts and trace steps,
buffered per chunk and written with COPY, each chunk in its own transaction."""

from __future__ import annotations

import hashlib
import json
import math
import random
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TextIO

from django.db import transaction

from benchmarks.scale.content import StepPool, trace_of
from benchmarks.scale.copy import Progress, TableCopy
from coevo.campaigns.models import Proposal
from coevo.evaluations.models import Evaluation, EvaluationStage, Rollout, TraceStep
from coevo.evaluations.plans import EvaluationPlan
from workers.trace import StepKind

EVALUATION_FIELDS = (
    "id", "project", "candidate", "policy_version", "suite", "split", "epochs", "seed", "plan",
    "reference", "state", "stage", "stop_reason", "started_at", "finished_at", "created_by",
    "created_at", "updated_at",
)  # fmt: skip
STAGE_FIELDS = (
    "evaluation", "index", "kind", "state", "tasks", "reason", "result", "started_at",
    "finished_at",
)  # fmt: skip
ROLLOUT_FIELDS = (
    "id", "evaluation", "task", "epoch", "seed", "stage", "cache_key", "state", "outcome",
    "error_kind", "score", "detail", "answer", "prompt_tokens", "completion_tokens",
    "model_calls", "latency_ms", "attempts", "worker", "enqueued_at", "started_at",
    "heartbeat_at", "finished_at", "created_at", "updated_at",
)  # fmt: skip
STEP_FIELDS = (
    "rollout", "attempt", "index", "kind", "payload", "payload_zlib", "prompt_tokens",
    "completion_tokens", "latency_ms", "created_at",
)  # fmt: skip
PROPOSAL_FIELDS = (
    "id", "campaign", "sequence", "kind", "parent_shas", "shown", "params", "trial_number",
    "prompt", "response", "proposer_tokens", "proposer_wall_ms", "patch", "stages", "state",
    "state_detail", "candidate", "search_evaluation", "validation_evaluation", "search_score",
    "validation_score", "tokens_per_task", "policy_version", "improved", "finished_at",
    "created_at", "updated_at",
)  # fmt: skip

DETAILS = {
    "passed": "exact match",
    "task_failure": "answer differs from the expected one",
    "harness_error": "the harness raised KeyError (see the trace)",
    "infra_error": "policy server unreachable: connection refused (retried 3 times)",
}
ERROR_KINDS = {
    "harness_error": ("exception", "limit", "exception", "protocol"),
    "infra_error": ("policy",),
}


@dataclass(frozen=True)
class TaskRef:
    id: int
    key: str
    difficulty: float


@dataclass
class EvaluationResult:
    id: uuid.UUID
    mean_score: float | None
    tokens_per_task: float | None
    rollouts: int


@dataclass
class Counts:
    evaluations: int = 0
    stages: int = 0
    rollouts: int = 0
    steps: int = 0
    proposals: int = 0


@dataclass
class RowWriter:
    """Buffers one chunk's rows; ``flush`` writes them in one transaction."""

    rng: random.Random
    pool: StepPool
    mean_steps: float
    chunk_rollouts: int
    progress: Progress
    out: TextIO
    counts: Counts = field(default_factory=Counts)
    _evaluations: list = field(default_factory=list)
    _stages: list = field(default_factory=list)
    _rollouts: list = field(default_factory=list)
    _steps: list = field(default_factory=list)
    _proposals: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.copies = {
            "evaluations": TableCopy(Evaluation, EVALUATION_FIELDS),
            "stages": TableCopy(EvaluationStage, STAGE_FIELDS),
            "rollouts": TableCopy(Rollout, ROLLOUT_FIELDS),
            "steps": TableCopy(TraceStep, STEP_FIELDS),
            "proposals": TableCopy(Proposal, PROPOSAL_FIELDS),
        }

    def evaluation(
        self,
        *,
        project_id: Any,
        candidate_id: Any,
        tree_sha: str,
        skill: float,
        policy_id: Any,
        suite_id: Any,
        split: str,
        tasks: Sequence[TaskRef],
        epochs: int = 1,
        smoke: int = 0,
        stop_after: int | None = None,
        pending_after: int | None = None,
        reference_id: Any = None,
        created_by: Any = None,
        at: datetime,
    ) -> EvaluationResult:
        """One evaluation of ``tasks`` × ``epochs``. ``smoke`` > 0 stages it (smoke, then a
        minibatch of the rest); ``stop_after`` stops it early after that many tasks (clearly
        worse than its reference); ``pending_after`` leaves it running, the rollouts from that
        one on still pending."""
        rng = self.rng
        evaluation_id = uuid.uuid4()
        seed = rng.getrandbits(31)
        heldout = split == "heldout"
        staged = smoke > 0
        plan = (
            EvaluationPlan(smoke_tasks=smoke, minibatch_tasks=len(tasks) - smoke, early_stop=True)
            if staged
            else EvaluationPlan()
        )
        ran = tasks[:stop_after] if stop_after else tasks
        running = pending_after is not None
        scores: list[float] = []
        tokens = 0
        clock = at + timedelta(seconds=rng.uniform(1, 30))
        for position, task in enumerate(ran):
            stage = 1 if staged and position >= smoke else 0
            pass_p = 1 / (1 + math.exp(task.difficulty - skill))
            for epoch in range(epochs):
                rollout_id = uuid.uuid4()
                rollout_seed = rng.getrandbits(31)
                cache_key = (
                    ""
                    if heldout
                    else hashlib.sha256(
                        f"{tree_sha}|{policy_id}|{task.id}|{rollout_seed}".encode()
                    ).hexdigest()
                )
                clock += timedelta(milliseconds=rng.randint(200, 4000))
                if running and len(scores) >= pending_after:
                    self._rollouts.append(
                        (rollout_id, evaluation_id, task.id, epoch, rollout_seed, stage, cache_key,
                         "pending", "", "", None, "", None, 0, 0, 0, 0, 0, "", clock, None, None,
                         None, at, clock)
                    )  # fmt: skip
                    scores.append(math.nan)
                    continue
                draw = rng.random()
                if draw < 0.02:
                    outcome, score = "harness_error", 0.0
                elif draw < 0.025:
                    outcome, score = "infra_error", None
                elif rng.random() < pass_p:
                    outcome, score = "passed", 1.0
                else:
                    outcome, score = "task_failure", 0.0
                steps = trace_of(rng, self.pool, outcome=outcome, mean_steps=self.mean_steps)
                prompt = sum(s.prompt_tokens for s in steps)
                completion = sum(s.completion_tokens for s in steps)
                latency = sum(s.latency_ms for s in steps)
                calls = sum(1 for s in steps if s.kind == StepKind.MODEL_CALL)
                started = clock
                clock += timedelta(milliseconds=latency + rng.randint(50, 500))
                error_kind = rng.choice(ERROR_KINDS[outcome]) if outcome in ERROR_KINDS else ""
                answer = (
                    json.dumps(json.loads(steps[-2].text)["answer"])
                    if outcome in ("passed", "task_failure")
                    else None
                )
                self._rollouts.append(
                    (rollout_id, evaluation_id, task.id, epoch, rollout_seed, stage, cache_key,
                     "done", outcome, error_kind, score, DETAILS[outcome], answer, prompt,
                     completion, calls, latency, 1, f"worker-{rng.randint(1, 8)}@rollouts",
                     started, started, clock, clock, at, clock)
                )  # fmt: skip
                self._steps.extend(
                    (rollout_id, 1, index, s.kind, s.text, s.payload_zlib, s.prompt_tokens,
                     s.completion_tokens, s.latency_ms, clock)
                    for index, s in enumerate(steps)
                )  # fmt: skip
                scores.append(math.nan if score is None else score)
                tokens += prompt + completion
        scored = [s for s in scores if not math.isnan(s)]
        mean = sum(scored) / len(scored) if scored and not running else None
        state = "running" if running else "finished"
        stages = self._stage_rows(
            evaluation_id, staged=staged, smoke=smoke, tasks=len(tasks), ran=len(ran),
            running=running, at=at, until=clock, mean=mean,
        )  # fmt: skip
        stop_reason = (
            f"stopped early after {len(ran)} of {len(tasks)} tasks: clearly worse than the "
            "reference (anytime-valid test, alpha 0.05)"
            if stop_after
            else ""
        )
        self._evaluations.append(
            (evaluation_id, project_id, candidate_id, policy_id, suite_id, split, epochs, seed,
             json.dumps(plan.as_dict()), reference_id, state, len(stages) - 1, stop_reason, at,
             None if running else clock, created_by, at, clock)
        )  # fmt: skip
        count = len(ran) * epochs
        return EvaluationResult(
            id=evaluation_id,
            mean_score=mean,
            tokens_per_task=tokens / max(len(scored), 1) if scored else None,
            rollouts=count,
        )

    def _stage_rows(
        self, evaluation_id: Any, *, staged: bool, smoke: int, tasks: int, ran: int,
        running: bool, at: datetime, until: datetime, mean: float | None,
    ) -> list:  # fmt: skip
        result = json.dumps({"mean": mean} if mean is not None else {})
        if not staged:
            state = "running" if running else "passed"
            rows = [
                (evaluation_id, 0, "full", state, tasks, "", result, at, None if running else until)
            ]
        else:
            last = "running" if running else ("stopped" if ran < tasks else "passed")
            reason = "clearly worse than the reference" if last == "stopped" else ""
            rows = [
                (evaluation_id, 0, "smoke", "passed", smoke, "", "{}", at, at),
                (evaluation_id, 1, "minibatch", last, tasks - smoke, reason, result, at,
                 None if running else until),
            ]  # fmt: skip
        self._stages.extend(rows)
        return rows

    def proposal(self, row: tuple) -> None:
        self._proposals.append(row)

    @property
    def pending(self) -> int:
        return len(self._rollouts)

    def maybe_flush(self) -> None:
        if len(self._rollouts) >= self.chunk_rollouts:
            self.flush()

    def flush(self, *, then: Callable[[], None] | None = None) -> None:
        """Write the chunk (and run ``then`` in the same transaction)."""
        rollouts = len(self._rollouts)
        with transaction.atomic():
            for name in ("evaluations", "stages", "rollouts", "steps", "proposals"):
                rows = getattr(self, f"_{name}")
                if rows:
                    written = self.copies[name].write(rows)
                    setattr(self.counts, name, getattr(self.counts, name) + written)
            if then is not None:
                then()
        for name in ("_evaluations", "_stages", "_rollouts", "_steps", "_proposals"):
            setattr(self, name, [])
        if rollouts:
            self.progress.advance(rollouts, extra=f"; {self.counts.steps:,} trace steps")

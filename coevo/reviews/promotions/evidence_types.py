"""A promotion request's evidence as a type: what coevo.reviews.promotions.evidence assembles
and stores on the request as JSON (``PromotionRequest.evidence``), read back through
``evidence_read`` by every page and answer that shows it.

``Evidence.from_payload`` reads every stored version into today's terms (the stored rows stay
as they are), so no reader branches on versions; ``to_payload`` writes the payload back in the
version it was stored in (new evidence: the current one, the shape evidence_build stores), so
the API answers an old request as it always did. Version 1 (before baselines) had no
``reference``, ``baseline``, ``heldout_tasks``, score labels, ``missing`` scores or search-gain
note, and its flipped tasks named the reference "holder" (``holder_score``,
``holder_rollout``); version 2 is the current one.

``sealed_evidence`` is the one place that decides what of it a member who is not reviewing
may see (docs/architecture.md, "The held-out seal"): per-task held-out results (the task
list, the flips and their rollouts, the tasks one side lacks) go to reviewers only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from coevo.evaluations.stats.base import Interval
from coevo.evaluations.stats.paired import PairedComparison
from coevo.projects.audience import Audience

EVIDENCE_VERSION = 2
SPLITS = ("search", "validation", "heldout")


@dataclass(frozen=True)
class Score:
    """One side's mean per-task score on one split, with its interval."""

    evaluation: str | None
    state: str | None
    mean: float | None
    ci_low: float | None
    ci_high: float | None
    confidence: float | None
    method: str | None
    n_tasks: int | None
    epochs: int | None
    # Where a search or validation score came from (version 2): the suite of the request's
    # family it was measured on. None for held-out scores (always the request's suite) and in
    # version 1 (always the request's suite).
    suite: str | None = None
    suite_id: str | None = None
    same_suite: bool | None = None
    slice_of: str | None = None

    @classmethod
    def from_payload(cls, data: Mapping[str, Any] | None) -> Score | None:
        if not data:
            return None
        return cls(
            evaluation=data.get("evaluation"),
            state=data.get("state"),
            mean=data.get("mean"),
            ci_low=data.get("ci_low"),
            ci_high=data.get("ci_high"),
            confidence=data.get("confidence"),
            method=data.get("method"),
            n_tasks=data.get("n_tasks"),
            epochs=data.get("epochs"),
            suite=data.get("suite"),
            suite_id=data.get("suite_id"),
            same_suite=data.get("same_suite"),
            slice_of=data.get("slice_of"),
        )

    def to_payload(self) -> dict[str, Any]:
        payload = {
            "evaluation": self.evaluation,
            "state": self.state,
            "mean": self.mean,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "confidence": self.confidence,
            "method": self.method,
            "n_tasks": self.n_tasks,
            "epochs": self.epochs,
        }
        if self.suite is not None:
            payload.update(
                suite=self.suite,
                suite_id=self.suite_id,
                same_suite=self.same_suite,
                slice_of=self.slice_of,
            )
        return payload


@dataclass(frozen=True)
class Errors:
    harness_error: int = 0
    infra_error: int = 0

    @classmethod
    def from_payload(cls, data: Mapping[str, Any] | None) -> Errors:
        data = data or {}
        return cls(int(data.get("harness_error") or 0), int(data.get("infra_error") or 0))

    def to_payload(self) -> dict[str, Any]:
        return {"harness_error": self.harness_error, "infra_error": self.infra_error}


@dataclass(frozen=True)
class Cost:
    """Policy tokens and latency per held-out task (summed over its epochs)."""

    tasks: int = 0
    rollouts: int = 0
    tokens_per_task: float | None = None
    prompt_tokens_per_task: float | None = None
    completion_tokens_per_task: float | None = None
    latency_ms_per_task: float | None = None
    model_calls_per_rollout: float | None = None

    @classmethod
    def from_payload(cls, data: Mapping[str, Any] | None) -> Cost:
        data = data or {}
        return cls(
            tasks=int(data.get("tasks") or 0),
            rollouts=int(data.get("rollouts") or 0),
            tokens_per_task=data.get("tokens_per_task"),
            prompt_tokens_per_task=data.get("prompt_tokens_per_task"),
            completion_tokens_per_task=data.get("completion_tokens_per_task"),
            latency_ms_per_task=data.get("latency_ms_per_task"),
            model_calls_per_rollout=data.get("model_calls_per_rollout"),
        )

    def to_payload(self) -> dict[str, Any]:
        return {
            "tasks": self.tasks,
            "rollouts": self.rollouts,
            "tokens_per_task": self.tokens_per_task,
            "prompt_tokens_per_task": self.prompt_tokens_per_task,
            "completion_tokens_per_task": self.completion_tokens_per_task,
            "latency_ms_per_task": self.latency_ms_per_task,
            "model_calls_per_rollout": self.model_calls_per_rollout,
        }


@dataclass(frozen=True)
class Side:
    """The candidate, or its reference: a score per split (None where it has none, and why in
    ``missing``), held-out errors and cost."""

    sha: str
    policy_version: str | None
    scores: Mapping[str, Score | None]
    missing: Mapping[str, str]
    errors: Errors
    cost: Cost

    @classmethod
    def from_payload(cls, data: Mapping[str, Any] | None) -> Side | None:
        if not data:
            return None
        scores = data.get("scores") or {}
        return cls(
            sha=data["sha"],
            policy_version=data.get("policy_version"),
            scores={split: Score.from_payload(value) for split, value in scores.items()},
            missing=dict(data.get("missing") or {}),
            errors=Errors.from_payload(data.get("errors")),
            cost=Cost.from_payload(data.get("cost")),
        )

    def to_payload(self, version: int = EVIDENCE_VERSION) -> dict[str, Any]:
        payload = {
            "sha": self.sha,
            "policy_version": self.policy_version,
            "scores": {
                split: score.to_payload() if score else None for split, score in self.scores.items()
            },
            "missing": dict(self.missing),
            "errors": self.errors.to_payload(),
            "cost": self.cost.to_payload(),
        }
        if version < 2:
            del payload["missing"]
        return payload


@dataclass(frozen=True)
class ReferenceSummary:
    """What the candidate was compared with (``kind`` holder, campaign_seed, picked, or None
    with the reason in ``summary``)."""

    kind: str | None
    sha: str | None
    policy_version: str | None
    summary: str

    @classmethod
    def from_payload(cls, data: Mapping[str, Any] | None) -> ReferenceSummary | None:
        if not data:
            return None
        return cls(
            kind=data.get("kind"),
            sha=data.get("sha"),
            policy_version=data.get("policy_version"),
            summary=data.get("summary") or "",
        )

    def to_payload(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "sha": self.sha,
            "policy_version": self.policy_version,
            "summary": self.summary,
        }


@dataclass(frozen=True)
class FlippedTask:
    """A held-out task whose result changed between the reference and the candidate."""

    task: str
    flip: str
    reference_score: float | None
    candidate_score: float | None
    reference_rollout: str | None
    candidate_rollout: str | None

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> FlippedTask:
        # Version 1 named the reference "holder".
        return cls(
            task=data["task"],
            flip=data["flip"],
            reference_score=data.get("reference_score", data.get("holder_score")),
            candidate_score=data.get("candidate_score"),
            reference_rollout=data.get("reference_rollout", data.get("holder_rollout")),
            candidate_rollout=data.get("candidate_rollout"),
        )

    def to_payload(self, version: int = EVIDENCE_VERSION) -> dict[str, Any]:
        reference = "reference" if version >= 2 else "holder"
        return {
            "task": self.task,
            "flip": self.flip,
            f"{reference}_score": self.reference_score,
            "candidate_score": self.candidate_score,
            f"{reference}_rollout": self.reference_rollout,
            "candidate_rollout": self.candidate_rollout,
        }


@dataclass(frozen=True)
class Comparison:
    """The paired comparison on held-out (``PairedComparison.as_dict``'s shape, which every
    version stores) and its flipped tasks. ``flips``, ``dropped`` and ``flipped_tasks`` are
    per-task results: None once sealed."""

    kind: str
    tasks: int
    reference_mean: float | None
    candidate_mean: float | None
    difference: float | None
    interval: Interval | None
    confidence: float
    flip_counts: Mapping[str, int]
    test: str
    p_value: float
    significant: bool
    verdict: str
    flips: Mapping[str, tuple[str, ...]] | None
    dropped: Mapping[str, int] | None
    flipped_tasks: tuple[FlippedTask, ...] | None

    @classmethod
    def from_payload(cls, data: Mapping[str, Any] | None) -> Comparison | None:
        if not data:
            return None
        statistics = PairedComparison.from_dict(dict(data))
        flips = data.get("flips")
        dropped = data.get("dropped")
        flipped = data.get("flipped_tasks")
        return cls(
            kind=statistics.kind,
            tasks=statistics.tasks,
            reference_mean=statistics.reference_mean,
            candidate_mean=statistics.candidate_mean,
            difference=statistics.difference,
            interval=statistics.interval,
            confidence=statistics.confidence,
            flip_counts=dict(
                data.get("flip_counts")
                or {name: len(keys) for name, keys in statistics.flips.items()}
            ),
            test=statistics.test,
            p_value=statistics.p_value,
            significant=statistics.significant,
            verdict=statistics.verdict,
            flips=None if flips is None else {name: tuple(keys) for name, keys in flips.items()},
            dropped=None if dropped is None else dict(dropped),
            flipped_tasks=None
            if flipped is None
            else tuple(FlippedTask.from_payload(row) for row in flipped),
        )

    def to_payload(self, version: int = EVIDENCE_VERSION) -> dict[str, Any]:
        payload: dict[str, Any] = {"kind": self.kind, "tasks": self.tasks}
        if self.dropped is not None:
            payload["dropped"] = dict(self.dropped)
        payload.update(
            reference_mean=self.reference_mean,
            candidate_mean=self.candidate_mean,
            difference=self.difference,
            interval=None
            if self.interval is None
            else {"low": self.interval.low, "high": self.interval.high},
            confidence=self.confidence,
        )
        if self.flips is not None:
            payload["flips"] = {name: list(keys) for name, keys in self.flips.items()}
        payload.update(
            flip_counts=dict(self.flip_counts),
            test=self.test,
            p_value=self.p_value,
            significant=self.significant,
            verdict=self.verdict,
        )
        if self.flipped_tasks is not None:
            payload["flipped_tasks"] = [row.to_payload(version) for row in self.flipped_tasks]
        return payload

    def statistics(self) -> PairedComparison:
        """The comparison as the comparison page's verdict line reads it (the flips only
        where they are not sealed: the line reads the verdict, the test and the figures)."""
        return PairedComparison.from_dict(self.to_payload())

    def sealed(self) -> Comparison:
        return replace(self, flips=None, dropped=None, flipped_tasks=None)


@dataclass(frozen=True)
class TaskResult:
    """One side's result on one held-out task: the first epoch's outcome, how many of its
    rollouts passed, its mean score and a rollout to open."""

    rollout: str
    outcome: str | None
    score: float | None
    rollouts: int
    passed: int

    @classmethod
    def from_payload(cls, data: Mapping[str, Any] | None) -> TaskResult | None:
        if not data:
            return None
        return cls(
            rollout=data["rollout"],
            outcome=data.get("outcome"),
            score=data.get("score"),
            rollouts=int(data.get("rollouts") or 0),
            passed=int(data.get("passed") or 0),
        )

    def to_payload(self) -> dict[str, Any]:
        return {
            "rollout": self.rollout,
            "outcome": self.outcome,
            "score": self.score,
            "rollouts": self.rollouts,
            "passed": self.passed,
        }


@dataclass(frozen=True)
class HeldoutTask:
    task: str
    flip: str | None
    changed: bool
    candidate: TaskResult | None
    reference: TaskResult | None

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> HeldoutTask:
        return cls(
            task=data["task"],
            flip=data.get("flip"),
            changed=bool(data.get("changed")),
            candidate=TaskResult.from_payload(data.get("candidate")),
            reference=TaskResult.from_payload(data.get("reference")),
        )

    def to_payload(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "flip": self.flip,
            "changed": self.changed,
            "candidate": self.candidate.to_payload() if self.candidate else None,
            "reference": self.reference.to_payload() if self.reference else None,
        }


@dataclass(frozen=True)
class HeldoutTasks:
    """Every held-out task of the suite in suite order (the first ``len(tasks)`` of
    ``total``)."""

    total: int
    truncated: bool
    tasks: tuple[HeldoutTask, ...]

    @classmethod
    def from_payload(cls, data: Mapping[str, Any] | None) -> HeldoutTasks | None:
        if not data:
            return None
        return cls(
            total=int(data.get("total") or 0),
            truncated=bool(data.get("truncated")),
            tasks=tuple(HeldoutTask.from_payload(row) for row in data.get("tasks") or ()),
        )

    def to_payload(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "truncated": self.truncated,
            "tasks": [task.to_payload() for task in self.tasks],
        }


@dataclass(frozen=True)
class Generalization:
    """Search-set gain against held-out gain (``not_generalized``: the share of a positive
    search gain that did not carry over)."""

    search_gain: float | None
    search_suite: str | None
    note: str | None
    heldout_gain: float | None
    gap: float | None
    not_generalized: float | None

    @classmethod
    def from_payload(cls, data: Mapping[str, Any] | None) -> Generalization | None:
        if not data:
            return None
        return cls(
            search_gain=data.get("search_gain"),
            search_suite=data.get("search_suite"),
            note=data.get("note"),
            heldout_gain=data.get("heldout_gain"),
            gap=data.get("gap"),
            not_generalized=data.get("not_generalized"),
        )

    def to_payload(self, version: int = EVIDENCE_VERSION) -> dict[str, Any]:
        payload = {
            "search_gain": self.search_gain,
            "search_suite": self.search_suite,
            "note": self.note,
            "heldout_gain": self.heldout_gain,
            "gap": self.gap,
            "not_generalized": self.not_generalized,
        }
        if version < 2:
            del payload["search_suite"], payload["note"]
        return payload


@dataclass(frozen=True)
class Compute:
    """The change in held-out cost per task, candidate against reference."""

    tokens_per_task_delta: float | None
    tokens_per_task_ratio: float | None
    latency_ms_per_task_delta: float | None
    latency_ms_per_task_ratio: float | None

    @classmethod
    def from_payload(cls, data: Mapping[str, Any] | None) -> Compute | None:
        if not data:
            return None
        return cls(
            tokens_per_task_delta=data.get("tokens_per_task_delta"),
            tokens_per_task_ratio=data.get("tokens_per_task_ratio"),
            latency_ms_per_task_delta=data.get("latency_ms_per_task_delta"),
            latency_ms_per_task_ratio=data.get("latency_ms_per_task_ratio"),
        )

    def to_payload(self) -> dict[str, Any]:
        return {
            "tokens_per_task_delta": self.tokens_per_task_delta,
            "tokens_per_task_ratio": self.tokens_per_task_ratio,
            "latency_ms_per_task_delta": self.latency_ms_per_task_delta,
            "latency_ms_per_task_ratio": self.latency_ms_per_task_ratio,
        }


@dataclass(frozen=True)
class Diff:
    """The harness change against the reference: git's list of changed files and the diff's
    text (None with ``error`` when git could not produce it)."""

    base: str | None
    files: tuple[str, ...]
    text: str | None = None
    truncated: bool = False
    error: str | None = None

    @classmethod
    def from_payload(cls, data: Mapping[str, Any] | None) -> Diff | None:
        if not data:
            return None
        return cls(
            base=data.get("base"),
            files=tuple(data.get("files") or ()),
            text=data.get("text"),
            truncated=bool(data.get("truncated")),
            error=data.get("error"),
        )

    def to_payload(self, version: int = EVIDENCE_VERSION) -> dict[str, Any]:
        payload: dict[str, Any] = {"base": self.base, "files": list(self.files)}
        if self.error is not None:
            payload["error"] = self.error
            if version < 2 and not self.files:
                # Version 1 listed no files when git could not diff.
                del payload["files"]
        else:
            payload.update(text=self.text or "", truncated=self.truncated)
        return payload


@dataclass(frozen=True)
class Commit:
    sha: str
    parents: tuple[str, ...]
    message: str
    author: str
    authored_at: str

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> Commit:
        return cls(
            sha=data["sha"],
            parents=tuple(data.get("parents") or ()),
            message=data.get("message") or "",
            author=data.get("author") or "",
            authored_at=data.get("authored_at") or "",
        )

    def to_payload(self) -> dict[str, Any]:
        return {
            "sha": self.sha,
            "parents": list(self.parents),
            "message": self.message,
            "author": self.author,
            "authored_at": self.authored_at,
        }


@dataclass(frozen=True)
class Lineage:
    """The commits from the reference to the candidate, newest first (or why there are
    none: ``error``)."""

    commits: tuple[Commit, ...] = ()
    holder_is_ancestor: bool = False
    candidate_is_ancestor: bool = False
    truncated: bool = False
    error: str | None = None

    @classmethod
    def from_payload(cls, data: Mapping[str, Any] | None) -> Lineage | None:
        if not data:
            return None
        return cls(
            commits=tuple(Commit.from_payload(c) for c in data.get("commits") or ()),
            holder_is_ancestor=bool(data.get("holder_is_ancestor")),
            candidate_is_ancestor=bool(data.get("candidate_is_ancestor")),
            truncated=bool(data.get("truncated")),
            error=data.get("error"),
        )

    def to_payload(self) -> dict[str, Any]:
        if self.error is not None:
            return {"error": self.error}
        return {
            "holder_is_ancestor": self.holder_is_ancestor,
            "candidate_is_ancestor": self.candidate_is_ancestor,
            "commits": [commit.to_payload() for commit in self.commits],
            "truncated": self.truncated,
        }


@dataclass(frozen=True)
class Evidence:
    """What reviewers decide on (coevo.reviews.promotions.evidence says how each part is
    assembled). ``holder`` is None for an empty channel, ``baseline`` unless one stood in for
    the holder; ``reference`` and ``heldout_tasks`` are None in version 1 evidence, and
    ``heldout_tasks`` once sealed. ``version``: the version it was stored in, which
    ``to_payload`` writes."""

    assembled_at: str | None
    holder_generation: int | None
    reference: ReferenceSummary | None
    candidate: Side | None
    holder: Side | None
    baseline: Side | None
    comparison: Comparison | None
    heldout_tasks: HeldoutTasks | None
    generalization: Generalization | None
    compute: Compute | None
    diff: Diff | None
    lineage: Lineage | None
    version: int = EVIDENCE_VERSION

    @property
    def reference_side(self) -> Side | None:
        """The side the candidate is compared with: the holder, else the baseline."""
        return self.holder or self.baseline

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> Evidence:
        """Any stored version in today's terms (the fields version 1 lacks are None or empty;
        its flipped tasks' "holder" is the reference)."""
        return cls(
            version=int(data.get("version") or 1),
            assembled_at=data.get("assembled_at"),
            holder_generation=data.get("holder_generation"),
            reference=ReferenceSummary.from_payload(data.get("reference")),
            candidate=Side.from_payload(data.get("candidate")),
            holder=Side.from_payload(data.get("holder")),
            baseline=Side.from_payload(data.get("baseline")),
            comparison=Comparison.from_payload(data.get("comparison")),
            heldout_tasks=HeldoutTasks.from_payload(data.get("heldout_tasks")),
            generalization=Generalization.from_payload(data.get("generalization")),
            compute=Compute.from_payload(data.get("compute")),
            diff=Diff.from_payload(data.get("diff")),
            lineage=Lineage.from_payload(data.get("lineage")),
        )

    def to_payload(self) -> dict[str, Any]:
        """The JSON of the version it was stored in (sealed parts left out, as
        ``sealed_evidence`` left them)."""
        version = self.version

        def part(value: Any, *, versioned: bool = False) -> Any:
            if value is None:
                return None
            return value.to_payload(version) if versioned else value.to_payload()

        payload = {
            "version": version,
            "assembled_at": self.assembled_at,
            "holder_generation": self.holder_generation,
            "reference": part(self.reference),
            "candidate": part(self.candidate, versioned=True),
            "holder": part(self.holder, versioned=True),
            "baseline": part(self.baseline, versioned=True),
            "comparison": part(self.comparison, versioned=True),
            "heldout_tasks": part(self.heldout_tasks),
            "generalization": part(self.generalization, versioned=True),
            "compute": part(self.compute),
            "diff": part(self.diff, versioned=True),
            "lineage": part(self.lineage),
        }
        if self.heldout_tasks is None:
            del payload["heldout_tasks"]
        if version < 2:
            del payload["reference"], payload["baseline"]
        return payload


def evidence_read(*, payload: Mapping[str, Any] | None) -> Evidence | None:
    """The stored evidence of a request, any version; None before it is assembled (a new or
    re-targeted request stores ``{}``)."""
    return Evidence.from_payload(payload) if payload else None


def sealed_evidence(*, evidence: Evidence | None, audience: Audience) -> Evidence | None:
    """What of ``evidence`` ``audience`` may see: all of it for a reviewer; for anyone else,
    no per-task held-out result (the held-out task list, the comparison's flips, flipped
    tasks and dropped tasks), only the aggregates."""
    if evidence is None or audience.sees_heldout:
        return evidence
    return replace(
        evidence,
        heldout_tasks=None,
        comparison=evidence.comparison.sealed() if evidence.comparison else None,
    )

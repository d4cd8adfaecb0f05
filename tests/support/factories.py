"""Test data builders shared by the test packages: plain functions, each making one thing the
way the services (or, where a docstring says so, the workers) leave it. Fixtures call them;
a test that needs a second one, or a variant, calls them itself."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from coevo.audit.models import AuditEvent
from coevo.campaigns.models import Campaign, Proposal, ProposalState, ProposerKind
from coevo.evaluations.models import (
    EVALUATION_FINAL_STATES,
    Evaluation,
    EvaluationState,
    Rollout,
    RolloutState,
    TraceStep,
)
from coevo.evaluations.services import evaluation_create
from coevo.policies.models import EndpointKind, PolicyEndpoint, PolicyVersion
from coevo.policies.services import policy_version_create
from coevo.projects.models import Project
from coevo.projects.services import membership_set
from coevo.suites.jsonl import ScorerSpec, scorer_spec_build
from coevo.suites.models import Split, Suite, Task
from coevo.suites.services import suite_import_jsonl
from harness_store.models import Candidate
from harness_store.services import candidate_import_directory
from workers.outcomes import RolloutOutcome

REPO_ROOT = Path(__file__).resolve().parents[2]
SEED_HARNESS = REPO_ROOT / "examples" / "humaneval-basic"
PASSWORD = "correct-horse-battery"
# The discard port: a policy endpoint for tests that never call it.
UNSERVED_URL = "http://127.0.0.1:9/v1"

# --- users ------------------------------------------------------------------------------------


def make_user(name: str, *, email: str = "") -> AbstractBaseUser:
    """A user who logs in with ``PASSWORD``."""
    return get_user_model().objects.create_user(name, email or f"{name}@example.com", PASSWORD)


def make_member(project: Project, name: str, role: str, *, email: str = "") -> AbstractBaseUser:
    """A user holding ``role`` in ``project``."""
    user = make_user(name, email=email)
    membership_set(project=project, user=user, role=role)
    return user


# --- policies ---------------------------------------------------------------------------------


def make_vllm_policy(*, base_url: str = UNSERVED_URL, **endpoint: Any) -> PolicyVersion:
    """The policy version ``base`` (base model ``base-model``) on a vLLM-kind endpoint; by
    default one nothing serves, for tests that finish rollouts by hand or never run them."""
    served = PolicyEndpoint.objects.create(
        name="vllm-test", base_url=base_url, kind=EndpointKind.VLLM, **endpoint
    )
    return policy_version_create(name="base", endpoint=served, base_model="base-model")


def make_policy_versions(like: PolicyVersion, count: int) -> list[PolicyVersion]:
    """``count`` more policy versions served by ``like``'s endpoint (a scripted server answers
    any served name)."""
    return [
        PolicyVersion.objects.create(
            name=f"extra-{i}",
            base_model=like.base_model,
            served_name=f"extra-{i}",
            endpoint=like.endpoint,
        )
        for i in range(count)
    ]


# --- suites -----------------------------------------------------------------------------------


def jsonl_rows(tasks: Iterable[Sequence[str]], *, split: str = "") -> list[dict[str, str]]:
    """Suite rows from ``(key, input, expected)`` or ``(key, input, expected, split)`` tuples;
    ``split`` (if given) for the tuples that name none."""
    rows = []
    for key, question, answer, *named in tasks:
        row = {"id": key, "input": question, "expected": answer}
        if named or split:
            row["split"] = named[0] if named else split
        rows.append(row)
    return rows


def make_jsonl_suite(
    project: Project,
    rows: Iterable[Mapping[str, Any]],
    *,
    name: str,
    scorer: ScorerSpec | str = "exact",
    **options: Any,
) -> Suite:
    """A JSONL suite of ``rows`` (one task each), imported as an upload is; ``scorer`` is a
    spec or the kind of a scorer that takes no options."""
    spec = scorer_spec_build(kind=scorer) if isinstance(scorer, str) else scorer
    data = "\n".join(json.dumps(row) for row in rows).encode()
    suite, _ = suite_import_jsonl(project=project, name=name, data=data, scorer=spec, **options)
    return suite


# --- candidates -------------------------------------------------------------------------------

AGENT_MANIFEST = """
[harness]
name = "{name}"
entrypoint = "agent:run"
policy_api = "completions"

[limits]
max_model_calls = 2
wall_time_s = 30
"""

# Agents for make_agent_candidate: one answers with the model's completion, one always "0".
ASKS_THE_MODEL = """
def run(task, ctx):
    return ctx.llm.complete(task["input"], max_tokens=8).texts[0].strip()
"""

GUESSES = """
def run(task, ctx):
    return "0"
"""


def make_agent_candidate(
    project: Project, tmp_path: Path, name: str, agent: str, *, parent: Candidate | None = None
) -> Candidate:
    """A one-file harness (``agent`` is its agent.py, ``AGENT_MANIFEST`` its manifest) imported
    from ``tmp_path / name``."""
    directory = tmp_path / name
    directory.mkdir()
    (directory / "harness.toml").write_text(AGENT_MANIFEST.format(name=name))
    (directory / "agent.py").write_text(agent)
    candidate, _ = candidate_import_directory(
        project=project, directory=directory, message=name, author_name="Tester", parent=parent
    )
    return candidate


def make_child_candidate(project: Project, parent: Candidate, directory: Path) -> Candidate:
    """The seed harness with one comment added to agent.py, committed as ``parent``'s child."""
    shutil.copytree(SEED_HARNESS, directory)
    agent = directory / "agent.py"
    agent.write_text(agent.read_text() + "\n# the child's change\n")
    candidate, created = candidate_import_directory(
        project=project,
        directory=directory,
        message="Child: one change",
        author_name="Proposer",
        parent=parent,
    )
    assert created
    return candidate


# --- evaluations and rollouts written straight to the database -------------------------------

# A trace step: (kind, payload, extra TraceStep fields such as token counts).
Step = tuple[str, dict[str, Any], dict[str, int]]


def make_evaluation(
    *,
    candidate: Candidate,
    suite: Suite,
    policy_version: PolicyVersion,
    split: str = Split.SEARCH,
    state: str = EvaluationState.FINISHED,
    **fields: Any,
) -> Evaluation:
    """An evaluation row in ``state`` with no rollouts (no plan, nothing enqueued): started
    unless pending, finished if final."""
    now = timezone.now()
    fields.setdefault("started_at", None if state == EvaluationState.PENDING else now)
    fields.setdefault("finished_at", now if state in EVALUATION_FINAL_STATES else None)
    return Evaluation.objects.create(
        project=candidate.project,
        candidate=candidate,
        policy_version=policy_version,
        suite=suite,
        split=split,
        state=state,
        **fields,
    )


def add_steps(rollout: Rollout, steps: Sequence[Step], *, start: int = 0, attempt: int = 1) -> None:
    """``steps`` appended to the rollout's ``attempt`` (the first unless told), numbered from
    ``start``."""
    TraceStep.objects.bulk_create(
        TraceStep(rollout=rollout, attempt=attempt, index=i, kind=kind, payload=payload, **extra)
        for i, (kind, payload, extra) in enumerate(steps, start)
    )


def make_rollout(
    evaluation: Evaluation,
    task: Task,
    *,
    outcome: str = "",
    detail: str = "",
    score: float | None = None,
    steps: Sequence[Step] = (),
    state: str = RolloutState.DONE,
) -> Rollout:
    """A rollout as a worker leaves it, with its trace ``steps``; its token counts and latency
    are the sums over the model-call steps."""
    calls = [s for s in steps if s[0] == "model_call"]
    rollout = Rollout.objects.create(
        evaluation=evaluation,
        task=task,
        seed=7,
        state=state,
        outcome=outcome,
        score=score,
        detail=detail,
        prompt_tokens=sum(s[2]["prompt_tokens"] for s in calls),
        completion_tokens=sum(s[2]["completion_tokens"] for s in calls),
        latency_ms=sum(s[2]["latency_ms"] for s in calls),
        model_calls=len(calls),
        attempts=1 if state != RolloutState.PENDING else 0,
    )
    add_steps(rollout, steps)
    return rollout


def finish_evaluation(
    evaluation: Evaluation,
    *,
    passed: Iterable[str] = (),
    outcomes: Mapping[str, str] | None = None,
    state: str = EvaluationState.FINISHED,
    detail: str = "",
) -> None:
    """Finish every rollout (by task key: those in ``passed`` pass, ``outcomes`` overrides,
    the rest fail) and the evaluation, the way workers leave them."""
    passed, outcomes = set(passed), dict(outcomes or {})
    for rollout in Rollout.objects.filter(evaluation=evaluation).select_related("task"):
        outcome = outcomes.get(
            rollout.task.key,
            RolloutOutcome.PASSED if rollout.task.key in passed else RolloutOutcome.TASK_FAILURE,
        )
        score = (
            None
            if outcome == RolloutOutcome.INFRA_ERROR
            else float(outcome == RolloutOutcome.PASSED)
        )
        Rollout.objects.filter(id=rollout.id).update(
            state=RolloutState.DONE, outcome=outcome, score=score, finished_at=timezone.now()
        )
    Evaluation.objects.filter(id=evaluation.id).update(
        state=state, state_detail=detail, finished_at=timezone.now()
    )


# --- many rows at once (query-count tests: a page read with few rows, then with many) ---------


def make_candidates(
    project: Project, count: int, *, parent: Candidate | None = None, label: str = "bulk"
) -> list[Candidate]:
    """``count`` candidate rows (children of ``parent``), newest last, with SHAs git does not
    know: for pages and lists that read only the rows, never a candidate's files."""
    now = timezone.now()
    rows = [
        Candidate(
            project=project,
            sha=uuid.uuid4().hex + f"{i:08x}",
            tree_sha=uuid.uuid4().hex + f"{i:08x}",
            parent_shas=[parent.sha] if parent else [],
            message=f"{label} candidate {i}",
            author_name="Bulk",
            authored_at=now + timedelta(seconds=i),
        )
        for i in range(count)
    ]
    return Candidate.objects.bulk_create(rows)


# Finished rollouts' outcomes in turn: a pass, a task failure, and both kinds of error.
OUTCOME_CYCLE = (
    (RolloutOutcome.PASSED, 1.0, ""),
    (RolloutOutcome.TASK_FAILURE, 0.0, ""),
    (RolloutOutcome.HARNESS_ERROR, 0.0, "import"),
    (RolloutOutcome.INFRA_ERROR, None, "policy"),
)


def make_rollouts(
    evaluation: Evaluation,
    tasks: Sequence[Task],
    *,
    epochs: int = 1,
    first_epoch: int = 0,
    error_kinds: int = 1,
) -> list[Rollout]:
    """A finished rollout per task × epoch (from ``first_epoch``), outcomes taken from
    ``OUTCOME_CYCLE`` in turn; the errors spread over ``error_kinds`` kinds of each."""
    rows = []
    for epoch in range(first_epoch, epochs):
        for i, task in enumerate(tasks):
            outcome, score, kind = OUTCOME_CYCLE[(i + epoch) % len(OUTCOME_CYCLE)]
            if kind and error_kinds > 1:
                kind = f"{kind}-{i % error_kinds}"
            rows.append(
                Rollout(
                    evaluation=evaluation,
                    task=task,
                    epoch=epoch,
                    seed=7,
                    state=RolloutState.DONE,
                    outcome=outcome,
                    error_kind=kind,
                    score=score,
                    detail=f"{outcome} {kind}".strip(),
                    prompt_tokens=100,
                    completion_tokens=20,
                    model_calls=1,
                    latency_ms=300,
                    attempts=1,
                    finished_at=timezone.now(),
                )
            )
    return Rollout.objects.bulk_create(rows)


def make_audit_events(
    project: Project | None, count: int, *, actor: AbstractBaseUser | None = None
) -> None:
    """``count`` audit events of ``project``, two actions in turn, each a one-key change."""
    AuditEvent.objects.bulk_create(
        AuditEvent(
            project=project,
            actor=actor,
            actor_label=actor.get_username() if actor else "system",
            action="candidate.imported" if i % 2 else "channel.moved",
            target_type="candidate" if i % 2 else "channel",
            target_id=str(i),
            target_label=f"target {i}",
            before={"n": i},
            after={"n": i + 1},
        )
        for i in range(count)
    )


def make_proposals(
    campaign: Campaign, candidates: Sequence[Candidate], *, start: int, batch_size: int = 4
) -> list[Proposal]:
    """A proposal per candidate from sequence ``start``, shaped as the runner leaves them: in
    rounds of ``batch_size``, most evaluated (scores and tokens varying, so plots and the front
    have points), one a round rejected at a stage, one eliminated by its round's first."""
    rows: list[Proposal] = []
    for i, candidate in enumerate(candidates):
        sequence = start + i
        batch = start + i - i % batch_size
        row = Proposal(
            campaign=campaign,
            sequence=sequence,
            kind=ProposerKind.LLM_PATCH,
            parent_shas=list(candidate.parent_shas),
            stages=[{"stage": "applies", "ok": True, "reason": "ok"}],
            candidate=candidate,
            policy_version=campaign.policy_version,
            state=ProposalState.EVALUATED,
            search_score=(i % 10) / 10,
            validation_score=(i % 7) / 7,
            tokens_per_task=10.0 + (i * 37) % 50,
            batch=batch,
        )
        if i % batch_size == 1:
            row.state, row.candidate = ProposalState.INVALID, None
            row.search_score = row.validation_score = row.tokens_per_task = None
            row.stages = [{"stage": "imports", "ok": False, "reason": "SyntaxError"}]
        elif i % batch_size == 2:
            row.validation_score = None
            row.eliminated_by = rows[-2]
            row.eliminated_at = timezone.now()
            row.eliminated_after_tasks = 3
            row.rollouts_saved = 5
        rows.append(row)
    return Proposal.objects.bulk_create(rows)


def evaluate_search(
    candidate: Candidate,
    suite: Suite,
    policy_version: PolicyVersion,
    *,
    tasks: int = 1,
    use_cache: bool = False,
) -> Evaluation:
    """An evaluation of the first ``tasks`` search-split tasks, enqueued on commit; by default
    it reuses no earlier result (a test about running rollouts must run them)."""
    return evaluation_create(
        candidate=candidate,
        suite=suite,
        split=Split.SEARCH,
        policy_version=policy_version,
        task_limit=tasks,
        use_cache=use_cache,
    )

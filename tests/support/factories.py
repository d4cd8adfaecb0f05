"""Test data builders shared by the test packages: plain functions, each making one thing the
way the services (or, where a docstring says so, the workers) leave it. Fixtures call them;
a test that needs a second one, or a variant, calls them itself."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from coevo.evaluations.models import (
    EVALUATION_FINAL_STATES,
    Evaluation,
    EvaluationState,
    Outcome,
    Rollout,
    RolloutState,
    TraceStep,
)
from coevo.policies.models import EndpointKind, PolicyEndpoint, PolicyVersion
from coevo.policies.services import policy_version_create
from coevo.projects.models import Project
from coevo.projects.services import membership_set
from coevo.suites.jsonl import ScorerSpec, scorer_spec_build
from coevo.suites.models import Split, Suite, Task
from coevo.suites.services import suite_import_jsonl
from harness_store.models import Candidate
from harness_store.services import candidate_import_directory

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


def add_steps(rollout: Rollout, steps: Sequence[Step]) -> None:
    TraceStep.objects.bulk_create(
        TraceStep(rollout=rollout, attempt=1, index=i, kind=kind, payload=payload, **extra)
        for i, (kind, payload, extra) in enumerate(steps)
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
            Outcome.PASSED if rollout.task.key in passed else Outcome.TASK_FAILURE,
        )
        score = None if outcome == Outcome.INFRA_ERROR else float(outcome == Outcome.PASSED)
        Rollout.objects.filter(id=rollout.id).update(
            state=RolloutState.DONE, outcome=outcome, score=score, finished_at=timezone.now()
        )
    Evaluation.objects.filter(id=evaluation.id).update(
        state=state, state_detail=detail, finished_at=timezone.now()
    )

"""Dashboard test data: evaluations, rollouts and traces written straight to the database
(no worker runs), shaped like what workers/rollout.py records."""

from __future__ import annotations

import shutil
from dataclasses import dataclass

import pytest
from django.utils import timezone

from coevo.evaluations.models import (
    Evaluation,
    EvaluationState,
    Rollout,
    RolloutState,
)
from coevo.suites.models import Split, Task
from harness_store.services import candidate_import_directory
from tests.conftest import SEED_HARNESS

# Browser tests (marked `browser`) take `page` from here.
from tests.support.browser import browser, page  # noqa: F401
from tests.support.factories import Step, add_steps, make_evaluation, make_rollout
from workers.outcomes import RolloutOutcome

CHILD_MARKER = "# child-change-marker"
COMPLETION = "    return sorted(set(numbers))  # distinctive-completion-marker\n"
INVALID_HARNESS = "invalid harness: harness.toml is missing the [harness] table"
CRASH = "harness raised ZeroDivisionError: division by zero"
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "agent.py", line 7, in run\n'
    "    return 1 / 0\n"
    "ZeroDivisionError: division by zero\n"
)
SAMPLING = {"max_tokens": 192, "temperature": 0.0, "stop": ["\ndef "], "seed": 7}


@dataclass
class EvaluationData:
    evaluation: Evaluation
    passed: Rollout
    failed: Rollout
    invalid: Rollout
    crashed: Rollout
    unfinished: list[Rollout]


def start_step(task: Task) -> Step:
    knobs = {"temperature": 0.0, "samples": 1}
    return "start", {"task": task.key, "knobs": knobs, "entrypoint": "agent:run", "seed": 7}, {}


def model_call_step(task: Task, completion: str) -> Step:
    payload = {
        "api": "completions",
        "model": "scripted",
        "prompt": task.inputs["prompt"],
        "sampling": SAMPLING,
        "completion": completion,
        "finish_reason": "stop",
    }
    return "model_call", payload, {"prompt_tokens": 120, "completion_tokens": 30, "latency_ms": 450}


def finish_rollout(rollout: Rollout) -> None:
    """What a worker leaves behind for a passing rollout."""
    task = rollout.task
    add_steps(
        rollout,
        [
            start_step(task),
            model_call_step(task, COMPLETION),
            ("answer", {"answer": COMPLETION}, {}),
            ("verdict", {"passed": True, "score": 1.0, "detail": "passed", "output": ""}, {}),
        ],
    )
    Rollout.objects.filter(id=rollout.id).update(
        state=RolloutState.DONE,
        outcome=RolloutOutcome.PASSED,
        score=1.0,
        detail="passed",
        prompt_tokens=120,
        completion_tokens=30,
        latency_ms=450,
        model_calls=1,
        finished_at=timezone.now(),
    )


def make_mixed_evaluation(
    *, project, candidate, suite, policy_version, running: bool = False
) -> EvaluationData:
    """Four finished rollouts (passed, task failure, two harness errors); with ``running`` also
    one running and one pending rollout, and the evaluation still running."""
    tasks = list(Task.objects.filter(suite=suite, split=Split.SEARCH).order_by("position")[:6])
    evaluation = make_evaluation(
        candidate=candidate,
        suite=suite,
        policy_version=policy_version,
        state=EvaluationState.RUNNING if running else EvaluationState.FINISHED,
        seed=7,
    )
    passed = make_rollout(
        evaluation,
        tasks[0],
        outcome=RolloutOutcome.PASSED,
        score=1.0,
        detail="passed",
        steps=[
            start_step(tasks[0]),
            model_call_step(tasks[0], COMPLETION),
            ("log", {"message": "kept the first sample"}, {}),
            ("answer", {"answer": COMPLETION}, {}),
            ("verdict", {"passed": True, "score": 1.0, "detail": "passed", "output": ""}, {}),
        ],
    )
    failed = make_rollout(
        evaluation,
        tasks[1],
        outcome=RolloutOutcome.TASK_FAILURE,
        score=0.0,
        detail="failed: AssertionError",
        steps=[
            start_step(tasks[1]),
            model_call_step(tasks[1], "    return None\n"),
            ("answer", {"answer": "    return None\n"}, {}),
            (
                "verdict",
                {
                    "passed": False,
                    "score": 0.0,
                    "detail": "failed: AssertionError",
                    "output": "AssertionError: verifier-output-marker",
                },
                {},
            ),
        ],
    )
    invalid = make_rollout(
        evaluation,
        tasks[2],
        outcome=RolloutOutcome.HARNESS_ERROR,
        score=0.0,
        detail=INVALID_HARNESS,
        steps=[("error", {"outcome": "harness_error", "message": INVALID_HARNESS}, {})],
    )
    crashed = make_rollout(
        evaluation,
        tasks[3],
        outcome=RolloutOutcome.HARNESS_ERROR,
        score=0.0,
        detail=CRASH,
        steps=[
            start_step(tasks[3]),
            ("harness_exception", {"error": "ZeroDivisionError", "traceback": TRACEBACK}, {}),
            (
                "error",
                {"outcome": "harness_error", "message": CRASH, "stderr": "stderr-marker"},
                {},
            ),
        ],
    )
    unfinished = []
    if running:
        unfinished = [
            make_rollout(evaluation, tasks[4], state=RolloutState.RUNNING),
            make_rollout(evaluation, tasks[5], state=RolloutState.PENDING),
        ]
    return EvaluationData(evaluation, passed, failed, invalid, crashed, unfinished)


@pytest.fixture
def finished_evaluation(project, seed_candidate, humaneval_suite, policy_version) -> EvaluationData:
    return make_mixed_evaluation(
        project=project,
        candidate=seed_candidate,
        suite=humaneval_suite,
        policy_version=policy_version,
    )


@pytest.fixture
def running_evaluation(project, seed_candidate, humaneval_suite, policy_version) -> EvaluationData:
    return make_mixed_evaluation(
        project=project,
        candidate=seed_candidate,
        suite=humaneval_suite,
        policy_version=policy_version,
        running=True,
    )


@pytest.fixture
def clamped_child(project, seed_candidate, tmp_path):
    """The seed with one line of agent.py changed (samples clamped to at least one) and a
    binary file added: a diff with a marked line and a binary file to show."""
    directory = tmp_path / "child"
    shutil.copytree(SEED_HARNESS, directory)
    agent = directory / "agent.py"
    agent.write_text(
        agent.read_text().replace(
            'samples = knobs["samples"]', f'samples = max(1, knobs["samples"])  {CHILD_MARKER}'
        )
    )
    (directory / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff binary")
    candidate, created = candidate_import_directory(
        project=project,
        directory=directory,
        message="Clamp samples to at least one\n\nA proposer's change.",
        author_name="Proposer",
        parent=seed_candidate,
    )
    assert created
    return candidate

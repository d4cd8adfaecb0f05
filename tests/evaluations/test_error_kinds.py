"""A finished rollout stores the kind its failure was raised with, never one read out of its
detail message: the breakdowns and metrics group by what happened, not by the words used."""

from __future__ import annotations

import pytest

from coevo.evaluations.models import (
    Rollout,
)
from coevo.evaluations.selectors import ErrorCount, evaluation_errors
from coevo.evaluations.services import (
    evaluation_create,
    rollout_claim,
    rollout_execute,
    rollout_finish,
)
from coevo.evaluations.services import rollouts as rollouts_service
from coevo.suites.models import Split
from harness_store.services import candidate_import_directory
from workers.outcomes import RolloutOutcome

pytestmark = pytest.mark.django_db(transaction=True)

# Every keyword the old classifier searched the detail for, in the order it searched.
KEYWORDS = "limit exceeded: protocol violation, invalid harness, sandbox, policy"


def pending_rollout(candidate, suite, policy_version) -> Rollout:
    evaluation = evaluation_create(
        candidate=candidate,
        suite=suite,
        split=Split.SEARCH,
        policy_version=policy_version,
        task_limit=1,
    )
    return Rollout.objects.get(evaluation=evaluation)


def test_it_stores_a_harness_exception_whose_message_names_a_limit_as_an_exception(
    empty_queue, tmp_path, project, owner, humaneval_suite, policy_version
):
    directory = tmp_path / "harness"
    directory.mkdir()
    (directory / "harness.toml").write_text('[harness]\nname = "t"\nentrypoint = "agent:run"\n')
    (directory / "agent.py").write_text(
        f"def run(task, ctx):\n    raise RuntimeError({KEYWORDS!r})\n"
    )
    candidate, _ = candidate_import_directory(
        project=project, directory=directory, message="raises", author_name="T", created_by=owner
    )
    rollout = pending_rollout(candidate, humaneval_suite, policy_version)

    done = rollout_execute(rollout_id=rollout.id, worker="test")

    assert done.outcome == RolloutOutcome.HARNESS_ERROR
    assert done.detail == f"the harness raised RuntimeError: {KEYWORDS}"
    assert done.error_kind == "exception"
    assert evaluation_errors(evaluation=done.evaluation) == [
        ErrorCount(RolloutOutcome.HARNESS_ERROR, "exception", 1, done.detail)
    ]


def test_it_stores_a_failure_of_the_worker_itself_as_a_worker_error(
    empty_queue, seed_candidate, humaneval_suite, policy_version, settings, monkeypatch
):
    settings.COEVO_ROLLOUT_MAX_ATTEMPTS = 1  # no retry: the attempt ends the rollout

    def broken(**kwargs):
        raise OSError(KEYWORDS)

    monkeypatch.setattr(rollouts_service, "_rollout_run_in_sandbox", broken)
    rollout = pending_rollout(seed_candidate, humaneval_suite, policy_version)

    done = rollout_execute(rollout_id=rollout.id, worker="test")

    assert done.outcome == RolloutOutcome.INFRA_ERROR
    assert done.detail == f"worker error: OSError: {KEYWORDS}"
    assert done.error_kind == "worker"


@pytest.mark.parametrize(
    ("outcome", "given", "stored"),
    [
        (RolloutOutcome.HARNESS_ERROR, "limit", "limit"),
        (RolloutOutcome.INFRA_ERROR, "sandbox", "sandbox"),
        (RolloutOutcome.HARNESS_ERROR, "", "other"),  # an error nobody classified
        (RolloutOutcome.TASK_FAILURE, "", ""),
    ],
)
def test_it_stores_the_kind_the_caller_gives_whatever_the_detail_says(
    seed_candidate, humaneval_suite, policy_version, outcome, given, stored
):
    rollout = pending_rollout(seed_candidate, humaneval_suite, policy_version)
    claimed = rollout_claim(rollout_id=rollout.id, worker="test")

    assert rollout_finish(
        rollout=claimed, outcome=outcome, score=0.0, detail=KEYWORDS, error_kind=given
    )

    assert Rollout.objects.get(id=rollout.id).error_kind == stored


def test_it_refuses_a_kind_outside_the_enumeration(seed_candidate, humaneval_suite, policy_version):
    rollout = pending_rollout(seed_candidate, humaneval_suite, policy_version)
    claimed = rollout_claim(rollout_id=rollout.id, worker="test")

    with pytest.raises(ValueError, match="limits"):
        rollout_finish(
            rollout=claimed,
            outcome=RolloutOutcome.HARNESS_ERROR,
            score=0.0,
            detail="",
            error_kind="limits",
        )

    assert Rollout.objects.get(id=rollout.id).state == "running"

"""A promotion request's evidence on known numbers: scores with intervals on every split, the
held-out paired comparison, the search-gain vs held-out-gain gap, the compute bought, errors,
diff and lineage."""

from __future__ import annotations

import pytest

from coevo.evaluations.models import (
    Rollout,
)
from coevo.evaluations.services import evaluation_create
from coevo.reviews.models import PromotionState
from coevo.reviews.promotions.create import promotion_request_create
from coevo.reviews.promotions.refresh import promotion_evidence_refresh
from coevo.reviews.services import channel_get_or_create
from harness_store.services import candidate_import_directory
from tests.support.factories import AGENT_MANIFEST, ASKS_THE_MODEL, finish_evaluation
from workers.outcomes import RolloutOutcome

pytestmark = pytest.mark.django_db


def _evaluate(candidate, suite, split, policy_version, **results):
    evaluation = evaluation_create(
        candidate=candidate, suite=suite, split=split, policy_version=policy_version
    )
    finish_evaluation(evaluation, **results)
    return evaluation


def _cost(evaluation, *, prompt: int, completion: int, latency_ms: int) -> None:
    Rollout.objects.filter(evaluation=evaluation).update(
        prompt_tokens=prompt, completion_tokens=completion, latency_ms=latency_ms
    )


@pytest.fixture
def evidence(researcher, policy_version, arith_suite, guesser, asker, production):
    # Search: the candidate solves both tasks, the holder none (search gain +1.0).
    _evaluate(asker, arith_suite, "search", policy_version, passed=["s-mul", "s-add"])
    _evaluate(guesser, arith_suite, "search", policy_version)
    _evaluate(asker, arith_suite, "validation", policy_version, passed=["v-mul"])
    request = promotion_request_create(
        channel=production,
        candidate=asker,
        policy_version=policy_version,
        requester=researcher,
        suite=arith_suite,
    )
    # Held-out: the candidate solves one task of three and crashes on one (gain +1/3).
    finish_evaluation(
        request.candidate_evaluation,
        passed=["h-mul"],
        outcomes={"h-sub": RolloutOutcome.HARNESS_ERROR},
    )
    finish_evaluation(request.holder_evaluation)
    _cost(request.candidate_evaluation, prompt=30, completion=10, latency_ms=200)
    _cost(request.holder_evaluation, prompt=10, completion=0, latency_ms=100)

    request = promotion_evidence_refresh(request=request)
    assert request.state == PromotionState.READY, request.state_detail
    assert request.evidence_at is not None
    return request.evidence


def test_it_shows_every_split_with_an_interval_for_both_sides(evidence, asker, guesser):
    candidate, holder = evidence["candidate"], evidence["holder"]
    assert (candidate["sha"], holder["sha"]) == (asker.sha, guesser.sha)
    assert candidate["scores"]["search"]["mean"] == 1.0
    assert candidate["scores"]["validation"]["mean"] == 0.5
    assert candidate["scores"]["heldout"]["mean"] == pytest.approx(1 / 3)
    low, high = candidate["scores"]["heldout"]["ci_low"], candidate["scores"]["heldout"]["ci_high"]
    assert 0 < low < 1 / 3 < high < 1
    assert holder["scores"]["search"]["mean"] == 0.0
    assert holder["scores"]["validation"] is None  # never evaluated there
    assert holder["scores"]["heldout"]["n_tasks"] == 3


def test_it_compares_the_held_out_results_task_by_task(evidence):
    comparison = evidence["comparison"]
    assert comparison["flips"]["fixed"] == ["h-mul"]
    assert comparison["flip_counts"]["both_fail"] == 2
    assert comparison["difference"] == pytest.approx(1 / 3)
    assert comparison["interval"]["low"] <= 1 / 3 <= comparison["interval"]["high"]
    assert comparison["p_value"] == 1.0  # one discordant task decides nothing
    [row] = comparison["flipped_tasks"]
    assert row["task"] == "h-mul" and row["flip"] == "fixed"
    assert Rollout.objects.get(id=row["candidate_rollout"]).task.key == "h-mul"
    assert Rollout.objects.get(id=row["reference_rollout"]).task.key == "h-mul"


def test_it_shows_how_much_of_the_search_gain_did_not_generalize(evidence):
    gap = evidence["generalization"]
    assert gap["search_gain"] == 1.0
    assert gap["heldout_gain"] == pytest.approx(1 / 3)
    assert gap["gap"] == pytest.approx(2 / 3)
    assert gap["not_generalized"] == pytest.approx(2 / 3)


def test_it_shows_the_compute_the_gain_cost(evidence):
    assert evidence["candidate"]["cost"]["tokens_per_task"] == 40
    assert evidence["holder"]["cost"]["tokens_per_task"] == 10
    compute = evidence["compute"]
    assert compute["tokens_per_task_delta"] == 30 and compute["tokens_per_task_ratio"] == 4
    assert compute["latency_ms_per_task_delta"] == 100


def test_it_counts_harness_and_infra_errors(evidence):
    assert evidence["candidate"]["errors"] == {"harness_error": 1, "infra_error": 0}
    assert evidence["holder"]["errors"] == {"harness_error": 0, "infra_error": 0}


def test_it_shows_the_diff_and_the_lineage_from_the_holder(evidence, asker, guesser):
    assert evidence["diff"]["base"] == guesser.sha
    assert evidence["diff"]["files"] == ["agent.py", "harness.toml"]
    assert "+    return ctx.llm.complete" in evidence["diff"]["text"]
    assert not evidence["diff"]["truncated"]
    lineage = evidence["lineage"]
    assert lineage["holder_is_ancestor"] and not lineage["candidate_is_ancestor"]
    assert [(c["sha"], c["parents"]) for c in lineage["commits"]] == [(asker.sha, [guesser.sha])]


def test_it_lists_every_changed_file_whatever_its_name(
    project, tmp_path, researcher, policy_version, arith_suite, guesser, production
):
    """Names git quotes in a diff's headers (non-ASCII) or that hold " b/" are listed as they
    are: a reviewer approving the promotion sees every file it changes."""
    directory = tmp_path / "odd"
    (directory / "x b").mkdir(parents=True)
    (directory / "harness.toml").write_text(AGENT_MANIFEST.format(name="odd"))
    (directory / "agent.py").write_text("import Aé\n" + ASKS_THE_MODEL)
    (directory / "Aé.py").write_text("SECRET = 1\n")
    (directory / "x b" / "y b.py").write_text("Y = 2\n")
    odd, _ = candidate_import_directory(
        project=project, directory=directory, message="odd", author_name="T", parent=guesser
    )
    request = promotion_request_create(
        channel=production,
        candidate=odd,
        policy_version=policy_version,
        requester=researcher,
        suite=arith_suite,
    )
    finish_evaluation(request.candidate_evaluation)
    finish_evaluation(request.holder_evaluation)

    diff = promotion_evidence_refresh(request=request).evidence["diff"]

    assert sorted(diff["files"]) == ["Aé.py", "agent.py", "harness.toml", "x b/y b.py"]


def test_it_reassembles_ready_evidence_with_newer_results(
    researcher, policy_version, arith_suite, asker, project
):
    staging = channel_get_or_create(project=project, name="staging")
    request = promotion_request_create(
        channel=staging,
        candidate=asker,
        policy_version=policy_version,
        requester=researcher,
        suite=arith_suite,
    )
    finish_evaluation(request.candidate_evaluation)
    request = promotion_evidence_refresh(request=request)
    assert request.evidence["candidate"]["scores"]["validation"] is None
    assert request.evidence["diff"]["base"] is None  # an empty channel: the whole harness

    _evaluate(asker, arith_suite, "validation", policy_version, passed=["v-mul", "v-add"])
    request = promotion_evidence_refresh(request=request)

    assert request.state == PromotionState.READY
    assert request.evidence["candidate"]["scores"]["validation"]["mean"] == 1.0

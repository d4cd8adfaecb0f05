"""The rollout cache keeps the held-out seal (issue 15): a result travels only within one
project and one split, never from or into held-out; a suite's split seed is part of what makes
two results identical; and a held-out rollout's page is not found outside a promotion."""

from __future__ import annotations

import json
from importlib import import_module

import pytest
from django.apps import apps

from coevo.evaluations.models import (
    Evaluation,
    Rollout,
    RolloutState,
)
from coevo.evaluations.services import evaluation_create, rollout_claim, rollout_finish
from coevo.exports.records import Selection, rollouts_selected
from coevo.projects.models import Role
from coevo.projects.services import membership_set, project_get_or_create
from coevo.suites.jsonl import scorer_spec_build
from coevo.suites.models import Split, Suite
from coevo.suites.services import suite_import_jsonl
from coevo.suites.splits import split_for
from harness_store.services import candidate_import_directory
from tests.conftest import PASSWORD, SEED_HARNESS
from workers.outcomes import RolloutOutcome

pytestmark = pytest.mark.django_db(transaction=True)

KEYS = [f"t{i:03d}" for i in range(120)]
DATA = "\n".join(json.dumps({"id": key, "input": key, "expected": "1"}) for key in KEYS).encode()


@pytest.fixture(autouse=True)
def _empty_queue(empty_queue):
    yield


def import_suite(project, split_seed: str) -> Suite:
    suite, _ = suite_import_jsonl(
        project=project,
        name="echo",
        data=DATA,
        scorer=scorer_spec_build(kind="exact"),
        split_seed=split_seed,
    )
    return suite


def import_seed(project, owner):
    candidate, _ = candidate_import_directory(
        project=project,
        directory=SEED_HARNESS,
        message="Seed harness",
        author_name="Owner",
        author_email="owner@example.com",
        created_by=owner,
    )
    return candidate


def evaluate(candidate, suite, policy_version, split: str, **kwargs) -> Evaluation:
    if split == Split.HELDOUT:
        kwargs["purpose"] = "promotion"
    return evaluation_create(
        candidate=candidate, suite=suite, split=split, policy_version=policy_version, **kwargs
    )


def run_all(evaluation: Evaluation) -> None:
    for rollout in Rollout.objects.filter(evaluation=evaluation, state=RolloutState.PENDING):
        claimed = rollout_claim(rollout_id=rollout.id, worker="test")
        assert claimed is not None
        assert rollout_finish(
            rollout=claimed,
            outcome=RolloutOutcome.PASSED,
            score=1.0,
            detail=f"held-out secret of {rollout.task.key}",
            answer="1",
        )


def reused_sources(evaluation: Evaluation) -> set:
    return set(
        evaluation.rollouts.filter(reused_from__isnull=False).values_list(
            "reused_from__evaluation_id", flat=True
        )
    )


def test_it_never_reuses_a_held_out_rollout_in_a_search_evaluation(
    project, owner, seed_candidate, policy_version
):
    sealed = import_suite(project, "0")
    resplit = import_suite(project, "1")
    heldout = evaluate(seed_candidate, sealed, policy_version, Split.HELDOUT)
    run_all(heldout)
    # The same task keys, now (partly) in seed 1's search split.
    moved = {k for k in KEYS if split_for(k, seed="0") == Split.HELDOUT}
    moved &= {k for k in KEYS if split_for(k, seed="1") == Split.SEARCH}
    assert moved <= set(heldout.rollouts.values_list("task__key", flat=True))
    assert len(moved) >= 3

    search = evaluate(seed_candidate, resplit, policy_version, Split.SEARCH)

    assert reused_sources(search) == set()
    assert not search.rollouts.filter(detail__contains="held-out secret").exists()
    assert not search.rollouts.filter(detail__contains=str(heldout.id)).exists()


def test_a_held_out_evaluation_neither_reuses_nor_is_reused(
    project, seed_candidate, policy_version
):
    suite = import_suite(project, "0")
    first = evaluate(seed_candidate, suite, policy_version, Split.HELDOUT)
    run_all(first)

    again = evaluate(seed_candidate, suite, policy_version, Split.HELDOUT)

    assert reused_sources(again) == set()
    assert again.rollouts.filter(state=RolloutState.PENDING).count() == again.rollouts.count()
    assert not first.rollouts.exclude(cache_key="").exists()


def test_it_reuses_only_within_the_same_split(project, seed_candidate, policy_version):
    sealed = import_suite(project, "0")
    resplit = import_suite(project, "1")
    validation = evaluate(seed_candidate, sealed, policy_version, Split.VALIDATION)
    run_all(validation)

    # Proposers read search traces: a validation result must not become one.
    search = evaluate(seed_candidate, resplit, policy_version, Split.SEARCH)
    assert reused_sources(search) == set()

    # The same split of the same suite is the cache's purpose.
    again = evaluate(seed_candidate, sealed, policy_version, Split.VALIDATION)
    assert reused_sources(again) == {validation.id}
    assert again.rollouts.filter(reused_from__isnull=False).count() == again.rollouts.count()


def test_it_never_reuses_another_projects_rollouts(project, owner, seed_candidate, policy_version):
    suite = import_suite(project, "0")
    first = evaluate(seed_candidate, suite, policy_version, Split.SEARCH)
    run_all(first)
    other = project_get_or_create(slug="other", name="Another team's agent")
    membership_set(project=other, user=owner, role=Role.ADMIN)
    twin = import_seed(other, owner)
    assert twin.tree_sha == seed_candidate.tree_sha

    theirs = evaluate(twin, import_suite(other, "0"), policy_version, Split.SEARCH)

    assert reused_sources(theirs) == set()


@pytest.mark.parametrize("who", ["researcher", "reviewer", "owner"])
def test_a_held_out_rollout_page_is_not_found_outside_a_promotion(
    client, request, who, researcher, project, seed_candidate, policy_version
):
    heldout = evaluate(seed_candidate, import_suite(project, "0"), policy_version, Split.HELDOUT)
    run_all(heldout)
    rollout = heldout.rollouts.first()
    client.login(username=request.getfixturevalue(who).username, password=PASSWORD)

    response = client.get(f"/p/{project.slug}/r/{rollout.id}/")

    assert response.status_code == 404
    assert b"held-out secret" not in response.content


def test_a_search_rollout_page_still_shows(
    client, researcher, project, seed_candidate, policy_version
):
    search = evaluate(seed_candidate, import_suite(project, "0"), policy_version, Split.SEARCH)
    run_all(search)
    client.login(username="researcher", password=PASSWORD)

    response = client.get(f"/p/{project.slug}/r/{search.rollouts.first().id}/")

    assert response.status_code == 200


def test_the_migration_withdraws_results_an_older_key_carried_across_the_seal(
    project, owner, seed_candidate, policy_version
):
    """Rows written before cache version 2: a search rollout that copied a held-out one."""
    suite = import_suite(project, "1")
    heldout = evaluate(seed_candidate, import_suite(project, "0"), policy_version, Split.HELDOUT)
    run_all(heldout)
    search = evaluate(seed_candidate, suite, policy_version, Split.SEARCH)
    run_all(search)
    honest = evaluate(seed_candidate, suite, policy_version, Split.SEARCH)  # reuses `search`
    leaked, kept = list(search.rollouts.all()[:2])
    source = heldout.rollouts.first()
    Rollout.objects.filter(id=leaked.id).update(
        reused_from=source, detail=f"reused from rollout {source.id}: held-out secret"
    )
    exported = rollouts_selected(
        Selection(
            evaluation_ids=[search.id],
            splits=[Split.SEARCH],
            successful_only=False,
            min_score=None,
            last_turns=None,
        )
    )
    # Even before the migration, an export never follows a link into the sealed split.
    assert leaked.id not in set(exported.values_list("id", flat=True))
    assert kept.id in set(exported.values_list("id", flat=True))

    import_module("coevo.evaluations.migrations.0006_withdraw_sealed_cache_reuse").withdraw(
        apps, None
    )

    leaked.refresh_from_db()
    assert leaked.reused_from_id is None
    assert (leaked.outcome, leaked.score, leaked.answer) == (RolloutOutcome.INFRA_ERROR, None, None)
    assert str(source.id) not in leaked.detail and "withdrawn" in leaked.detail
    kept.refresh_from_db()
    assert kept.outcome == RolloutOutcome.PASSED
    assert honest.rollouts.filter(reused_from__isnull=False).count() == honest.rollouts.count()

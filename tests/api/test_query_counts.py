"""Issue 21: no API list runs more queries for a longer list. Each test reads a list with a
few items, then with more than a page of them (or many more of what each item carries), and
compares the queries (tests/support/queries.py prints both runs' SQL when they differ)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from coevo.exports.models import TrajectoryExport
from coevo.gates.models import Gate
from coevo.projects.models import Role
from coevo.projects.services import membership_set, project_get_or_create
from coevo.reviews.models import Approval, PromotionRequest
from coevo.reviews.services import channel_get_or_create
from coevo.suites.models import Split, Task
from coevo.training.models import Trainer, TrainingRun
from tests.campaigns.support import set_best, started_campaign
from tests.matrices.conftest import written_matrix
from tests.support.factories import (
    make_candidates,
    make_evaluation,
    make_jsonl_suite,
    make_policy_versions,
    make_proposals,
    make_rollouts,
)
from tests.support.queries import assert_same_queries, queries_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(make_client, owner):
    return make_client(owner)


def read(api, url: str):
    """Read ``url`` once (warm caches), then return a reader that counts its queries."""
    api.get(url)
    return lambda: queries_of(lambda: api.get(url))


def tasks_of(suite, count: int) -> list[Task]:
    return list(Task.objects.filter(suite=suite, split=Split.SEARCH).order_by("position")[:count])


def evaluation_with_rollouts(candidate, suite, policy_version, tasks=4):
    evaluation = make_evaluation(candidate=candidate, suite=suite, policy_version=policy_version)
    make_rollouts(evaluation, tasks_of(suite, tasks))
    return evaluation


def test_it_lists_projects_in_as_many_queries_with_many(api, owner, project):
    reader = read(api, reverse("api:projects"))
    few = reader()
    for i in range(60):
        other = project_get_or_create(slug=f"p{i}", name=f"P {i}")
        membership_set(project=other, user=owner, role=Role.VIEWER)
    assert_same_queries(few, reader(), what="GET projects/")


def test_it_lists_candidates_in_as_many_queries_with_many(api, project, seed_candidate):
    reader = read(api, reverse("api:candidates", args=[project.slug]))
    few = reader()
    make_candidates(project, 250, parent=seed_candidate)
    assert_same_queries(few, reader(), what="GET candidates/")


def test_it_lists_suites_in_as_many_queries_with_many(api, project, humaneval_suite):
    reader = read(api, reverse("api:suites", args=[project.slug]))
    few = reader()
    for i in range(6):
        rows = [{"id": f"t{j}", "input": "q", "expected": "a"} for j in range(i + 2)]
        make_jsonl_suite(project, rows, name=f"suite-{i}")
    assert_same_queries(few, reader(), what="GET suites/")


def test_it_lists_evaluations_and_tasks_in_as_many_queries_with_many(
    api, project, seed_candidate, humaneval_suite, policy_version
):
    evaluation = evaluation_with_rollouts(seed_candidate, humaneval_suite, policy_version)
    listing = read(api, reverse("api:evaluations", args=[project.slug]))
    tasks = read(api, reverse("api:evaluation_tasks", args=[project.slug, evaluation.id]))
    few, few_tasks = listing(), tasks()
    for candidate in make_candidates(project, 60, parent=seed_candidate):
        evaluation_with_rollouts(candidate, humaneval_suite, policy_version, tasks=2)
    make_rollouts(evaluation, tasks_of(humaneval_suite, 150)[4:])
    assert_same_queries(few, listing(), what="GET evaluations/")
    assert_same_queries(few_tasks, tasks(), what="GET evaluations/<id>/tasks/")


def test_it_lists_campaigns_and_proposals_in_as_many_queries_with_many(
    api, project, tmp_path, policy_version
):
    campaign = started_campaign(project, tmp_path, policy_version)
    seed = campaign.seed_candidate
    make_proposals(campaign, make_candidates(project, 3, parent=seed), start=1)
    campaigns = read(api, reverse("api:campaigns", args=[project.slug]))
    proposals = read(api, reverse("api:campaign_proposals", args=[project.slug, campaign.id]))
    few, few_proposals = campaigns(), proposals()
    make_proposals(campaign, make_candidates(project, 120, parent=seed, label="more"), start=4)
    set_best(campaign)
    for i in range(4):
        (tmp_path / f"c{i}").mkdir()
        started_campaign(project, tmp_path / f"c{i}", policy_version)
    assert_same_queries(few, campaigns(), what="GET campaigns/")
    assert_same_queries(few_proposals, proposals(), what="GET campaigns/<id>/proposals/")


def test_it_lists_channels_in_as_many_queries_with_many(api, project, seed_candidate):
    channel_get_or_create(project=project, name="production")
    reader = read(api, reverse("api:channels", args=[project.slug]))
    few = reader()
    for i in range(8):
        channel_get_or_create(project=project, name=f"canary-{i}")
    assert_same_queries(few, reader(), what="GET channels/")


def test_it_lists_matrices_in_as_many_queries_with_many(
    api, project, seed_candidate, humaneval_suite, policy_version
):
    def matrix(policies) -> None:
        written_matrix(
            project=project,
            suite=humaneval_suite,
            candidates=[seed_candidate],
            policy_versions=policies,
            passes=[[[1, 0]] * len(policies)],
        )

    matrix([policy_version])
    reader = read(api, reverse("api:matrices", args=[project.slug]))
    few = reader()
    policies = [policy_version, *make_policy_versions(policy_version, 2)]
    for _ in range(5):
        matrix(policies)
    assert_same_queries(few, reader(), what="GET matrices/")


def test_it_lists_gates_in_as_many_queries_with_many(
    api, owner, project, seed_candidate, child_candidate, humaneval_suite, policy_version
):
    def gate() -> None:
        Gate.objects.create(
            project=project,
            candidate=child_candidate,
            baseline=seed_candidate,
            against="seed",
            suite=humaneval_suite,
            policy_version=policy_version,
            candidate_evaluation=evaluation_with_rollouts(
                child_candidate, humaneval_suite, policy_version
            ),
            baseline_evaluation=evaluation_with_rollouts(
                seed_candidate, humaneval_suite, policy_version
            ),
            reasons=[{"code": "x", "message": "y"}],
            created_by=owner,
        )

    gate()
    reader = read(api, reverse("api:gates", args=[project.slug]))
    few = reader()
    for _ in range(6):
        gate()
    assert_same_queries(few, reader(), what="GET gates/")


def export(project, owner, evaluations) -> TrajectoryExport:
    made = TrajectoryExport.objects.create(project=project, format="sft", created_by=owner)
    made.evaluations.set(evaluations)
    return made


def test_it_lists_exports_and_training_runs_in_as_many_queries_with_many(
    api, owner, project, seed_candidate, humaneval_suite, policy_version
):
    evaluations = [
        evaluation_with_rollouts(seed_candidate, humaneval_suite, policy_version) for _ in range(3)
    ]
    trainer = Trainer.objects.create(name="t0", command=["train"])

    def run() -> None:
        TrainingRun.objects.create(
            project=project,
            trainer=trainer,
            export=export(project, owner, evaluations),
            parent_policy=policy_version,
            time_limit_s=60,
            created_by=owner,
        )

    run()
    exports = read(api, reverse("api:exports", args=[project.slug]))
    runs = read(api, reverse("api:training_runs", args=[project.slug]))
    trainers = read(api, reverse("api:trainers"))
    few, few_runs, few_trainers = exports(), runs(), trainers()
    for i in range(6):
        run()
        Trainer.objects.create(name=f"t{i + 1}", command=["train"])
    assert_same_queries(few, exports(), what="GET exports/")
    assert_same_queries(few_runs, runs(), what="GET training-runs/")
    assert_same_queries(few_trainers, trainers(), what="GET trainers/")


def test_it_lists_promotions_in_as_many_queries_with_many(
    api, owner, reviewer, project, seed_candidate, humaneval_suite, policy_version
):
    channel = channel_get_or_create(project=project, name="production")

    def promotion() -> None:
        [candidate] = make_candidates(project, 1, parent=seed_candidate)
        request = PromotionRequest.objects.create(
            project=project,
            channel=channel,
            candidate=candidate,
            policy_version=policy_version,
            suite=humaneval_suite,
            requester=owner,
            holder_generation=0,
            candidate_evaluation=make_evaluation(
                candidate=candidate,
                suite=humaneval_suite,
                policy_version=policy_version,
                split=Split.HELDOUT,
            ),
        )
        Approval.objects.create(
            request=request, reviewer=reviewer, requester=owner, decision="approve"
        )

    promotion()
    reader = read(api, reverse("api:promotions", args=[project.slug]))
    few = reader()
    for _ in range(6):
        promotion()
    assert_same_queries(few, reader(), what="GET promotions/")

"""The scale fill (benchmarks/scale, ``python -m benchmarks.scale``): the small scale fills real
PostgreSQL and git with consistent rows that the dashboard renders, deterministically, and the
command refuses what it must."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command
from django.db import connections
from django.db.models import Count, Q, Sum
from django.urls import reverse

from benchmarks.scale.command import Command
from benchmarks.scale.plan import SCALES
from coevo.accounts.models import ApiToken
from coevo.audit.models import AuditEvent
from coevo.campaigns.models import Campaign, Proposal
from coevo.evaluations.models import Evaluation, Rollout, TraceStep
from coevo.matrices.models import CompatibilityMatrix
from coevo.projects.models import Project
from coevo.reviews.models import Channel, PromotionRequest
from harness_store.models import Candidate
from harness_store.services import project_repo
from tests.conftest import REPO_ROOT

SMALL = SCALES["small"]


def fill(slug: str = "scale", *extra: str) -> str:
    out = io.StringIO()
    call_command(Command(), "--project", slug, "--scale", "small", *extra, stdout=out)
    return out.getvalue()


@pytest.fixture
def filled(db) -> Project:
    fill()
    return Project.objects.get(slug="scale")


def test_it_fills_the_small_scale_with_the_planned_counts(filled):
    project = filled
    assert Candidate.objects.filter(project=project).count() > SMALL.proposals_per_campaign
    assert Campaign.objects.filter(project=project).count() == SMALL.campaigns
    assert Proposal.objects.filter(campaign__project=project).count() == SMALL.proposals
    rollouts = Rollout.objects.filter(evaluation__project=project)
    assert 300 < rollouts.count() < 600
    steps = TraceStep.objects.filter(rollout__evaluation__project=project).count()
    # ~10 steps per finished rollout (the pending ones of the open evaluation have none).
    done = rollouts.filter(state="done").count()
    assert 7 * done < steps < 13 * done
    assert AuditEvent.objects.filter(
        Q(project_id=project.id) | Q(project__isnull=True)
    ).count() >= (SMALL.audit_events - 1)
    assert CompatibilityMatrix.objects.get(project=project).cells.count() == (
        SMALL.matrix_candidates * SMALL.policies
    )
    assert PromotionRequest.objects.filter(project=project).count() == SMALL.promotions
    # Outcomes and scores vary, so plots and statistics have something to show.
    outcomes = set(rollouts.values_list("outcome", flat=True))
    assert {"passed", "task_failure"} <= outcomes
    # A rollout's counters are the sums over its trace's model calls.
    rollout = rollouts.filter(state="done").annotate(n=Count("steps")).order_by("-n").first()
    calls = TraceStep.objects.filter(rollout=rollout, kind="model_call")
    assert rollout.model_calls == calls.count()
    assert rollout.prompt_tokens == calls.aggregate(t=Sum("prompt_tokens"))["t"]


def test_its_relations_are_consistent_and_lineage_is_in_git(filled):
    project = filled
    repo = project_repo(project=project)
    shas = set(Candidate.objects.filter(project=project).values_list("sha", flat=True))
    for candidate in Candidate.objects.filter(project=project):
        info = repo.commit_info(candidate.sha)
        assert info.tree_sha == candidate.tree_sha
        assert list(info.parents) == candidate.parent_shas
        assert set(candidate.parent_shas) <= shas
    assert any(len(c.parent_shas) == 2 for c in Candidate.objects.filter(project=project)) or (
        not Proposal.objects.filter(campaign__project=project, kind="merge").exists()
    )
    for proposal in Proposal.objects.filter(campaign__project=project):
        if proposal.state == "invalid":
            assert proposal.candidate_id is None and proposal.search_evaluation_id is None
            continue
        assert proposal.candidate.project_id == project.id
        assert proposal.parent_shas == proposal.candidate.parent_shas or proposal.kind == "seed"
        assert proposal.search_evaluation.candidate_id == proposal.candidate_id
    for rollout in Rollout.objects.filter(evaluation__project=project).select_related(
        "evaluation", "task"
    )[:200]:
        assert rollout.task.suite_id == rollout.evaluation.suite_id
        assert rollout.task.split == rollout.evaluation.split


def test_its_heldout_evaluations_exist_only_under_promotion_requests(filled):
    project = filled
    heldout = set(
        Evaluation.objects.filter(project=project, split="heldout").values_list("id", flat=True)
    )
    assert heldout
    under_requests = set()
    for request in PromotionRequest.objects.filter(project=project):
        under_requests |= {
            request.candidate_evaluation_id,
            request.holder_evaluation_id,
            request.baseline_evaluation_id,
        }
        assert request.evidence["version"] >= 2
    assert heldout <= under_requests
    # Sealed as in production: no cache key, and the cache never serves them.
    assert not Rollout.objects.filter(evaluation_id__in=heldout).exclude(cache_key="").exists()
    production = Channel.objects.get(project=project, name="production")
    assert production.generation == production.moves.count()


def test_the_dashboard_renders_the_filled_project(filled, client):
    project = filled
    owner = project.memberships.get(role="admin").user
    client.force_login(owner)
    campaign = Campaign.objects.filter(project=project).first()
    proposal = Proposal.objects.filter(campaign=campaign, state="evaluated").exclude(kind="seed")
    candidate = proposal.first().candidate
    evaluation = Evaluation.objects.filter(project=project, split="search").first()
    rollout = Rollout.objects.filter(evaluation=evaluation, state="done").first()
    heldout = Rollout.objects.filter(evaluation__split="heldout", evaluation__project=project)
    request = PromotionRequest.objects.filter(project=project).first()
    pages = [
        reverse("web:project", args=[project.slug]),
        reverse("web:candidate", args=[project.slug, candidate.sha]),
        reverse("web:candidate_diff", args=[project.slug, candidate.sha]),
        reverse("web:campaign", args=[project.slug, campaign.id]),
        reverse("web:evaluation", args=[project.slug, evaluation.id]),
        reverse("web:rollout", args=[project.slug, rollout.id]),
        reverse("web:promotion", args=[project.slug, request.id]),
        reverse("web:matrices", args=[project.slug]),
        reverse("web:audit", args=[project.slug]),
    ]
    for url in pages:
        response = client.get(url)
        assert response.status_code == 200, url
    trace = client.get(reverse("web:rollout", args=[project.slug, rollout.id])).content.decode()
    assert "model_call" in trace
    # A held-out rollout is sealed: not found outside its promotion request, shown there to
    # a reviewer.
    sealed = heldout.filter(evaluation_id=request.candidate_evaluation_id).first()
    assert client.get(reverse("web:rollout", args=[project.slug, sealed.id])).status_code == 404
    client.force_login(project.memberships.filter(role="reviewer").first().user)
    url = reverse("web:promotion_rollout", args=[project.slug, request.id, sealed.id])
    assert client.get(url).status_code == 200


def test_the_same_seed_writes_the_same_commits_and_scores(db):
    fill("first", "--seed", "3")
    fill("second", "--seed", "3")
    fill("third", "--seed", "4")

    def shape(slug: str) -> tuple:
        project = Project.objects.get(slug=slug)
        shas = sorted(Candidate.objects.filter(project=project).values_list("sha", flat=True))
        scores = Rollout.objects.filter(evaluation__project=project).aggregate(s=Sum("score"))
        return shas, scores["s"]

    assert shape("first") == shape("second")
    assert shape("first") != shape("third")


def test_it_refuses_a_project_that_exists_unless_replace(filled):
    with pytest.raises(CommandError, match="already exists. Pass --replace"):
        fill()
    before = set(Candidate.objects.values_list("id", flat=True))
    out = fill("scale", "--replace")
    assert "Filled project 'scale'" in out
    project = Project.objects.get(slug="scale")
    after = set(Candidate.objects.filter(project=project).values_list("id", flat=True))
    assert after and not before & after
    assert Project.objects.filter(slug="scale").count() == 1
    # The old project's tokens went with its users; the new fill's are there.
    assert ApiToken.objects.filter(user__username="scale-ci").exists()


def test_it_refuses_a_database_that_is_not_postgresql(db, monkeypatch):
    monkeypatch.setattr(connections["default"], "vendor", "sqlite")
    with pytest.raises(CommandError, match="PostgreSQL"):
        fill()
    assert not Project.objects.filter(slug="scale").exists()


def test_it_never_replaces_a_project_it_did_not_write(project, seed_candidate):
    with pytest.raises(CommandError, match="was not written by scale_fill"):
        fill(project.slug, "--replace")
    assert Candidate.objects.filter(project=project).count() == 1


def test_it_runs_as_a_module_of_the_benchmarks_from_the_repository_root():
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.scale", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m benchmarks.scale ")
    assert "--scale {full,medium,pages,small}" in result.stdout

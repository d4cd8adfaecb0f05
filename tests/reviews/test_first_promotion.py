"""A first promotion: a campaign's best candidate to an empty channel, judged on the full suite
while the campaign ran on a slice of it. The evidence compares against the campaign's seed (or
a baseline the requester picks, or says why there is none), lists every held-out task with its
traces for reviewers only, and takes search and validation scores from the suite family,
labelled with the suite each came from."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from coevo.audit.models import AuditEvent
from coevo.campaigns.models import Proposal, ProposalState, ProposerKind
from coevo.campaigns.services import campaign_create
from coevo.errors import InvalidInput
from coevo.evaluations.models import (
    Evaluation,
)
from coevo.evaluations.services import evaluation_create
from coevo.reviews.models import BaselineKind, PromotionRequest, PromotionState
from coevo.reviews.promotions.create import promotion_request_create
from coevo.reviews.promotions.decide import promotion_decide
from coevo.reviews.promotions.refresh import promotion_evidence_refresh
from coevo.reviews.selectors import channel_holder
from coevo.reviews.services import channel_get_or_create, channel_move
from coevo.suites.models import Suite
from coevo.suites.selectors import suite_family
from tests.conftest import wait_until_final
from tests.reviews.conftest import HELDOUT_KEYS, TASKS, wait_for_state
from tests.reviews.test_promotion_pages import html, login
from tests.support.factories import finish_evaluation, jsonl_rows, make_jsonl_suite
from workers.outcomes import RolloutOutcome

pytestmark = pytest.mark.django_db


@pytest.fixture
def arith_slice(project, arith_suite):
    """The campaign's suite: the search and validation tasks of arith, a slice of it (as the
    demo slices TextWorld)."""
    rows = jsonl_rows([task for task in TASKS if task[3] != "heldout"])
    suite = make_jsonl_suite(project, rows, name="arith-slice", scorer="numeric")
    Suite.objects.filter(id=suite.id).update(source=arith_suite)
    suite.refresh_from_db()
    return suite


@pytest.fixture
def campaign(project, owner, policy_version, arith_slice, guesser, asker):
    """A campaign seeded with the guesser whose best proposal is the asker."""
    campaign = campaign_create(
        project=project,
        name="evolve arith",
        seed_candidate=guesser,
        policy_version=policy_version,
        suite=arith_slice,
        strategy=[{"kind": "merge"}],
        created_by=owner,
    )
    Proposal.objects.create(
        campaign=campaign,
        sequence=1,
        kind=ProposerKind.CONFIG,
        state=ProposalState.EVALUATED,
        candidate=asker,
    )
    return campaign


@pytest.fixture
def empty_production(project):
    return channel_get_or_create(project=project, name="production")


def _evaluate(candidate, suite, split, policy_version, **results) -> Evaluation:
    evaluation = evaluation_create(
        candidate=candidate, suite=suite, split=split, policy_version=policy_version
    )
    finish_evaluation(evaluation, **results)
    return evaluation


def _request(channel, candidate, requester, suite, policy_version, **options) -> PromotionRequest:
    return promotion_request_create(
        channel=channel,
        candidate=candidate,
        policy_version=policy_version,
        requester=requester,
        suite=suite,
        **options,
    )


@pytest.fixture
def first(
    campaign, empty_production, researcher, policy_version, arith_suite, arith_slice, asker, guesser
) -> PromotionRequest:
    """The asker's first promotion, ready: on the slice it solved both search tasks and one
    validation task, the seed none; on held-out it solves h-mul only and crashes on h-sub."""
    _evaluate(asker, arith_slice, "search", policy_version, passed=["s-mul", "s-add"])
    _evaluate(guesser, arith_slice, "search", policy_version)
    _evaluate(asker, arith_slice, "validation", policy_version, passed=["v-mul"])
    request = _request(empty_production, asker, researcher, arith_suite, policy_version)
    assert (request.baseline_candidate, request.baseline_kind) == (
        guesser,
        BaselineKind.CAMPAIGN_SEED,
    )
    assert request.holder_candidate is None and request.holder_evaluation is None
    # The seed's held-out run has the request's own settings: the same sealed split and seed.
    baseline = request.baseline_evaluation
    assert (baseline.suite, baseline.split, baseline.epochs, baseline.seed) == (
        arith_suite,
        "heldout",
        request.epochs,
        request.seed,
    )
    assert baseline.policy_version == policy_version
    assert request.heldout_looks_project == 2  # the candidate's and the seed's
    finish_evaluation(
        request.candidate_evaluation,
        passed=["h-mul"],
        outcomes={"h-sub": RolloutOutcome.HARNESS_ERROR},
    )
    request = promotion_evidence_refresh(request=request)
    assert request.state == PromotionState.EVALUATING  # still waiting on the seed's run
    finish_evaluation(request.baseline_evaluation)
    request = promotion_evidence_refresh(request=request)
    assert request.state == PromotionState.READY, request.state_detail
    return request


def test_it_compares_a_first_promotion_with_the_campaign_seed(first, guesser):
    evidence = first.evidence
    assert evidence["version"] == 2
    reference = evidence["reference"]
    assert (reference["kind"], reference["sha"]) == ("campaign_seed", guesser.sha)
    assert reference["summary"] == (
        f"Compared with the campaign seed {guesser.short_sha} (of “evolve arith”) because "
        "production held nothing."
    )
    assert evidence["holder"] is None and evidence["baseline"]["sha"] == guesser.sha
    comparison = evidence["comparison"]
    assert comparison["flips"]["fixed"] == ["h-mul"]
    assert comparison["difference"] == pytest.approx(1 / 3)
    [row] = comparison["flipped_tasks"]
    assert Evaluation.objects.get(rollouts__id=row["reference_rollout"]).candidate == guesser
    # HDA: +100 pts on the (slice's) search split, +33 pts on held-out.
    gap = evidence["generalization"]
    assert gap["search_gain"] == 1.0 and gap["search_suite"] == "arith-slice@v1"
    assert gap["heldout_gain"] == pytest.approx(1 / 3)
    assert gap["not_generalized"] == pytest.approx(2 / 3)
    assert evidence["compute"]["tokens_per_task_delta"] is not None
    assert evidence["diff"]["base"] == guesser.sha  # what the campaign changed


def test_it_takes_search_and_validation_from_the_slice_and_says_so(first, policy_version):
    candidate, seed = first.evidence["candidate"], first.evidence["baseline"]
    search = candidate["scores"]["search"]
    assert (search["mean"], search["suite"], search["same_suite"], search["slice_of"]) == (
        1.0,
        "arith-slice@v1",
        False,
        "arith",
    )
    assert candidate["scores"]["validation"]["mean"] == 0.5
    # Held-out only ever from the request's own sealed evaluations.
    assert candidate["scores"]["heldout"]["evaluation"] == str(first.candidate_evaluation_id)
    assert seed["scores"]["heldout"]["evaluation"] == str(first.baseline_evaluation_id)
    assert seed["scores"]["validation"] is None
    assert seed["missing"]["validation"] == (
        f"No validation evaluation of {seed['sha'][:12]} on arith or its slices under policy "
        f"{policy_version.name}."
    )


def test_it_lists_every_held_out_task_with_both_sides(first, asker, guesser):
    listed = first.evidence["heldout_tasks"]
    assert (listed["total"], listed["truncated"]) == (3, False)
    rows = {row["task"]: row for row in listed["tasks"]}
    assert list(rows) == HELDOUT_KEYS  # in suite order
    assert rows["h-mul"]["flip"] == "fixed" and rows["h-mul"]["changed"]
    assert rows["h-add"]["flip"] == "both_fail" and not rows["h-add"]["changed"]
    assert rows["h-sub"]["candidate"]["outcome"] == RolloutOutcome.HARNESS_ERROR
    assert rows["h-mul"]["candidate"]["score"] == 1.0
    assert rows["h-mul"]["reference"]["score"] == 0.0
    for row in rows.values():
        assert Evaluation.objects.get(rollouts__id=row["candidate"]["rollout"]).candidate == asker
        assert Evaluation.objects.get(rollouts__id=row["reference"]["rollout"]).candidate == guesser


def test_the_review_page_shows_the_seed_and_every_held_out_trace_to_reviewers(
    first, reviewer, researcher, viewer, outsider, guesser
):
    urls = {
        reverse("web:promotion_rollout", args=[first.project.slug, first.id, row[side]["rollout"]])
        for row in first.evidence["heldout_tasks"]["tasks"]
        for side in ("candidate", "reference")
    }
    assert len(urls) == 6
    client = login(reviewer)
    body = html(client.get(reverse("web:promotion", args=[first.project.slug, first.id])))
    assert "Compared with the campaign seed" in body and "because production held nothing" in body
    table = re.search(r'<table class="table" id="heldout-tasks">(.*?)</table>', body, re.S)
    assert table and "<th>campaign seed</th>" in table.group(1)
    assert '<tr class="flipped flip-fixed"><td>h-mul</td>' in table.group(1)
    assert all(url in table.group(1) for url in urls)
    scores = re.search(r'<table class="table" id="scores">(.*?)</table>', body, re.S).group(1)
    assert "campaign seed" in scores and "on arith-slice@v1 (a slice of arith)" in scores
    assert "No validation evaluation of" in scores
    for url in urls:
        assert client.get(url).status_code == 200

    # Members without the reviewer role: no list, and the links stay shut (the existing gate).
    for user in (researcher, viewer):
        member = login(user)
        body = html(member.get(reverse("web:promotion", args=[first.project.slug, first.id])))
        assert 'id="heldout-tasks"' not in body and "h-add" not in body
        assert "Compared with the campaign seed" in body  # which reference is not sealed
        for url in urls:
            assert member.get(url).status_code == 403
    stranger = login(outsider)
    for url in urls:
        assert stranger.get(url).status_code == 404


def test_approval_moves_the_empty_channel_to_the_candidate(first, reviewer, asker, project):
    request = promotion_decide(request=first, reviewer=reviewer, decision="approve")

    assert request.state == PromotionState.APPROVED
    assert channel_holder(project=project, name="production") == asker
    move = request.channel_move
    assert move.from_candidate is None and move.to_candidate == asker  # the seed is evidence only
    requested = AuditEvent.objects.get(action="promotion.requested")
    assert requested.after["baseline"] == first.baseline_candidate.sha
    assert requested.after["baseline_kind"] == "campaign_seed"


def test_a_picked_baseline_is_compared_instead(
    empty_production, researcher, policy_version, arith_suite, asker, guesser
):
    # The asker came from no campaign: without a pick there would be no comparison.
    request = _request(
        empty_production, asker, researcher, arith_suite, policy_version, baseline=guesser
    )
    assert (request.baseline_candidate, request.baseline_kind) == (guesser, BaselineKind.PICKED)
    finish_evaluation(request.candidate_evaluation, passed=HELDOUT_KEYS)
    finish_evaluation(request.baseline_evaluation)
    request = promotion_evidence_refresh(request=request)

    reference = request.evidence["reference"]
    assert reference["kind"] == "picked"
    assert reference["summary"] == (
        f"Compared with the baseline {guesser.short_sha} that researcher picked, because "
        "production held nothing."
    )
    assert request.evidence["comparison"]["flip_counts"]["fixed"] == 3


def test_it_refuses_a_baseline_it_cannot_use(
    project, empty_production, production_other, researcher, policy_version, arith_suite, asker
):
    with pytest.raises(InvalidInput, match="the candidate itself"):
        _request(empty_production, asker, researcher, arith_suite, policy_version, baseline=asker)
    with pytest.raises(InvalidInput, match="A baseline is only for an empty channel"):
        _request(production_other, asker, researcher, arith_suite, policy_version, baseline=asker)
    assert not PromotionRequest.objects.filter(candidate=asker).exists()


@pytest.fixture
def production_other(project, owner, guesser, policy_version):
    """A channel holding the guesser."""
    channel = channel_get_or_create(project=project, name="staging")
    channel_move(channel=channel, candidate=guesser, policy_version=policy_version, moved_by=owner)
    channel.refresh_from_db()
    return channel


def test_it_says_why_there_is_no_comparison(
    empty_production, researcher, reviewer, policy_version, arith_suite, asker
):
    request = _request(empty_production, asker, researcher, arith_suite, policy_version)
    assert request.baseline_candidate is None and request.baseline_evaluation is None
    finish_evaluation(request.candidate_evaluation, passed=["h-mul"])
    request = promotion_evidence_refresh(request=request)

    evidence = request.evidence
    assert evidence["reference"]["kind"] is None
    summary = evidence["reference"]["summary"]
    assert "production held nothing" in summary and "came from no campaign" in summary
    assert "coevo promote --baseline" in summary
    assert evidence["comparison"] is None and evidence["generalization"]["search_gain"] is None
    assert evidence["generalization"]["note"] == (
        "No search gain: there is no reference to compare with."
    )
    rows = evidence["heldout_tasks"]["tasks"]
    assert [row["task"] for row in rows] == HELDOUT_KEYS
    assert all(row["reference"] is None and row["flip"] is None for row in rows)
    assert evidence["candidate"]["missing"]["search"].startswith(
        "No search evaluation of this candidate on arith or its slices"
    )
    body = html(
        login(reviewer).get(reverse("web:promotion", args=[request.project.slug, request.id]))
    )
    assert "came from no campaign" in body and 'id="heldout-tasks"' in body


def test_a_campaign_seed_has_no_baseline_of_its_own(
    campaign, empty_production, researcher, policy_version, arith_suite, guesser
):
    # A started campaign evaluates its seed as proposal 0.
    Proposal.objects.create(
        campaign=campaign,
        sequence=0,
        kind=ProposerKind.SEED,
        state=ProposalState.EVALUATED,
        candidate=guesser,
    )
    request = _request(empty_production, guesser, researcher, arith_suite, policy_version)
    assert request.campaign == campaign and request.baseline_candidate is None
    finish_evaluation(request.candidate_evaluation)
    request = promotion_evidence_refresh(request=request)

    assert (
        "the candidate is the seed of its campaign “evolve arith”"
        in (request.evidence["reference"]["summary"])
    )


def test_it_prefers_a_suite_both_sides_were_evaluated_on(
    campaign, empty_production, researcher, policy_version, arith_suite, arith_slice, asker, guesser
):
    """The request's own suite first; but a search gain needs both sides on one suite, so when
    only the slice has both, both come from the slice."""
    _evaluate(asker, arith_suite, "search", policy_version, passed=["s-mul"])
    _evaluate(asker, arith_slice, "search", policy_version, passed=["s-mul", "s-add"])
    _evaluate(guesser, arith_slice, "search", policy_version)
    _evaluate(asker, arith_suite, "validation", policy_version, passed=["v-mul", "v-add"])
    request = _request(empty_production, asker, researcher, arith_suite, policy_version)
    finish_evaluation(request.candidate_evaluation)
    finish_evaluation(request.baseline_evaluation)
    evidence = promotion_evidence_refresh(request=request).evidence

    assert evidence["candidate"]["scores"]["search"]["suite"] == "arith-slice@v1"
    assert evidence["baseline"]["scores"]["search"]["suite"] == "arith-slice@v1"
    assert evidence["generalization"]["search_gain"] == 1.0
    validation = evidence["candidate"]["scores"]["validation"]
    assert (validation["suite"], validation["same_suite"]) == ("arith@v1", True)


def test_the_suite_family_holds_versions_and_slices_only(project, arith_suite, arith_slice):
    other = make_jsonl_suite(project, jsonl_rows([("x", "1 =", "1")]), name="other")
    assert set(suite_family(suite=arith_suite)) == {arith_suite, arith_slice}
    assert set(suite_family(suite=arith_slice)) == {arith_suite, arith_slice}
    assert set(suite_family(suite=other)) == {other}


def test_a_retargeted_request_drops_its_baseline_for_the_new_holder(
    first, empty_production, owner, asker, guesser, policy_version, researcher
):
    # Someone else fills production meanwhile: the holder is the reference from now on.
    channel_move(
        channel=empty_production, candidate=guesser, policy_version=policy_version, moved_by=owner
    )
    request = promotion_evidence_refresh(request=first, by=researcher)

    assert request.state == PromotionState.EVALUATING
    assert request.holder_candidate == guesser and request.holder_evaluation is not None
    assert request.baseline_candidate is None and request.baseline_evaluation is None
    assert request.baseline_kind == ""
    event = AuditEvent.objects.get(action="promotion.retargeted")
    assert event.before["baseline"] == guesser.sha and event.after["baseline"] is None


def test_older_evidence_still_renders(first, reviewer):
    """Evidence stored before baselines (version 1): no reference, no task list, flipped
    tasks naming the reference "holder"."""
    old = {
        key: value
        for key, value in first.evidence.items()
        if key not in ("reference", "baseline", "heldout_tasks")
    }
    old["version"] = 1
    old["comparison"] = {
        **old["comparison"],
        "flipped_tasks": [
            {
                "task": row["task"],
                "flip": row["flip"],
                "holder_score": row["reference_score"],
                "candidate_score": row["candidate_score"],
                "holder_rollout": row["reference_rollout"],
                "candidate_rollout": row["candidate_rollout"],
            }
            for row in old["comparison"]["flipped_tasks"]
        ],
    }
    PromotionRequest.objects.filter(id=first.id).update(evidence=old)

    response = login(reviewer).get(reverse("web:promotion", args=[first.project.slug, first.id]))
    body = html(response)
    assert response.status_code == 200
    assert "No comparison: production held nothing." in body
    assert '<table class="table" id="flips">' in body and "h-mul" in body
    # Its comparison reads through the same verdict line as today's (issue 38).
    assert 'id="comparison-verdict">' in body and "too few tasks (n=3) for an interval" in body


@pytest.mark.django_db(transaction=True)
def test_a_first_promotion_on_a_real_worker(
    celery_worker_thread,
    project,
    owner,
    reviewer,
    researcher,
    policy_version,
    scripted_policy,
    arith_suite,
    arith_slice,
    campaign,
    asker,
    guesser,
):
    scripted_policy.rules.extend((question, f" {answer}") for _, question, answer, _ in TASKS)
    for candidate in (asker, guesser):
        wait_until_final(
            evaluation_create(
                candidate=candidate,
                suite=arith_slice,
                split="search",
                policy_version=policy_version,
            )
        )
    production = channel_get_or_create(project=project, name="production")

    request = _request(production, asker, researcher, arith_suite, policy_version)
    request = wait_for_state(request, [PromotionState.READY, PromotionState.FAILED])

    assert request.state == PromotionState.READY, request.state_detail
    evidence = request.evidence
    assert evidence["reference"]["kind"] == "campaign_seed"
    assert sorted(evidence["comparison"]["flips"]["fixed"]) == sorted(HELDOUT_KEYS)
    assert all(row["changed"] for row in evidence["heldout_tasks"]["tasks"])
    gap = evidence["generalization"]
    assert (gap["search_gain"], gap["heldout_gain"], gap["gap"]) == (1.0, 1.0, 0.0)
    request = promotion_decide(request=request, reviewer=reviewer, decision="approve")
    assert request.state == PromotionState.APPROVED
    assert channel_holder(project=project, name="production") == asker


def test_the_request_form_picks_a_baseline(
    project, researcher, arith_suite, asker, guesser, policy_version, empty_production
):
    client = login(researcher)
    url = reverse("web:promotion_new", args=[project.slug])
    assert 'id="baseline"' in html(client.get(url))
    values = {
        "candidate": asker.sha,
        "policy_version": policy_version.name,
        "channel": "production",
        "suite": str(arith_suite.id),
        "epochs": "1",
        "baseline": "f" * 40,
    }
    response = client.post(url, values)
    assert response.status_code == 400 and "Baseline: No candidate" in html(response)
    assert not PromotionRequest.objects.exists()

    response = client.post(url, {**values, "baseline": guesser.sha})

    request = PromotionRequest.objects.get()
    assert response.status_code == 302
    assert (request.baseline_candidate, request.baseline_kind) == (guesser, "picked")
    page = html(client.get(reverse("web:promotion", args=[project.slug, request.id])))
    assert f"Will compare with the baseline {guesser.short_sha}." in page

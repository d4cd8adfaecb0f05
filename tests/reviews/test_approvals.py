"""Approvals: a reviewer other than the requester (in the service and in the database), the
project's required count, rejection, and stale evidence blocking approval until refreshed."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from coevo.errors import InvalidState, PermissionDenied
from coevo.evaluations.models import Evaluation
from coevo.projects.models import Role
from coevo.projects.services import membership_set
from coevo.reviews.models import Approval, PromotionState
from coevo.reviews.promotions import decide
from coevo.reviews.promotions.create import promotion_request_create
from coevo.reviews.promotions.decide import promotion_comment, promotion_decide
from coevo.reviews.promotions.refresh import promotion_evidence_refresh
from coevo.reviews.selectors import (
    channel_holder,
    promotion_comments,
    promotion_is_stale,
)
from coevo.reviews.services import channel_move
from tests.reviews.conftest import HELDOUT_KEYS
from tests.support.factories import ASKS_THE_MODEL, finish_evaluation, make_agent_candidate

pytestmark = pytest.mark.django_db


@pytest.fixture
def ready_request(researcher, policy_version, arith_suite, asker, production):
    """A request of the researcher, its held-out evaluations finished: ready to decide."""
    request = promotion_request_create(
        channel=production,
        candidate=asker,
        policy_version=policy_version,
        requester=researcher,
        suite=arith_suite,
    )
    finish_evaluation(request.holder_evaluation)
    finish_evaluation(request.candidate_evaluation, passed=HELDOUT_KEYS)
    request = promotion_evidence_refresh(request=request)
    assert request.state == PromotionState.READY
    return request


def test_it_refuses_a_promotion_approved_by_its_requester(
    project, researcher, ready_request, guesser
):
    # Even a requester who is (or becomes) a reviewer of the project.
    membership_set(project=project, user=researcher, role=Role.REVIEWER)

    with pytest.raises(PermissionDenied, match="another reviewer"):
        promotion_decide(request=ready_request, reviewer=researcher, decision="approve")

    ready_request.refresh_from_db()
    assert ready_request.state == PromotionState.READY
    assert not Approval.objects.exists()
    assert channel_holder(project=project, name="production") == guesser


def test_it_refuses_a_crafted_approval_by_the_requester_in_the_database(researcher, ready_request):
    with pytest.raises(IntegrityError, match="approval_not_by_requester"), transaction.atomic():
        Approval.objects.create(
            request=ready_request,
            reviewer=researcher,
            requester=researcher,
            decision="approve",
        )


def test_it_refuses_a_crafted_approval_with_a_false_requester_copy(reviewer, owner, ready_request):
    # The copy must be the request's requester: else the check above could be dodged.
    with pytest.raises(IntegrityError, match="approval_requester_matches"), transaction.atomic():
        Approval.objects.create(
            request=ready_request, reviewer=reviewer, requester=owner, decision="approve"
        )


def test_it_refuses_a_second_decision_by_the_same_reviewer(project, reviewer, ready_request):
    project.required_approvals = 2
    project.save()
    ready_request.required_approvals = 2
    ready_request.save()
    promotion_decide(request=ready_request, reviewer=reviewer, decision="approve")

    with pytest.raises(InvalidState, match="already decided"):
        promotion_decide(request=ready_request, reviewer=reviewer, decision="approve")
    with pytest.raises(IntegrityError, match="approval_one_per_reviewer"), transaction.atomic():
        Approval.objects.create(
            request=ready_request,
            reviewer=reviewer,
            requester=ready_request.requester,
            decision="reject",
        )


def test_it_refuses_decisions_by_researchers_and_viewers(
    project, outsider, policy_version, arith_suite, asker, production, ready_request
):
    for role in (Role.VIEWER, Role.RESEARCHER):
        membership_set(project=project, user=outsider, role=role)
        with pytest.raises(PermissionDenied, match="Only reviewers"):
            promotion_decide(request=ready_request, reviewer=outsider, decision="approve")
    assert not Approval.objects.exists()


def test_it_waits_for_the_required_number_of_approvals(
    project,
    researcher,
    reviewer,
    second_reviewer,
    policy_version,
    arith_suite,
    asker,
    guesser,
    production,
):
    project.required_approvals = 2
    project.save()
    request = promotion_request_create(
        channel=production,
        candidate=asker,
        policy_version=policy_version,
        requester=researcher,
        suite=arith_suite,
    )
    assert request.required_approvals == 2
    finish_evaluation(request.holder_evaluation)
    finish_evaluation(request.candidate_evaluation, passed=HELDOUT_KEYS)
    promotion_evidence_refresh(request=request)

    request = promotion_decide(request=request, reviewer=reviewer, decision="approve")
    assert request.state == PromotionState.READY
    assert channel_holder(project=project, name="production") == guesser

    request = promotion_decide(request=request, reviewer=second_reviewer, decision="approve")
    assert request.state == PromotionState.APPROVED
    assert channel_holder(project=project, name="production") == asker
    assert "2 of 2" in request.state_detail


def test_it_ends_a_request_on_a_reject(project, reviewer, ready_request, guesser):
    request = promotion_decide(
        request=ready_request, reviewer=reviewer, decision="reject", comment="search overfit"
    )

    assert request.state == PromotionState.REJECTED
    assert "search overfit" in request.state_detail and request.decided_at
    assert channel_holder(project=project, name="production") == guesser
    with pytest.raises(InvalidState, match="no longer be decided"):
        promotion_decide(request=request, reviewer=reviewer, decision="approve")


def test_it_refuses_to_decide_before_the_evidence_is_ready(
    reviewer, researcher, policy_version, arith_suite, asker, production
):
    request = promotion_request_create(
        channel=production,
        candidate=asker,
        policy_version=policy_version,
        requester=researcher,
        suite=arith_suite,
    )
    with pytest.raises(InvalidState, match="still running"):
        promotion_decide(request=request, reviewer=reviewer, decision="approve")


def test_it_blocks_approval_on_stale_evidence_until_refreshed(
    project, owner, reviewer, policy_version, ready_request, tmp_path, guesser, asker
):
    # Someone approves first (2 required), then the channel moves under the request.
    project.required_approvals = 2
    ready_request.required_approvals = 2
    ready_request.save()
    promotion_decide(request=ready_request, reviewer=owner, decision="approve")
    hotfix = make_agent_candidate(
        project, tmp_path, "hotfix", ASKS_THE_MODEL + "\n# hotfix\n", parent=guesser
    )
    production = ready_request.channel
    production.refresh_from_db()
    channel_move(channel=production, candidate=hotfix, policy_version=None, moved_by=owner)
    assert promotion_is_stale(request=ready_request)

    with pytest.raises(InvalidState, match="refresh the evidence"):
        promotion_decide(request=ready_request, reviewer=reviewer, decision="approve")

    request = promotion_evidence_refresh(request=ready_request, by=reviewer)
    assert request.state == PromotionState.EVALUATING
    assert request.holder_candidate == hotfix and request.holder_generation == 2
    assert request.holder_evaluation.candidate == hotfix
    assert not Approval.objects.filter(request=request).exists()  # given on other evidence
    assert "owner" in request.state_detail
    assert request.heldout_looks_project == 3
    assert not promotion_is_stale(request=request)
    with pytest.raises(InvalidState, match="still running"):
        promotion_decide(request=request, reviewer=reviewer, decision="approve")

    finish_evaluation(request.holder_evaluation)
    request = promotion_evidence_refresh(request=request)
    assert request.state == PromotionState.READY
    assert request.evidence["holder"]["sha"] == hotfix.sha
    promotion_decide(request=request, reviewer=reviewer, decision="approve")
    request = promotion_decide(request=request, reviewer=owner, decision="approve")

    assert request.state == PromotionState.APPROVED
    assert (request.channel_move.from_candidate, request.channel_move.to_candidate) == (
        hotfix,
        asker,
    )
    assert Evaluation.objects.filter(candidate=hotfix, split="heldout").count() == 1


def test_it_refuses_an_approval_when_the_channel_moves_during_the_decision(
    project, owner, reviewer, ready_request, tmp_path, guesser, monkeypatch
):
    """The staleness check and the move are separate reads: the move's compare-and-swap on
    the evidence's generation is what finally holds, and the approval rolls back with it."""
    monkeypatch.setattr(decide, "promotion_is_stale", lambda request: False)
    hotfix = make_agent_candidate(
        project, tmp_path, "hotfix", ASKS_THE_MODEL + "\n# hotfix\n", parent=guesser
    )
    production = ready_request.channel
    production.refresh_from_db()
    channel_move(channel=production, candidate=hotfix, policy_version=None, moved_by=owner)

    with pytest.raises(InvalidState, match="moved while this move was prepared"):
        promotion_decide(request=ready_request, reviewer=reviewer, decision="approve")

    assert not Approval.objects.exists()
    assert channel_holder(project=project, name="production") == hotfix


def test_it_keeps_comments_in_order(researcher, reviewer, ready_request, project, outsider):
    promotion_comment(request=ready_request, author=reviewer, body="why is h-sub fixed?")
    promotion_comment(request=ready_request, author=researcher, body="  the model computes  ")
    with pytest.raises(PermissionDenied):
        promotion_comment(request=ready_request, author=outsider, body="hi")

    bodies = [c.body for c in promotion_comments(request=ready_request)]
    assert bodies == ["why is h-sub fixed?", "the model computes"]

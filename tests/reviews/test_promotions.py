"""Promotion requests end to end on a real worker (request → held-out runs → evidence →
approval by another reviewer → channel moved and tagged), and what a request starts: the
holder's evaluation reused when cached, none for an empty channel, one open request at a time;
rollback; webhooks and retention."""

from __future__ import annotations

import git
import pytest

from coevo.audit.models import AuditEvent
from coevo.errors import InvalidInput, InvalidState, PermissionDenied
from coevo.evaluations.models import Evaluation, EvaluationState
from coevo.evaluations.retention import protected_evaluations
from coevo.projects.models import Role
from coevo.projects.services import membership_set
from coevo.reviews.models import ChannelMove, PromotionRequest, PromotionState
from coevo.reviews.promotions.create import promotion_request_create
from coevo.reviews.promotions.decide import promotion_cancel, promotion_decide
from coevo.reviews.promotions.refresh import promotion_evidence_refresh, promotions_refresh_open
from coevo.reviews.selectors import channel_holder
from coevo.reviews.services import channel_get_or_create, channel_move, channel_rollback
from coevo.suites.models import Split
from harness_store.services import project_repo
from tests.reviews.conftest import HELDOUT_KEYS, TASKS, wait_for_state
from tests.support.factories import ASKS_THE_MODEL, finish_evaluation, make_agent_candidate


def tags(project) -> dict[str, str]:
    repo = git.Repo(project_repo(project=project).path)
    return {tag.name: tag.commit.hexsha for tag in repo.tags}


@pytest.mark.django_db(transaction=True)
def test_it_promotes_a_candidate_end_to_end_on_a_real_worker(
    celery_worker_thread,
    project,
    owner,
    reviewer,
    researcher,
    policy_version,
    scripted_policy,
    arith_suite,
    guesser,
    asker,
    production,
):
    scripted_policy.rules.extend((question, f" {answer}") for _, question, answer, _ in TASKS)

    request = promotion_request_create(
        channel=production,
        candidate=asker,
        policy_version=policy_version,
        requester=researcher,
        suite=arith_suite,
    )
    assert request.state == PromotionState.EVALUATING
    assert request.holder_candidate == guesser and request.holder_generation == 1
    assert request.heldout_looks_project == 2  # the candidate's and the holder's runs
    request = wait_for_state(request, [PromotionState.READY, PromotionState.FAILED])

    assert request.state == PromotionState.READY, request.state_detail
    evidence = request.evidence
    assert evidence["candidate"]["scores"]["heldout"]["mean"] == 1.0
    assert evidence["holder"]["scores"]["heldout"]["mean"] == 0.0
    comparison = evidence["comparison"]
    assert sorted(comparison["flips"]["fixed"]) == sorted(HELDOUT_KEYS)
    assert comparison["difference"] == 1.0
    flipped = {row["task"]: row for row in comparison["flipped_tasks"]}
    assert set(flipped) == set(HELDOUT_KEYS)
    for row in flipped.values():  # links to both traces of every flipped task
        assert Evaluation.objects.get(rollouts__id=row["candidate_rollout"]).candidate == asker
        assert Evaluation.objects.get(rollouts__id=row["reference_rollout"]).candidate == guesser
    assert "ctx.llm.complete" in evidence["diff"]["text"]
    assert [c["sha"] for c in evidence["lineage"]["commits"]] == [asker.sha]
    assert evidence["lineage"]["holder_is_ancestor"] is True

    # The requester cannot approve; another reviewer can, and the channel moves.
    with pytest.raises(PermissionDenied):
        promotion_decide(request=request, reviewer=researcher, decision="approve")
    request = promotion_decide(
        request=request, reviewer=reviewer, decision="approve", comment="held-out gain is real"
    )

    assert request.state == PromotionState.APPROVED
    assert channel_holder(project=project, name="production") == asker
    move = request.channel_move
    assert move.reason == f"promotion {request.id}" and move.moved_by == reviewer
    assert (move.from_candidate, move.to_candidate) == (guesser, asker)
    assert tags(project)["production"] == asker.sha
    assert tags(project)[move.tag] == asker.sha
    actions = set(AuditEvent.objects.filter(project=project).values_list("action", flat=True))
    assert {"promotion.requested", "promotion.ready", "promotion.approved", "channel.moved"} <= (
        actions
    )


def _request(channel, candidate, requester, suite, policy_version):
    return promotion_request_create(
        channel=channel,
        candidate=candidate,
        policy_version=policy_version,
        requester=requester,
        suite=suite,
    )


@pytest.mark.django_db
def test_it_evaluates_only_the_candidate_for_an_empty_channel(
    project, researcher, policy_version, arith_suite, asker
):
    staging = channel_get_or_create(project=project, name="staging")

    request = _request(staging, asker, researcher, arith_suite, policy_version)
    assert request.holder_candidate is None and request.holder_evaluation is None
    assert request.candidate_evaluation.split == Split.HELDOUT
    finish_evaluation(request.candidate_evaluation, passed=["h-mul"])
    request = promotion_evidence_refresh(request=request)

    assert request.state == PromotionState.READY
    assert request.evidence["holder"] is None and request.evidence["comparison"] is None
    assert request.evidence["candidate"]["scores"]["heldout"]["n_tasks"] == 3
    assert request.evidence["generalization"]["heldout_gain"] is None


@pytest.mark.django_db
def test_it_reuses_a_finished_held_out_evaluation_of_the_holder(
    project, researcher, policy_version, arith_suite, guesser, asker, production, tmp_path
):
    first = _request(production, asker, researcher, arith_suite, policy_version)
    finish_evaluation(first.holder_evaluation)
    finish_evaluation(first.candidate_evaluation)
    promotion_cancel(request=first, by=researcher)
    other = make_agent_candidate(
        project, tmp_path, "other", ASKS_THE_MODEL + "\n# other\n", parent=guesser
    )

    second = _request(production, other, researcher, arith_suite, policy_version)

    assert second.holder_evaluation_id == first.holder_evaluation_id
    assert Evaluation.objects.filter(candidate=guesser, split=Split.HELDOUT).count() == 1
    assert second.heldout_looks_project == 3  # two looks of the first request, one new


@pytest.mark.django_db
def test_it_returns_the_open_request_instead_of_starting_another(
    project, researcher, owner, policy_version, arith_suite, asker, production
):
    first = _request(production, asker, researcher, arith_suite, policy_version)
    again = _request(production, asker, owner, arith_suite, policy_version)

    assert again.id == first.id
    assert PromotionRequest.objects.count() == 1
    assert Evaluation.objects.filter(split=Split.HELDOUT).count() == 2


@pytest.mark.django_db
def test_it_refuses_requests_from_viewers_and_outsiders(
    project, outsider, policy_version, arith_suite, asker, production
):
    with pytest.raises(PermissionDenied):
        _request(production, asker, outsider, arith_suite, policy_version)
    membership_set(project=project, user=outsider, role=Role.VIEWER)
    with pytest.raises(PermissionDenied):
        _request(production, asker, outsider, arith_suite, policy_version)
    assert not Evaluation.objects.filter(split=Split.HELDOUT).exists()


@pytest.mark.django_db
def test_it_refuses_to_promote_the_holder_itself(
    researcher, policy_version, arith_suite, guesser, production
):
    with pytest.raises(InvalidInput, match="already holds"):
        _request(production, guesser, researcher, arith_suite, policy_version)


@pytest.mark.django_db
def test_it_fails_a_request_whose_held_out_evaluation_failed(
    researcher, policy_version, arith_suite, asker, production
):
    request = _request(production, asker, researcher, arith_suite, policy_version)
    finish_evaluation(request.holder_evaluation)
    finish_evaluation(
        request.candidate_evaluation, state=EvaluationState.FAILED, detail="worker lost"
    )

    request = promotion_evidence_refresh(request=request)

    assert request.state == PromotionState.FAILED
    assert "candidate's held-out evaluation failed" in request.state_detail
    assert request.evidence == {}


# --- rollback ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_it_rolls_back_to_the_previous_holder_in_one_action(
    project, owner, reviewer, policy_version, guesser, asker, production
):
    channel_move(channel=production, candidate=asker, policy_version=None, moved_by=owner)

    move = channel_rollback(channel=production, by=reviewer, reason="regression in prod")

    production.refresh_from_db()
    assert production.candidate == guesser and production.policy_version == policy_version
    assert move.number == 3 and move.reverts.number == 2
    assert move.reason == "rollback of move 2: regression in prod"
    assert tags(project)["production"] == guesser.sha
    assert AuditEvent.objects.filter(action="channel.rolled_back", target_id=str(production.id))


@pytest.mark.django_db
def test_it_walks_back_through_the_history_on_repeated_rollbacks(
    project, owner, reviewer, policy_version, guesser, asker, production, tmp_path
):
    third = make_agent_candidate(
        project, tmp_path, "third", ASKS_THE_MODEL + "\n# 3\n", parent=asker
    )
    channel_move(channel=production, candidate=asker, policy_version=None, moved_by=owner)
    production.refresh_from_db()
    channel_move(channel=production, candidate=third, policy_version=None, moved_by=owner)

    channel_rollback(channel=production, by=reviewer)
    assert channel_holder(project=project, name="production") == asker
    channel_rollback(channel=production, by=reviewer)  # further back, not back to `third`
    assert channel_holder(project=project, name="production") == guesser
    with pytest.raises(InvalidState, match="no previous holder"):
        channel_rollback(channel=production, by=reviewer)
    assert ChannelMove.objects.filter(channel=production).count() == 5


@pytest.mark.django_db
def test_it_refuses_a_rollback_by_a_researcher(researcher, owner, asker, production):
    channel_move(channel=production, candidate=asker, policy_version=None, moved_by=owner)
    with pytest.raises(PermissionDenied):
        channel_rollback(channel=production, by=researcher)
    production.refresh_from_db()
    assert production.candidate == asker


# --- notifications and retention --------------------------------------------------------------


@pytest.mark.django_db
def test_it_notifies_webhooks_once_a_move_commits(
    monkeypatch, django_capture_on_commit_callbacks, project, owner, asker, production
):
    import coevo.reviews.services as services  # where channel_move looks it up

    sent = []
    monkeypatch.setattr(services, "webhooks_notify", lambda **kwargs: sent.append(kwargs))
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        channel_move(channel=production, candidate=asker, policy_version=None, moved_by=owner)
    assert sent == []  # nothing before the commit
    for callback in callbacks:
        callback()

    assert [(s["project"], s["event"]) for s in sent] == [(project, "channel.moved")]
    payload = sent[0]["payload"]
    assert payload["channel"] == "production" and payload["kind"] == "move"
    assert payload["to"]["candidate"] == asker.sha and payload["moved_by"] == "owner"


@pytest.mark.django_db
def test_it_keeps_the_traces_of_what_promotion_requests_reference(
    researcher, policy_version, arith_suite, asker, production
):
    request = _request(production, asker, researcher, arith_suite, policy_version)

    kept = set(protected_evaluations().values_list("id", flat=True))
    assert {request.candidate_evaluation_id, request.holder_evaluation_id} <= kept


@pytest.mark.django_db
def test_it_catches_up_on_requests_whose_signal_was_missed(
    researcher, policy_version, arith_suite, asker, production
):
    request = _request(production, asker, researcher, arith_suite, policy_version)
    assert promotions_refresh_open() == 0  # still running: nothing to do
    finish_evaluation(request.holder_evaluation)
    finish_evaluation(request.candidate_evaluation, passed=HELDOUT_KEYS)  # no signal sent

    assert promotions_refresh_open() == 1
    request.refresh_from_db()
    assert request.state == PromotionState.READY
    assert promotions_refresh_open() == 0  # only evaluating requests are looked at

"""Raced rounds (batch_size > 1): three proposals drafted together, raced on the search split
task by task; the clearly worse one eliminated before it finishes, its unsent rollouts never
run nor charged, the survivors validated."""

from __future__ import annotations

import contextlib
import time

import pytest

from coevo.campaigns.models import CampaignState, Proposal, ProposalState
from coevo.campaigns.racing import RACE_AHEAD_TASKS
from coevo.campaigns.runner import campaign_advance
from coevo.campaigns.selectors import (
    campaign_points,
    campaign_progress,
    campaign_rollouts_saved,
)
from coevo.campaigns.services import (
    campaign_create,
    campaign_pause,
    campaign_resume,
    campaign_stop,
)
from coevo.errors import InvalidInput
from coevo.evaluations.models import (
    Budget,
    Evaluation,
    EvaluationState,
    LedgerEntry,
    LedgerKind,
    Rollout,
    RolloutState,
)
from tests.campaigns.support import (
    MARKER,
    drive_round,
    raced_campaign,
    raced_rules,
    raced_seed,
    raced_suite,
)

pytestmark = pytest.mark.django_db(transaction=True)

SEARCH_TASKS = 16


def _round(campaign):
    return {p.params["style"]: p for p in Proposal.objects.filter(campaign=campaign, batch=1)}


def _sent_tasks(evaluation_id) -> int:
    return (
        Rollout.objects.filter(evaluation_id=evaluation_id, enqueued_at__isnull=False)
        .values("task")
        .distinct()
        .count()
    )


def _ran(evaluation_id) -> int:
    return Rollout.objects.filter(evaluation_id=evaluation_id, state=RolloutState.DONE).count()


def test_it_eliminates_the_clearly_worse_proposal_and_validates_the_survivors(
    project, tmp_path, policy_version
):
    campaign = raced_campaign(project, tmp_path, policy_version)

    campaign = drive_round(campaign)

    assert campaign.state == CampaignState.FINISHED, campaign.stop_reason
    round_ = _round(campaign)
    assert set(round_) == {"good", "okay", "meh"}
    meh = round_["meh"]
    assert meh.state == ProposalState.EVALUATED and meh.validation_evaluation_id is None
    assert meh.eliminated_by_id in (round_["good"].id, round_["okay"].id)
    assert 1 <= meh.eliminated_after_tasks < SEARCH_TASKS
    assert meh.eliminated_at is not None
    assert meh.elimination["kind"] in ("evidence", "out_of_reach")
    assert "eliminated after" in meh.elimination["reason"]
    assert f"by proposal #{meh.eliminated_by.sequence}" in meh.state_detail
    # Its remaining search rollouts were never run: at most the tasks sent ahead of the race.
    ran = _ran(meh.search_evaluation_id)
    assert ran <= meh.eliminated_after_tasks + RACE_AHEAD_TASKS
    assert meh.rollouts_saved == SEARCH_TASKS - ran > 0
    assert campaign_rollouts_saved(campaign=campaign) == meh.rollouts_saved
    progress = campaign_progress(campaign=campaign)
    assert progress.rollouts_saved == meh.rollouts_saved
    # The campaign page counts from the points it already read: the same figures.
    from_points = campaign_progress(campaign=campaign, points=campaign_points(campaign=campaign))
    assert from_points == progress and from_points.by_state == progress.by_state
    search = Evaluation.objects.get(id=meh.search_evaluation_id)
    assert search.state == EvaluationState.CANCELLED
    assert not Rollout.objects.filter(
        evaluation=search, state=RolloutState.CANCELLED, attempts__gt=0
    ).exists()
    # The survivors were validated as single proposals are; the best chosen on validation.
    for style in ("good", "okay"):
        survivor = round_[style]
        assert survivor.eliminated_at is None and survivor.validation_score == 1.0
    assert campaign.best_validation_score == 1.0
    # The ledger charged only what ran: nothing left reserved, no rollout charged twice.
    budget = Budget.objects.get(id=campaign.budget_id)
    done = Rollout.objects.filter(
        evaluation__in=Evaluation.objects.filter(
            id__in=[
                e
                for p in Proposal.objects.filter(campaign=campaign)
                for e in (p.search_evaluation_id, p.validation_evaluation_id)
                if e
            ]
        ),
        state=RolloutState.DONE,
    ).count()
    assert budget.spent_rollouts == done and budget.reserved_rollouts == 0
    meh_budget = Budget.objects.get(evaluation_id=search.id)
    assert meh_budget.spent_rollouts == ran and meh_budget.reserved_rollouts == 0


def test_it_sends_the_racers_task_by_task(project, tmp_path, policy_version):
    campaign = raced_campaign(project, tmp_path, policy_version)
    checked = 0
    for _ in range(200):
        drive_round_steps(campaign, 1)
        racers = [
            Evaluation.objects.get(id=p.search_evaluation_id)
            for p in Proposal.objects.filter(
                campaign=campaign, batch=1, search_evaluation__isnull=False
            )
        ]
        racers = [
            e for e in racers if e.state in (EvaluationState.PENDING, EvaluationState.RUNNING)
        ]
        if len(racers) < 2:
            if checked:
                break
            continue
        assert all(e.paced for e in racers)
        # No racer is sent more than RACE_AHEAD_TASKS ahead of the tasks all have finished.
        frontier = min(_ran(e.id) for e in racers)
        for evaluation in racers:
            assert _sent_tasks(evaluation.id) <= frontier + RACE_AHEAD_TASKS
        checked += 1
    assert checked >= 5


def drive_round_steps(campaign, steps: int) -> None:
    # Not final yet: the test looks in mid-round.
    with contextlib.suppress(AssertionError):
        drive_round(campaign, max_steps=steps)


def test_a_redelivered_advance_in_mid_round_does_nothing_twice(project, tmp_path, policy_version):
    campaign = raced_campaign(project, tmp_path, policy_version)
    meh = None
    for _ in range(200):
        drive_round_steps(campaign, 1)
        meh = Proposal.objects.filter(campaign=campaign, params__style="meh").first()
        if meh is not None and meh.eliminated_at is not None:
            break
    assert meh is not None and meh.eliminated_at is not None
    before = (meh.eliminated_at, meh.rollouts_saved, meh.eliminated_after_tasks)
    refunds = LedgerEntry.objects.filter(
        budget__evaluation_id=meh.search_evaluation_id, kind=LedgerKind.REFUND
    ).count()
    sent = set(Rollout.objects.filter(enqueued_at__isnull=False).values_list("id", "enqueued_at"))

    campaign_advance(campaign_id=campaign.id)
    campaign_advance(campaign_id=campaign.id)

    meh.refresh_from_db()
    assert (meh.eliminated_at, meh.rollouts_saved, meh.eliminated_after_tasks) == before
    assert (
        LedgerEntry.objects.filter(
            budget__evaluation_id=meh.search_evaluation_id, kind=LedgerKind.REFUND
        ).count()
        == refunds
    )
    # Nothing sent already was sent again.
    again = set(Rollout.objects.filter(enqueued_at__isnull=False).values_list("id", "enqueued_at"))
    assert sent <= again
    assert Proposal.objects.filter(campaign=campaign, batch=1).count() == 3


def test_stopping_mid_round_cancels_the_rounds_pending_rollouts(project, tmp_path, policy_version):
    campaign = raced_campaign(project, tmp_path, policy_version)
    while not Proposal.objects.filter(
        campaign=campaign, batch=1, search_evaluation__isnull=False
    ).exists():
        drive_round_steps(campaign, 1)
    drive_round_steps(campaign, 4)

    campaign_stop(campaign=campaign, reason="enough")

    for proposal in Proposal.objects.filter(campaign=campaign, batch=1):
        assert proposal.state == ProposalState.FAILED, proposal.state
        evaluation = Evaluation.objects.get(id=proposal.search_evaluation_id)
        assert evaluation.state == EvaluationState.CANCELLED
        assert not Rollout.objects.filter(
            evaluation=evaluation, state__in=[RolloutState.PENDING, RolloutState.RUNNING]
        ).exists()
    budget = Budget.objects.get(id=campaign.budget_id)
    assert budget.reserved_rollouts == 0
    # A later advance (a redelivered task) does nothing.
    campaign_advance(campaign_id=campaign.id)
    assert (
        not Rollout.objects.filter(state=RolloutState.PENDING, enqueued_at__isnull=True)
        .filter(evaluation__state=EvaluationState.RUNNING)
        .exists()
    )


def test_pausing_mid_round_holds_it_and_resuming_goes_on(project, tmp_path, policy_version):
    campaign = raced_campaign(project, tmp_path, policy_version)
    while not Proposal.objects.filter(
        campaign=campaign, batch=1, search_evaluation__isnull=False
    ).exists():
        drive_round_steps(campaign, 1)
    drive_round_steps(campaign, 3)
    campaign_pause(campaign=campaign)
    for proposal in Proposal.objects.filter(campaign=campaign, batch=1):
        assert Evaluation.objects.get(id=proposal.search_evaluation_id).state in (
            EvaluationState.PAUSED,
            EvaluationState.CANCELLED,
        )
    campaign_resume(campaign=campaign)

    campaign = drive_round(campaign)

    assert campaign.state == CampaignState.FINISHED, campaign.stop_reason
    assert _round(campaign)["meh"].eliminated_at is not None


@pytest.mark.parametrize("size", [0, 17])
def test_it_refuses_a_batch_size_out_of_range(project, tmp_path, policy_version, size):
    with pytest.raises(InvalidInput, match="batch_size must be between 1 and 16"):
        campaign_create(
            project=project,
            name="too many",
            seed_candidate=raced_seed(project, tmp_path),
            policy_version=policy_version,
            suite=raced_suite(project),
            strategy=[{"kind": "random"}],
            batch_size=size,
        )


def test_the_page_shows_who_was_eliminated_when_and_by_whom(
    client, owner, project, tmp_path, policy_version
):
    campaign = drive_round(raced_campaign(project, tmp_path, policy_version))
    meh = _round(campaign)["meh"]
    client.force_login(owner)

    page = client.get(f"/p/{project.slug}/campaigns/{campaign.id}/").content.decode()

    assert 'id="campaign-rounds"' in page
    assert f'id="elimination-{meh.sequence}"' in page
    assert f'by <a href="#proposal-{meh.eliminated_by.sequence}">' in page
    assert f"after {meh.eliminated_after_tasks} task" in page
    assert f"Rollouts saved by racing: <strong>{meh.rollouts_saved}</strong>" in page
    assert f"eliminated by #{meh.eliminated_by.sequence}" in page
    assert "3 proposals per round" in page
    assert MARKER not in page.split('id="campaign-rounds"')[1].split("</table>")[0]


def test_it_races_a_round_on_a_real_worker(
    celery_worker_thread, project, tmp_path, policy_version, scripted_policy
):
    scripted_policy.rules.extend(raced_rules(SEARCH_TASKS))
    scripted_policy.default = "no"
    campaign = raced_campaign(project, tmp_path, policy_version)

    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        campaign.refresh_from_db()
        if campaign.is_final:
            break
        time.sleep(0.5)

    assert campaign.state == CampaignState.FINISHED, (campaign.state, campaign.stop_reason)
    round_ = _round(campaign)
    meh = round_["meh"]
    assert meh.eliminated_at is not None, [(p.params, p.state_detail) for p in round_.values()]
    ran = _ran(meh.search_evaluation_id)
    assert ran < SEARCH_TASKS and meh.rollouts_saved == SEARCH_TASKS - ran
    assert {round_["good"].validation_score, round_["okay"].validation_score} == {1.0}
    budget = Budget.objects.get(evaluation_id=meh.search_evaluation_id)
    assert budget.spent_rollouts == ran and budget.reserved_rollouts == 0

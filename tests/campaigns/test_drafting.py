"""A slow proposer model (llm-patch) writes its proposal outside the campaign's row lock:
pause, stop and the campaign page never wait on it, a second advance does not draft again,
a stop discards the draft, and a draft whose worker died is redrafted once it is stale."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from coevo.campaigns.models import Campaign, CampaignState, Proposal, ProposalState
from coevo.campaigns.runner import DRAFT_STALE_S, campaign_advance
from coevo.campaigns.services import campaign_create, campaign_start, campaign_stop
from coevo.errors import PolicyUnavailable
from coevo.evaluations.models import Evaluation
from tests.campaigns.support import (
    finish_open_rollouts,
    marked_suite,
    proposer_endpoint,
    styled_seed,
)
from tests.campaigns.test_llm_patch import STYLE_LINE, QueuedProposer, block
from tests.support.openai_server import ScriptedOpenAIServer

pytestmark = pytest.mark.django_db(transaction=True)

GOOD = "HYPOTHESIS: the good style answers right\n" + block(
    "agent.py", STYLE_LINE, '    prompt = "style=good " + task["input"]\n'
)


@pytest.fixture
def slow_proposer():
    policy = QueuedProposer([GOOD, GOOD])
    policy.model = "proposer-model"
    policy.latency_s = 2.0
    with ScriptedOpenAIServer(policy) as server:
        policy.url = server.url
        proposer_endpoint(server.url)
        yield policy


@pytest.fixture
def campaign(project, tmp_path, policy_version, slow_proposer):
    campaign = campaign_create(
        project=project,
        name="drafting",
        seed_candidate=styled_seed(project, tmp_path),
        policy_version=policy_version,
        suite=marked_suite(project),
        strategy=[
            {
                "kind": "llm-patch",
                "options": {"endpoint": "proposer", "model": "proposer-model"},
            }
        ],
        max_proposals=1,
    )
    campaign_start(campaign=campaign)
    _evaluate_seed_but_the_last_step(campaign)
    return campaign


def _evaluate_seed_but_the_last_step(campaign: Campaign) -> None:
    """Finish the seed's rollouts by hand, leaving the advance that ends the seed (and then
    drafts proposal 1) to the test."""
    for _ in range(40):
        seed = Proposal.objects.filter(campaign=campaign, kind="seed").first()
        if seed is not None and seed.validation_evaluation_id:
            validation = Evaluation.objects.get(id=seed.validation_evaluation_id)
            finish_open_rollouts(validation, passed=False)
            validation.refresh_from_db()
            if validation.is_final:
                return
            continue
        campaign_advance(campaign_id=campaign.id)
        seed = Proposal.objects.filter(campaign=campaign, kind="seed").first()
        if seed is not None and seed.search_evaluation_id:
            finish_open_rollouts(Evaluation.objects.get(id=seed.search_evaluation_id), False)
    raise AssertionError("the seed's validation evaluation never finished")


def _advance_in_thread(campaign: Campaign) -> tuple[threading.Thread, list]:
    errors: list = []

    def target() -> None:
        try:
            campaign_advance(campaign_id=campaign.id)
        except BaseException as exc:  # reported to the test
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    return thread, errors


def _wait_for_the_proposer_call(proposer, count: int = 1) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if len(proposer.requests) >= count:
            return
        time.sleep(0.05)
    raise AssertionError("the proposer model was never called")


def test_the_campaign_row_is_not_locked_while_the_proposer_model_writes(campaign, slow_proposer):
    thread, errors = _advance_in_thread(campaign)
    _wait_for_the_proposer_call(slow_proposer)

    # Mid-call: the row can be locked at once (a pause or stop would not wait), and the
    # campaign says what it is doing.
    with transaction.atomic():
        locked = Campaign.objects.select_for_update(nowait=True).get(id=campaign.id)
    assert locked.drafting_sequence == 1
    assert "proposer model is writing" in locked.state_detail
    # A second advance meanwhile (a signal, beat) does not draft the same proposal again.
    campaign_advance(campaign_id=campaign.id)

    thread.join(timeout=60)
    assert not errors, errors
    assert len(slow_proposer.requests) == 1
    proposal = Proposal.objects.get(campaign=campaign, sequence=1)
    assert proposal.kind == "llm-patch" and proposal.state == ProposalState.EVALUATING
    assert proposal.search_evaluation_id is not None
    campaign.refresh_from_db()
    assert campaign.drafting_sequence is None and campaign.drafting_at is None
    assert campaign.state_detail == ""


def test_a_campaign_stopped_while_its_proposal_is_written_records_no_proposal(
    campaign, slow_proposer
):
    thread, errors = _advance_in_thread(campaign)
    _wait_for_the_proposer_call(slow_proposer)

    campaign_stop(campaign=campaign)  # does not wait for the model call

    thread.join(timeout=60)
    assert not errors, errors
    assert not Proposal.objects.filter(campaign=campaign, sequence=1).exists()
    campaign.refresh_from_db()
    assert campaign.state == CampaignState.STOPPED
    assert campaign.drafting_sequence is None


def test_a_draft_whose_worker_died_is_written_again_once_stale(campaign, slow_proposer):
    # A worker took the ticket and died mid-call: the fields stay behind.
    Campaign.objects.filter(id=campaign.id).update(
        drafting_sequence=1, drafting_at=timezone.now() - timedelta(seconds=30)
    )
    campaign_advance(campaign_id=campaign.id)  # the seed ends; the fresh draft is waited on
    assert len(slow_proposer.requests) == 0
    assert not Proposal.objects.filter(campaign=campaign, sequence=1).exists()

    Campaign.objects.filter(id=campaign.id).update(
        drafting_at=timezone.now() - timedelta(seconds=DRAFT_STALE_S + 1)
    )
    campaign_advance(campaign_id=campaign.id)
    assert len(slow_proposer.requests) == 1
    assert Proposal.objects.get(campaign=campaign, sequence=1).state == ProposalState.EVALUATING


def test_a_proposer_server_that_is_down_leaves_no_draft_behind(campaign, slow_proposer):
    slow_proposer.fail_next = 100  # 503s: unavailable after the client's retries

    with pytest.raises(PolicyUnavailable):
        campaign_advance(campaign_id=campaign.id)

    campaign.refresh_from_db()
    assert campaign.drafting_sequence is None and campaign.drafting_at is None
    assert not Proposal.objects.filter(campaign=campaign, sequence=1).exists()
    assert campaign.state == CampaignState.RUNNING  # the next advance tries again

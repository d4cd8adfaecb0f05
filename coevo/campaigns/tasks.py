"""Campaign tasks (``default`` queue): take ids, call the runner."""

from __future__ import annotations

import logging

from celery import shared_task

from coevo.campaigns.models import Campaign, CampaignState
from coevo.campaigns.runner import campaign_advance as campaign_advance_service
from coevo.campaigns.runner import campaign_draft as campaign_draft_service
from coevo.campaigns.services import CAMPAIGN_ADVANCE_TASK, CAMPAIGN_DRAFT_TASK

logger = logging.getLogger(__name__)


@shared_task(
    name=CAMPAIGN_ADVANCE_TASK,
    acks_late=True,
    soft_time_limit=300,
    time_limit=360,
)
def campaign_advance(campaign_id: str) -> None:
    campaign_advance_service(campaign_id=campaign_id)


@shared_task(
    name=CAMPAIGN_DRAFT_TASK,
    acks_late=True,
    soft_time_limit=300,
    time_limit=360,
)
def campaign_draft(campaign_id: str, sequence: str, drafting_at: str) -> None:
    """One of a round's slow drafts (the round's others run in parallel on other workers)."""
    campaign_draft_service(campaign_id=campaign_id, sequence=int(sequence), drafting_at=drafting_at)


@shared_task(
    name="coevo.campaigns.tasks.campaigns_advance_running", soft_time_limit=540, time_limit=600
)
def campaigns_advance_running() -> None:
    """Run by beat: a lost message or a killed worker only delays a campaign."""
    for campaign_id in Campaign.objects.filter(state=CampaignState.RUNNING).values_list(
        "id", flat=True
    ):
        try:
            campaign_advance_service(campaign_id=campaign_id)
        except Exception:  # one broken campaign must not hold up the others
            logger.exception("campaign %s: advance failed", campaign_id)

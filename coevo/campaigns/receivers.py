"""Listens to the evaluation engine: an evaluation of an open proposal ended → advance."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Q
from django.dispatch import receiver

from coevo.evaluations.signals import evaluation_finished


@receiver(evaluation_finished, dispatch_uid="coevo.campaigns.advance_on_evaluation_finished")
def advance_campaign_on_evaluation_finished(sender: Any, evaluation_id: Any, **kwargs: Any) -> None:
    from coevo.campaigns.models import PROPOSAL_OPEN_STATES, Proposal
    from coevo.campaigns.tasks import campaign_advance_enqueue

    campaign_ids = set(
        Proposal.objects.filter(state__in=PROPOSAL_OPEN_STATES)
        .filter(Q(search_evaluation_id=evaluation_id) | Q(validation_evaluation_id=evaluation_id))
        .values_list("campaign_id", flat=True)
    )
    for campaign_id in campaign_ids:
        transaction.on_commit(
            lambda campaign_id=campaign_id: campaign_advance_enqueue(campaign_id=campaign_id)
        )

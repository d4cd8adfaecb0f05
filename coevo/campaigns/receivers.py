"""Listens to the evaluation engine, exports and training: what an open proposal waits for
ended → advance."""

from __future__ import annotations

from typing import Any

from django.db.models import Q
from django.dispatch import receiver

from coevo.campaigns.models import PROPOSAL_OPEN_STATES, Proposal
from coevo.campaigns.policy_steps import campaigns_with_open_step
from coevo.campaigns.services import campaign_advance_enqueue
from coevo.evaluations.signals import evaluation_finished, evaluation_progressed
from coevo.exports.signals import export_finished
from coevo.training.signals import training_finished


@receiver(evaluation_finished, dispatch_uid="coevo.campaigns.advance_on_evaluation_finished")
def advance_campaign_on_evaluation_finished(sender: Any, evaluation_id: Any, **kwargs: Any) -> None:
    campaign_ids = set(
        Proposal.objects.filter(state__in=PROPOSAL_OPEN_STATES)
        .filter(Q(search_evaluation_id=evaluation_id) | Q(validation_evaluation_id=evaluation_id))
        .values_list("campaign_id", flat=True)
    )
    for campaign_id in campaign_ids:
        campaign_advance_enqueue(campaign_id=campaign_id, on_commit=True)


@receiver(evaluation_progressed, dispatch_uid="coevo.campaigns.advance_on_evaluation_progressed")
def advance_campaign_on_evaluation_progressed(
    sender: Any, evaluation_id: Any, **kwargs: Any
) -> None:
    """A raced search evaluation moved: its round's race eliminates and sends the next tasks."""
    for campaign_id in set(
        Proposal.objects.filter(
            state__in=PROPOSAL_OPEN_STATES, search_evaluation_id=evaluation_id
        ).values_list("campaign_id", flat=True)
    ):
        campaign_advance_enqueue(campaign_id=campaign_id, on_commit=True)


def _advance_waiting(**ids: Any) -> None:
    for campaign_id in campaigns_with_open_step(**ids):
        campaign_advance_enqueue(campaign_id=campaign_id, on_commit=True)


@receiver(export_finished, dispatch_uid="coevo.campaigns.advance_on_export_finished")
def advance_campaign_on_export_finished(sender: Any, export_id: Any, **kwargs: Any) -> None:
    """A policy step's training data is ready (or failed)."""
    _advance_waiting(export_id=export_id)


@receiver(training_finished, dispatch_uid="coevo.campaigns.advance_on_training_finished")
def advance_campaign_on_training_finished(sender: Any, run_id: Any, **kwargs: Any) -> None:
    """A policy step's training run ended."""
    _advance_waiting(run_id=run_id)

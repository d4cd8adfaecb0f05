"""A campaign's states and the moves between them, in one table.

Life of a campaign::

    pending ──start──> running ──pause──> paused ──resume──> running
    pending | running | paused ──stop (a user)──> stopped
    running ──finish (a stop rule: budget, patience, target, candidates)──> finished
    running ──fail (a proposal's evaluation could not be set up)──> failed

Every move is a compare-and-swap from the states the table allows: a redelivered task, or a
user racing the runner, moves a campaign once, and the loser learns it moved nothing. The
services (``coevo.campaigns.services``, ``stop_rules``) decide when; this module only moves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from coevo.campaigns.models import Campaign, CampaignState


@dataclass(frozen=True)
class Move:
    sources: tuple[str, ...]
    target: str


CAMPAIGN_MOVES: dict[str, Move] = {
    "start": Move((CampaignState.PENDING,), CampaignState.RUNNING),
    "pause": Move((CampaignState.RUNNING,), CampaignState.PAUSED),
    "resume": Move((CampaignState.PAUSED,), CampaignState.RUNNING),
    "stop": Move(
        (CampaignState.PENDING, CampaignState.RUNNING, CampaignState.PAUSED),
        CampaignState.STOPPED,
    ),
    "finish": Move((CampaignState.RUNNING,), CampaignState.FINISHED),
    "fail": Move((CampaignState.RUNNING,), CampaignState.FAILED),
}


def campaign_move(*, campaign_id: Any, move: str, **fields: Any) -> bool:
    """Move the campaign by ``move`` (a key of CAMPAIGN_MOVES) if it is in one of the move's
    source states, writing ``fields`` with the state; False when it was not (it moved
    meanwhile, or the move does not apply)."""
    step = CAMPAIGN_MOVES[move]
    return bool(
        Campaign.objects.filter(id=campaign_id, state__in=step.sources).update(
            state=step.target, updated_at=timezone.now(), **fields
        )
    )

"""Listens to the evaluation engine: when a held-out evaluation ends, refresh the promotion
requests waiting on it."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.dispatch import receiver

from coevo.evaluations.signals import evaluation_finished
from coevo.reviews.promotions.refresh import promotions_for_evaluation
from coevo.reviews.promotions.transitions import refresh_later


@receiver(evaluation_finished, dispatch_uid="coevo.reviews.refresh_on_evaluation_finished")
def refresh_promotions_on_evaluation_finished(
    sender: Any, evaluation_id: Any, **kwargs: Any
) -> None:
    for request_id in promotions_for_evaluation(evaluation_id=evaluation_id):
        transaction.on_commit(lambda request_id=request_id: refresh_later(request_id))

"""Trace retention keeps the traces of every evaluation an export was built from: an export
can be rebuilt (or audited against its rollouts) only while those traces exist."""

from __future__ import annotations

from django.db.models import QuerySet

from coevo.evaluations.retention import protect_evaluations
from coevo.exports.models import TrajectoryExport


@protect_evaluations
def _exported_evaluations() -> QuerySet:
    return TrajectoryExport.evaluations.through.objects.values("evaluation_id")

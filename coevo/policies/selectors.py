"""Reading policy versions and endpoints: the one place pages, the API and commands look them
up."""

from __future__ import annotations

from uuid import UUID

from django.conf import settings
from django.db.models import Q, QuerySet

from coevo.policies.concurrency import SlotsStatus, slots_status
from coevo.policies.models import PolicyEndpoint, PolicyVersion


def policy_versions_list() -> QuerySet[PolicyVersion]:
    """Every policy version, by name (for choice lists)."""
    return PolicyVersion.objects.order_by("name")


def policy_endpoints_list() -> QuerySet[PolicyEndpoint]:
    """Every registered policy endpoint, by name (for choice lists: a proposer names one)."""
    return PolicyEndpoint.objects.order_by("name")


def policy_version_find(*, name_or_id: str) -> PolicyVersion | None:
    """The policy version with this id (a UUID) or, failing that, this name; None if neither."""
    try:
        version = PolicyVersion.objects.filter(id=UUID(name_or_id)).first()
    except ValueError:
        version = None
    return version or PolicyVersion.objects.filter(name=name_or_id).first()


def policy_endpoint_slots(*, endpoint: PolicyEndpoint) -> SlotsStatus:
    """Who holds and who waits for the endpoint's concurrency slots now (empty without Redis:
    one worker process's semaphore has no one else to show)."""
    return slots_status(
        endpoint_id=str(endpoint.id),
        limit=endpoint.max_concurrency,
        redis_url=settings.COEVO_REDIS_URL,
    )


def policy_slot_wait(*, version: PolicyVersion, holder: str) -> SlotsStatus | None:
    """The slots of the endpoint of ``version`` that ``holder`` (a limiter's label, "rollout
    <id>") is waiting for now, or None when it waits for none."""
    if not settings.COEVO_REDIS_URL:
        return None
    serving = PolicyEndpoint.objects.filter(
        Q(pk=version.endpoint_id) | Q(replica_versions=version)
    ).distinct()
    for endpoint in serving:
        slots = policy_endpoint_slots(endpoint=endpoint)
        if slots.waiting(holder):
            return slots
    return None

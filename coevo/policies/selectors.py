"""Reading policy versions and endpoints: the one place pages, the API and commands look them
up."""

from __future__ import annotations

from uuid import UUID

from django.db.models import QuerySet

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

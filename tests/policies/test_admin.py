"""Operators size endpoints and read budgets in the Django admin."""

from __future__ import annotations

import pytest
from django.urls import reverse

from coevo.policies.models import PolicyEndpoint


@pytest.fixture
def operator(django_user_model):
    return django_user_model.objects.create_superuser("operator", password="x")


def test_it_lets_an_operator_set_an_endpoints_concurrency(client, operator, policy_version):
    client.force_login(operator)
    endpoint = policy_version.endpoint
    url = reverse("admin:policies_policyendpoint_change", args=[endpoint.id])
    response = client.post(
        url,
        {
            "name": endpoint.name,
            "base_url": endpoint.base_url,
            "kind": endpoint.kind,
            "max_concurrency": 16,
        },
    )
    assert response.status_code == 302, response.content[:500]
    assert PolicyEndpoint.objects.get(id=endpoint.id).max_concurrency == 16
    for name in ("admin:policies_policyversion_changelist", "admin:evaluations_budget_changelist"):
        assert client.get(reverse(name)).status_code == 200

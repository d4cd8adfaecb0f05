"""Reading policy endpoints for choice lists."""

from __future__ import annotations

import pytest

from coevo.policies.models import EndpointKind, PolicyEndpoint
from coevo.policies.selectors import policy_endpoints_list

pytestmark = pytest.mark.django_db


def test_it_lists_every_endpoint_by_name():
    for name in ("zeta", "alpha", "mid"):
        PolicyEndpoint.objects.create(
            name=name, base_url=f"http://{name}.invalid/v1", kind=EndpointKind.OPENAI_COMPATIBLE
        )
    assert list(policy_endpoints_list().values_list("name", flat=True)) == ["alpha", "mid", "zeta"]

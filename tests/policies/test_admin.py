"""Operators size endpoints and read budgets in the Django admin."""

from __future__ import annotations

from django.urls import reverse

from coevo.policies.models import PolicyEndpoint


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


def test_it_shows_a_versions_adapter_and_provenance_and_an_endpoints_health(
    client, operator, policy_version
):
    from coevo.policies.services import policy_endpoint_health_record, policy_version_create

    child = policy_version_create(
        name="ft-1",
        endpoint=policy_version.endpoint,
        parent=policy_version,
        adapter_name="ft-1-lora",
        adapter_path="/adapters/ft-1",
        provenance={"export": "export-123"},
    )
    policy_endpoint_health_record(endpoint=policy_version.endpoint, ok=False, error="refused")
    client.force_login(operator)

    page = client.get(reverse("admin:policies_policyversion_change", args=[child.id]))
    assert page.status_code == 200
    assert b"/adapters/ft-1" in page.content and b"export-123" in page.content
    listing = client.get(reverse("admin:policies_policyendpoint_changelist")).content.decode()
    assert "icon-no.svg" in listing  # the endpoint shows as unhealthy


def test_the_default_endpoint_takes_its_kind_and_base_model_from_the_settings(db, settings):
    from coevo.policies.services import policy_version_get_default

    settings.COEVO_POLICY_URL = "http://vllm.invalid:8000/v1"
    settings.COEVO_POLICY_MODEL = "gemma-3-270m"
    settings.COEVO_POLICY_KIND = "vllm"
    settings.COEVO_POLICY_BASE_MODEL = "google/gemma-3-270m"
    version = policy_version_get_default()
    assert version.endpoint.kind == "vllm"
    assert version.served_name == "gemma-3-270m"
    assert version.base_model == "google/gemma-3-270m"


def test_the_default_endpoint_follows_the_kind_the_settings_name_now(db, settings):
    """A demo database made when a plain llama.cpp server (openai-compatible) served the URL
    gets the llama.cpp host's kind, which loads adapters, once the settings say so."""
    from coevo.policies.services import policy_version_get_default

    settings.COEVO_POLICY_URL = "http://127.0.0.1:8089/v1"
    settings.COEVO_POLICY_KIND = "openai-compatible"
    before = policy_version_get_default()
    assert before.endpoint.kind == "openai-compatible"
    settings.COEVO_POLICY_KIND = "llamacpp"
    after = policy_version_get_default()
    assert after.id == before.id and after.endpoint.id == before.endpoint.id
    after.endpoint.refresh_from_db()
    assert after.endpoint.kind == "llamacpp"

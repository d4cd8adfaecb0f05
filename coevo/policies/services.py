from django.conf import settings

from coevo.policies.client import PolicyClient, normalize_base_url
from coevo.policies.models import EndpointKind, PolicyEndpoint, PolicyVersion


def policy_version_get_default() -> PolicyVersion:
    """The policy version configured by COEVO_POLICY_URL and COEVO_POLICY_MODEL."""
    base_url = normalize_base_url(settings.COEVO_POLICY_URL)
    endpoint, _ = PolicyEndpoint.objects.get_or_create(
        base_url=base_url,
        defaults={
            "name": f"default-{PolicyEndpoint.objects.count() + 1}",
            "kind": EndpointKind.OPENAI_COMPATIBLE,
        },
    )
    version, _ = PolicyVersion.objects.get_or_create(
        endpoint=endpoint,
        served_name=settings.COEVO_POLICY_MODEL,
        defaults={
            "name": f"{settings.COEVO_POLICY_MODEL}-{str(endpoint.id)[:8]}".lower().replace(
                ".", "-"
            ),
            "base_model": settings.COEVO_POLICY_MODEL,
        },
    )
    return version


def policy_client_for(*, version: PolicyVersion) -> PolicyClient:
    return PolicyClient(
        version.endpoint.base_url,
        model=version.served_name,
        timeout_s=settings.COEVO_POLICY_TIMEOUT_S,
        retries=settings.COEVO_POLICY_RETRIES,
    )

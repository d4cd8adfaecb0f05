from django.conf import settings

from coevo.errors import PolicyUnavailable
from coevo.policies.client import PolicyClient, normalize_base_url
from coevo.policies.concurrency import EndpointLimiter
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
    """A client for the version's endpoint that holds one of the endpoint's slots per request."""
    endpoint = version.endpoint
    return PolicyClient(
        endpoint.base_url,
        model=version.served_name,
        timeout_s=settings.COEVO_POLICY_TIMEOUT_S,
        retries=settings.COEVO_POLICY_RETRIES,
        limiter=EndpointLimiter(
            endpoint_id=str(endpoint.id),
            limit=endpoint.max_concurrency,
            redis_url=settings.COEVO_REDIS_URL,
            # A slot outlives the longest request with its retries, then frees itself.
            lease_s=settings.COEVO_POLICY_TIMEOUT_S * (settings.COEVO_POLICY_RETRIES + 1) + 60,
        ),
    )


def policy_endpoint_reachable(*, version: PolicyVersion, timeout_s: float = 5.0) -> bool:
    """Whether the endpoint answers ``GET /v1/models`` now (one try, short timeout)."""
    client = PolicyClient(
        version.endpoint.base_url, model=version.served_name, timeout_s=timeout_s, retries=0
    )
    try:
        client.models()
    except PolicyUnavailable:
        return False
    except Exception:
        # It answered, if not as we hoped (a 4xx): reachable.
        return True
    finally:
        client.close()
    return True

"""Policy versions and endpoints: the default version, version registration, routing a
version's requests to a healthy endpoint, endpoint health, and LoRA adapters loaded at run time
(on vLLM, and on llama.cpp through the coevo llama.cpp host, which speaks vLLM's LoRA API)."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from coevo.audit.services import audit_record
from coevo.errors import (
    AdapterLoadFailed,
    InvalidInput,
    PolicyRequestFailed,
    PolicyRequestRejected,
    PolicyUnavailable,
)
from coevo.policies.client import (
    PolicyClient,
    Route,
    RoutedPolicyClient,
    normalize_base_url,
    server_message,
)
from coevo.policies.concurrency import EndpointLimiter
from coevo.policies.models import (
    ADAPTER_ENDPOINT_KINDS,
    EndpointKind,
    LoadedAdapter,
    PolicyEndpoint,
    PolicyVersion,
)
from coevo.policies.prices import price_schedule_for
from coevo.policies.secrets import MAX_API_KEY_CHARS, secret_decrypt, secret_encrypt

logger = logging.getLogger(__name__)

_LORA_FIX = (
    "Start vLLM with --enable-lora (and --max-loras/--max-lora-rank large enough) and the "
    "environment variable VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, and check that the adapter "
    "path exists on the vLLM machine (docs/deployment.md)."
)
_LLAMACPP_LORA_FIX = (
    "Serve llama.cpp endpoints that take adapters through the coevo llama.cpp host "
    "(python -m coevo.policies.llamacpp_host --adapter-root COEVO_ADAPTER_DIR ...; a plain "
    "llama_cpp.server cannot load adapters at run time), and check that the adapter directory "
    "holds its GGUF conversion, adapter.gguf (docs/deployment.md)."
)


def policy_version_get_default() -> PolicyVersion:
    """The policy version configured by COEVO_POLICY_URL, COEVO_POLICY_MODEL (served name),
    COEVO_POLICY_BASE_MODEL (the weights) and COEVO_POLICY_KIND (the endpoint's kind)."""
    base_url = normalize_base_url(settings.COEVO_POLICY_URL)
    endpoint, _ = PolicyEndpoint.objects.get_or_create(
        base_url=base_url,
        defaults={
            "name": f"default-{PolicyEndpoint.objects.count() + 1}",
            "kind": settings.COEVO_POLICY_KIND,
        },
    )
    if endpoint.kind != settings.COEVO_POLICY_KIND:
        # The settings describe the default endpoint: a database made when the same URL was
        # served by another kind of server (the demo's llama.cpp server before the llama.cpp
        # host, which loads adapters) follows what serves it now.
        PolicyEndpoint.objects.filter(id=endpoint.id).update(kind=settings.COEVO_POLICY_KIND)
        endpoint.kind = settings.COEVO_POLICY_KIND
    version, _ = PolicyVersion.objects.get_or_create(
        endpoint=endpoint,
        served_name=settings.COEVO_POLICY_MODEL,
        defaults={
            "name": f"{settings.COEVO_POLICY_MODEL}-{str(endpoint.id)[:8]}".lower().replace(
                ".", "-"
            ),
            "base_model": settings.COEVO_POLICY_BASE_MODEL,
        },
    )
    return version


def policy_version_create(
    *,
    name: str,
    endpoint: PolicyEndpoint,
    base_model: str = "",
    served_name: str = "",
    adapter_name: str = "",
    adapter_path: str = "",
    parent: PolicyVersion | None = None,
    provenance: dict[str, Any] | None = None,
    replicas: Iterable[PolicyEndpoint] = (),
) -> PolicyVersion:
    """Register a policy version: a base model, or a LoRA adapter on top of ``parent``.

    An adapter version is served under its adapter name (that is how vLLM addresses a LoRA),
    inherits the parent's base model, and records where it came from in ``provenance``
    (export id, trainer command, output dir…; ``created_at`` is added).
    """
    if bool(adapter_name) != bool(adapter_path):
        raise InvalidInput("An adapter needs both adapter_name and adapter_path.")
    if adapter_name:
        if served_name and served_name != adapter_name:
            raise InvalidInput(
                f"An adapter version is served under its adapter name {adapter_name!r}; "
                f"leave served_name empty or set it to {adapter_name!r}."
            )
        served_name = adapter_name
        base_model = base_model or (parent.base_model if parent else "")
    if not base_model:
        raise InvalidInput("A policy version needs a base_model (or a parent to inherit it from).")
    with transaction.atomic():
        version = PolicyVersion.objects.create(
            name=name,
            endpoint=endpoint,
            base_model=base_model,
            served_name=served_name or base_model,
            adapter_name=adapter_name,
            adapter_path=adapter_path,
            parent=parent,
            provenance={"created_at": timezone.now().isoformat(), **(provenance or {})},
        )
        extra = [e for e in replicas if e.pk != endpoint.pk]
        if extra:
            version.replicas.add(*extra)
    return version


def policy_version_endpoints(*, version: PolicyVersion) -> list[PolicyEndpoint]:
    """The endpoints serving a version: its primary endpoint first (as loaded with the
    version), then its replicas."""
    endpoints = [version.endpoint]
    if version.pk is not None and not version._state.adding:
        endpoints += [e for e in version.replicas.all() if e.pk != version.endpoint_id]
    return endpoints


def _endpoints_now(*, version: PolicyVersion) -> list[PolicyEndpoint]:
    """The endpoints serving a saved version as written now (health included, however long
    ago the version was loaded): its primary endpoint first, then its replicas by name. One
    query: a worker asks for every rollout."""
    if version.pk is None or version._state.adding:  # a version not saved: its endpoint
        endpoint = version.endpoint
        if endpoint.pk is not None and not endpoint._state.adding:
            endpoint = PolicyEndpoint.objects.filter(pk=endpoint.pk).first() or endpoint
        return [endpoint]
    serving = PolicyEndpoint.objects.filter(
        Q(pk=version.endpoint_id) | Q(replica_versions=version)
    ).distinct()
    return sorted(serving, key=lambda e: (e.pk != version.endpoint_id, e.name))


# Round robin among healthy endpoints, per worker process (so replicas share the load).
_turn = itertools.count()


def policy_client_for(*, version: PolicyVersion, holder: str = "") -> RoutedPolicyClient:
    """A client for the version that sends to a healthy endpoint serving it, holding one of
    that endpoint's concurrency slots per request, and fails over to the next healthy one.

    Unhealthy endpoints get no requests. With none healthy, the client raises PolicyUnavailable
    on its first request: the worker's policy-outage path. ``holder`` names who asks ("rollout
    <id>") beside the slots it holds or waits for. A version with a LoRA adapter on a
    vLLM or llama.cpp endpoint gets the adapter loaded (and verified) before the first request
    it sends there.
    """
    endpoints = _endpoints_now(version=version)
    healthy = [e for e in endpoints if e.healthy]
    if healthy:
        shift = next(_turn) % len(healthy)
        healthy = healthy[shift:] + healthy[:shift]
    routes = [
        _route(
            endpoint=endpoint,
            version=version,
            # With a replica to fail over to, one retry is enough: waiting out a dead server's
            # backoff only delays the rollout.
            retries=settings.COEVO_POLICY_RETRIES
            if i == len(healthy) - 1
            else min(1, settings.COEVO_POLICY_RETRIES),
            holder=holder,
        )
        for i, endpoint in enumerate(healthy)
    ]
    unavailable = ""
    if not routes:
        unavailable = (
            "every endpoint serving it is marked unhealthy ("
            + "; ".join(f"{e.name}: {e.last_error[:200] or 'no answer'}" for e in endpoints)
            + "); they are checked again every COEVO_ENDPOINT_HEALTH_S seconds"
        )
    return RoutedPolicyClient(routes, model=version.served_name, unavailable=unavailable)


def policy_client_for_endpoint(
    *,
    endpoint: PolicyEndpoint,
    model: str,
    timeout_s: float | None = None,
    retries: int | None = None,
    limiter: EndpointLimiter | None = None,
) -> PolicyClient:
    """A client for one endpoint: its kind's request table, its API key (decrypted here,
    in the process that sends; SecretUnreadable when COEVO_SECRETS_KEY cannot read it) and its
    price rows (each call priced by the row that applies when it is answered)."""
    return PolicyClient(
        endpoint.base_url,
        model=model,
        timeout_s=settings.COEVO_POLICY_TIMEOUT_S if timeout_s is None else timeout_s,
        retries=settings.COEVO_POLICY_RETRIES if retries is None else retries,
        limiter=limiter,
        kind=endpoint.kind,
        api_key=secret_decrypt(token=endpoint.api_key_encrypted),
        prices=price_schedule_for(endpoint=endpoint),
    )


def policy_endpoint_api_key_set(
    *, endpoint: PolicyEndpoint, api_key: str, actor: AbstractBaseUser | None
) -> None:
    """Store (or rotate) the endpoint's API key, encrypted, and audit it; the event says that
    a key was set or replaced, never what it is."""
    api_key = api_key.strip()
    if not api_key or len(api_key) > MAX_API_KEY_CHARS:
        raise InvalidInput(f"An API key is 1 to {MAX_API_KEY_CHARS} characters.")
    if any(ch.isspace() or not ch.isprintable() for ch in api_key):
        # It goes into an HTTP header: a line break there would end the header.
        raise InvalidInput("An API key holds no spaces, line breaks or control characters.")
    token = secret_encrypt(plain=api_key)
    with transaction.atomic():
        endpoint = PolicyEndpoint.objects.select_for_update().get(pk=endpoint.pk)
        had = endpoint.has_api_key
        PolicyEndpoint.objects.filter(pk=endpoint.pk).update(
            api_key_encrypted=token, api_key_set_at=timezone.now()
        )
        audit_record(
            actor=actor,
            project=None,
            action="policyendpoint.api_key_rotated" if had else "policyendpoint.api_key_set",
            target=endpoint,
            before={"api_key": "set" if had else "not set"},
            after={"api_key": "set"},
        )


def policy_endpoint_api_key_revoke(
    *, endpoint: PolicyEndpoint, actor: AbstractBaseUser | None
) -> bool:
    """Forget the endpoint's API key (its requests go without one) and audit it; False when
    it had none."""
    with transaction.atomic():
        endpoint = PolicyEndpoint.objects.select_for_update().get(pk=endpoint.pk)
        if not endpoint.has_api_key:
            return False
        PolicyEndpoint.objects.filter(pk=endpoint.pk).update(
            api_key_encrypted="", api_key_set_at=None
        )
        audit_record(
            actor=actor,
            project=None,
            action="policyendpoint.api_key_revoked",
            target=endpoint,
            before={"api_key": "set"},
            after={"api_key": "not set"},
        )
    return True


def _route(*, endpoint: PolicyEndpoint, version: PolicyVersion, retries: int, holder: str) -> Route:
    client = policy_client_for_endpoint(
        endpoint=endpoint,
        model=version.served_name,
        retries=retries,
        limiter=EndpointLimiter(
            endpoint_id=str(endpoint.id),
            limit=endpoint.max_concurrency,
            redis_url=settings.COEVO_REDIS_URL,
            lease_s=settings.COEVO_POLICY_SLOT_LEASE_S,
            wait_s=settings.COEVO_POLICY_SLOT_WAIT_S,
            holder=holder,
        ),
    )
    prepare = None
    if version.has_adapter and endpoint.kind in ADAPTER_ENDPOINT_KINDS:

        def prepare(client: PolicyClient) -> None:
            policy_adapter_ensure(endpoint=endpoint, version=version, client=client)

    def on_down(error: str) -> None:
        policy_endpoint_health_record(endpoint=endpoint, ok=False, error=error)

    def on_ok() -> None:
        policy_endpoint_health_record(endpoint=endpoint, ok=True)

    return Route(
        client=client,
        name=endpoint.name,
        prepare=prepare,
        on_down=on_down,
        # A healthy endpoint with no failures has nothing to clear: no write per rollout.
        on_ok=on_ok if endpoint.consecutive_failures else None,
    )


def policy_endpoint_health_record(
    *, endpoint: PolicyEndpoint, ok: bool, error: str = "", latency_ms: int | None = None
) -> None:
    """Write one health observation of an endpoint (from beat, a probe, or a failover)."""
    now = timezone.now()
    if ok:
        fields: dict[str, Any] = {
            "healthy": True,
            "checked_at": now,
            "consecutive_failures": 0,
            "last_error": "",
        }
        if latency_ms is not None:
            fields["latency_ms"] = latency_ms
    else:
        fields = {
            "healthy": False,
            "checked_at": now,
            "failed_at": now,
            "consecutive_failures": F("consecutive_failures") + 1,
            "last_error": error[:2000],
            "latency_ms": None,
        }
    PolicyEndpoint.objects.filter(pk=endpoint.pk).update(**fields)
    if ok and not endpoint.healthy:
        logger.info("policy endpoint %s is healthy again", endpoint.name)
    elif not ok and endpoint.healthy:
        logger.warning("policy endpoint %s is unhealthy: %s", endpoint.name, error[:300])


def _probe(endpoint: PolicyEndpoint, timeout_s: float) -> tuple[bool, str, int]:
    """(answered, error, latency in ms) of the endpoint's health probe (``GET /v1/models``,
    one try, short timeout): the same probe a client asks when a request keeps failing."""
    started = time.monotonic()
    with policy_client_for_endpoint(
        endpoint=endpoint, model="", timeout_s=timeout_s, retries=0
    ) as client:
        health = client.health(timeout_s=timeout_s)
        shown = client.shown_url
    if not health.up:
        return (
            False,
            f"The policy server at {shown} did not answer its health probe (GET /models: "
            f"{health.reason}). Check that it is running (COEVO_POLICY_URL).",
            0,
        )
    return True, "", int((time.monotonic() - started) * 1000)


def policy_endpoints_check(*, timeout_s: float = 5.0) -> dict[str, bool]:
    """Probe every endpoint (in parallel) and record its health; {endpoint name: healthy}."""
    endpoints = list(PolicyEndpoint.objects.all())
    if not endpoints:
        return {}
    with ThreadPoolExecutor(max_workers=min(8, len(endpoints))) as pool:
        results = list(pool.map(lambda e: _probe(e, timeout_s), endpoints))
    for endpoint, (ok, error, latency_ms) in zip(endpoints, results, strict=True):
        policy_endpoint_health_record(endpoint=endpoint, ok=ok, error=error, latency_ms=latency_ms)
    return {e.name: ok for e, (ok, _, _) in zip(endpoints, results, strict=True)}


def policy_endpoint_reachable(*, version: PolicyVersion, timeout_s: float = 5.0) -> bool:
    """Whether any endpoint serving the version answers ``GET /v1/models`` now (one try each,
    short timeout); records what it saw as the endpoints' health."""
    for endpoint in policy_version_endpoints(version=version):
        ok, error, latency_ms = _probe(endpoint, timeout_s)
        if endpoint.pk is not None and not endpoint._state.adding:
            policy_endpoint_health_record(
                endpoint=endpoint, ok=ok, error=error, latency_ms=latency_ms
            )
        if ok:
            return True
    return False


# --- LoRA adapters loaded at run time (vLLM; llama.cpp through the coevo llama.cpp host) ------


def policy_adapter_ensure(
    *, endpoint: PolicyEndpoint, version: PolicyVersion, client: PolicyClient | None = None
) -> bool:
    """Make sure the version's adapter is loaded on a vLLM or llama.cpp endpoint (the coevo
    llama.cpp host); True if it loaded it now.

    ``/v1/models`` lists it from its path → nothing to do (vLLM refuses to load a name it
    serves); lists the name from another path (stale weights: the version's adapter was
    re-installed elsewhere) → load it in place (``load_inplace``); does not list it →
    ``POST /v1/load_lora_adapter``. Then verify via ``/v1/models``. A refused load is checked
    against ``/v1/models`` again: another worker may have loaded it a moment ago (vLLM's 400
    "has already been loaded"). The last use is recorded first, so the idle unloader never takes
    an adapter a rollout is about to use. Raises AdapterLoadFailed (an infra error) naming the
    adapter and the server's message.
    """
    if not version.has_adapter:
        return False
    name, path = version.adapter_name, version.adapter_path
    fix = _LLAMACPP_LORA_FIX if endpoint.kind == EndpointKind.LLAMACPP else _LORA_FIX
    LoadedAdapter.objects.update_or_create(
        endpoint=endpoint,
        adapter_name=name,
        defaults={"adapter_path": path, "last_used_at": timezone.now()},
    )
    own = client is None
    client = client or policy_client_for_endpoint(endpoint=endpoint, model=name, retries=1)
    try:
        listed = client.lora_paths()
        if _loaded_from(listed, name, path):
            return False
        try:
            message = client.lora_load(name=name, path=path, replace=name in listed)
        except (PolicyRequestRejected, PolicyUnavailable) as exc:
            if _loaded_from(client.lora_paths(), name, path):
                return False
            said = str(exc)
            if isinstance(exc, PolicyRequestRejected):
                # The server's own words (vLLM's JSON body read), with its status.
                said = f"HTTP {exc.status}: {server_message(exc.reply)}"
            raise AdapterLoadFailed(
                f"Could not load the LoRA adapter {name!r} ({path}) of policy version "
                f"{version.name} on {endpoint.name}: {said}. {fix}"
            ) from exc
        if name not in client.models():
            raise AdapterLoadFailed(
                f"The server at {endpoint.base_url} accepted the LoRA adapter {name!r} "
                f"({message.strip()[:300]!r}) but does not list it in /v1/models. {fix}"
            )
        logger.info("loaded LoRA adapter %s (%s) on %s", name, path, endpoint.name)
        return True
    finally:
        if own:
            client.close()


def _loaded_from(listed: dict[str, str], name: str, path: str) -> bool:
    """Whether the server lists adapter ``name`` loaded from ``path`` (or from a path it does
    not say: a server that lists no roots is taken at its word)."""
    return name in listed and listed[name] in ("", path)


def policy_adapters_unload_idle(*, now: datetime | None = None) -> list[str]:
    """Unload adapters not used for COEVO_ADAPTER_IDLE_S; returns ``name@endpoint`` of each."""
    cutoff = (now or timezone.now()) - timedelta(seconds=settings.COEVO_ADAPTER_IDLE_S)
    unloaded = []
    for loaded in LoadedAdapter.objects.filter(last_used_at__lt=cutoff).select_related("endpoint"):
        # Compare-and-swap on the last use: a rollout that touched it since keeps it.
        if not LoadedAdapter.objects.filter(pk=loaded.pk, last_used_at__lt=cutoff).delete()[0]:
            continue
        endpoint = loaded.endpoint
        client = policy_client_for_endpoint(endpoint=endpoint, model="", timeout_s=30, retries=1)
        try:
            client.lora_unload(name=loaded.adapter_name)
        except (PolicyUnavailable, PolicyRequestFailed) as exc:
            logger.warning(
                "could not unload adapter %s on %s: %s", loaded.adapter_name, endpoint.name, exc
            )
            continue
        except PolicyRequestRejected as exc:
            # Not loaded any more (the server restarted): nothing to unload.
            logger.info("adapter %s on %s: %s", loaded.adapter_name, endpoint.name, exc)
        finally:
            client.close()
        unloaded.append(f"{loaded.adapter_name}@{endpoint.name}")
    return unloaded

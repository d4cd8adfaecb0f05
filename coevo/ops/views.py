"""Operations endpoints: /healthz, /readyz, /metrics (no login; /metrics takes a bearer token
when COEVO_METRICS_TOKEN is set) and /system/ (staff only)."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe
from prometheus_client import CONTENT_TYPE_LATEST

from coevo.ops import selectors
from coevo.ops.health import readiness
from coevo.ops.metrics import web_metrics_text


@never_cache
@require_safe
def healthz(request: HttpRequest) -> JsonResponse:
    """The process answers HTTP: touches no dependency, so a restart is never triggered by a
    database or broker outage (readyz reports those)."""
    return JsonResponse({"alive": True})


@never_cache
@require_safe
def readyz(request: HttpRequest) -> JsonResponse:
    ready, checks = readiness()
    return JsonResponse(
        {"ready": ready, "checks": {name: check.as_json() for name, check in checks.items()}},
        status=200 if ready else 503,
    )


@never_cache
@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    token = settings.COEVO_METRICS_TOKEN
    if token:
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), token.encode()):
            response = HttpResponse(
                "Send the metrics token: Authorization: Bearer <COEVO_METRICS_TOKEN>.\n",
                status=401,
                content_type="text/plain",
            )
            response["WWW-Authenticate"] = 'Bearer realm="coevo metrics"'
            return response
    return HttpResponse(web_metrics_text(), content_type=CONTENT_TYPE_LATEST)


@never_cache
@login_required
def system(request: HttpRequest) -> HttpResponse:
    # Operators only; to everyone else the page does not exist.
    if not request.user.is_staff:
        raise Http404("No such page.")
    pinging = selectors.workers_pinging()
    workers = selectors.worker_heartbeats(pinging=pinging or set())
    known = {w.hostname for w in workers}
    context = {
        "workers": workers,
        "broker_reachable": pinging is not None,
        # Answering the broker but never beat: a worker of an older version, or one whose
        # heartbeat cannot reach the database.
        "unlisted_workers": sorted((pinging or set()) - known),
        "queues": selectors.queue_depths(),
        "endpoints": selectors.policy_endpoints_status(),
        "store_bytes": selectors.directory_size(settings.COEVO_HARNESS_STORE_DIR),
        "store_dir": settings.COEVO_HARNESS_STORE_DIR,
        "trace_bytes": selectors.trace_storage_bytes(),
        "store_checks": selectors.store_checks_latest(),
        "stale_after_s": settings.COEVO_WORKER_STALE_S,
        "refresh_s": settings.COEVO_SYSTEM_REFRESH_S,
    }
    if getattr(request, "htmx", False):
        return render(request, "ops/_system_status.html", context)
    return render(request, "ops/system.html", context)

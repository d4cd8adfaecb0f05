"""Operations endpoints: /healthz, /readyz (no login), /metrics (no login, but the bearer token
COEVO_METRICS_TOKEN, or COEVO_METRICS_PUBLIC=1: coevo/ops/metrics.py) and /system/ (staff
only)."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe
from prometheus_client import CONTENT_TYPE_LATEST

from coevo.ops import selectors
from coevo.ops.health import readiness
from coevo.ops.metrics import METRICS_REALM, metrics_refusal, web_metrics_text


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
    refusal = metrics_refusal(
        authorization=request.headers.get("Authorization", ""),
        token=settings.COEVO_METRICS_TOKEN,
        public=settings.COEVO_METRICS_PUBLIC,
    )
    if refusal is not None:
        response = HttpResponse(refusal.message, status=refusal.status, content_type="text/plain")
        if refusal.status == 401:
            response["WWW-Authenticate"] = METRICS_REALM
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

"""Readiness checks for the web process: database, broker, harness store, policy endpoints.

Each check returns a ``Check`` (ok, milliseconds, the error in words) and never raises. The
database and broker checks open their own short-lived connections with a short timeout: the
question is "can this process reach it now", and a probe must not wait out the default
timeouts (kombu retries a broker connection for a long time) or disturb the connection a
request is using. The policy check asks every registered endpoint's ``/v1/models`` until one
answers; its result is cached for COEVO_READYZ_POLICY_CACHE_S, so a probe every few seconds
does not keep the policy servers busy.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connections

from coevo.celery import app
from coevo.logs import redact
from coevo.policies.client import normalize_base_url
from coevo.policies.models import PolicyEndpoint, PolicyVersion
from coevo.policies.services import policy_endpoint_reachable


@dataclass(frozen=True)
class Check:
    ok: bool
    ms: int
    error: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"ok": self.ok, "ms": self.ms}
        if self.error:
            body["error"] = self.error
        body.update(self.detail)
        return body


def _timed(fn: Any) -> Check:
    started = time.monotonic()
    try:
        detail = fn() or {}
        return Check(ok=True, ms=_ms(started), detail=detail)
    except Exception as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
        return Check(ok=False, ms=_ms(started), error=redact(text)[:500])


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def database_check(*, alias: str = "default") -> Check:
    """``SELECT 1`` over a new connection built from the alias's current settings."""

    def probe() -> None:
        live = connections[alias]
        settings_dict = {**live.settings_dict, "CONN_MAX_AGE": 0}
        if live.vendor == "postgresql":
            options = {**settings_dict.get("OPTIONS", {})}
            options.setdefault("connect_timeout", max(1, int(settings.COEVO_READYZ_TIMEOUT_S)))
            settings_dict["OPTIONS"] = options
        wrapper = live.__class__(settings_dict, alias=alias)
        try:
            with wrapper.cursor() as cursor:
                cursor.execute("SELECT 1")
                cursor.fetchone()
        finally:
            wrapper.close()

    return _timed(probe)


def broker_check() -> Check:
    """A broker connection and a channel on it, with a short timeout and one try."""

    def probe() -> None:
        timeout = settings.COEVO_READYZ_TIMEOUT_S
        with app.connection_for_write(connect_timeout=timeout) as conn:
            conn.ensure_connection(max_retries=1, timeout=timeout)
            channel = conn.channel()
            try:
                # Redis connects lazily: a round trip proves the server answers.
                client = getattr(channel, "client", None)
                if client is not None and hasattr(client, "ping"):
                    client.ping()
            finally:
                channel.close()

    return _timed(probe)


def harness_store_check() -> Check:
    """The store directory exists (or can be created) and a file can be written in it."""

    def probe() -> dict[str, Any]:
        root = Path(settings.COEVO_HARNESS_STORE_DIR)
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".readyz-", delete=True) as handle:
            handle.write(b"ok")
            handle.flush()
            os.fsync(handle.fileno())
        return {}

    return _timed(probe)


@dataclass(frozen=True)
class Probe:
    ok: bool
    ms: int
    error: str


def policy_probe(*, endpoint: Any, version: Any = None, timeout_s: float | None = None) -> Probe:
    """GET /v1/models on one endpoint (through policy_endpoint_reachable)."""
    version = version or PolicyVersion(endpoint=endpoint, served_name="", name="probe")
    timeout = settings.COEVO_READYZ_TIMEOUT_S if timeout_s is None else timeout_s
    started = time.monotonic()
    try:
        ok = policy_endpoint_reachable(version=version, timeout_s=timeout)
    except Exception as exc:
        return Probe(ok=False, ms=_ms(started), error=redact(f"{type(exc).__name__}: {exc}"))
    return Probe(
        ok=ok, ms=_ms(started), error="" if ok else f"{endpoint.base_url}/models did not answer"
    )


_policy_cache: dict[str, Any] = {}
_policy_lock = threading.Lock()


def policy_check() -> Check:
    """At least one policy endpoint answers. Endpoints are the registered ones, or the
    configured COEVO_POLICY_URL when none is registered yet (a fresh install)."""
    ttl = settings.COEVO_READYZ_POLICY_CACHE_S
    with _policy_lock:
        cached = _policy_cache.get("check")
        if cached is not None and time.monotonic() - cached[0] < ttl:
            return cached[1]
    check = _timed(_policy_probe_all)
    if check.ok and not check.detail.get("reachable"):
        check = Check(ok=False, ms=check.ms, error=check.detail.pop("error"), detail=check.detail)
    with _policy_lock:
        _policy_cache["check"] = (time.monotonic(), check)
    return check


def policy_check_cache_clear() -> None:
    with _policy_lock:
        _policy_cache.clear()


def _policy_probe_all() -> dict[str, Any]:
    try:
        endpoints = list(PolicyEndpoint.objects.order_by("name"))
    except Exception:  # the database check reports that; still say whether a policy answers
        endpoints = []
    if not endpoints:
        endpoints = [PolicyEndpoint(name="configured", base_url=normalize_base_url(
            settings.COEVO_POLICY_URL))]  # fmt: skip
    failures = []
    for endpoint in endpoints:
        probe = policy_probe(endpoint=endpoint)
        if probe.ok:
            return {"reachable": endpoint.name, "checked": len(failures) + 1}
        failures.append(f"{endpoint.name}: {probe.error}")
    return {
        "reachable": "",
        "checked": len(failures),
        "error": "no policy endpoint answers GET /v1/models (" + "; ".join(failures) + ")",
    }


CHECKS = {
    "database": database_check,
    "broker": broker_check,
    "harness_store": harness_store_check,
    "policy": policy_check,
}


def readiness() -> tuple[bool, dict[str, Check]]:
    """Every check, run one after another (each bounded by its own timeout)."""
    results = {name: check() for name, check in CHECKS.items()}
    return all(c.ok for c in results.values()), results

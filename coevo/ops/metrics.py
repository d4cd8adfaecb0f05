"""Prometheus metrics, in two halves (docs/monitoring.md).

In-process counters and histograms, recorded where the work happens (policy client, rollout
path, sandbox) in the default registry (defined in workers/metrics.py, below the runtime that
records them): a worker serves them on its own HTTP port
(``worker_metrics_server_start``, from COEVO_WORKER_METRICS_PORT). Counters in one process are
invisible to every other, so the web ``/metrics`` adds ``DatabaseCollector``: figures read
from the database and the broker at scrape time (rollouts and evaluations by state, queue
depths, ledger spend, worker heartbeat age), the same whichever web process answers.

Labels stay low-cardinality: endpoint URL, served model, outcome, error kind, queue, project
slug, worker hostname — never a task id, rollout id or SHA.

Those labels are for operators (which projects exist and spend, which hosts run workers, where
the policy servers are), so both endpoints answer only a scrape that sends COEVO_METRICS_TOKEN,
or anyone when an operator opts in with COEVO_METRICS_PUBLIC=1; with neither, the web answers
403 saying so and a worker opens no metrics port at all (``metrics_refusal``).
"""

from __future__ import annotations

import hmac
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from coevo.ops import selectors
from coevo.policies.selectors import policy_endpoint_slots, policy_endpoints_list
from workers.metrics import REGISTRY

logger = logging.getLogger(__name__)

# --- who may read them ----------------------------------------------------------------------

METRICS_REALM = 'Bearer realm="coevo metrics"'


@dataclass(frozen=True)
class MetricsRefusal:
    status: int  # 401: send (the right) token; 403: metrics are not served to anyone
    message: str


def metrics_refusal(*, authorization: str, token: str, public: bool) -> MetricsRefusal | None:
    """Why a scrape with this ``Authorization`` header is refused, or None when it may read.

    A configured token is always required (COEVO_METRICS_PUBLIC does not waive it); without
    one, metrics are served only on the operator's explicit COEVO_METRICS_PUBLIC=1.
    """
    if token:
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), token.encode()):
            return None
        return MetricsRefusal(
            401, "Send the metrics token: Authorization: Bearer <COEVO_METRICS_TOKEN>.\n"
        )
    if public:
        return None
    return MetricsRefusal(
        403,
        "Metrics are not served: they name projects, worker hosts and policy endpoints. "
        "Set COEVO_METRICS_TOKEN and scrape with Authorization: Bearer <token>, or set "
        "COEVO_METRICS_PUBLIC=1 to serve them to anyone who can reach this address.\n",
    )


def _guarded(app: Callable[..., Iterable[bytes]], *, token: str, public: bool) -> Callable:
    """The registry's WSGI app behind ``metrics_refusal``."""

    def guarded(environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        refusal = metrics_refusal(
            authorization=environ.get("HTTP_AUTHORIZATION", ""), token=token, public=public
        )
        if refusal is None:
            return app(environ, start_response)
        headers = [("Content-Type", "text/plain; charset=utf-8")]
        if refusal.status == 401:
            headers.append(("WWW-Authenticate", METRICS_REALM))
        start_response(f"{refusal.status} {HTTPStatus(refusal.status).phrase}", headers)
        return [refusal.message.encode()]

    return guarded


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per scrape on the worker's stderr is noise


_server_lock = threading.Lock()
_server: Any = None


def worker_metrics_server_start(
    *, port: int, addr: str = "0.0.0.0", token: str = "", public: bool = False, tries: int = 1
) -> int | None:
    """Serve the default registry on the first free port of ``port`` … ``port + tries - 1``
    (``port`` 0 disables); returns the bound port, or None.

    Several worker processes on one host (a rollouts worker and the trainer, say) share one
    COEVO_WORKER_METRICS_PORT: each takes the next free port, logs it and records it on its
    heartbeat row (the system page shows it). Scrapes must send ``token`` when it is set;
    without one the server starts only when ``public`` (COEVO_METRICS_PUBLIC), else the worker
    opens no port and says why in its log. No free port is logged, not fatal: the worker runs
    on without its endpoint.
    """
    global _server
    if port <= 0:
        return None
    if not token and not public:
        logger.info(
            "worker metrics off: set COEVO_METRICS_TOKEN (scrapes send it as a bearer token) "
            "or COEVO_METRICS_PUBLIC=1 to serve them on %s:%s",
            addr,
            port,
        )
        return None

    with _server_lock:
        if _server is not None:
            return _server.server_port
        app = _guarded(make_wsgi_app(REGISTRY), token=token, public=public)
        last = min(port + max(tries, 1) - 1, 65535)
        error: OSError | None = None
        for candidate in range(port, last + 1):
            try:
                _server = _serve(addr, candidate, app)
            except OSError as exc:
                error = exc
                continue
            break
        else:
            logger.warning(
                "worker metrics: cannot listen on %s, ports %s-%s (%s); raise "
                "COEVO_WORKER_METRICS_PORTS, set COEVO_WORKER_METRICS_PORT to a free range, or "
                "0 to disable",
                addr,
                port,
                last,
                error,
            )
            return None
        threading.Thread(target=_server.serve_forever, name="metrics", daemon=True).start()
        bound = _server.server_port
        taken = f" (the first free port from {port})" if bound != port else ""
        logger.info("worker metrics on http://%s:%s/metrics%s", addr, bound, taken)
        return bound


def _serve(addr: str, port: int, app: Callable) -> Any:
    """A metrics server bound to ``addr:port``; OSError when the port is taken."""
    # The address family the address needs ("::" is IPv6), as prometheus_client does.
    family, _, _, _, sockaddr = socket.getaddrinfo(
        addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    server_class = type("_MetricsServer", (ThreadingWSGIServer,), {"address_family": family})
    return make_server(sockaddr[0], port, app, server_class, handler_class=_QuietHandler)


def worker_metrics_server_stop() -> None:
    global _server
    with _server_lock:
        if _server is not None:
            _server.shutdown()
            _server.server_close()
            _server = None


# --- read at scrape time (web) -------------------------------------------------------------


class DatabaseCollector(Collector):
    """Figures every web process reports alike, read at scrape time from the database and
    the broker. Cached for COEVO_METRICS_CACHE_S so that several scrapers (or a fast scrape
    interval) cost the database one set of queries."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cached: tuple[float, list[Metric]] | None = None

    def collect(self) -> Iterator[Metric]:
        from django.conf import settings

        ttl = settings.COEVO_METRICS_CACHE_S
        with self._lock:
            now = time.monotonic()
            if self._cached is None or now - self._cached[0] >= ttl:
                self._cached = (now, list(self._read()))
            metrics = self._cached[1]
        yield from metrics

    def invalidate(self) -> None:
        with self._lock:
            self._cached = None

    def _read(self) -> Iterator[Metric]:
        rollouts = GaugeMetricFamily(
            "coevo_rollouts",
            "Rollout rows by state, outcome and error kind (done rollouts only grow, until "
            "retention deletes them).",
            labels=["state", "outcome", "error_kind"],
        )
        for row in selectors.rollout_counts():
            rollouts.add_metric(
                [row["state"], row["outcome"] or "none", row["error_kind"] or "none"], row["n"]
            )
        yield rollouts

        evaluations = GaugeMetricFamily(
            "coevo_evaluations", "Evaluation rows by state.", labels=["state"]
        )
        for state, n in selectors.evaluation_counts().items():
            evaluations.add_metric([state], n)
        yield evaluations

        depths = selectors.queue_depths()
        broker_up = GaugeMetricFamily(
            "coevo_broker_up", "1 when the broker answered the queue-depth query."
        )
        broker_up.add_metric([], 0 if all(v is None for v in depths.values()) else 1)
        yield broker_up
        queue = GaugeMetricFamily(
            "coevo_queue_depth", "Messages waiting in each broker queue.", labels=["queue"]
        )
        for name, depth in depths.items():
            if depth is not None:
                queue.add_metric([name], depth)
        yield queue

        spent = GaugeMetricFamily(
            "coevo_ledger_spent",
            "Budget ledger spend per project (root budgets: a campaign's budget already "
            "includes its evaluations'), by unit.",
            labels=["project", "unit"],
        )
        reserved = GaugeMetricFamily(
            "coevo_ledger_reserved",
            "Budget ledger reservations not yet settled, per project and unit.",
            labels=["project", "unit"],
        )
        for row in selectors.ledger_totals():
            for unit in ("rollouts", "tokens", "wall_s"):
                spent.add_metric([row["project"], unit], row[f"spent_{unit}"] or 0)
                reserved.add_metric([row["project"], unit], row[f"reserved_{unit}"] or 0)
        yield spent
        yield reserved

        age = GaugeMetricFamily(
            "coevo_worker_heartbeat_age_seconds",
            "Seconds since each running worker's last heartbeat.",
            labels=["worker"],
        )
        workers = GaugeMetricFamily(
            "coevo_workers", "Workers by heartbeat state (alive, stale, stopped).", labels=["state"]
        )
        counts = {"alive": 0, "stale": 0, "stopped": 0}
        for worker in selectors.worker_heartbeats():
            counts[worker.state] += 1
            if worker.state != "stopped":
                age.add_metric([worker.hostname], worker.age_s)
        for state, n in counts.items():
            workers.add_metric([state], n)
        yield age
        yield workers

        in_use = GaugeMetricFamily(
            "coevo_policy_slots_in_use",
            "Concurrency slots of each policy endpoint held now (leases in Redis).",
            labels=["endpoint"],
        )
        limit = GaugeMetricFamily(
            "coevo_policy_slots_limit",
            "Each policy endpoint's max_concurrency.",
            labels=["endpoint"],
        )
        waiting = GaugeMetricFamily(
            "coevo_policy_slot_waiters",
            "Requests waiting for a slot of each policy endpoint.",
            labels=["endpoint"],
        )
        for endpoint in policy_endpoints_list():
            slots = policy_endpoint_slots(endpoint=endpoint)
            in_use.add_metric([endpoint.name], len(slots.holders))
            limit.add_metric([endpoint.name], slots.limit)
            waiting.add_metric([endpoint.name], len(slots.waiters))
        yield in_use
        yield limit
        yield waiting


_web_registry: CollectorRegistry | None = None
_web_lock = threading.Lock()


def web_registry() -> CollectorRegistry:
    """The registry of the web ``/metrics``: the database collector (created once)."""
    global _web_registry
    with _web_lock:
        if _web_registry is None:
            registry = CollectorRegistry(auto_describe=False)
            registry.register(DatabaseCollector())
            _web_registry = registry
        return _web_registry


def web_metrics_text() -> bytes:
    """What the web ``/metrics`` serves: the database figures, then this process's own
    registry (process and Python metrics; its in-process counters, which in a web process
    stay near zero)."""
    return generate_latest(web_registry()) + generate_latest(REGISTRY)

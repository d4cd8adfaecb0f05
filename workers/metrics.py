"""The in-process Prometheus metrics: counters and histograms recorded where the work happens
(policy client, rollout path, sandbox), in the default registry.

They sit below the runtime so that the sandbox and the policy client can count without
importing the operations layer; ``coevo.ops.metrics`` serves this registry (a worker's own
HTTP port) next to the figures it reads from the database (the web ``/metrics``).
docs/monitoring.md lists them. Labels stay low-cardinality: endpoint URL, served model,
outcome, error kind — never a task id, rollout id or SHA.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY, Counter, Histogram

POLICY_REQUESTS = Counter(
    "coevo_policy_requests",
    "Model calls answered by a policy endpoint (completions and chat).",
    ["endpoint", "model", "api"],
    registry=REGISTRY,
)
POLICY_REQUEST_ERRORS = Counter(
    "coevo_policy_request_errors",
    "Failed policy requests: retried (one per failed try), rejected (4xx), failed (a 500 on "
    "every try while the server answers its health probe), unavailable (gave up).",
    ["endpoint", "model", "api", "reason"],
    registry=REGISTRY,
)
POLICY_LATENCY = Histogram(
    "coevo_policy_request_seconds",
    "Latency of answered model calls, waiting for a concurrency slot excluded.",
    ["endpoint", "model", "api"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300),
    registry=REGISTRY,
)
POLICY_TOKENS = Counter(
    "coevo_policy_tokens",
    "Tokens reported by policy endpoints (kind: prompt or completion).",
    ["endpoint", "model", "kind"],
    registry=REGISTRY,
)
ROLLOUTS_STARTED = Counter(
    "coevo_worker_rollouts_started",
    "Rollouts this process claimed and started.",
    registry=REGISTRY,
)
ROLLOUTS_FINISHED = Counter(
    "coevo_worker_rollouts_finished",
    "Rollouts this process finished, by outcome and error kind.",
    ["outcome", "error_kind"],
    registry=REGISTRY,
)
ROLLOUT_DURATION = Histogram(
    "coevo_rollout_duration_seconds",
    "Wall time of finished rollouts (sandbox, model calls and verifier).",
    ["outcome"],
    buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 900, 1800, 3600),
    registry=REGISTRY,
)
SANDBOX_STARTS = Counter(
    "coevo_sandbox_starts",
    "Harness sandboxes started, by kind: warm (forked by a candidate tree's zygote) or cold.",
    ["kind"],
    registry=REGISTRY,
)
SANDBOX_FAILURES = Counter(
    "coevo_sandbox_failures",
    "Sandboxed runs that did not end normally, by reason "
    "(unavailable, no_uid, timeout, output_limit, killed).",
    ["reason"],
    registry=REGISTRY,
)


def policy_request_observed(
    *,
    endpoint: str,
    model: str,
    api: str,
    seconds: float,
    prompt_tokens: int,
    completion_tokens: int,
) -> None:
    POLICY_REQUESTS.labels(endpoint, model, api).inc()
    POLICY_LATENCY.labels(endpoint, model, api).observe(seconds)
    POLICY_TOKENS.labels(endpoint, model, "prompt").inc(prompt_tokens)
    POLICY_TOKENS.labels(endpoint, model, "completion").inc(completion_tokens)


def policy_request_failed(*, endpoint: str, model: str, path: str, reason: str) -> None:
    POLICY_REQUEST_ERRORS.labels(endpoint, model, _api_of(path), reason).inc()


def rollout_started() -> None:
    ROLLOUTS_STARTED.inc()


def rollout_finished(*, outcome: str, error_kind: str, seconds: float) -> None:
    ROLLOUTS_FINISHED.labels(outcome, error_kind or "none").inc()
    ROLLOUT_DURATION.labels(outcome).observe(seconds)


def sandbox_started(*, kind: str) -> None:
    SANDBOX_STARTS.labels(kind).inc()


def sandbox_failure(*, reason: str) -> None:
    SANDBOX_FAILURES.labels(reason).inc()


def sandbox_run_observed(run: Any) -> Any:
    """Count a finished ``sandbox.run`` that did not end normally; returns it unchanged."""
    if run.timed_out:
        sandbox_failure(reason="timeout")
    elif run.output_exceeded:
        sandbox_failure(reason="output_limit")
    elif run.returncode is not None and run.returncode < 0:
        sandbox_failure(reason="killed")  # a signal: the memory or CPU limit, most often
    return run


def _api_of(path: str) -> str:
    return {"/completions": "completions", "/chat/completions": "chat", "/models": "models"}.get(
        path, path.strip("/") or "other"
    )

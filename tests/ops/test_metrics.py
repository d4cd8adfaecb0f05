"""Prometheus metrics: the web /metrics (figures from the database and the broker) and a
worker's in-process registry, after a real evaluation on a real worker."""

from __future__ import annotations

import logging
import socket

import httpx
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from coevo.ops.metrics import worker_metrics_server_start, worker_metrics_server_stop
from coevo.policies.client import PolicyClient, Sampling, normalize_base_url
from tests.conftest import wait_until_final
from tests.support.net import free_port

CORRECT = "    return [s for s in strings if substring in s]\n"  # HumanEval/7


TOKEN = "metrics-secret-123"
AUTHORIZED = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(autouse=True)
def _metrics_settings(settings):
    settings.COEVO_METRICS_CACHE_S = 0
    settings.COEVO_METRICS_TOKEN = TOKEN
    settings.COEVO_METRICS_PUBLIC = False


def scrape(client, headers=AUTHORIZED) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.content[:500]
    assert response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def worker_value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_it_reports_a_real_evaluation_on_metrics_and_in_the_worker_registry(
    client, celery_worker_thread, seed_candidate, humaneval_suite, policy_version, scripted_policy
):
    from coevo.evaluations.models import Rollout, RolloutOutcome
    from coevo.evaluations.services import evaluation_create
    from coevo.suites.models import Split

    scripted_policy.rules.append(("def filter_by_substring", CORRECT))
    endpoint = normalize_base_url(scripted_policy.url)
    labels = {"endpoint": endpoint, "model": "scripted", "api": "completions"}
    before = {
        "requests": worker_value("coevo_policy_requests_total", **labels),
        "latency": worker_value("coevo_policy_request_seconds_count", **labels),
        "tokens": worker_value(
            "coevo_policy_tokens_total", endpoint=endpoint, model="scripted", kind="completion"
        ),
        "started": worker_value("coevo_worker_rollouts_started_total"),
        "passed": worker_value(
            "coevo_worker_rollouts_finished_total", outcome="passed", error_kind="none"
        ),
        "failed": worker_value(
            "coevo_worker_rollouts_finished_total", outcome="task_failure", error_kind="none"
        ),
        "duration": worker_value("coevo_rollout_duration_seconds_count", outcome="passed"),
    }

    evaluation = evaluation_create(
        candidate=seed_candidate,
        suite=humaneval_suite,
        split=Split.SEARCH,
        policy_version=policy_version,
        task_limit=4,
    )
    wait_until_final(evaluation)
    outcomes = list(Rollout.objects.filter(evaluation=evaluation).values_list("outcome", flat=True))
    passed = outcomes.count(RolloutOutcome.PASSED)
    assert passed == 1 and outcomes.count(RolloutOutcome.TASK_FAILURE) == 3

    # The worker's own registry (the in-thread worker shares this process's).
    assert worker_value("coevo_policy_requests_total", **labels) == before["requests"] + 4
    assert worker_value("coevo_policy_request_seconds_count", **labels) == before["latency"] + 4
    assert (
        worker_value(
            "coevo_policy_tokens_total", endpoint=endpoint, model="scripted", kind="completion"
        )
        > before["tokens"]
    )
    assert worker_value("coevo_worker_rollouts_started_total") == before["started"] + 4
    assert (
        worker_value("coevo_worker_rollouts_finished_total", outcome="passed", error_kind="none")
        == before["passed"] + 1
    )
    assert (
        worker_value(
            "coevo_worker_rollouts_finished_total", outcome="task_failure", error_kind="none"
        )
        == before["failed"] + 3
    )
    assert (
        worker_value("coevo_rollout_duration_seconds_count", outcome="passed")
        == before["duration"] + 1
    )

    # The web /metrics: read from the database and the broker.
    samples = scrape(client)
    assert value(samples, "coevo_rollouts", state="done", outcome="passed", error_kind="none") == 1
    assert (
        value(samples, "coevo_rollouts", state="done", outcome="task_failure", error_kind="none")
        == 3
    )
    assert value(samples, "coevo_evaluations", state="finished") == 1
    assert value(samples, "coevo_broker_up") == 1
    assert value(samples, "coevo_queue_depth", queue="rollouts") == 0
    assert value(samples, "coevo_queue_depth", queue="default") == 0
    assert value(samples, "coevo_ledger_spent", project="demo", unit="rollouts") == 4
    assert value(samples, "coevo_ledger_spent", project="demo", unit="tokens") > 0
    # This process's own registry follows the database figures on the same page.
    assert value(samples, "coevo_policy_requests_total", **labels) >= 4


def test_it_counts_messages_waiting_in_each_queue(client, db):
    from coevo.celery import app
    from coevo.evaluations.tasks import rollout_run

    app.control.purge()
    try:
        for _ in range(3):
            rollout_run.apply_async(args=["00000000-0000-0000-0000-000000000000"], queue="rollouts")
        samples = scrape(client)
    finally:
        app.control.purge()
    assert value(samples, "coevo_queue_depth", queue="rollouts") == 3
    assert value(samples, "coevo_queue_depth", queue="default") == 0


def test_it_reports_the_broker_down_without_failing_the_scrape(client, db, monkeypatch):
    monkeypatch.setenv("CELERY_BROKER_URL", f"redis://127.0.0.1:{free_port()}/0")
    samples = scrape(client)
    assert value(samples, "coevo_broker_up") == 0
    assert value(samples, "coevo_queue_depth", queue="rollouts") is None


def test_it_asks_for_the_token_when_one_is_set(client, db, settings):
    assert client.get("/metrics").status_code == 401
    wrong = client.get("/metrics", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert wrong["WWW-Authenticate"].startswith("Bearer")
    samples = scrape(client, headers={"Authorization": "Bearer metrics-secret-123"})
    assert value(samples, "coevo_broker_up") == 1
    # The public opt-in does not waive a token that is set.
    settings.COEVO_METRICS_PUBLIC = True
    assert client.get("/metrics").status_code == 401


def test_it_serves_no_metrics_without_a_token_or_the_public_opt_in(
    client, seed_candidate, humaneval_suite, policy_version, settings
):
    from coevo.evaluations.services import evaluation_create
    from coevo.suites.models import Split

    # A project with ledger spend: its slug is a label of coevo_ledger_spent.
    evaluation_create(
        candidate=seed_candidate,
        suite=humaneval_suite,
        split=Split.SEARCH,
        policy_version=policy_version,
        task_limit=1,
    )
    settings.COEVO_METRICS_TOKEN = ""
    for headers in ({}, {"Authorization": "Bearer anything"}):
        response = client.get("/metrics", headers=headers)
        assert response.status_code == 403
        assert b'project="demo"' not in response.content
        assert response.content.decode() == (
            "Metrics are not served: they name projects, worker hosts and policy endpoints. "
            "Set COEVO_METRICS_TOKEN and scrape with Authorization: Bearer <token>, or set "
            "COEVO_METRICS_PUBLIC=1 to serve them to anyone who can reach this address.\n"
        )

    settings.COEVO_METRICS_PUBLIC = True
    samples = scrape(client, headers={})
    assert value(samples, "coevo_ledger_reserved", project="demo", unit="rollouts") == 1


def test_it_counts_policy_retries_and_outages(scripted_policy):
    endpoint = normalize_base_url(scripted_policy.url)
    failed = {"endpoint": endpoint, "model": "scripted", "api": "completions"}
    retried = worker_value("coevo_policy_request_errors_total", **failed, reason="retried")
    unavailable = worker_value("coevo_policy_request_errors_total", **failed, reason="unavailable")
    scripted_policy.fail_next = 5
    client = PolicyClient(scripted_policy.url, model="scripted", retries=1, backoff_s=0.01)
    with client, pytest.raises(Exception, match="did not answer"):
        client.complete("x", Sampling(max_tokens=4))
    assert (
        worker_value("coevo_policy_request_errors_total", **failed, reason="retried") == retried + 1
    )
    assert (
        worker_value("coevo_policy_request_errors_total", **failed, reason="unavailable")
        == unavailable + 1
    )


def test_it_counts_sandbox_timeouts(settings):
    from workers import sandbox

    before = worker_value("coevo_sandbox_failures_total", reason="timeout")
    run = sandbox.run(
        [sandbox.python_executable(), "-c", "import time; time.sleep(30)"], timeout_s=0.5
    )
    assert run.timed_out
    assert worker_value("coevo_sandbox_failures_total", reason="timeout") == before + 1


def test_it_serves_the_worker_registry_over_http_to_the_token_only():
    port = worker_metrics_server_start(port=free_port(), addr="127.0.0.1", token=TOKEN)
    assert port
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        anonymous = httpx.get(url, timeout=5)
        wrong = httpx.get(url, headers={"Authorization": "Bearer nope"}, timeout=5)
        body = httpx.get(url, headers=AUTHORIZED, timeout=5).text
    finally:
        worker_metrics_server_stop()
    assert anonymous.status_code == wrong.status_code == 401
    assert anonymous.headers["WWW-Authenticate"].startswith("Bearer")
    assert "coevo_policy_requests_total" not in anonymous.text
    assert "coevo_policy_requests_total" in body or "# HELP coevo_policy_requests" in body
    assert "coevo_sandbox_failures" in body
    assert worker_metrics_server_start(port=0, token=TOKEN) is None  # 0 disables


def test_it_opens_no_worker_metrics_port_without_a_token_or_the_public_opt_in():
    port = free_port()

    assert worker_metrics_server_start(port=port, addr="127.0.0.1") is None
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)

    assert worker_metrics_server_start(port=port, addr="127.0.0.1", public=True) == port
    try:
        public = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    finally:
        worker_metrics_server_stop()
    assert public.status_code == 200 and "coevo_sandbox_failures" in public.text


def test_it_serves_worker_metrics_on_the_next_free_port_when_the_first_is_taken(caplog):
    caplog.set_level(logging.INFO, logger="coevo.ops.metrics")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        bound = worker_metrics_server_start(port=port, addr="127.0.0.1", token=TOKEN, tries=16)
        try:
            assert bound is not None and port < bound < port + 16
            scrape = httpx.get(f"http://127.0.0.1:{bound}/metrics", headers=AUTHORIZED, timeout=5)
            assert scrape.status_code == 200
        finally:
            worker_metrics_server_stop()
        assert f"127.0.0.1:{bound}/metrics (the first free port from {port})" in caplog.text
        # One try: the taken port or nothing, and the warning says what to set.
        assert worker_metrics_server_start(port=port, addr="127.0.0.1", token=TOKEN) is None
        assert "COEVO_WORKER_METRICS_PORTS" in caplog.text

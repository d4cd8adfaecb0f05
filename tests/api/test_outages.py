"""The API while a dependency is down: 503 with Retry-After and a JSON error naming it, never a
500; the rate limit lets requests through while its cache (Redis) is down; nothing is created
while the broker cannot take the work. Each outage is real: a refused connection, or a
connection PostgreSQL itself terminated."""

from __future__ import annotations

import logging

import psycopg
import pytest
from django.db import OperationalError, close_old_connections

from coevo.api import throttling
from coevo.evaluations.models import Evaluation, Rollout
from coevo.outages import RETRY_AFTER_S, Dependency, outage_of
from tests.api.conftest import assert_error
from tests.support.outages import (
    broker_down,
    cache_down,
    connection_terminated,
    database_down,
)

BASE = "/api/v1/projects/demo/evaluations/"


@pytest.fixture(autouse=True)
def _fresh_outage_state(monkeypatch):
    # Both are per process: a test that saw an outage must not silence the next one's warning,
    # or skip its rate limit.
    from coevo import outages

    monkeypatch.setattr(outages, "_warnings", outages._Warnings())
    monkeypatch.setattr(throttling, "_cache_down_until", 0.0)


def assert_unavailable(response, dependency: str) -> dict:
    error = assert_error(response, 503, f"{dependency}_unavailable")
    assert response["Retry-After"] == str(RETRY_AFTER_S)
    assert error["details"] == {"dependency": dependency, "retry_after": RETRY_AFTER_S}
    # Which dependency, and nothing about where it is or what failed inside.
    text = response.content.decode()
    for leak in ("127.0.0.1", "Traceback", "psycopg", "connection failed", "postgres://"):
        assert leak not in text
    return error


def test_it_answers_reads_while_the_rate_limit_cache_is_down(
    settings, make_client, researcher, caplog
):
    cache_down(settings)
    client = make_client(researcher, ["read"])
    with caplog.at_level(logging.WARNING, logger="coevo.outages"):
        for _ in range(3):
            response = client.get(BASE)
            assert response.status_code == 200, response.content[:300]
            assert response.json()["results"] == []
    warnings = [r for r in caplog.records if "rate limit is not enforced" in r.getMessage()]
    assert len(warnings) == 1  # once, not per request
    assert warnings[0].levelno == logging.WARNING
    assert "redis unavailable" in warnings[0].getMessage()


@pytest.mark.django_db(transaction=True)
def test_it_answers_503_with_retry_after_while_postgresql_refuses_connections(
    make_client, researcher, caplog
):
    client = make_client(researcher, ["read"])
    with database_down(), caplog.at_level(logging.WARNING):
        list_response = client.get(BASE)
        projects_response = client.get("/api/v1/projects/")
    assert_unavailable(list_response, "database")
    assert_unavailable(projects_response, "database")
    assert "database unavailable" in caplog.text
    # Logged once by coevo (rate-limited), not as an error per request by Django.
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert client.get(BASE).status_code == 200  # back as soon as the database is


@pytest.mark.django_db(transaction=True)
def test_it_answers_503_when_postgresql_ends_the_connection_and_recovers_after(
    make_client, researcher
):
    client = make_client(researcher, ["read"])
    assert client.get(BASE).status_code == 200  # a connection is open and reused
    with connection_terminated():
        assert_unavailable(client.get(BASE), "database")
        # What Django does before each request outside the test client: drop the broken one.
        close_old_connections()
        assert client.get(BASE).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_it_refuses_to_start_an_evaluation_while_the_broker_is_down(
    make_client, researcher, seed_candidate, humaneval_suite, policy_version
):
    body = {
        "candidate": seed_candidate.sha,
        "suite": humaneval_suite.name,
        "split": "validation",
        "task_limit": 3,
    }
    client = make_client(researcher)
    with broker_down():
        response = client.post(BASE, body, format="json")
    assert_unavailable(response, "broker")
    # Nothing half-created: no evaluation whose rollouts were never sent.
    assert not Evaluation.objects.exists() and not Rollout.objects.exists()
    assert client.post(BASE, body, format="json").status_code == 202


def test_it_answers_500_for_a_bug_not_503(make_client, researcher, monkeypatch):
    # A database error that is not an outage (here a query PostgreSQL refused) stays a 500.
    from coevo.api import evaluations

    def refused(**kwargs):
        raise OperationalError("deadlock detected") from psycopg.errors.DeadlockDetected()

    monkeypatch.setattr(evaluations, "evaluation_list", refused)
    response = make_client(researcher, ["read"]).get(BASE)
    assert_error(response, 500, "server_error")
    assert "Retry-After" not in response


def test_it_tells_outages_from_other_errors_by_type_and_sqlstate():
    def django_error(cause: Exception) -> OperationalError:
        try:
            raise OperationalError(str(cause)) from cause
        except OperationalError as exc:
            return exc

    refused = psycopg.OperationalError("connection failed: Connection refused")
    assert outage_of(django_error(refused)) == Dependency.DATABASE
    assert outage_of(django_error(psycopg.errors.AdminShutdown())) == Dependency.DATABASE
    assert outage_of(django_error(psycopg.errors.CannotConnectNow())) == Dependency.DATABASE
    assert outage_of(django_error(psycopg.errors.DeadlockDetected())) is None
    assert outage_of(django_error(psycopg.errors.QueryCanceled())) is None
    assert outage_of(ValueError("connection refused")) is None

"""/healthz and /readyz: each dependency's failure reported by name, against real services
(a private Redis stopped under the check, a database that does not exist, a policy server
taken down)."""

from __future__ import annotations

import pytest
from django.db import connections

from coevo.ops.health import policy_check_cache_clear
from coevo.policies.models import PolicyEndpoint, PolicyVersion
from tests.support.net import free_port
from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy
from tests.support.processes import RedisProcess

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_policy_cache(settings):
    settings.COEVO_READYZ_TIMEOUT_S = 2
    policy_check_cache_clear()
    yield
    policy_check_cache_clear()


def readyz(client) -> tuple[int, dict]:
    response = client.get("/readyz")
    assert response["Content-Type"] == "application/json"
    return response.status_code, response.json()


def failed(body: dict) -> set[str]:
    return {name for name, check in body["checks"].items() if not check["ok"]}


def test_it_answers_healthz_without_touching_any_dependency(client, monkeypatch):
    # Every dependency unreachable: the process is still alive.
    # Celery reads CELERY_BROKER_URL from the environment before its configuration.
    monkeypatch.setenv("CELERY_BROKER_URL", f"redis://127.0.0.1:{free_port()}/0")
    monkeypatch.setitem(connections["default"].settings_dict, "NAME", "coevo_no_such_db")
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"alive": True}


def test_it_is_ready_when_every_dependency_answers(client, policy_version):
    status, body = readyz(client)
    assert status == 200, body
    assert body["ready"] is True
    assert set(body["checks"]) == {"database", "broker", "harness_store", "policy"}
    assert failed(body) == set()
    assert body["checks"]["policy"]["reachable"] == policy_version.endpoint.name


def test_it_reports_the_broker_down_when_redis_stops(client, policy_version, monkeypatch, tmp_path):
    redis = RedisProcess(tmp_path)
    redis.start()
    try:
        monkeypatch.setenv("CELERY_BROKER_URL", redis.url)
        status, body = readyz(client)
        assert status == 200, body
        redis.stop()
        status, body = readyz(client)
    finally:
        redis.stop()
    assert status == 503
    assert body["ready"] is False
    assert failed(body) == {"broker"}
    error = body["checks"]["broker"]["error"]
    assert "refused" in error.lower() or "connect" in error.lower(), error
    assert body["checks"]["broker"]["ms"] < 10_000


def test_it_reports_a_database_that_does_not_exist(client, policy_version, monkeypatch):
    # The check connects afresh with the current settings: point them at a missing database
    # (this test's own connection stays open on the real one).
    monkeypatch.setitem(connections["default"].settings_dict, "NAME", "coevo_h5_no_such_db")
    status, body = readyz(client)
    assert status == 503
    assert failed(body) == {"database"}
    assert "coevo_h5_no_such_db" in body["checks"]["database"]["error"]
    assert "does not exist" in body["checks"]["database"]["error"]


def test_it_reports_a_policy_endpoint_that_is_down(client, db):
    server = ScriptedOpenAIServer(ScriptedPolicy())
    server.start()
    endpoint = PolicyEndpoint.objects.create(name="gpu-1", base_url=server.url, kind="vllm")
    PolicyVersion.objects.create(name="v1", base_model="m", served_name="m", endpoint=endpoint)
    status, body = readyz(client)
    assert status == 200, body

    server.stop()
    policy_check_cache_clear()
    status, body = readyz(client)
    assert status == 503
    assert failed(body) == {"policy"}
    error = body["checks"]["policy"]["error"]
    assert "gpu-1" in error and "/models" in error


def test_it_is_ready_while_one_of_two_policy_endpoints_answers(client, db, scripted_policy):
    down_url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    PolicyEndpoint.objects.create(name="a-down", base_url=down_url, kind="vllm")
    PolicyEndpoint.objects.create(name="b-up", base_url=scripted_policy.url, kind="vllm")
    status, body = readyz(client)
    assert status == 200, body
    assert body["checks"]["policy"]["reachable"] == "b-up"


def test_it_caches_the_policy_answer_for_a_few_seconds(client, settings, scripted_policy, db):
    settings.COEVO_READYZ_POLICY_CACHE_S = 60
    server = ScriptedOpenAIServer(ScriptedPolicy())
    server.start()
    PolicyEndpoint.objects.create(name="only", base_url=server.url, kind="vllm")
    assert readyz(client)[0] == 200
    server.stop()
    # Within the cache window the earlier answer stands; a fresh check sees the outage.
    assert readyz(client)[0] == 200
    policy_check_cache_clear()
    assert readyz(client)[0] == 503


def test_it_reports_a_harness_store_it_cannot_write(client, settings, policy_version, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    settings.COEVO_HARNESS_STORE_DIR = str(blocker / "store")
    status, body = readyz(client)
    assert status == 503
    assert failed(body) == {"harness_store"}
    assert body["checks"]["harness_store"]["error"]


def test_it_needs_no_login(client, policy_version):
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200

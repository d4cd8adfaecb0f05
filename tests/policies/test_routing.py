"""Endpoint health (beat's check) and routing a version's requests when an endpoint is down."""

from __future__ import annotations

import pytest

from coevo.errors import PolicyUnavailable
from coevo.policies.client import Sampling
from coevo.policies.models import EndpointKind, PolicyEndpoint
from coevo.policies.services import (
    policy_client_for,
    policy_endpoint_reachable,
    policy_endpoints_check,
    policy_version_create,
)
from coevo.policies.tasks import policy_endpoints_check as policy_endpoints_check_task
from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy


@pytest.fixture
def two_servers():
    a, b = ScriptedPolicy(default="from a"), ScriptedPolicy(default="from b")
    with ScriptedOpenAIServer(a) as server_a, ScriptedOpenAIServer(b) as server_b:
        yield server_a, server_b


@pytest.fixture
def replicated(db, two_servers, settings):
    settings.COEVO_POLICY_RETRIES = 0
    server_a, server_b = two_servers
    a = PolicyEndpoint.objects.create(
        name="a", base_url=server_a.url, kind=EndpointKind.OPENAI_COMPATIBLE
    )
    b = PolicyEndpoint.objects.create(
        name="b", base_url=server_b.url, kind=EndpointKind.OPENAI_COMPATIBLE
    )
    return policy_version_create(
        name="v1", endpoint=a, base_model="scripted", served_name="scripted", replicas=[b]
    )


def ask(version) -> str:
    with policy_client_for(version=version) as client:
        return client.complete("hi", Sampling(max_tokens=2)).text


def test_it_marks_a_stopped_endpoint_down_and_routes_around_it(replicated, two_servers):
    server_a, _ = two_servers
    server_a.stop()

    assert policy_endpoints_check() == {"a": False, "b": True}

    a = PolicyEndpoint.objects.get(name="a")
    assert not a.healthy and a.consecutive_failures == 1 and a.last_error and a.checked_at
    assert PolicyEndpoint.objects.get(name="b").latency_ms is not None
    assert {ask(replicated) for _ in range(4)} == {"from b"}
    assert server_a.policy.requests == []


def test_it_routes_to_an_endpoint_again_once_it_answers(replicated, two_servers):
    server_a, _ = two_servers
    server_a.stop()
    policy_endpoints_check()
    server_a.start()

    policy_endpoints_check_task()  # what beat runs

    assert PolicyEndpoint.objects.get(name="a").healthy
    assert {ask(replicated) for _ in range(4)} == {"from a", "from b"}  # round robin


def test_it_fails_over_when_an_endpoint_dies_before_beat_notices(replicated, two_servers):
    server_a, _ = two_servers
    server_a.stop()

    answers = {ask(replicated) for _ in range(4)}

    assert answers == {"from b"}
    assert not PolicyEndpoint.objects.get(name="a").healthy


def test_it_raises_policy_unavailable_when_no_endpoint_is_healthy(replicated, two_servers):
    for server in two_servers:
        server.stop()
    policy_endpoints_check()

    with pytest.raises(PolicyUnavailable, match="marked unhealthy"):
        ask(replicated)
    assert not policy_endpoint_reachable(version=replicated, timeout_s=1)
    two_servers[1].start()
    assert policy_endpoint_reachable(version=replicated, timeout_s=1)
    assert PolicyEndpoint.objects.get(name="b").healthy

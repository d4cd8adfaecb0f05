"""Endpoint health (beat's check) and routing a version's requests when an endpoint is down."""

from __future__ import annotations

import pytest

from coevo.errors import PolicyRequestFailed, PolicyRequestRejected, PolicyUnavailable
from coevo.policies.client import Sampling
from coevo.policies.concurrency import EndpointLimiter
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


# --- what marks an endpoint down: its health probe and failed connections, not one answer ---

REQUIRED_TOOL = {
    "messages": [{"role": "user", "content": "hi"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    "tool_choice": "required",
}


def never_marked_down(name: str) -> bool:
    endpoint = PolicyEndpoint.objects.get(name=name)
    return endpoint.healthy and endpoint.consecutive_failures == 0 and endpoint.failed_at is None


def test_a_500_to_one_request_marks_no_endpoint_down_and_a_refused_connection_does(
    replicated, two_servers, settings
):
    settings.COEVO_POLICY_RETRIES = 2
    for server in two_servers:
        server.policy.fails_on = {"tool_choice": "required"}

    with (
        policy_client_for(version=replicated) as client,
        pytest.raises(PolicyRequestFailed, match="HTTP 500"),
    ):
        client.forward("chat", REQUIRED_TOOL)

    assert never_marked_down("a") and never_marked_down("b")
    # The request's fault: retried as a transient error (once, on a route with a replica
    # behind it), but not sent to the replica too.
    assert sorted(len(server.policy.requests) for server in two_servers) == [0, 2]
    assert {ask(replicated) for _ in range(4)} == {"from a", "from b"}

    two_servers[0].stop()
    assert {ask(replicated) for _ in range(4)} == {"from b"}

    a = PolicyEndpoint.objects.get(name="a")
    assert not a.healthy and a.failed_at is not None and "Connection refused" in a.last_error
    assert never_marked_down("b")


def test_a_500_when_the_health_probe_fails_too_marks_the_endpoint_down(db, settings):
    settings.COEVO_POLICY_RETRIES = 0
    # The server is failing: every request and its health probe get HTTP 500.
    policy = ScriptedPolicy(fails_on={"model": "scripted"}, models_status=500)
    with ScriptedOpenAIServer(policy) as server:
        endpoint = PolicyEndpoint.objects.create(
            name="failing", base_url=server.url, kind=EndpointKind.OPENAI_COMPATIBLE
        )
        version = policy_version_create(
            name="v-failing", endpoint=endpoint, base_model="scripted", served_name="scripted"
        )

        with pytest.raises(PolicyUnavailable) as caught:
            ask(version)

    assert not isinstance(caught.value, PolicyRequestRejected)  # an infra_error
    endpoint.refresh_from_db()
    assert not endpoint.healthy and endpoint.failed_at is not None
    assert "health probe failed too" in endpoint.last_error


# --- what the version's error says: its servers down (an outage) or only busy ---------------


def test_the_versions_error_says_its_servers_were_down_only_when_none_was_merely_busy(
    replicated, two_servers, settings
):
    server_a, server_b = two_servers
    # Both up but busy (HTTP 503 while their probes answer): capacity, not an outage.
    server_a.policy.fail_next = server_b.policy.fail_next = 10
    with pytest.raises(PolicyUnavailable) as busy:
        ask(replicated)
    assert busy.value.endpoint_down is False
    assert never_marked_down("a") and never_marked_down("b")

    # One refuses connections, the other is busy: one server still serves the version.
    server_a.stop()
    server_b.policy.fail_next = 10
    with pytest.raises(PolicyUnavailable) as mixed:
        ask(replicated)
    assert mixed.value.endpoint_down is False

    # Both refuse connections: down.
    server_b.stop()
    PolicyEndpoint.objects.update(healthy=True)
    with pytest.raises(PolicyUnavailable) as down:
        ask(replicated)
    assert down.value.endpoint_down is True

    # Both marked unhealthy: no request is sent, and that is the servers being down too, even
    # once they are back (a restart shorter than the time between two probes).
    server_a.start()
    server_b.start()
    with pytest.raises(PolicyUnavailable, match="marked unhealthy") as marked:
        ask(replicated)
    assert marked.value.endpoint_down is True


def test_a_version_whose_endpoints_have_no_free_slot_is_not_down(replicated, settings):
    settings.COEVO_POLICY_SLOT_WAIT_S = 1
    PolicyEndpoint.objects.update(max_concurrency=1)
    holders = [
        EndpointLimiter(
            endpoint_id=str(e.id), limit=1, redis_url=settings.COEVO_REDIS_URL, holder="other"
        )
        for e in PolicyEndpoint.objects.all()
    ]
    with holders[0].slot(), holders[1].slot(), pytest.raises(PolicyUnavailable) as caught:
        ask(replicated)

    assert "no concurrency slot" in str(caught.value)
    assert caught.value.endpoint_down is False
    assert never_marked_down("a") and never_marked_down("b")

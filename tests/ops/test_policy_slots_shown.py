"""Who holds a policy endpoint's slots and who waits for them, where people look: the system
page (staff), /metrics, and the page of a rollout that waits. Real Redis leases, no rollout ids
in what the system page and a waiting rollout's neighbours see."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest
import redis

from coevo.evaluations.models import EvaluationState, RolloutState
from coevo.policies.concurrency import EndpointLimiter, slot_keys
from tests.conftest import PASSWORD
from tests.ops.test_metrics import TOKEN, scrape, value
from tests.support.factories import make_evaluation, make_rollout

REDIS_URL = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15")


@pytest.fixture
def held_endpoint(settings, policy_version):
    """The policy version's endpoint at max_concurrency 1, its slot held by this process, and
    a request of ``rollout <id>`` waiting for it (set ``waiter`` before use)."""
    settings.COEVO_REDIS_URL = REDIS_URL
    settings.COEVO_METRICS_CACHE_S = 0
    settings.COEVO_METRICS_TOKEN = TOKEN
    settings.COEVO_METRICS_PUBLIC = False
    endpoint = policy_version.endpoint
    endpoint.max_concurrency = 1
    endpoint.save(update_fields=["max_concurrency"])
    release = threading.Event()
    held = threading.Event()

    def hold() -> None:
        with EndpointLimiter(
            endpoint_id=str(endpoint.id), limit=1, redis_url=REDIS_URL, holder="other"
        ).slot():
            held.set()
            release.wait(30)

    threading.Thread(target=hold, daemon=True).start()
    assert held.wait(10)
    state = {"endpoint": endpoint, "release": release}

    def wait_as(holder: str) -> None:
        limiter = EndpointLimiter(
            endpoint_id=str(endpoint.id), limit=1, redis_url=REDIS_URL, holder=holder, wait_s=30
        )
        threading.Thread(target=lambda: limiter.slot().__enter__(), daemon=True).start()
        time.sleep(0.5)

    state["wait_as"] = wait_as
    yield state
    release.set()
    time.sleep(0.2)
    redis.Redis.from_url(REDIS_URL).delete(*slot_keys(str(endpoint.id)))


def test_the_system_page_and_metrics_show_slots_holders_and_waiters(client, owner, held_endpoint):
    owner.is_staff = True
    owner.save(update_fields=["is_staff"])
    held_endpoint["wait_as"]("rollout someone")
    assert client.login(username=owner.username, password=PASSWORD)

    page = client.get("/system/").content.decode()
    assert "1/1 in use · 1 waiting" in page
    assert f"{socket.gethostname()} pid {os.getpid()}" in page
    assert "rollout someone" not in page  # rollout ids stay on their project's pages

    samples = scrape(client)
    name = held_endpoint["endpoint"].name
    assert value(samples, "coevo_policy_slots_in_use", endpoint=name) == 1
    assert value(samples, "coevo_policy_slots_limit", endpoint=name) == 1
    assert value(samples, "coevo_policy_slot_waiters", endpoint=name) == 1


def test_a_rollout_waiting_for_a_slot_says_so_on_its_page(
    client, owner, project, seed_candidate, humaneval_suite, policy_version, held_endpoint
):
    evaluation = make_evaluation(
        candidate=seed_candidate,
        suite=humaneval_suite,
        policy_version=policy_version,
        state=EvaluationState.RUNNING,
    )
    task = humaneval_suite.tasks.first()
    waiting = make_rollout(evaluation, task, state=RolloutState.RUNNING)
    other = make_rollout(evaluation, humaneval_suite.tasks.last(), state=RolloutState.RUNNING)
    held_endpoint["wait_as"](f"rollout {waiting.id}")
    assert client.login(username=owner.username, password=PASSWORD)

    page = client.get(f"/p/{project.slug}/r/{waiting.id}/").content.decode()
    assert "for a policy slot: 1/1 held by" in page
    assert "not counted against the harness" in page
    other_page = client.get(f"/p/{project.slug}/r/{other.id}/").content.decode()
    assert "for a policy slot" not in other_page

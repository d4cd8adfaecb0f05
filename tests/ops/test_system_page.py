"""The system page: for staff (operators) only; workers, queues, policy endpoints, storage."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from coevo.ops.heartbeats import worker_heartbeat_record, worker_heartbeat_stop
from coevo.ops.models import WorkerHeartbeat
from tests.conftest import PASSWORD
from tests.support.net import free_port

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fast(settings):
    settings.COEVO_SYSTEM_PING_TIMEOUT_S = 0.2
    settings.COEVO_READYZ_TIMEOUT_S = 1


@pytest.fixture
def staff(owner):
    owner.is_staff = True
    owner.save(update_fields=["is_staff"])
    return owner


def login(client, user):
    assert client.login(username=user.username, password=PASSWORD)
    return client


def test_it_shows_workers_queues_endpoints_and_storage_to_staff(
    client, staff, policy_version, seed_candidate, empty_queue
):
    # empty_queue: an earlier test may have left work in the shared broker (CI did, once).
    from coevo.policies.models import PolicyEndpoint

    identity = {"queues": ["default", "rollouts"], "concurrency": 8, "version": "0.1.0"}
    worker_heartbeat_record(hostname="alive@host1", pid=101, starting=True, **identity)
    worker_heartbeat_record(hostname="dead@host2", pid=102, starting=True, **identity)
    WorkerHeartbeat.objects.filter(hostname="dead@host2").update(
        last_seen_at=timezone.now() - timedelta(hours=1)
    )
    worker_heartbeat_record(hostname="gone@host3", pid=103, starting=True, **identity)
    worker_heartbeat_stop(hostname="gone@host3", pid=103)
    PolicyEndpoint.objects.create(
        name="down-1", base_url=f"http://127.0.0.1:{free_port()}/v1", kind="vllm"
    )

    response = login(client, staff).get("/system/")
    assert response.status_code == 200
    page = response.content.decode()
    assert 'data-worker="alive@host1"' in page and 'data-worker="dead@host2"' in page
    workers = {w.hostname: w for w in response.context["workers"]}
    assert (workers["alive@host1"].state, workers["dead@host2"].state) == ("alive", "stale")
    assert workers["gone@host3"].state == "stopped"
    assert workers["alive@host1"].answers_ping is False  # no such process answers the broker
    assert response.context["queues"] == {"default": 0, "rollouts": 0, "training": 0, "ops": 0}
    endpoints = {e.name: e for e in response.context["endpoints"]}
    assert endpoints[policy_version.endpoint.name].reachable
    assert endpoints[policy_version.endpoint.name].latency_ms is not None
    assert not endpoints["down-1"].reachable and endpoints["down-1"].error
    assert response.context["store_bytes"] > 0  # the seed candidate's repository
    # Every partition counts (the partitioned table itself has no storage: it would read 0).
    assert response.context["trace_bytes"] > 0
    assert 'id="storage"' in page and 'data-endpoint="down-1"' in page


def test_it_renders_only_the_status_partial_for_htmx(client, staff):
    response = login(client, staff).get("/system/", headers={"HX-Request": "true"})
    assert response.status_code == 200
    page = response.content.decode()
    assert page.lstrip().startswith('<section id="system-status"')
    assert "<html" not in page
    assert 'id="no-workers"' in page


def test_it_shows_the_latest_store_check_when_checks_exist(client, staff, project):
    from harness_store.models import StoreCheck as store_check

    now = timezone.now()
    store_check.objects.create(
        project=project, ok=True, output="old", checked_at=now - timedelta(days=1)
    )
    store_check.objects.create(project=project, ok=False, output="missing blob abc", checked_at=now)
    response = login(client, staff).get("/system/")
    page = response.content.decode()
    assert 'id="store-checks"' in page
    assert "missing blob abc" in page and ">old<" not in page


def test_it_hides_the_page_from_users_who_are_not_staff(client, outsider, reviewer):
    assert login(client, outsider).get("/system/").status_code == 404
    client.logout()
    assert login(client, reviewer).get("/system/").status_code == 404


def test_it_sends_anonymous_visitors_to_log_in(client, db):
    response = client.get("/system/")
    assert response.status_code == 302
    assert "/login/" in response["Location"]


def test_it_names_a_manage_py_command_that_exists_when_no_store_check_ran(client, staff):
    from django.core.management import get_commands

    page = login(client, staff).get("/system/").content.decode()
    text = " ".join(re.sub(r"<[^>]+>", " ", page).split())
    assert "No store check has run yet" in text
    named = re.findall(r"manage\.py (\S+?)[,.)\s]", text)
    assert named == ["harness_fsck"]
    assert set(named) <= set(get_commands())

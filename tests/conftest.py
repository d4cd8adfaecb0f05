"""Shared fixtures: real PostgreSQL (via DATABASE_URL), a real git repository per test,
users with roles (an owner, a reviewer, a researcher, a viewer and an outsider; an operator),
the seed harness and a child of it, and HumanEval. Builders: tests/support/factories.py."""

from __future__ import annotations

import threading

import pytest
from celery.contrib.testing.worker import start_worker
from django.db import connection
from django.db.backends.signals import connection_created

from coevo.celery import app
from coevo.projects.models import Project, Role
from coevo.projects.services import membership_set, project_get_or_create
from tests.support.factories import (  # noqa: F401  (tests import REPO_ROOT, PASSWORD from here)
    PASSWORD,
    REPO_ROOT,
    SEED_HARNESS,
    make_child_candidate,
    make_member,
    make_user,
    make_vllm_policy,
)
from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy
from tests.support.processes import CeleryProcesses


@pytest.fixture(autouse=True)
def _fast_password_hasher(settings):
    """Django's default hasher costs ~0.26 s a password on a CI core, and most tests create two
    or three users and log one in: about a second a test. Tests are not about the hasher
    (live_server threads share these settings; subprocess servers create their own users)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _harness_store_dir(settings, tmp_path):
    """Each test gets its own harness store (a real git repository on disk)."""
    settings.COEVO_HARNESS_STORE_DIR = str(tmp_path / "harness-store")


@pytest.fixture
def owner(db):
    return make_user("owner")


@pytest.fixture
def reviewer(db):
    return make_user("reviewer")


@pytest.fixture
def outsider(db):
    return make_user("outsider")


@pytest.fixture
def researcher(project):
    return make_member(project, "researcher", Role.RESEARCHER)


@pytest.fixture
def viewer(project):
    return make_member(project, "viewer", Role.VIEWER)


@pytest.fixture
def operator(django_user_model):
    """A superuser (the Django admin's operator), who belongs to no project."""
    return django_user_model.objects.create_superuser("operator", password="x")


@pytest.fixture
def project(owner, reviewer) -> Project:
    project = project_get_or_create(slug="demo", name="Demo agent")
    membership_set(project=project, user=owner, role=Role.ADMIN)
    membership_set(project=project, user=reviewer, role=Role.REVIEWER)
    return project


@pytest.fixture
def seed_candidate(project, owner):
    from harness_store.services import candidate_import_directory

    candidate, _ = candidate_import_directory(
        project=project,
        directory=SEED_HARNESS,
        message="Seed harness: plain completion",
        author_name="Owner",
        author_email="owner@example.com",
        created_by=owner,
    )
    return candidate


@pytest.fixture
def child_candidate(project, seed_candidate, tmp_path):
    return make_child_candidate(project, seed_candidate, tmp_path / "child")


@pytest.fixture
def humaneval_suite(project):
    from coevo.suites.services import suite_import_humaneval

    suite, _ = suite_import_humaneval(project=project)
    return suite


@pytest.fixture
def scripted_server():
    """A scripted OpenAI-compatible server (``.stop()`` and ``.start()`` restart it on its
    port); ``.policy`` is its ScriptedPolicy."""
    with ScriptedOpenAIServer(ScriptedPolicy()) as server:
        server.policy.url = server.url
        yield server


@pytest.fixture
def scripted_policy(scripted_server):
    """The scripted server's ScriptedPolicy (``.url`` is set)."""
    return scripted_server.policy


@pytest.fixture
def policy_version(db, settings, scripted_policy):
    from coevo.policies.services import policy_version_get_default

    settings.COEVO_POLICY_URL = scripted_policy.url
    settings.COEVO_POLICY_MODEL = "scripted"
    return policy_version_get_default()


@pytest.fixture
def base_policy(db):
    """A vLLM-kind base policy on an endpoint nothing serves: for tests that never call the
    policy (training, rollouts finished by hand)."""
    return make_vllm_policy()


@pytest.fixture
def empty_queue():
    """The broker's queues empty before and after the test: work a test enqueued (and did not
    run) never reaches the next test's worker."""
    app.control.purge()
    yield
    app.control.purge()


@pytest.fixture
def celery_worker_thread(transactional_db, settings):
    """A real worker (in a thread of this process) consuming the real broker's queues."""
    yield from _worker(settings, pool="solo", concurrency=1)


@pytest.fixture
def celery_worker_threads(transactional_db, settings):
    """A real worker running four tasks at once, each in a thread of its own: work the design
    spreads over several workers (a round's drafts) runs in parallel, as it would there."""
    yield from _worker(settings, pool="threads", concurrency=4)


def _worker(settings, *, pool: str, concurrency: int):
    assert not settings.CELERY_BROKER_URL.startswith("filesystem"), "tests need CELERY_BROKER_URL"
    app.control.purge()
    # A worker's threads keep their database connections from task to task (as in
    # production, where they live as long as the process): close them when this worker
    # stops, or each test's worker would leave its connections open until garbage collection.
    opened = []

    def track(sender, connection, **_):
        if threading.current_thread() is not threading.main_thread():
            opened.append((threading.current_thread(), connection))

    connection_created.connect(track, weak=False)
    try:
        with start_worker(
            app,
            pool=pool,
            concurrency=concurrency,
            perform_ping_check=False,
            queues=["rollouts", "default", "training", "ops"],
            loglevel="WARNING",
            shutdown_timeout=30,
        ) as worker:
            yield worker
    finally:
        connection_created.disconnect(track)
        for thread, wrapper in opened:
            raw = wrapper.connection
            if not thread.is_alive() and raw is not None and not raw.closed:
                raw.close()  # its thread has ended: closed from here
    connection.close()


@pytest.fixture
def celery_processes(transactional_db, tmp_path):
    """Real ``celery worker`` and ``celery beat`` processes on the test database and the real
    broker, started by the test (``.worker(name, queues=…, **env)``, ``.beat(**env)``) and
    stopped after it; the broker's queues are empty before and after."""
    app.control.purge()
    processes = CeleryProcesses(broker_url=app.conf.broker_url, log_dir=tmp_path)
    yield processes
    processes.stop()
    app.control.purge()
    connection.close()


def wait_until_final(evaluation, timeout_s: float = 90):
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        evaluation.refresh_from_db()
        if evaluation.is_final:
            return evaluation
        time.sleep(0.2)
    raise AssertionError(f"evaluation still {evaluation.state} after {timeout_s}s")

"""Task image builds: recorded from a rollout's "environment" steps (what the worker task stores),
and shown on the suite's page, built or failed, with the failed step named and the log
collapsed; a held-out task's build shows its state and time only. The builds themselves, on the
real engine, are tests/containers/test_image_builds.py's."""

from __future__ import annotations

import html
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from coevo.suites.harbor import suite_import_harbor
from coevo.suites.image_builds import (
    LOG_HEAD_CHARS,
    LOG_TAIL_CHARS,
    bounded_log,
    image_build_from_step,
    task_image_builds_record_steps,
)
from coevo.suites.models import (
    ImageBuildOutcome,
    ImageBuildSource,
    Split,
    Suite,
    Task,
    TaskImageBuild,
)
from coevo.suites.selectors import suite_image_rows
from coevo.suites.splits import split_for
from tests.support.harbor import write_harbor_task
from workers.trace import Environment, Step

pytestmark = pytest.mark.django_db

RUN_DOCKERFILE = "FROM python:3.11-slim-bookworm\nRUN echo made\nWORKDIR /app\nCOPY . /app\n"
# What a held-out task's build log and failed step say: never on a page.
SECRET_LOG = "HELDOUT-BUILD-LOG-7f3a: the hidden answer is 42"
SECRET_STEP = "RUN echo HELDOUT-STEP-91c2"


def key_in(split: Split, *, prefix: str, seed: str = "0") -> str:
    """A task key the hash split puts in ``split``."""
    return next(
        f"{prefix}-{i}" for i in range(1000) if split_for(f"{prefix}-{i}", seed=seed) == split
    )


def built_step(*, log: str = "Step 1/4 : FROM base\nSuccessfully built\n") -> Step:
    """An "environment" step as the rollout records it when its call built the image."""
    return Step(
        "environment",
        {
            "backend": "container",
            "image": "coevo-task:0123abcd",
            "image_cached": False,
            "network": "none",
            "build": {"seconds": 12.5, "content_hash": "ab" * 32, "log": log},
        },
    )


def failed_step(*, step: str = "RUN pip install nothing-such", line: int = 2, log: str) -> Step:
    """The "environment" step a rollout records before it ends on a failed build."""
    return Step(
        "environment",
        {
            "backend": "container",
            "build_failed": {
                "step": step,
                "line": line,
                "timed_out": False,
                "error": f"the task's image did not build: `{step}` (Dockerfile line {line}) "
                "failed with exit code 1: no such package",
                "log": log,
            },
        },
    )


def cached_step() -> Step:
    return Step(
        "environment", {"backend": "container", "image": "coevo-task:1", "image_cached": True}
    )


@pytest.fixture
def container_suite(settings, project, tmp_path) -> Suite:
    """A workspace suite with a task that runs in its container in each split, and one that
    runs in bubblewrap (files only). Imported without checking: no engine is asked."""
    settings.COEVO_CONTAINER_BACKEND = True
    tasks = tmp_path / "tasks"
    for split in Split:
        write_harbor_task(tasks, key_in(split, prefix="image"), dockerfile=RUN_DOCKERFILE)
    write_harbor_task(tasks, "files-only")
    suite, _, report = suite_import_harbor(project=project, name="images", directory=tasks)
    assert not report.refused, report.refused
    return suite


def task_in(suite: Suite, split: Split) -> Task:
    return suite.tasks.get(key=key_in(split, prefix="image"))


def page_text(client, suite: Suite, **query) -> str:
    url = reverse("web:suite", args=[suite.project.slug, suite.id])
    response = client.get(url, query)
    assert response.status_code == 200
    return html.unescape(response.content.decode())


# --- recording -----------------------------------------------------------------------------


def test_it_records_the_builds_a_rollouts_steps_carry(container_suite):
    task = task_in(container_suite, Split.SEARCH)

    rows = task_image_builds_record_steps(
        task_id=task.id,
        steps=[
            Step("start", {"task": task.key}),
            cached_step(),  # a cache hit: no build ran
            built_step(),
            failed_step(log="Step 2/4 : RUN pip install nothing-such\nERROR: no such package\n"),
        ],
        machine="worker-7",
    )

    assert len(rows) == 2
    built, failed = TaskImageBuild.objects.filter(task=task).order_by("outcome")
    assert (built.outcome, built.source, built.machine) == (
        ImageBuildOutcome.BUILT,
        ImageBuildSource.ROLLOUT,
        "worker-7",
    )
    assert (built.seconds, built.content_hash, built.image) == (
        12.5,
        "ab" * 32,
        "coevo-task:0123abcd",
    )
    assert "Successfully built" in built.log and built.failed_step == ""
    assert failed.outcome == ImageBuildOutcome.FAILED
    assert (failed.failed_step, failed.failed_line) == ("RUN pip install nothing-such", 2)
    assert "ERROR: no such package" in failed.log and "exit code 1" in failed.error
    assert failed.image == "" and failed.seconds is None


def test_it_records_nothing_when_the_image_was_cached(container_suite):
    task = task_in(container_suite, Split.SEARCH)

    assert task_image_builds_record_steps(task_id=task.id, steps=[cached_step()]) == []
    assert not TaskImageBuild.objects.exists()


def test_it_takes_a_steps_values_only_of_their_types(container_suite):
    # The payload is the worker's trace: a value of the wrong type is dropped, not stored.
    payload = {
        "build_failed": {"step": ["RUN x"], "line": "2", "timed_out": "yes", "log": 7},
    }
    build = image_build_from_step(Environment.from_payload(payload))
    assert build is not None and build.outcome == ImageBuildOutcome.FAILED
    assert (build.failed_step, build.failed_line, build.timed_out, build.log) == (
        "",
        None,
        False,
        "",
    )
    cached = Environment.from_payload({"backend": "container", "image_cached": True})
    assert image_build_from_step(cached) is None


def test_it_keeps_a_long_logs_head_and_tail_and_no_nul():
    log = "FIRST LINE\n" + "x" * (LOG_HEAD_CHARS + LOG_TAIL_CHARS) + "\x00LAST LINE\n"

    kept = bounded_log(log)

    assert kept.startswith("FIRST LINE") and kept.endswith("\ufffdLAST LINE\n")
    assert "characters of the log left out" in kept
    assert len(kept) < LOG_HEAD_CHARS + LOG_TAIL_CHARS + 100
    assert "\x00" not in kept


# --- the suite's page ----------------------------------------------------------------------


def test_it_shows_a_built_and_a_failed_build_with_the_failed_step(client, owner, container_suite):
    search, validation = (
        task_in(container_suite, Split.SEARCH),
        task_in(container_suite, Split.VALIDATION),
    )
    task_image_builds_record_steps(
        task_id=search.id, steps=[built_step(log="BUILT-LOG-LINE\n")], machine="worker-1"
    )
    task_image_builds_record_steps(
        task_id=validation.id,
        steps=[failed_step(log="Step 2/4 : RUN pip install nothing-such\nFAILED-LOG-LINE\n")],
        machine="worker-2",
    )
    client.force_login(owner)

    page = page_text(client, container_suite)

    assert 'id="images"' in page
    built = page.split(f'id="image-{search.key}"')[1].split("</tr>")[0]
    assert "built" in built and "12.5" in built and "worker-1" in built
    assert "<details" in built and "BUILT-LOG-LINE" in built and "<details open" not in built
    failed = page.split(f'id="image-{validation.key}"')[1].split("</tr>")[0]
    assert "failed" in failed and "worker-2" in failed
    assert "RUN pip install nothing-such" in failed and "Dockerfile line 2" in failed
    assert "FAILED-LOG-LINE" in failed


def test_it_shows_the_latest_build_of_each_task(client, owner, container_suite):
    task = task_in(container_suite, Split.SEARCH)
    (old,) = task_image_builds_record_steps(task_id=task.id, steps=[failed_step(log="OLD-LOG\n")])
    TaskImageBuild.objects.filter(id=old.id).update(created_at=timezone.now() - timedelta(hours=1))
    task_image_builds_record_steps(task_id=task.id, steps=[built_step(log="NEW-LOG\n")])
    client.force_login(owner)

    page = page_text(client, container_suite)

    assert "NEW-LOG" in page and "OLD-LOG" not in page


def test_it_says_when_no_build_ran_yet_and_lists_only_container_tasks(
    client, owner, container_suite
):
    client.force_login(owner)

    page = page_text(client, container_suite)

    images = page.split('id="images"')[1]
    assert images.count("no build yet: workers build it on the first rollout") == len(Split)
    assert "files-only" not in images


def test_it_seals_a_held_out_tasks_build(client, owner, container_suite):
    heldout = task_in(container_suite, Split.HELDOUT)
    task_image_builds_record_steps(
        task_id=heldout.id,
        steps=[failed_step(step=SECRET_STEP, line=3, log=SECRET_LOG)],
        machine="secret-machine",
    )
    client.force_login(owner)

    for query in ({}, {"split": Split.HELDOUT.value}):
        page = page_text(client, container_suite, **query)
        row = page.split(f'id="image-{heldout.key}"')[1].split("</tr>")[0]
        assert "failed" in row and "sealed" in row
        assert "HELDOUT-BUILD-LOG" not in page and "HELDOUT-STEP" not in page
        assert "no such package" not in page and "secret-machine" not in page
    # Nor does the selector read them from the database.
    (row,) = [r for r in suite_image_rows(suite=container_suite, task_ids=[heldout.id])]
    assert row.sealed and row.build is not None
    assert (row.build.log, row.build.failed_step, row.build.error) == ("", "", "")


def test_it_shows_no_images_section_for_a_suite_without_container_tasks(
    client, owner, project, tmp_path
):
    write_harbor_task(tmp_path / "tasks", "plain")
    suite, _, _ = suite_import_harbor(project=project, name="plain", directory=tmp_path / "tasks")
    client.force_login(owner)

    assert 'id="images"' not in page_text(client, suite)


def test_an_outsider_sees_no_build(client, outsider, container_suite):
    task_image_builds_record_steps(
        task_id=task_in(container_suite, Split.SEARCH).id, steps=[built_step(log="PRIVATE\n")]
    )
    client.force_login(outsider)

    url = reverse("web:suite", args=[container_suite.project.slug, container_suite.id])
    response = client.get(url)

    assert response.status_code in (403, 404)
    assert b"PRIVATE" not in response.content

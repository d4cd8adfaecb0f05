"""Task image builds recorded where they ran, on the real engine: by the import's solution check
(in the importing process) and by a rollout's worker (its "environment" step, stored by the
worker task), built or failed with the step named; the suite's page then shows them."""

from __future__ import annotations

import secrets
import socket

import pytest

from coevo.evaluations.models import (
    Rollout,
    TraceStep,
)
from coevo.evaluations.services import evaluation_create
from coevo.evaluations.services.rollouts import rollout_execute
from coevo.suites.harbor import suite_import_harbor
from coevo.suites.models import ImageBuildOutcome, ImageBuildSource, Split, TaskImageBuild
from tests.containers.conftest import TASK_BASE
from tests.suites.test_image_builds import key_in, page_text
from tests.support.harbor import SOLVE_42, write_harbor_task
from workers.outcomes import ErrorKind, RolloutOutcome


def built_dockerfile(nonce: str) -> str:
    # The nonce makes the RUN step the engine's to run, not a layer cached by an earlier session.
    return f"FROM {TASK_BASE}\nRUN echo built-{nonce} > /opt/made\nWORKDIR /app\nCOPY . /app\n"


def failing_dockerfile(nonce: str) -> str:
    return f"FROM {TASK_BASE}\nWORKDIR /app\nRUN echo failing-{nonce} && exit 3\nCOPY . /app\n"


@pytest.mark.django_db
def test_the_import_check_records_the_builds_it_ran(
    client, owner, project, settings, tmp_path, base_image, image_map
):
    settings.COEVO_CONTAINER_BACKEND = True
    key = key_in(Split.SEARCH, prefix="checked")
    write_harbor_task(
        tmp_path / "tasks",
        key,
        dockerfile=built_dockerfile(secrets.token_hex(6)),
        solve_sh=SOLVE_42,
    )

    suite, _, report = suite_import_harbor(
        project=project, name="checked", directory=tmp_path / "tasks", check_solutions=True
    )

    assert report.taken == [key], report.refused
    (build,) = TaskImageBuild.objects.filter(task__suite=suite)
    assert (build.outcome, build.source) == (
        ImageBuildOutcome.BUILT,
        ImageBuildSource.SOLUTION_CHECK,
    )
    assert build.image.startswith("coevo-task:") and len(build.content_hash) == 64
    assert build.machine == socket.gethostname() and build.seconds > 0
    assert ": RUN echo built-" in build.log and f"Successfully tagged {build.image}" in build.log
    # Imported again: the image is cached, no build ran, none is recorded.
    suite_import_harbor(
        project=project, name="checked", directory=tmp_path / "tasks", check_solutions=True
    )
    assert TaskImageBuild.objects.filter(task__suite=suite).count() == 1

    client.force_login(owner)
    page = page_text(client, suite)
    row = page.split(f'id="image-{key}"')[1].split("</tr>")[0]
    assert "built" in row and "(import check)" in row and "RUN echo built-" in row


def container_rollout(*, project, candidate, policy_version, directory, name) -> Rollout:
    suite, _, report = suite_import_harbor(project=project, name=name, directory=directory)
    assert not report.refused, report.refused
    evaluation = evaluation_create(
        candidate=candidate,
        suite=suite,
        split=Split.SEARCH,
        policy_version=policy_version,
        task_limit=1,
    )
    return Rollout.objects.select_related("task").get(evaluation=evaluation)


@pytest.mark.django_db(transaction=True)
def test_a_rollout_records_the_build_it_ran(
    empty_queue, project, seed_candidate, policy_version, settings, tmp_path, base_image, image_map
):
    settings.COEVO_CONTAINER_BACKEND = True
    write_harbor_task(
        tmp_path / "tasks",
        key_in(Split.SEARCH, prefix="built"),
        dockerfile=built_dockerfile(secrets.token_hex(6)),
    )
    rollout = container_rollout(
        project=project,
        candidate=seed_candidate,
        policy_version=policy_version,
        directory=tmp_path / "tasks",
        name="built",
    )

    done = rollout_execute(rollout_id=rollout.id, worker="test")

    assert done is not None and done.outcome != RolloutOutcome.INFRA_ERROR, done.detail
    (build,) = TaskImageBuild.objects.filter(task=rollout.task)
    assert (build.outcome, build.source) == (ImageBuildOutcome.BUILT, ImageBuildSource.ROLLOUT)
    assert build.machine == socket.gethostname() and build.seconds > 0
    assert "RUN echo built-" in build.log and len(build.content_hash) == 64
    environment = TraceStep.objects.get(rollout=done, kind="environment")
    assert environment.payload["build"]["content_hash"] == build.content_hash


@pytest.mark.django_db(transaction=True)
def test_a_rollout_whose_image_fails_records_the_failed_step(
    client,
    owner,
    empty_queue,
    project,
    seed_candidate,
    policy_version,
    settings,
    tmp_path,
    base_image,
    image_map,
):
    settings.COEVO_CONTAINER_BACKEND = True
    settings.COEVO_ROLLOUT_MAX_ATTEMPTS = 1  # ends now, rather than retried
    nonce = secrets.token_hex(6)
    key = key_in(Split.SEARCH, prefix="failing")
    write_harbor_task(tmp_path / "tasks", key, dockerfile=failing_dockerfile(nonce))
    rollout = container_rollout(
        project=project,
        candidate=seed_candidate,
        policy_version=policy_version,
        directory=tmp_path / "tasks",
        name="failing",
    )

    done = rollout_execute(rollout_id=rollout.id, worker="test")

    assert (done.outcome, done.error_kind) == (RolloutOutcome.INFRA_ERROR, ErrorKind.SANDBOX)
    assert done.detail.startswith("the task's container: the task's image did not build")
    (build,) = TaskImageBuild.objects.filter(task=rollout.task)
    assert build.outcome == ImageBuildOutcome.FAILED and build.image == ""
    assert build.failed_step == f"RUN echo failing-{nonce} && exit 3"
    assert build.failed_line == 3 and not build.timed_out
    assert f"failing-{nonce}" in build.log and "exit code 3" in build.error

    client.force_login(owner)
    page = page_text(client, rollout.task.suite)
    row = page.split(f'id="image-{key}"')[1].split("</tr>")[0]
    assert "failed" in row and "Dockerfile line 3" in row
    assert f"RUN echo failing-{nonce} && exit 3" in row and "exit code 3" in row

"""``POST projects/{slug}/suites/import-harbor/``: a tar.gz of Harbor tasks becomes a suite."""

from __future__ import annotations

import io
import tarfile

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from coevo.suites.models import Suite, SuiteKind
from tests.api.conftest import assert_error, tar_of
from tests.support.harbor import write_harbor_task

URL = "/api/v1/projects/demo/suites/import-harbor/"
RUN_DOCKERFILE = "FROM a\nRUN make\nWORKDIR /app\nCOPY answer.txt /app/\n"


@pytest.fixture
def tasks_dir(tmp_path):
    root = tmp_path / "upload" / "tasks"
    write_harbor_task(root, "plain")
    write_harbor_task(root, "needs-image", dockerfile=RUN_DOCKERFILE)
    return root


def post(client, archive: bytes, **fields):
    data = {"name": "bench", "file": SimpleUploadedFile("tasks.tar.gz", archive), **fields}
    return client.post(URL, data, format="multipart")


def test_it_imports_the_tasks_and_reports_what_it_refused(make_client, researcher, tasks_dir):
    client = make_client(researcher)

    response = post(client, tar_of(tasks_dir))

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["suite"]["name"] == "bench" and body["suite"]["version"] == "v1"
    assert body["suite"]["kind"] == SuiteKind.WORKSPACE
    assert sum(body["suite"]["task_counts"].values()) == 1
    assert body["report"]["taken"] == ["plain"]
    (refused,) = body["report"]["refused"]
    assert refused["task"] == "needs-image"
    assert refused["reason"].startswith("environment/Dockerfile runs `RUN make`")
    assert body["report"]["warnings"] == []
    assert post(client, tar_of(tasks_dir)).status_code == 200


def test_it_takes_dockerfile_tasks_with_allow_dockerfile_and_a_wrapping_folder(
    make_client, researcher, tasks_dir
):
    # tar czf tasks.tar.gz tasks/: the archive's one top-level folder holds the tasks.
    response = post(
        make_client(researcher),
        tar_of(tasks_dir.parent),
        allow_dockerfile="true",
        split_seed="5",
    )

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["report"]["taken"] == ["needs-image", "plain"]
    assert body["suite"]["split_seed"] == "5"
    (warning,) = body["report"]["warnings"]
    assert warning["task"] == "needs-image" and "skipped: RUN make" in warning["message"]


def test_it_keys_a_lone_task_archived_without_a_folder_by_the_suite_name(
    make_client, researcher, tmp_path
):
    task_dir = write_harbor_task(tmp_path, "whatever")

    response = post(make_client(researcher), tar_of(task_dir))

    assert response.status_code == 201, response.content
    assert response.json()["report"]["taken"] == ["bench"]


def test_it_answers_400_for_an_archive_it_cannot_read(make_client, researcher, project):
    error = assert_error(post(make_client(researcher), b"not a tarball"), 400, "invalid_input")

    assert "not a readable tar" in error["message"]
    assert not Suite.objects.exists()


def test_it_answers_400_for_an_archive_with_a_link(make_client, researcher, project):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        link = tarfile.TarInfo("t/tests/test.sh")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)

    assert_error(post(make_client(researcher), buffer.getvalue()), 400, "unsafe_archive")


def test_it_answers_400_listing_every_refusal_when_nothing_is_taken(
    make_client, researcher, tmp_path
):
    write_harbor_task(tmp_path, "a", tests=None)

    error = assert_error(
        post(make_client(researcher), tar_of(tmp_path)), 400, "suite_import_invalid"
    )

    assert error["details"]["errors"] == [
        "a: tests/ is missing: it holds test.sh, which runs the tests and writes the reward"
    ]


def test_it_answers_400_naming_the_limit_for_env_lines_that_double_a_value(
    make_client, researcher, tmp_path
):
    # Each ENV line doubles the one before: 11 make 128 KiB; 40 asked for 64 TiB (a 500).
    doubling = "".join(f"ENV V{n}=$V{n - 1}$V{n - 1}\n" for n in range(1, 12))
    dockerfile = f"FROM a\nWORKDIR /app\nENV V0={'x' * 64}\n{doubling}COPY answer.txt /app/\n"
    write_harbor_task(tmp_path, "doubling", dockerfile=dockerfile)

    error = assert_error(
        post(make_client(researcher), tar_of(tmp_path)), 400, "suite_import_invalid"
    )

    (reason,) = error["details"]["errors"]
    assert reason.startswith(
        "doubling: environment/Dockerfile: line 14: its variables expand to 131072 characters, "
        "over the 64 KiB limit on one expanded value"
    ), reason
    assert not Suite.objects.exists()


def test_it_answers_400_for_a_bad_name(make_client, researcher, tasks_dir):
    response = post(make_client(researcher), tar_of(tasks_dir), name="Not A Name")

    assert_error(response, 400, "suite_import_invalid")


def test_it_answers_404_for_an_outsider_and_403_for_a_viewer(
    make_client, outsider, viewer, tasks_dir
):
    assert_error(post(make_client(outsider), tar_of(tasks_dir)), 404, "not_found")
    assert_error(post(make_client(viewer), tar_of(tasks_dir)), 403, "permission_denied")
    assert not Suite.objects.exists()


def test_it_needs_the_suites_write_scope(make_client, researcher, tasks_dir):
    response = post(make_client(researcher, ["read"]), tar_of(tasks_dir))

    assert_error(response, 403, "scope_missing")

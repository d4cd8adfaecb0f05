"""The dashboard's import form takes a tar.gz of Harbor tasks and shows the report after."""

from __future__ import annotations

import html

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from coevo.suites import harbor
from coevo.suites.models import Suite, SuiteKind
from tests.api.conftest import tar_of
from tests.support.harbor import write_harbor_task

pytestmark = pytest.mark.django_db

RUN_DOCKERFILE = "FROM a\nRUN make\nWORKDIR /app\nCOPY answer.txt /app/\n"


def text(response) -> str:
    return html.unescape(response.content.decode())


def harbor_form(archive: bytes, **fields) -> dict:
    return {
        "kind": "harbor",
        "name": "bench",
        "split_seed": "0",
        "file": SimpleUploadedFile("tasks.tar.gz", archive, content_type="application/gzip"),
        **fields,
    }


def test_it_offers_the_harbor_form(client, researcher, project):
    client.force_login(researcher)

    page = text(client.get(reverse("web:suite_import", args=[project.slug])))

    assert "Harbor tasks (tar.gz)" in page
    assert 'id="harbor_allow_dockerfile"' in page and 'value="harbor"' in page


def test_it_imports_an_upload_and_shows_the_report(client, researcher, project, tmp_path):
    client.force_login(researcher)
    write_harbor_task(tmp_path, "plain")
    write_harbor_task(tmp_path, "needs-image", dockerfile=RUN_DOCKERFILE)

    response = client.post(
        reverse("web:suite_import", args=[project.slug]), harbor_form(tar_of(tmp_path))
    )

    suite = Suite.objects.get(project=project, name="bench")
    assert suite.kind == SuiteKind.WORKSPACE and suite.tasks.count() == 1
    assert response.status_code == 302
    page = text(client.get(response["Location"]))
    assert "Imported bench v1." in page
    assert "Tasks taken: 1; refused 1." in page
    assert "refused needs-image: environment/Dockerfile runs `RUN make`" in page


def test_it_shows_why_nothing_was_taken_on_the_form(client, researcher, project, tmp_path):
    client.force_login(researcher)
    write_harbor_task(tmp_path, "needs-image", dockerfile=RUN_DOCKERFILE)

    response = client.post(
        reverse("web:suite_import", args=[project.slug]), harbor_form(tar_of(tmp_path))
    )

    assert response.status_code == 400
    assert "needs-image: environment/Dockerfile runs `RUN make`" in text(response)
    assert not Suite.objects.exists()

    allowed = client.post(
        reverse("web:suite_import", args=[project.slug]),
        harbor_form(tar_of(tmp_path), allow_dockerfile="on"),
    )
    assert allowed.status_code == 302
    assert Suite.objects.get(name="bench").tasks.count() == 1


def test_it_imports_the_shipped_workspace_tasks_from_its_button(
    client, researcher, project, tmp_path, monkeypatch
):
    client.force_login(researcher)
    write_harbor_task(tmp_path, "shipped")
    monkeypatch.setattr(harbor, "WORKSPACE_DATA_DIR", tmp_path)

    response = client.post(reverse("web:suite_import", args=[project.slug]), {"kind": "workspace"})

    assert response.status_code == 302
    assert Suite.objects.get(project=project, name="workspace-basic").tasks.count() == 1

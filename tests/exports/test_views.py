"""The exports page, the streaming download and the API: permissions and shapes."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from coevo.exports.models import TrajectoryExport
from coevo.exports.services import trajectory_export_create
from coevo.projects.services import membership_remove
from tests.conftest import PASSWORD
from tests.exports.conftest import build, run_evaluation

pytestmark = pytest.mark.django_db(transaction=True)


def logged_in(user) -> Client:
    client = Client()
    assert client.login(username=user.username, password=PASSWORD)
    return client


@pytest.fixture
def ready_export(project, owner, seed_candidate, humaneval_suite, policy_version):
    run_evaluation(seed_candidate, humaneval_suite, policy_version, results=[("passed", 1.0)])
    return build(trajectory_export_create(project=project, format="chat", created_by=owner))


def test_it_streams_the_download_to_members_only(ready_export, viewer, outsider):
    url = reverse("web:export_download", args=["demo", ready_export.id])
    response = logged_in(viewer).get(url)
    assert response.status_code == 200
    assert response.streaming
    body = b"".join(response.streaming_content)
    assert len(body) == ready_export.size_bytes and body.count(b"\n") == ready_export.rows
    assert ready_export.sha256[:12] in response["Content-Disposition"]
    assert logged_in(outsider).get(url).status_code == 404
    page = logged_in(viewer).get(reverse("web:exports", args=["demo"]))
    assert page.status_code == 200 and url.encode() in page.content
    assert b"export-form" not in page.content  # viewers do not get the create form


def test_a_download_is_never_cached_and_stops_once_membership_ends(
    make_client, ready_export, viewer, project
):
    page_url = reverse("web:export_download", args=["demo", ready_export.id])
    api_url = f"/api/v1/projects/demo/exports/{ready_export.id}/download/"
    browser, api = logged_in(viewer), make_client(viewer, ["read"])

    for response in (browser.get(page_url), api.get(api_url)):
        assert response.status_code == 200
        # No browser or proxy keeps a copy that would outlive the member's access.
        directives = {d.strip() for d in response["Cache-Control"].split(",")}
        assert directives == {"private", "no-store"}
        assert "max-age" not in response["Cache-Control"] and not response.has_header("Expires")
        b"".join(response.streaming_content)

    membership_remove(project=project, user=viewer)

    assert browser.get(page_url).status_code == 404
    assert api.get(api_url).status_code == 404


def test_it_lets_researchers_create_exports_and_refuses_viewers(
    researcher, viewer, outsider, seed_candidate
):
    url = reverse("web:exports", args=["demo"])
    form = {"format": "prompt_completion", "splits": ["search"], "candidate": seed_candidate.sha}
    assert logged_in(outsider).post(url, form).status_code == 404
    assert logged_in(viewer).post(url, form).status_code == 403
    assert not TrajectoryExport.objects.exists()
    response = logged_in(researcher).post(url, form)
    assert response.status_code == 302
    export = TrajectoryExport.objects.get()
    assert export.filters["candidate"] == seed_candidate.sha
    assert export.created_by == researcher


def test_it_creates_reads_and_downloads_over_the_api(
    make_client, researcher, viewer, seed_candidate, humaneval_suite, policy_version
):
    run_evaluation(seed_candidate, humaneval_suite, policy_version, results=[("passed", 1.0)])
    api = make_client(researcher)
    url = "/api/v1/projects/demo/exports/"
    refused = api.post(url, {"splits": ["heldout"]}, format="json")
    assert refused.status_code == 400 and "never exportable" in refused.json()["error"]["message"]
    assert make_client(viewer).post(url, {}, format="json").status_code == 403
    assert make_client(researcher, scopes=["read"]).post(url, {}, format="json").status_code == 403

    created = api.post(
        url,
        {"format": "chat", "candidate": seed_candidate.sha[:10], "suite": "humaneval"},
        format="json",
    )
    assert created.status_code == 202, created.json()
    status_url = created.json()["status_url"]
    assert created["Location"] == status_url
    pending = make_client(viewer, scopes=["read"]).get(status_url).json()
    assert pending["state"] == "pending" and pending["download_url"] is None
    download = f"{url}{pending['id']}/download/"
    assert api.get(download).status_code == 409

    build(TrajectoryExport.objects.get(id=pending["id"]))
    ready = make_client(viewer, scopes=["read"]).get(status_url).json()
    assert ready["state"] == "ready" and ready["rows"] == 2 and ready["rollouts"] == 1
    assert ready["filters"]["candidate"] == seed_candidate.sha
    response = make_client(viewer, scopes=["read"]).get(ready["download_url"])
    assert response.status_code == 200 and response.streaming
    assert len(b"".join(response.streaming_content)) == ready["size_bytes"]
    listed = api.get(url).json()["results"]
    assert [e["id"] for e in listed] == [pending["id"]]

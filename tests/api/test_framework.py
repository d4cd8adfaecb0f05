"""The API framework: errors, throttling, body limits, the schema and its docs pages."""

from __future__ import annotations

import json

from rest_framework.test import APIClient

from tests.api.conftest import assert_error


def test_it_throttles_each_token_separately(settings, make_client, owner, project):
    settings.COEVO_API_RATE = "3/min"
    first, second = make_client(owner), make_client(owner)
    for _ in range(3):
        assert first.get("/api/v1/projects/").status_code == 200
    error = assert_error(first.get("/api/v1/projects/"), 429, "throttled")
    assert error["details"]["retry_after"] > 0
    assert second.get("/api/v1/projects/").status_code == 200


def test_it_answers_unknown_api_paths_with_a_json_404(make_client, owner):
    assert_error(make_client(owner).get("/api/v1/nothing/here/"), 404, "not_found")
    assert_error(APIClient().get("/api/v1/projects/demo/candidates/abc/"), 404, "not_found")


def test_it_refuses_a_json_body_over_one_mebibyte_before_reading_it(make_client, owner, project):
    body = json.dumps({"shas": ["a" * 40] * 30_000})
    response = make_client(owner).post(
        "/api/v1/projects/demo/candidates/known/", body, content_type="application/json"
    )
    assert_error(response, 413, "payload_too_large")


def test_it_refuses_an_unsupported_media_type(make_client, owner, project):
    response = make_client(owner).post(
        "/api/v1/projects/demo/candidates/known/", "shas", content_type="text/plain"
    )
    assert_error(response, 415, "unsupported_media_type")


def test_it_reports_bad_json_as_invalid_input(make_client, owner, project):
    response = make_client(owner).post(
        "/api/v1/projects/demo/candidates/known/", "{", content_type="application/json"
    )
    assert_error(response, 400, "invalid_input")


def test_it_serves_the_schema_and_docs_without_a_cdn(client):
    schema = client.get("/api/v1/schema/?format=json")
    assert schema.status_code == 200
    document = schema.json()
    assert "/api/v1/projects/{slug}/evaluations/" in document["paths"]
    assert document["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    assert "Error" in document["components"]["schemas"]
    assert client.get("/api/v1/schema/").status_code == 200
    for page in ("/api/v1/docs/", "/api/v1/redoc/"):
        html = client.get(page).content.decode()
        assert "drf_spectacular_sidecar" in html
        assert "cdn" not in html.lower()


def test_the_schema_generates_without_warnings(tmp_path):
    # An enum-name collision or an unannotated view degrades the published schema silently;
    # drf-spectacular only reports it as a warning, which this turns into a failure.
    from django.core.management import call_command

    call_command(
        "spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml")
    )
    assert (tmp_path / "schema.yaml").read_text().startswith("openapi: 3")

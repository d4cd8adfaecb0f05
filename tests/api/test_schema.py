"""The published schema: a tag per resource, each described, and generated once per process."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from drf_spectacular.generators import SchemaGenerator

from coevo.api.views import schema_cache_clear


@pytest.fixture
def schema(client) -> dict[str, Any]:
    response = client.get("/api/v1/schema/?format=json")
    assert response.status_code == 200
    return response.json()


def _operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path, method, operation)
        for path, operations in schema["paths"].items()
        for method, operation in operations.items()
    ]


def test_it_tags_every_operation_by_its_resource(schema):
    projects_prefix = "/api/v1/projects/{slug}/"
    for path, method, operation in _operations(schema):
        assert len(operation["tags"]) == 1, (method, path)
        (tag,) = operation["tags"]
        if path.startswith(projects_prefix) and path != projects_prefix:
            assert tag != "projects", (method, path)
    tags = {(method, path): operation["tags"][0] for path, method, operation in _operations(schema)}
    assert tags["get", "/api/v1/projects/"] == "projects"
    assert tags["get", "/api/v1/projects/{slug}/"] == "projects"
    assert (
        tags["post", "/api/v1/projects/{slug}/campaigns/{campaign_id}/candidates/"] == "campaigns"
    )
    assert tags["get", "/api/v1/projects/{slug}/candidates/{sha}/files/{path}"] == "candidates"
    assert tags["get", "/api/v1/projects/{slug}/training-runs/"] == "training"
    assert tags["get", "/api/v1/trainers/"] == "training"
    assert tags["post", "/api/v1/projects/{slug}/promotions/{request_id}/approve/"] == "promotions"


def test_every_tag_is_described_and_used(schema):
    described = {tag["name"]: tag.get("description", "") for tag in schema["tags"]}
    used = {tag for _, _, operation in _operations(schema) for tag in operation["tags"]}
    assert used == set(described), "a tag without a description, or a description of no tag"
    for name, description in described.items():
        assert len(description) > 40, name
    assert [tag["name"] for tag in settings.SPECTACULAR_SETTINGS["TAGS"]] == list(described)


def test_it_generates_the_schema_once_and_serves_it_from_memory(client, monkeypatch):
    generated = []
    original = SchemaGenerator.get_schema

    def counting(self, *args, **kwargs):
        generated.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SchemaGenerator, "get_schema", counting)
    schema_cache_clear()
    first = client.get("/api/v1/schema/?format=json")
    second = client.get("/api/v1/schema/?format=json")
    yaml = client.get("/api/v1/schema/")
    assert len(generated) == 1
    assert first.status_code == second.status_code == yaml.status_code == 200
    assert first.content == second.content
    assert first["Content-Type"].startswith("application/vnd.oai.openapi+json")
    assert yaml["Content-Type"].startswith("application/vnd.oai.openapi")
    assert yaml.content.startswith(b"openapi: 3")
    assert 'filename="coevo API.json"' in first["Content-Disposition"]


def test_it_answers_304_to_a_browser_holding_the_same_schema(client):
    first = client.get("/api/v1/schema/?format=json")
    assert first["Cache-Control"] == "no-cache"
    again = client.get("/api/v1/schema/?format=json", HTTP_IF_NONE_MATCH=first["ETag"])
    assert again.status_code == 304
    assert again.content == b""
    stale = client.get("/api/v1/schema/?format=json", HTTP_IF_NONE_MATCH='"0123"')
    assert stale.status_code == 200


def test_the_docs_pages_still_render_from_the_schema(client):
    for page in ("/api/v1/docs/", "/api/v1/redoc/"):
        response = client.get(page)
        assert response.status_code == 200
        assert "/api/v1/schema/" in response.content.decode()

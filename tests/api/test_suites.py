from __future__ import annotations

import json

from django.core.files.uploadedfile import SimpleUploadedFile

from coevo.suites.models import Suite
from tests.api.conftest import assert_error

BASE = "/api/v1/projects/demo/suites/"
JSONL = (
    b'{"id": "a", "input": "1+1", "expected": "2"}\n{"id": "b", "input": "2+2", "expected": "4"}\n'
)


def _import(client, data=JSONL, scorer='{"kind": "exact"}', name="sums"):
    return client.post(
        f"{BASE}import-jsonl/",
        {"name": name, "file": SimpleUploadedFile("s.jsonl", data), "scorer": scorer},
        format="multipart",
    )


def test_it_imports_a_jsonl_suite_then_returns_the_same_one(make_client, researcher, project):
    client = make_client(researcher)
    response = _import(client)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["name"] == "sums" and body["version"] == "v1" and body["kind"] == "jsonl"
    assert sum(body["task_counts"].values()) == 2
    assert _import(client).status_code == 200
    changed = _import(client, data=JSONL.replace(b'"4"', b'"5"'))
    assert changed.json()["version"] == "v2"


def test_it_lists_and_gets_suites_by_name_and_version(make_client, researcher, project):
    client = make_client(researcher)
    _import(client)
    _import(client, data=JSONL.replace(b'"4"', b'"5"'))
    listing = client.get(BASE).json()["results"]
    assert sorted(s["version"] for s in listing) == ["v1", "v2"]
    assert client.get(f"{BASE}sums/").json()["version"] == "v2"
    assert client.get(f"{BASE}sums/?version=v1").json()["version"] == "v1"


def test_it_answers_404_for_an_unknown_suite(make_client, viewer, project):
    error = assert_error(make_client(viewer, ["read"]).get(f"{BASE}nope/"), 404, "not_found")
    assert "nope" in error["message"]


def test_it_lists_every_problem_of_a_bad_file_and_imports_nothing(make_client, researcher, project):
    bad = b'{"id": "a", "input": "x"}\nnot json\n'
    response = _import(make_client(researcher), data=bad)
    assert response.status_code == 400
    error = response.json()["error"]
    assert len(error["details"]["errors"]) >= 2
    assert not Suite.objects.exists()


def test_it_refuses_a_bad_scorer(make_client, researcher, project):
    client = make_client(researcher)
    assert_error(_import(client, scorer="{"), 400, "invalid_input")
    assert _import(client, scorer=json.dumps({"kind": "magic"})).status_code == 400
    assert not Suite.objects.exists()

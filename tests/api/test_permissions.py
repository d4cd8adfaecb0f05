"""Every endpoint × (no token, revoked token, missing scope, outsider, viewer where it writes)."""

from __future__ import annotations

import uuid

import pytest
from rest_framework.test import APIClient

from coevo.accounts.services import token_revoke
from coevo.evaluations.services import evaluation_create
from coevo.suites.jsonl import scorer_spec_build
from coevo.suites.services import suite_import_jsonl
from tests.api.conftest import ALL_BUT_APPROVE, assert_error

# (method, path under /api/v1/projects/demo/, scope, writes)
ENDPOINTS = [
    ("get", "", "read", False),
    ("get", "candidates/", "read", False),
    ("get", "candidates/{sha}/", "read", False),
    ("get", "candidates/{sha}/files/", "read", False),
    ("get", "candidates/{sha}/files/agent.py", "read", False),
    ("get", "candidates/{sha}/diff/", "read", False),
    ("post", "candidates/known/", "read", False),
    ("post", "candidates/import-bundle/", "candidates:write", True),
    ("post", "candidates/import-tarball/", "candidates:write", True),
    ("get", "suites/", "read", False),
    ("get", "suites/{suite}/", "read", False),
    ("post", "suites/import-jsonl/", "suites:write", True),
    ("post", "suites/import-harbor/", "suites:write", True),
    ("get", "evaluations/", "read", False),
    ("post", "evaluations/", "evaluations:run", True),
    ("get", "evaluations/{evaluation}/", "read", False),
    ("get", "evaluations/{evaluation}/tasks/", "read", False),
    ("post", "evaluations/{evaluation}/cancel/", "evaluations:run", True),
    ("get", "comparisons/?reference={evaluation}&candidate={evaluation}", "read", False),
]
IDS = [f"{m} {p or '.'}" for m, p, _, _ in ENDPOINTS]


@pytest.fixture
def ids(project):
    """Refusals come before any lookup: ids of objects that need not exist."""
    return {"sha": "a" * 40, "evaluation": uuid.uuid4(), "suite": "sums"}


@pytest.fixture
def real_ids(seed_candidate, policy_version, owner):
    scorer = scorer_spec_build(kind="exact")
    data = (
        b'{"id": "a", "input": "1", "expected": "1"}\n{"id": "b", "input": "2", "expected": "2"}\n'
    )
    suite, _ = suite_import_jsonl(
        project=seed_candidate.project, name="sums", data=data, scorer=scorer
    )
    split = suite.tasks.first().split
    evaluation = evaluation_create(
        candidate=seed_candidate,
        suite=suite,
        split=split,
        policy_version=policy_version,
        created_by=owner,
    )
    return {"sha": seed_candidate.sha, "evaluation": evaluation.id, "suite": suite.name}


def _call(client: APIClient, method: str, path: str, ids: dict):
    url = "/api/v1/projects/demo/" + path.format(**ids)
    body = {"shas": []}
    return (
        getattr(client, method)(url, body, format="json") if method == "post" else client.get(url)
    )


@pytest.mark.parametrize(("method", "path", "scope", "writes"), ENDPOINTS, ids=IDS)
def test_it_refuses_requests_without_a_token(method, path, scope, writes, ids):
    response = _call(APIClient(), method, path, ids)
    assert_error(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(("method", "path", "scope", "writes"), ENDPOINTS, ids=IDS)
def test_it_refuses_a_revoked_token(method, path, scope, writes, ids, make_client, owner):
    client = make_client(owner)
    token_revoke(token=client.token)
    assert_error(_call(client, method, path, ids), 401, "not_authenticated")


@pytest.mark.parametrize(("method", "path", "scope", "writes"), ENDPOINTS, ids=IDS)
def test_it_refuses_a_token_without_the_scope(method, path, scope, writes, ids, make_client, owner):
    others = [s for s in ALL_BUT_APPROVE if s != scope]
    error = assert_error(_call(make_client(owner, others), method, path, ids), 403, "scope_missing")
    assert scope in error["message"]


@pytest.mark.parametrize(("method", "path", "scope", "writes"), ENDPOINTS, ids=IDS)
def test_it_hides_the_project_from_an_outsider(
    method, path, scope, writes, ids, make_client, outsider
):
    assert_error(_call(make_client(outsider), method, path, ids), 404, "not_found")


@pytest.mark.parametrize(
    ("method", "path", "scope", "writes"),
    [e for e in ENDPOINTS if e[3]],
    ids=[i for i, e in zip(IDS, ENDPOINTS, strict=True) if e[3]],
)
def test_it_refuses_writes_by_a_viewer(method, path, scope, writes, ids, make_client, viewer):
    assert_error(_call(make_client(viewer), method, path, ids), 403, "permission_denied")


@pytest.mark.parametrize(
    ("method", "path", "scope", "writes"),
    [e for e in ENDPOINTS if not e[3]],
    ids=[i for i, e in zip(IDS, ENDPOINTS, strict=True) if not e[3]],
)
def test_it_lets_a_viewer_read(method, path, scope, writes, real_ids, make_client, viewer):
    response = _call(make_client(viewer, ["read"]), method, path, real_ids)
    assert response.status_code == 200, response.content[:300]

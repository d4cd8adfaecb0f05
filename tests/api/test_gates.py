"""POST/GET gates: 202 with a status URL, the finished verdict, scopes and roles."""

from __future__ import annotations

import pytest

from coevo.gates.models import Gate
from coevo.gates.services import gate_advance
from coevo.reviews.services import channel_get_or_create, channel_move
from tests.api.conftest import assert_error
from tests.gates.conftest import validation_keys
from tests.support.factories import finish_evaluation

BASE = "/api/v1/projects/demo/gates/"


@pytest.fixture
def production(project, owner, seed_candidate):
    channel = channel_get_or_create(project=project, name="production")
    channel_move(channel=channel, candidate=seed_candidate, policy_version=None, moved_by=owner)
    return channel


@pytest.fixture
def gate_body(child_candidate, humaneval_suite, policy_version, production):
    return {
        "candidate": child_candidate.sha,
        "against": "production",
        "suite": humaneval_suite.name,
        "min_score": 0.2,
        "max_regression": 0.05,
    }


def test_it_creates_a_gate_with_202_and_reports_its_verdict(
    make_client, researcher, gate_body, seed_candidate, child_candidate, humaneval_suite
):
    response = make_client(researcher, ["evaluations:run"]).post(BASE, gate_body, format="json")

    assert response.status_code == 202, response.content
    body = response.json()
    assert response["Location"] == body["status_url"]
    assert body["state"] == "pending"
    assert body["dashboard_url"].endswith(f"/p/demo/gates/{body['id']}/")
    gate = Gate.objects.get(id=body["id"])
    assert gate.created_by == researcher and gate.baseline == seed_candidate
    assert gate.split == "validation" and gate.policy["confidence"] == 0.95

    reader = make_client(researcher, ["read"])
    running = reader.get(body["status_url"]).json()
    assert running["verdict"] is None and running["reasons"] == []

    keys = validation_keys(humaneval_suite)
    finish_evaluation(gate.baseline_evaluation, passed=keys[:10])
    finish_evaluation(gate.candidate_evaluation, passed=keys[:12])
    gate_advance(gate_id=gate.id)
    finished = reader.get(body["status_url"]).json()

    assert finished["state"] == "finished"
    assert finished["verdict"] == "pass"
    assert [r["rule"] for r in finished["reasons"]] == ["min_score", "max_regression"]
    assert finished["candidate"] == child_candidate.sha
    assert finished["baseline"] == seed_candidate.sha
    assert finished["against"] == "production"
    stats = finished["statistics"]
    assert set(stats) >= {"candidate", "baseline", "comparison"}
    assert stats["comparison"]["flips"]["fixed"] == sorted(keys[10:12])
    assert finished["evaluations"]["candidate"]["id"] == str(gate.candidate_evaluation_id)
    assert "reference=" in finished["evaluations"]["comparison_url"]
    listed = reader.get(BASE).json()["results"]
    assert [g["id"] for g in listed] == [body["id"]]


def test_it_explains_an_empty_channel(make_client, researcher, gate_body, project):
    channel_get_or_create(project=project, name="staging")
    error = assert_error(
        make_client(researcher).post(BASE, {**gate_body, "against": "staging"}, format="json"),
        400,
        "invalid_input",
    )
    assert "channel_move" in error["message"]
    assert not Gate.objects.exists()


def test_it_refuses_bad_policies_and_held_out(make_client, researcher, gate_body):
    client = make_client(researcher)
    assert_error(
        client.post(BASE, {**gate_body, "min_score": 2}, format="json"), 400, "invalid_input"
    )
    assert_error(
        client.post(BASE, {**gate_body, "split": "heldout"}, format="json"),
        403,
        "permission_denied",
    )
    assert_error(
        client.post(BASE, {**gate_body, "against": "nope"}, format="json"), 404, "not_found"
    )
    assert_error(client.post(BASE, {**gate_body, "suite": "nope"}, format="json"), 404, "not_found")
    assert not Gate.objects.exists()


def test_a_viewer_cannot_create_a_gate(make_client, viewer, gate_body):
    assert_error(make_client(viewer).post(BASE, gate_body, format="json"), 403, "permission_denied")
    assert not Gate.objects.exists()


def test_a_token_without_the_run_scope_cannot_create_a_gate(make_client, researcher, gate_body):
    assert_error(
        make_client(researcher, ["read"]).post(BASE, gate_body, format="json"),
        403,
        "scope_missing",
    )


def test_an_outsider_sees_no_gate(make_client, outsider, researcher, gate_body):
    created = make_client(researcher).post(BASE, gate_body, format="json").json()
    client = make_client(outsider, ["read", "evaluations:run"])
    assert_error(client.get(created["status_url"]), 404, "not_found")
    assert_error(client.get(BASE), 404, "not_found")
    assert_error(client.post(BASE, gate_body, format="json"), 404, "not_found")


def test_it_answers_404_for_an_unknown_gate(make_client, researcher):
    response = make_client(researcher, ["read"]).get(f"{BASE}00000000-0000-0000-0000-000000000000/")
    assert_error(response, 404, "not_found")

from __future__ import annotations

import pytest

from coevo.evaluations.models import (
    Evaluation,
    EvaluationState,
    Rollout,
    RolloutState,
)
from coevo.evaluations.services import evaluation_create
from tests.api.conftest import assert_error
from workers.outcomes import RolloutOutcome

BASE = "/api/v1/projects/demo/evaluations/"


@pytest.fixture
def start_body(seed_candidate, humaneval_suite, policy_version):
    return {
        "candidate": seed_candidate.sha,
        "suite": humaneval_suite.name,
        "split": "validation",
        "task_limit": 3,
        "epochs": 2,
    }


def _evaluation(candidate, suite, policy_version, split="validation", finish=None):
    evaluation = evaluation_create(
        candidate=candidate,
        suite=suite,
        split=split,
        policy_version=policy_version,
        task_limit=3,
        purpose="promotion" if split == "heldout" else "evaluation",
    )
    if finish is not None:
        for rollout, outcome in zip(
            Rollout.objects.filter(evaluation=evaluation), finish, strict=False
        ):
            Rollout.objects.filter(pk=rollout.pk).update(state=RolloutState.DONE, outcome=outcome)
    return evaluation


def test_it_starts_an_evaluation_with_202_and_a_status_url(make_client, researcher, start_body):
    response = make_client(researcher).post(BASE, start_body, format="json")
    assert response.status_code == 202, response.content
    body = response.json()
    evaluation = Evaluation.objects.get(id=body["id"])
    assert evaluation.epochs == 2 and evaluation.created_by == researcher
    assert Rollout.objects.filter(evaluation=evaluation).count() == 6
    assert response["Location"] == body["status_url"]
    status = make_client(researcher, ["read"]).get(body["status_url"]).json()
    assert status["progress"]["total"] == 6 and status["state"] == "pending"
    assert status["summary"]["n_tasks"] == 0


def test_it_refuses_a_held_out_evaluation(make_client, owner, start_body):
    start_body["split"] = "heldout"
    assert_error(make_client(owner).post(BASE, start_body, format="json"), 403, "permission_denied")
    assert not Evaluation.objects.exists()


def test_it_refuses_unknown_suites_candidates_and_bad_fields(make_client, researcher, start_body):
    client = make_client(researcher)
    assert_error(
        client.post(BASE, {**start_body, "suite": "nope"}, format="json"), 404, "not_found"
    )
    assert_error(
        client.post(BASE, {**start_body, "candidate": "0" * 40}, format="json"), 404, "not_found"
    )
    error = assert_error(
        client.post(BASE, {**start_body, "epochs": 0}, format="json"), 400, "invalid_input"
    )
    assert "epochs" in error["details"]["fields"]
    assert not Evaluation.objects.exists()


def test_it_lists_with_filters_and_hides_held_out_from_non_reviewers(
    make_client, researcher, reviewer, seed_candidate, humaneval_suite, policy_version
):
    visible = _evaluation(seed_candidate, humaneval_suite, policy_version)
    sealed = _evaluation(seed_candidate, humaneval_suite, policy_version, split="heldout")
    client = make_client(researcher, ["read"])
    assert [e["id"] for e in client.get(BASE).json()["results"]] == [str(visible.id)]
    assert_error(client.get(f"{BASE}{sealed.id}/"), 404, "not_found")
    assert_error(client.get(f"{BASE}{sealed.id}/tasks/"), 404, "not_found")
    ci = make_client(reviewer, ["read"], kind="ci")
    assert len(ci.get(BASE).json()["results"]) == 1
    personal = make_client(reviewer, ["read"])
    assert len(personal.get(BASE).json()["results"]) == 2
    assert personal.get(f"{BASE}{sealed.id}/tasks/").status_code == 200
    assert client.get(f"{BASE}?state=cancelled").json()["results"] == []
    assert len(client.get(f"{BASE}?candidate={seed_candidate.sha[:8]}").json()["results"]) == 1
    assert_error(client.get(f"{BASE}?state=bogus"), 400, "invalid_input")


def test_it_returns_per_task_results(
    make_client, viewer, seed_candidate, humaneval_suite, policy_version
):
    evaluation = _evaluation(
        seed_candidate,
        humaneval_suite,
        policy_version,
        finish=[RolloutOutcome.PASSED, RolloutOutcome.HARNESS_ERROR],
    )
    rows = make_client(viewer, ["read"]).get(f"{BASE}{evaluation.id}/tasks/").json()
    assert [r["outcomes"] for r in rows] == [["passed"], ["harness_error"], ["pending"]]
    assert [r["mean_score"] for r in rows] == [1.0, 0.0, None]
    detail = make_client(viewer, ["read"]).get(f"{BASE}{evaluation.id}/").json()
    assert detail["progress"]["passed"] == 1 and detail["progress"]["failed"] == 1
    assert detail["errors"] == {"harness_error": 1, "infra_error": 0}


def test_it_cancels_once_then_answers_409(
    make_client, researcher, seed_candidate, humaneval_suite, policy_version
):
    evaluation = _evaluation(seed_candidate, humaneval_suite, policy_version)
    client = make_client(researcher)
    response = client.post(f"{BASE}{evaluation.id}/cancel/")
    assert response.status_code == 202
    evaluation.refresh_from_db()
    assert evaluation.state == EvaluationState.CANCELLED
    assert_error(client.post(f"{BASE}{evaluation.id}/cancel/"), 409, "invalid_state")


def test_it_compares_two_evaluations(
    make_client, viewer, seed_candidate, humaneval_suite, policy_version
):
    ref = _evaluation(
        seed_candidate, humaneval_suite, policy_version, finish=[RolloutOutcome.TASK_FAILURE] * 3
    )
    new = _evaluation(
        seed_candidate,
        humaneval_suite,
        policy_version,
        finish=[RolloutOutcome.PASSED, RolloutOutcome.PASSED, RolloutOutcome.TASK_FAILURE],
    )
    client = make_client(viewer, ["read"])
    body = client.get(
        f"/api/v1/projects/demo/comparisons/?reference={ref.id}&candidate={new.id}"
    ).json()
    assert (
        body["n_tasks"] == 3 and len(body["flips"]["fixed"]) == 2 and body["flips"]["broken"] == []
    )
    assert body["delta"] == pytest.approx(2 / 3)
    assert_error(client.get("/api/v1/projects/demo/comparisons/?reference=x"), 400, "invalid_input")

"""API: POST projects/{slug}/matrices/ (202 + status URL) and GET the grid."""

from __future__ import annotations

from coevo.matrices.models import CompatibilityMatrix
from tests.matrices.conftest import written_matrix

URL = "/api/v1/projects/demo/matrices/"
ALL, NONE = [1] * 10, [0] * 10


def first(k: int) -> list[int]:
    return [1] * k + [0] * (10 - k)


def body(seed_candidate, *policies, split="search"):
    return {
        "candidates": [seed_candidate.sha],
        "policy_versions": [p.name for p in policies],
        "suite": "humaneval",
        "split": split,
        "task_limit": 2,
    }


def test_it_accepts_a_matrix_with_202_and_a_status_url(
    make_client, researcher, humaneval_suite, seed_candidate, policy_version, second_policy
):
    client = make_client(researcher)
    response = client.post(URL, body(seed_candidate, policy_version, second_policy), format="json")

    assert response.status_code == 202, response.json()
    matrix = CompatibilityMatrix.objects.get()
    data = response.json()
    assert data["id"] == str(matrix.id) and data["state"] == "running"
    assert response["Location"] == data["status_url"]
    status = client.get(data["status_url"]).json()
    assert [c["policy_version"] for c in status["columns"]] == [policy_version.name, "scripted-b"]
    assert status["rows"][0]["candidate"] == seed_candidate.sha
    assert {c["state"] for c in status["rows"][0]["cells"]} <= {"pending", "running"}


def test_it_refuses_held_out_a_viewer_and_a_token_without_the_run_scope(
    make_client, researcher, viewer, humaneval_suite, seed_candidate, policy_version
):
    held_out = make_client(researcher).post(
        URL, body(seed_candidate, policy_version, split="heldout"), format="json"
    )
    assert held_out.status_code == 400
    assert (
        make_client(viewer)
        .post(URL, body(seed_candidate, policy_version), format="json")
        .status_code
        == 403
    )
    read_only = make_client(researcher, scopes=["read"])
    assert (
        read_only.post(URL, body(seed_candidate, policy_version), format="json").status_code == 403
    )
    assert not CompatibilityMatrix.objects.exists()


def test_it_answers_the_grid_with_its_mismatch(
    make_client,
    viewer,
    project,
    humaneval_suite,
    seed_candidate,
    child_candidate,
    policy_version,
    second_policy,
):
    matrix = written_matrix(
        project=project,
        suite=humaneval_suite,
        candidates=[seed_candidate, child_candidate],
        policy_versions=[policy_version, second_policy],
        passes=[[ALL, NONE], [first(5), first(8)]],
    )

    data = make_client(viewer).get(f"{URL}{matrix.id}/").json()

    assert data["state"] == "finished" and data["mismatches"] == 1
    assert data["columns"][0]["best"] == [seed_candidate.sha]
    assert data["rows"][1]["best_under"] == ["scripted-b"]
    cell = data["rows"][0]["cells"][1]
    assert cell["mean"] == 0.0 and cell["n"] == 10 and cell["interval"]["high"] > 0
    assert cell["mismatch"]["best_policy_version"] == policy_version.name
    assert cell["mismatch"]["tuned_for"] == [policy_version.name]
    assert cell["mismatch"]["difference"] == -1.0
    assert "reference=" in cell["mismatch"]["comparison_url"]
    assert data["rows"][0]["cells"][0]["mismatch"] is None
    listing = make_client(viewer).get(URL).json()
    assert [m["id"] for m in listing["results"]] == [str(matrix.id)]


def test_it_hides_a_matrix_from_an_outsider(
    make_client, outsider, project, humaneval_suite, seed_candidate, policy_version
):
    matrix = written_matrix(
        project=project,
        suite=humaneval_suite,
        candidates=[seed_candidate],
        policy_versions=[policy_version],
        passes=[[ALL]],
    )
    assert make_client(outsider).get(f"{URL}{matrix.id}/").status_code == 404

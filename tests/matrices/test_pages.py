"""The matrix pages: list + create form (researchers), the grid with intervals, mismatch
links to the comparison page, htmx polling that stops when every cell is final."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from coevo.evaluations.models import Evaluation, EvaluationState
from coevo.matrices.models import CompatibilityMatrix
from tests.conftest import PASSWORD
from tests.matrices.conftest import written_matrix

ALL, NONE = [1] * 10, [0] * 10


def first(k: int) -> list[int]:
    return [1] * k + [0] * (10 - k)


def client_for(user) -> Client:
    client = Client()
    assert client.login(username=user.get_username(), password=PASSWORD)
    return client


@pytest.fixture
def mismatched(
    project, humaneval_suite, seed_candidate, child_candidate, policy_version, second_policy
):
    return written_matrix(
        project=project,
        suite=humaneval_suite,
        candidates=[seed_candidate, child_candidate],
        policy_versions=[policy_version, second_policy],
        passes=[[ALL, NONE], [first(5), first(8)]],
    )


def test_it_shows_the_grid_with_intervals_and_links_a_mismatch_to_its_comparison(
    project, owner, mismatched
):
    url = reverse("web:matrix", args=[project.slug, mismatched.id])
    response = client_for(owner).get(url)

    assert response.status_code == 200
    html = response.content.decode()
    assert html.count('class="matrix-cell') == 4
    assert "[0.72, 1.00]" in html  # 10/10: the Wilson interval
    best = mismatched.cells.get(row=0, column=0).evaluation_id
    losing = mismatched.cells.get(row=0, column=1).evaluation_id
    compare = reverse("web:comparison", args=[project.slug])
    assert f"{compare}?reference={best}&amp;candidate={losing}" in html
    assert html.count("mismatch-reason") == 1
    # Final: no polling.
    assert "hx-get" not in html


def test_it_polls_while_a_cell_runs_and_answers_htmx_with_the_grid_only(project, owner, mismatched):
    cell = mismatched.cells.get(row=1, column=1)
    Evaluation.objects.filter(id=cell.evaluation_id).update(state=EvaluationState.RUNNING)
    url = reverse("web:matrix", args=[project.slug, mismatched.id])
    client = client_for(owner)

    page = client.get(url).content.decode()
    assert f'hx-get="{url}"' in page and "<html" in page
    partial = client.get(url, HTTP_HX_REQUEST="true").content.decode()
    assert partial.lstrip().startswith('<section id="matrix-grid"') and "hx-get=" in partial

    Evaluation.objects.filter(id=cell.evaluation_id).update(state=EvaluationState.FINISHED)
    assert "hx-get" not in client.get(url, HTTP_HX_REQUEST="true").content.decode()


def test_it_lets_a_researcher_create_a_matrix_from_the_form(
    project, researcher, humaneval_suite, seed_candidate, policy_version, second_policy
):
    url = reverse("web:matrices", args=[project.slug])
    client = client_for(researcher)
    assert 'id="matrix-form"' in client.get(url).content.decode()

    response = client.post(
        url,
        {
            "candidates": [seed_candidate.id],
            "policy_versions": [policy_version.id, second_policy.id],
            "suite": humaneval_suite.id,
            "split": "validation",
            "epochs": 1,
            "random_seed": 0,
            "task_limit": 2,
        },
    )

    matrix = CompatibilityMatrix.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("web:matrix", args=[project.slug, matrix.id])
    assert matrix.cells.count() == 2
    listing = client.get(url).content.decode()
    assert reverse("web:matrix", args=[project.slug, matrix.id]) in listing


def test_it_refuses_the_create_form_to_a_viewer(
    project, viewer, humaneval_suite, seed_candidate, policy_version
):
    url = reverse("web:matrices", args=[project.slug])
    client = client_for(viewer)

    assert 'id="matrix-form"' not in client.get(url).content.decode()
    response = client.post(
        url,
        {
            "candidates": [seed_candidate.id],
            "policy_versions": [policy_version.id],
            "suite": humaneval_suite.id,
            "split": "search",
            "epochs": 1,
            "random_seed": 0,
        },
    )
    assert response.status_code == 403
    assert not CompatibilityMatrix.objects.exists()


def test_it_hides_a_matrix_from_an_outsider(project, outsider, mismatched):
    client = client_for(outsider)
    assert client.get(reverse("web:matrix", args=[project.slug, mismatched.id])).status_code == 404
    assert client.get(reverse("web:matrices", args=[project.slug])).status_code == 404

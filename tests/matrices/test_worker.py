"""A matrix run end to end by a real Celery worker over the real Redis broker: two harnesses
× two policy versions (two served names on the scripted server) finish by themselves."""

from __future__ import annotations

import time

import pytest

from coevo.matrices.models import MatrixState
from coevo.matrices.selectors import matrix_grid
from coevo.matrices.services import matrix_create
from tests.gates.test_worker import TASKS
from tests.support.factories import (
    ASKS_THE_MODEL,
    GUESSES,
    jsonl_rows,
    make_agent_candidate,
    make_jsonl_suite,
)


@pytest.mark.django_db(transaction=True)
def test_it_finishes_a_matrix_by_itself_on_a_real_worker(
    celery_worker_thread, project, owner, policy_version, second_policy, scripted_policy, tmp_path
):
    scripted_policy.rules.extend((question, f" {answer}") for _, question, answer in TASKS)
    suite = make_jsonl_suite(
        project, jsonl_rows(TASKS, split="validation"), name="arith", scorer="numeric"
    )
    asker = make_agent_candidate(project, tmp_path, "asker", ASKS_THE_MODEL)
    guesser = make_agent_candidate(project, tmp_path, "guesser", GUESSES)

    matrix = matrix_create(
        project=project,
        candidates=[asker, guesser],
        policy_versions=[policy_version, second_policy],
        suite=suite,
        split="validation",
        created_by=owner,
    )

    deadline = time.monotonic() + 120
    grid = matrix_grid(matrix=matrix)
    while not grid.is_final and time.monotonic() < deadline:
        time.sleep(0.5)
        grid = matrix_grid(matrix=matrix)
    assert grid.state == MatrixState.FINISHED
    assert [[c.mean for c in row.cells] for row in grid.rows] == [[1.0, 1.0], [0.0, 0.0]]
    assert [c.best_rows for c in grid.columns] == [(0,), (0,)]
    assert grid.mismatches == []
    models = {r.get("model") for r in scripted_policy.requests if "model" in r}
    assert {policy_version.served_name, "scripted-b"} <= models

"""A matrix run end to end by a real Celery worker over the real Redis broker: two harnesses
× two policy versions (two served names on the scripted server) finish by themselves."""

from __future__ import annotations

import time

import pytest

from coevo.matrices.models import MatrixState
from coevo.matrices.selectors import matrix_grid
from coevo.matrices.services import matrix_create
from coevo.policies.models import PolicyVersion
from coevo.suites.jsonl import scorer_spec_build
from coevo.suites.services import suite_import_jsonl
from tests.gates.test_worker import ASKS_THE_MODEL, GUESSES, TASKS, harness


@pytest.mark.django_db(transaction=True)
def test_it_finishes_a_matrix_by_itself_on_a_real_worker(
    celery_worker_thread, project, owner, policy_version, scripted_policy, tmp_path
):
    import json

    scripted_policy.rules.extend((question, f" {answer}") for _, question, answer in TASKS)
    second = PolicyVersion.objects.create(
        name="scripted-b",
        base_model=policy_version.base_model,
        served_name="scripted-b",
        endpoint=policy_version.endpoint,
    )
    rows = [
        {"id": key, "input": question, "expected": answer, "split": "validation"}
        for key, question, answer in TASKS
    ]
    suite, _ = suite_import_jsonl(
        project=project,
        name="arith",
        data="\n".join(json.dumps(row) for row in rows).encode(),
        scorer=scorer_spec_build(kind="numeric"),
    )
    asker = harness(project, tmp_path, "asker", ASKS_THE_MODEL)
    guesser = harness(project, tmp_path, "guesser", GUESSES)

    matrix = matrix_create(
        project=project,
        candidates=[asker, guesser],
        policy_versions=[policy_version, second],
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

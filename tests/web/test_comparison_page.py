"""The comparison page's verdict line (issue 38): the exact test decides and is named, every
number is labelled, and an interval that cannot mean anything is replaced by words."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from coevo.evaluations.models import (
    Evaluation,
)
from coevo.suites.models import Split, Task
from tests.support.factories import make_evaluation, make_rollout
from tests.web.test_pages import plain
from workers.outcomes import RolloutOutcome

pytestmark = pytest.mark.django_db(transaction=True)


def two_task_pair(*, candidate, suite, policy_version) -> tuple[Evaluation, Evaluation]:
    """Issue 38's pair: graded scores on 2 tasks, the candidate better on both (+62.5 pts of
    mean per-task score, sign test 2 vs 0: p = 0.5), reference and candidate."""
    tasks = list(Task.objects.filter(suite=suite, split=Split.SEARCH).order_by("position")[:2])
    pair = []
    for scores in ([0.25, 0.0], [0.75, 0.75]):
        evaluation = make_evaluation(
            candidate=candidate, suite=suite, policy_version=policy_version
        )
        for task, score in zip(tasks, scores, strict=True):
            outcome = RolloutOutcome.PASSED if score == 1.0 else RolloutOutcome.TASK_FAILURE
            make_rollout(evaluation, task, outcome=outcome, score=score)
        pair.append(evaluation)
    return pair[0], pair[1]


def comparison_url(project, reference, candidate) -> str:
    query = f"?reference={reference.id}&candidate={candidate.id}"
    return reverse("web:comparison", args=[project.slug]) + query


def test_it_names_the_deciding_test_and_shows_no_interval_on_two_tasks(
    client, owner, project, seed_candidate, humaneval_suite, policy_version
):
    reference, candidate = two_task_pair(
        candidate=seed_candidate, suite=humaneval_suite, policy_version=policy_version
    )
    client.force_login(owner)
    page = plain(client.get(comparison_url(project, reference, candidate)))
    assert "no significant difference (verdict of the exact sign test: p = 0.5000)" in page
    assert "mean per-task score difference +62.5 pts" in page
    assert "too few tasks (n=2) for an interval" in page
    # The contradiction of issue 38 cannot appear: no interval beside this verdict.
    line = page.split("score compared")[0]
    assert not re.search(r"\[[+−-][\d.]+ pts, [+−-][\d.]+ pts\]", line)
    assert "reference mean per-task score 12.5%" in page
    assert "candidate mean per-task score 75.0%" in page


def test_the_pages_name_the_score_they_show(
    client, owner, project, seed_candidate, humaneval_suite, policy_version
):
    # The candidate reads 0.0% pass rate (no rollout passed) on the project page and 75.0% mean
    # per-task score on the comparison: each page says which it shows.
    reference, candidate = two_task_pair(
        candidate=seed_candidate, suite=humaneval_suite, policy_version=policy_version
    )
    client.force_login(owner)
    project_page = plain(client.get(reverse("web:project", args=[project.slug])))
    assert "done pass rate created" in project_page
    compared = plain(client.get(comparison_url(project, reference, candidate)))
    assert "score compared mean per-task score" in compared

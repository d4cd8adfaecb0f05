"""Issue 21: no dashboard page runs more queries for a bigger project. Each test reads a page
with a few rows of the kind that grows (candidates, evaluations, proposals, rollouts, audit
events, trace steps), then with many more than a page of them, and compares the queries
(tests/support/queries.py prints both runs' SQL when they differ)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from coevo.matrices.models import MatrixCell
from coevo.suites.models import Split, Task
from tests.campaigns.support import set_best, started_campaign
from tests.matrices.conftest import written_matrix
from tests.support.factories import (
    add_steps,
    make_audit_events,
    make_candidates,
    make_evaluation,
    make_policy_versions,
    make_proposals,
    make_rollout,
    make_rollouts,
    make_user,
)
from tests.support.queries import assert_same_queries, queries_of
from workers.outcomes import RolloutOutcome

pytestmark = pytest.mark.django_db


def read(client, url: str, **headers: str):
    """Read ``url`` once to warm per-process caches, then return a reader that counts."""
    client.get(url, headers=headers)
    return lambda: queries_of(lambda: client.get(url, headers=headers))


def search_tasks(suite, count: int) -> list[Task]:
    return list(Task.objects.filter(suite=suite, split=Split.SEARCH).order_by("position")[:count])


# --- the project page: candidates and recent evaluations -----------------------------------


def test_it_reads_the_project_page_in_as_many_queries_with_many_candidates(
    client, owner, project, seed_candidate, humaneval_suite, policy_version
):
    tasks = search_tasks(humaneval_suite, 4)
    make_rollouts(
        make_evaluation(
            candidate=seed_candidate, suite=humaneval_suite, policy_version=policy_version
        ),
        tasks,
    )
    client.force_login(owner)
    reader = read(client, reverse("web:project", args=[project.slug]))
    few = reader()

    children = make_candidates(project, 130, parent=seed_candidate)
    for child in children[:25]:
        evaluation = make_evaluation(
            candidate=child, suite=humaneval_suite, policy_version=policy_version
        )
        make_rollouts(evaluation, tasks)

    assert_same_queries(few, reader(), what="the project page")


def test_it_reads_an_older_page_of_candidates_in_as_many_queries(
    client, owner, project, seed_candidate
):
    client.force_login(owner)
    make_candidates(project, 60, parent=seed_candidate)
    first = client.get(reverse("web:project", args=[project.slug]))
    older = first.context["older_query"]
    assert older
    reader = read(client, reverse("web:project", args=[project.slug]) + "?" + older)
    few = reader()
    make_candidates(project, 200, parent=seed_candidate, label="more")
    assert_same_queries(few, reader(), what="an older page of candidates")


def test_it_reads_the_candidate_page_in_as_many_queries_with_many_evaluations(
    client, owner, project, seed_candidate, humaneval_suite, policy_version
):
    tasks = search_tasks(humaneval_suite, 4)

    def evaluate(split: str) -> None:
        evaluation = make_evaluation(
            candidate=seed_candidate,
            suite=humaneval_suite,
            policy_version=policy_version,
            split=split,
        )
        make_rollouts(evaluation, tasks)

    evaluate(Split.SEARCH)
    evaluate(Split.VALIDATION)
    client.force_login(owner)
    reader = read(client, reverse("web:candidate", args=[project.slug, seed_candidate.sha]))
    few = reader()
    for _ in range(30):
        evaluate(Split.SEARCH)
        evaluate(Split.VALIDATION)
    assert_same_queries(few, reader(), what="the candidate page")


# --- the campaign page: plots, lineage, Pareto front, rounds, proposals ----------------------


def test_it_reads_the_campaign_page_in_as_many_queries_with_many_proposals(
    client, owner, project, tmp_path, policy_version
):
    campaign = started_campaign(project, tmp_path, policy_version)
    seed = campaign.seed_candidate
    make_proposals(campaign, make_candidates(project, 8, parent=seed), start=1)
    set_best(campaign)
    client.force_login(owner)
    url = reverse("web:campaign", args=[project.slug, campaign.id])
    reader = read(client, url)
    few = reader()
    live = read(client, url, HX_Request="true")
    few_live = live()

    make_proposals(campaign, make_candidates(project, 300, parent=seed, label="more"), start=9)
    set_best(campaign)
    assert_same_queries(few, reader(), what="the campaign page")
    assert_same_queries(few_live, live(), what="the campaign page's live part")


# --- the evaluation page and the comparison of two ------------------------------------------


def test_it_reads_the_evaluation_page_in_as_many_queries_with_many_rollouts(
    client, owner, project, seed_candidate, humaneval_suite, policy_version
):
    evaluation = make_evaluation(
        candidate=seed_candidate, suite=humaneval_suite, policy_version=policy_version, epochs=2
    )
    tasks = search_tasks(humaneval_suite, 120)
    make_rollouts(evaluation, tasks[:4])
    client.force_login(owner)
    url = reverse("web:evaluation", args=[project.slug, evaluation.id])
    reader = read(client, url)
    few = reader()
    live = read(client, url, HX_Request="true")
    few_live = live()

    make_rollouts(evaluation, tasks[4:], error_kinds=6)
    make_rollouts(evaluation, tasks, epochs=2, first_epoch=1)
    assert_same_queries(few, reader(), what="the evaluation page")
    assert_same_queries(few_live, live(), what="the evaluation page's live part")


def test_it_reads_the_comparison_in_as_many_queries_with_many_tasks(
    client, owner, project, seed_candidate, child_candidate, humaneval_suite, policy_version
):
    reference = make_evaluation(
        candidate=seed_candidate, suite=humaneval_suite, policy_version=policy_version
    )
    candidate = make_evaluation(
        candidate=child_candidate, suite=humaneval_suite, policy_version=policy_version
    )
    tasks = search_tasks(humaneval_suite, 120)
    make_rollouts(reference, tasks[:4])
    make_rollouts(candidate, tasks[1:5])  # shifted: some tasks flip
    client.force_login(owner)
    url = reverse("web:comparison", args=[project.slug])
    reader = read(client, f"{url}?reference={reference.id}&candidate={candidate.id}")
    few = reader()

    make_rollouts(reference, tasks[4:])
    make_rollouts(candidate, [tasks[0], *tasks[5:]], error_kinds=3)
    assert_same_queries(few, reader(), what="the comparison page")


# --- the matrix pages -------------------------------------------------------------------------


def test_it_reads_the_matrix_page_in_as_many_queries_with_many_cells(
    client, owner, project, seed_candidate, child_candidate, humaneval_suite, policy_version
):
    small = written_matrix(
        project=project,
        suite=humaneval_suite,
        candidates=[seed_candidate],
        policy_versions=[policy_version],
        passes=[[[1, 0, 1]]],
    )
    policies = [policy_version, *make_policy_versions(policy_version, 2)]
    big = written_matrix(
        project=project,
        suite=humaneval_suite,
        candidates=[seed_candidate, child_candidate],
        policy_versions=policies,
        passes=[[[1, 1, 1], [0, 0, 0], [1, 0, 1]], [[0, 0, 0], [1, 1, 1], [1, 1, 0]]],
    )
    assert MatrixCell.objects.filter(matrix=big).count() == 6
    client.force_login(owner)
    few = read(client, reverse("web:matrix", args=[project.slug, small.id]))()
    many = read(client, reverse("web:matrix", args=[project.slug, big.id]))()
    assert_same_queries(few, many, what="the matrix page")


def test_it_reads_the_matrix_list_in_as_many_queries_with_many_matrices(
    client, owner, project, seed_candidate, humaneval_suite, policy_version
):
    def matrix() -> None:
        written_matrix(
            project=project,
            suite=humaneval_suite,
            candidates=[seed_candidate],
            policy_versions=[policy_version],
            passes=[[[1, 0]]],
        )

    matrix()
    client.force_login(owner)
    reader = read(client, reverse("web:matrices", args=[project.slug]))
    few = reader()
    for _ in range(6):
        matrix()
    assert_same_queries(few, reader(), what="the matrix list")


# --- the audit log ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "query",
    ["", "?actor=owner", "?action=channel", "?target_type=candidate&since=2000-01-01"],
)
def test_it_reads_the_audit_log_in_as_many_queries_with_many_events(client, owner, project, query):
    make_audit_events(project, 5, actor=owner)
    client.force_login(owner)
    reader = read(client, reverse("web:audit", args=[project.slug]) + query)
    few = reader()
    make_audit_events(project, 300, actor=owner)
    make_audit_events(project, 40)
    assert_same_queries(few, reader(), what=f"the audit log{query}")


def test_it_reads_the_global_audit_log_in_as_many_queries_with_many_events(client, project):
    staff = make_user("staff")
    staff.is_staff = True
    staff.save()
    make_audit_events(project, 5, actor=staff)
    make_audit_events(None, 5)
    client.force_login(staff)
    reader = read(client, reverse("web:global_audit"))
    few = reader()
    make_audit_events(project, 300, actor=staff)
    make_audit_events(None, 100)
    assert_same_queries(few, reader(), what="the global audit log")


# --- a rollout's trace ------------------------------------------------------------------------


def trace_steps(task: Task, count: int, start: int = 0) -> list:
    steps = []
    for i in range(start, start + count):
        if i % 3 == 0:
            payload = {"api": "completions", "prompt": f"p{i}", "completion": f"c{i}"}
            usage = {"prompt_tokens": 10, "completion_tokens": 2, "latency_ms": 5}
            steps.append(("model_call", payload, usage))
        elif i % 3 == 1:
            steps.append(("log", {"message": f"step {i}"}, {}))
        else:
            steps.append(("tool_call", {"name": "run", "arguments": {"i": i}, "result": "ok"}, {}))
    return steps


def test_it_reads_a_trace_page_in_as_many_queries_with_many_steps(
    client, owner, project, seed_candidate, humaneval_suite, policy_version
):
    evaluation = make_evaluation(
        candidate=seed_candidate, suite=humaneval_suite, policy_version=policy_version
    )
    task = search_tasks(humaneval_suite, 1)[0]
    small = make_rollout(
        evaluation, task, outcome=RolloutOutcome.PASSED, score=1.0, steps=trace_steps(task, 6)
    )
    client.force_login(owner)
    reader = read(client, reverse("web:rollout", args=[project.slug, small.id]))
    few = reader()
    add_steps(small, trace_steps(task, 400, start=6), start=6)
    many = reader()
    assert_same_queries(few, many, what="the trace page")

"""The evaluation engine on the dashboard: stages, spend, pass@k, cancel/resume, comparison,
and sealed held-out rollouts."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from coevo.evaluations.lifecycle import evaluation_advance
from coevo.evaluations.models import (
    EvaluationState,
    Rollout,
    RolloutState,
)
from coevo.evaluations.plans import EvaluationPlan
from coevo.evaluations.services import evaluation_create, rollout_claim, rollout_finish
from coevo.evaluations.services.evaluations import HELDOUT_PURPOSE
from coevo.projects.models import Role
from coevo.projects.services import membership_set
from coevo.suites.models import Split, Task
from tests.support.factories import make_evaluation
from tests.web.test_pages import plain, text
from workers.outcomes import RolloutOutcome

pytestmark = pytest.mark.django_db(transaction=True)


def run(rollout: Rollout, outcome: str) -> None:
    claimed = rollout_claim(rollout_id=rollout.id, worker="test")
    rollout_finish(
        rollout=claimed,
        outcome=outcome,
        score=float(outcome == RolloutOutcome.PASSED),
        detail=outcome,
        prompt_tokens=50,
        latency_ms=1200,
    )


def evaluation(seed_candidate, suite, policy, **kwargs):
    kwargs.setdefault("split", Split.SEARCH)
    return evaluation_create(candidate=seed_candidate, suite=suite, policy_version=policy, **kwargs)


def test_it_shows_stages_spend_and_pass_at_k(
    client, owner, project, seed_candidate, humaneval_suite, policy_version
):
    staged = evaluation(
        seed_candidate,
        humaneval_suite,
        policy_version,
        task_limit=4,
        epochs=2,
        plan=EvaluationPlan(smoke_tasks=1),
    )
    for i, rollout in enumerate(staged.rollouts.order_by("stage", "task__position", "epoch")):
        run(rollout, RolloutOutcome.PASSED if i % 2 == 0 else RolloutOutcome.TASK_FAILURE)
    staged.refresh_from_db()
    assert staged.state == EvaluationState.FINISHED
    client.force_login(owner)
    response = client.get(reverse("web:evaluation", args=[project.slug, staged.id]))
    page = plain(response)
    assert "smoke · 1 task" in page and "full · 3 tasks" in page
    assert "pass@k" in page
    # Every task passed one epoch of two: pass@1 = 50%, pass@2 = 100%.
    assert "1 50.0%" in page and "2 100.0%" in page
    assert "400 spent" in page  # 8 rollouts × 50 tokens
    assert "mean per-task score" in page


def test_a_researcher_cancels_and_resumes_but_a_viewer_cannot(
    client, owner, project, seed_candidate, humaneval_suite, policy_version, django_user_model
):
    running = evaluation(seed_candidate, humaneval_suite, policy_version, task_limit=3)
    viewer = django_user_model.objects.create_user("vera", password="x")
    membership_set(project=project, user=viewer, role=Role.VIEWER)
    cancel = reverse("web:evaluation_action", args=[project.slug, running.id, "cancel"])
    resume = reverse("web:evaluation_action", args=[project.slug, running.id, "resume"])

    client.force_login(viewer)
    assert client.post(cancel).status_code == 403
    page = text(client.get(reverse("web:evaluation", args=[project.slug, running.id])))
    assert 'id="cancel-evaluation"' not in page

    client.force_login(owner)
    assert 'id="cancel-evaluation"' in text(
        client.get(reverse("web:evaluation", args=[project.slug, running.id]))
    )
    response = client.post(cancel, follow=True)
    assert "Evaluation cancelled; 3 rollouts stopped." in plain(response)
    running.refresh_from_db()
    assert running.state == EvaluationState.CANCELLED
    assert client.get(cancel).status_code == 405
    response = client.post(resume, follow=True)
    assert "3 rollouts will run again" in plain(response)
    running.refresh_from_db()
    assert running.state == EvaluationState.RUNNING
    response = client.post(
        reverse("web:evaluation_action", args=[project.slug, running.id, "explode"])
    )
    assert response.status_code == 404


def test_it_compares_two_evaluations_with_links_to_both_traces(
    client, owner, project, seed_candidate, humaneval_suite, policy_version
):
    reference = evaluation(seed_candidate, humaneval_suite, policy_version, task_limit=3, seed=1)
    candidate = evaluation(seed_candidate, humaneval_suite, policy_version, task_limit=3, seed=2)
    for rollout, outcome in zip(
        reference.rollouts.order_by("task__position"),
        [RolloutOutcome.PASSED, RolloutOutcome.TASK_FAILURE, RolloutOutcome.TASK_FAILURE],
        strict=True,
    ):
        run(rollout, outcome)
    for rollout, outcome in zip(
        candidate.rollouts.order_by("task__position"),
        [RolloutOutcome.TASK_FAILURE, RolloutOutcome.PASSED, RolloutOutcome.PASSED],
        strict=True,
    ):
        run(rollout, outcome)
    client.force_login(owner)
    url = reverse("web:comparison", args=[project.slug])
    response = client.get(url, {"reference": reference.id, "candidate": candidate.id})
    assert response.status_code == 200
    page = plain(response)
    assert "fixed 2 · broken 1 · both pass 0 · both fail 0" in page
    assert "+33.3 pts" in page
    html = text(response)
    fixed_task = reference.rollouts.order_by("task__position")[1]
    theirs = candidate.rollouts.get(task=fixed_task.task)
    assert reverse("web:rollout", args=[project.slug, fixed_task.id]) in html
    assert reverse("web:rollout", args=[project.slug, theirs.id]) in html
    # Each kind of flip is a filter; the table then lists that kind only.
    assert re.search(r'class="flip-filter" href="\?reference=[^"]+flip=fixed"', html)
    query = {"reference": reference.id, "candidate": candidate.id, "flip": "fixed"}
    filtered = text(client.get(url, query))
    assert filtered.count('<tr class="flip-fixed">') == 2
    assert '<tr class="flip-broken">' not in filtered
    assert "All 2" in plain(client.get(url, query))
    # The evaluation page offers the comparison.
    page = text(client.get(reverse("web:evaluation", args=[project.slug, candidate.id])))
    assert 'id="compare-form"' in page


def test_it_offers_comparisons_only_on_the_same_suite_and_split(
    client, owner, project, seed_candidate, humaneval_suite, policy_version
):
    def make(split=Split.SEARCH):
        return make_evaluation(
            candidate=seed_candidate,
            suite=humaneval_suite,
            policy_version=policy_version,
            split=split,
        )

    shown, same, other_split = make(), make(), make(Split.VALIDATION)
    client.force_login(owner)
    page = text(client.get(reverse("web:evaluation", args=[project.slug, shown.id])))
    offered = set(re.findall(r'<option value="([0-9a-f-]{36})"', page))
    assert offered == {str(same.id)}
    assert str(other_split.id) not in offered and str(shown.id) not in offered


def test_it_refuses_to_compare_different_splits(
    client, owner, project, seed_candidate, humaneval_suite, policy_version
):
    search = evaluation(seed_candidate, humaneval_suite, policy_version, task_limit=1)
    validation = evaluation(
        seed_candidate, humaneval_suite, policy_version, task_limit=1, split=Split.VALIDATION
    )
    client.force_login(owner)
    response = client.get(
        reverse("web:comparison", args=[project.slug]),
        {"reference": search.id, "candidate": validation.id},
    )
    assert response.status_code == 400
    assert "same suite and split" in plain(response)


def test_it_never_shows_a_held_out_tasks_inputs_or_trace(
    client, owner, project, seed_candidate, humaneval_suite, policy_version
):
    marker = "HELD-OUT-MARKER-7f3a"
    task = Task.objects.filter(suite=humaneval_suite, split=Split.HELDOUT).first()
    Task.objects.filter(id=task.id).update(
        inputs={**task.inputs, "prompt": task.inputs["prompt"] + marker}
    )
    sealed = evaluation(
        seed_candidate,
        humaneval_suite,
        policy_version,
        task_limit=1,
        split=Split.HELDOUT,
        purpose=HELDOUT_PURPOSE,
    )
    rollout = sealed.rollouts.get()
    assert rollout.task_id == task.id
    claimed = rollout_claim(rollout_id=rollout.id, worker="test")
    from coevo.evaluations.models import TraceStep

    TraceStep.objects.create(
        rollout=rollout, attempt=1, index=0, kind="model_call", payload={"prompt": marker}
    )
    rollout_finish(rollout=claimed, outcome=RolloutOutcome.PASSED, score=1.0, detail="ok")
    evaluation_advance(evaluation_id=sealed.id)
    client.force_login(owner)
    response = client.get(reverse("web:rollout", args=[project.slug, rollout.id]))
    assert marker not in text(response)
    # Held-out results (even per-task scores) belong to promotion requests only: outside them the
    # evaluation and its rollouts do not exist, for its admin as for anyone.
    assert response.status_code == 404
    assert client.get(reverse("web:evaluation", args=[project.slug, sealed.id])).status_code == 404
    other = evaluation(
        seed_candidate,
        humaneval_suite,
        policy_version,
        task_limit=1,
        split=Split.HELDOUT,
        purpose=HELDOUT_PURPOSE,
    )
    compare = client.get(
        reverse("web:comparison", args=[project.slug]),
        {"reference": other.id, "candidate": sealed.id},
    )
    assert compare.status_code == 404
    for page in (
        reverse("web:project", args=[project.slug]),
        reverse("web:candidate", args=[project.slug, seed_candidate.sha]),
    ):
        body = text(client.get(page))
        assert str(sealed.id)[:8] not in body
        assert marker not in body
    assert Rollout.objects.get(id=rollout.id).state == RolloutState.DONE


def test_the_candidate_page_shows_its_search_vs_validation_gap(
    client, owner, project, seed_candidate, humaneval_suite, policy_version
):
    search = evaluation(seed_candidate, humaneval_suite, policy_version, task_limit=2)
    validation = evaluation(
        seed_candidate, humaneval_suite, policy_version, task_limit=2, split=Split.VALIDATION
    )
    for rollout, outcome in zip(
        list(search.rollouts.order_by("id")) + list(validation.rollouts.order_by("id")),
        (
            RolloutOutcome.PASSED,
            RolloutOutcome.PASSED,
            RolloutOutcome.PASSED,
            RolloutOutcome.TASK_FAILURE,
        ),
        strict=True,
    ):
        run(rollout, outcome)
    for done in (search, validation):
        evaluation_advance(evaluation_id=done.id)
        done.refresh_from_db()
        assert done.state == EvaluationState.FINISHED
    client.force_login(owner)
    page = plain(client.get(reverse("web:candidate", args=[project.slug, seed_candidate.sha])))
    assert "Search vs validation" in page
    assert "1.000" in page and "0.500" in page  # search 2/2, validation 1/2: gap 0.500
